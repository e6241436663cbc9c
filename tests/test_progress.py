"""The progress bar of convert and augment (pipelines/progress.py): its count from an output directory filling
up, its thread that never fails a run, and what a terminal, ``--no-progress`` and a pipe show."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import sys
import termios
import threading
import time

import numpy as np
import pytest

from tests.conftest import ROOT, convert
from tfrecord_etl.pipelines import progress
from tfrecord_etl.transforms.output.outdir import name_key

NAMES = [f"data-{i:05d}-of-00004.tfrecord" for i in range(4)]


def temp(final: str, attempt: int = 0) -> str:
    """A temporary of ``final`` as transforms/output/sink.py names it."""
    return f".tmp-{attempt:032x}-{name_key(final)}"


def planned(rows=100, row_bytes=10):
    return progress.Planned(dict.fromkeys(NAMES, rows), rows * len(NAMES), rows * row_bytes * len(NAMES))


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def test_measure_counts_committed_shards_and_temporaries_by_their_bytes():
    p = planned()
    assert progress.measure(p, {}) == (0, 0)
    # shard 0 committed (its planned 100 records, 1,500 bytes: 15 bytes per record from now on), shard 1 half
    # written by two attempts (the furthest counts), a foreign file and a file of an earlier output ignored
    listing = {
        NAMES[0]: 1500,
        temp(NAMES[1]): 750,
        temp(NAMES[1], 1): 300,
        "notes.txt": 99,
        NAMES[3]: 5000,
        ".tmp-" + "0" * 32 + "-ffffffff": 10,
    }
    assert progress.measure(p, listing, before=frozenset({NAMES[3]})) == (150, 1500 + 750)
    # before any commit, the plan's 10 bytes per record; a temporary never counts more than its shard
    assert progress.measure(p, {temp(NAMES[2]): 500}) == (50, 500)
    assert progress.measure(p, {temp(NAMES[2]): 5000}) == (100, 5000)
    # a committed shard's temporary left behind is not counted twice; never more than the total
    everything = dict.fromkeys(NAMES, 1000) | {temp(NAMES[0]): 1000}
    assert progress.measure(p, everything) == (400, 4000)
    # shards of unknown records (splits, the beam writer): their bytes at the plan's bytes per record
    unknown = progress.Planned(dict.fromkeys(NAMES), 400, 4000)
    assert progress.measure(unknown, {NAMES[0]: 1000, temp(NAMES[1]): 200}) == (120, 1200)


def test_the_bar_follows_a_directory_filling_up_and_ends_at_the_planned_total(tmp_path):
    stream = Tty()
    watcher = progress.Watcher(str(tmp_path), planned(), "convert", stream=stream, interval=0.02).start()
    seen = []
    try:
        for i, name in enumerate(NAMES[:3]):
            (tmp_path / temp(name)).write_bytes(b"x" * 500)  # half of its 100 records at 10 bytes each
            deadline = time.time() + 10
            while watcher._bar.n < i * 100 + 50 and time.time() < deadline:
                time.sleep(0.01)
            seen.append(watcher._bar.n)
            os.replace(tmp_path / temp(name), tmp_path / name)
            (tmp_path / name).write_bytes(b"x" * 1000)
        deadline = time.time() + 10
        while watcher._bar.n < 300 and time.time() < deadline:
            time.sleep(0.01)
        seen.append(watcher._bar.n)
    finally:
        watcher.finish()
    assert seen == [50, 150, 250, 300] and watcher.failed is None
    frames = stream.getvalue().split("\r")
    assert re.match(r"convert: 100%\|.*\| 400/400 records, 2\.9 KiB of ~3\.9 KiB \[", frames[-1]), frames[-1]
    assert frames[-1].endswith("\n")  # the finished bar stays on its line
    assert not [t for t in threading.enumerate() if t.name == "tfrecord-etl-progress"]


def test_an_error_in_the_poller_stops_the_bar_and_never_the_run(tmp_path):
    calls = []

    def lister(directory):
        calls.append(directory)
        if len(calls) > 2:
            raise PermissionError("listing refused")
        return {}

    stream = Tty()
    watcher = progress.Watcher(str(tmp_path), planned(), "convert", stream=stream, interval=0.01, lister=lister)
    watcher.start()
    deadline = time.time() + 10
    while watcher.failed is None and time.time() < deadline:
        time.sleep(0.01)
    assert isinstance(watcher.failed, PermissionError)
    drawn = stream.getvalue()
    watcher.finish()  # nothing more is drawn, nothing is raised
    assert stream.getvalue() == drawn and "100%" not in drawn
    # a stream that breaks (the terminal went away): the same
    broken = Tty()
    broken.write = lambda text: (_ for _ in ()).throw(OSError("terminal gone"))
    watcher = progress.Watcher(str(tmp_path), planned(), "convert", stream=broken, interval=0.01).start()
    watcher.finish()
    assert isinstance(watcher.failed, OSError)


def test_a_failed_run_clears_the_bar_before_the_error(tmp_path):
    stream = Tty()
    with pytest.raises(RuntimeError, match="shard 2 failed"):
        with progress.watch(str(tmp_path), planned(), "convert", enabled=True, stream=stream):
            (tmp_path / NAMES[0]).write_bytes(b"x" * 1000)
            time.sleep(0.3)
            raise RuntimeError("shard 2 failed")
    text = stream.getvalue()
    assert "convert:" in text and "100%" not in text and not text.endswith("\n")  # the line is cleared, no newline
    with progress.watch(str(tmp_path), planned(), "convert", enabled=False) as watcher:
        assert watcher is None


def test_mode_bar_in_a_terminal_lines_for_logs_nothing_when_off():
    pipe = io.StringIO()
    assert [progress.mode(s, Tty()) for s in (None, True, False)] == ["bar", "bar", None]
    assert [progress.mode(s, pipe) for s in (None, True, False)] == [None, "lines", None]


def run_in_terminal(argv, cwd) -> tuple[int, str]:
    """``tfrecord-etl ARGV`` with stdin, stdout and stderr on a pseudo-terminal of 120 columns; (status, output)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        try:
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "tfrecord_etl.pipelines.cli", *argv], env)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    out, deadline = b"", time.time() + 240  # a guard against a hang, not a timing assertion
    try:
        while time.time() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        if time.time() >= deadline:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


BEAM = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def test_a_convert_in_a_terminal_shows_the_bar_up_to_the_planned_total(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(3000 * 8, dtype="<i8").reshape(3000, 8))
    status, out = run_in_terminal(
        ["convert", "--input", "a.npy", "--output_dir", "out", "--num_shards", "3", *BEAM], tmp_path
    )
    assert status == 0, out[-3000:]
    frames = [f for f in re.split(r"[\r\n]+", out) if f.startswith("convert:")]
    assert frames and re.match(r"convert: 100%\|█+\| 3000/3000 records, \d+\.\d KiB of ~\d+\.\d KiB \[", frames[-1]), (
        frames[-3:]
    )
    assert "wrote 3000 examples in 3 shards" in out
    assert "[tfrecord-etl] shard" not in out  # the bar replaces the per-shard lines in a terminal
    status, out = run_in_terminal(
        ["augment", "--input", "out", "--output_dir", "aug", "--constants", "k=1", *BEAM], tmp_path
    )  # each output shard counts its input shard's records
    assert status == 0, out[-3000:]
    frames = [f for f in re.split(r"[\r\n]+", out) if f.startswith("augment:")]
    assert frames and re.match(r"augment: 100%\|█+\| 3000/3000 records, ", frames[-1]), frames[-3:]
    status, out = run_in_terminal(
        ["convert", "--input", "a.npy", "--output_dir", "out2", "--num_shards", "3", "--no-progress", *BEAM], tmp_path
    )
    assert status == 0, out[-3000:]
    assert "wrote 3000 examples in 3 shards" in out and "records" not in out.split("wrote")[0]
    assert "%|" not in out


def test_nothing_is_drawn_on_a_pipe(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.arange(300, dtype="<i8").reshape(100, 3))
    code, out, err = convert(tmp_path / "a.npy", tmp_path / "out", "--num_shards", "2", capsys=capsys)
    assert code == 0 and "wrote 100 examples" in out
    assert "%|" not in err and "records" not in err and "[tfrecord-etl] shard" not in err
