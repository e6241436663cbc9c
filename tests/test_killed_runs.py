"""Runs with worker processes (DirectRunner multi_processing) killed or interrupted at a chosen moment
(``outdir.failpoint``): a dead worker and a Ctrl-C end in one line with nothing committed, a killed launcher's
orphaned workers commit nothing, and a re-run started at once (while orphans may still run) is exact."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import outdir, runlock

MULTI = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
ROWS = 4000


def make_h5(path, start):
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(start, start + ROWS, dtype="<i8")
        f["x"] = np.arange(start, start + ROWS, dtype="<f4")[:, None] * np.ones(64, "<f4")
    return path


def convert(inp, out, *flags, failpoint=None, multi=True, once=None):
    """``python -m pipelines.convert`` as a process; ``failpoint`` kills it at that stage (``once``: the file a
    ``:once`` failpoint creates when it fires)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(outdir.FAILPOINT_ENV, None)
    if failpoint:
        env[outdir.FAILPOINT_ENV] = failpoint
    if once:
        env[runlock.FAILPOINT_ONCE_ENV] = str(once)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.convert",
            "--input",
            str(inp),
            "--output_dir",
            str(out),
            "--num_shards",
            "4",
            "--overwrite",
            *flags,
            *(MULTI if multi else ["--runner=DirectRunner", "--direct_running_mode=in_memory"]),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr


def ids(out):
    return [int(e["id"]) for e in reader.iter_numpy(str(out))]


def files_of(out):
    meta = json.loads((out / "metadata.json").read_text())
    return {s["file"] for s in meta["shards"]} | {"metadata.json", "schema.pbtxt", outdir.MARKER_FILE}


def orphans(out):
    """Pids of live Beam worker processes that were started for a run on ``out`` (their environment names its
    lock), from /proc."""
    lock = str(out / outdir.LOCK_FILE)
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"apache_beam.runners.worker" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if lock.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except OSError:
            continue
        found.append(int(pid))
    return found


def wait_for_no_orphans(out, limit=90.0):
    deadline = time.monotonic() + limit
    while orphans(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not orphans(out), "worker processes of a dead launcher are still running"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("killed")
    return [make_h5(tmp / f"in{i}.h5", i * 100_000) for i in range(3)]


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.timeout(600)
def test_a_dead_worker_is_one_line_and_commits_nothing(inputs, tmp_path):
    out = tmp_path / "out"
    assert convert(inputs[0], out, multi=False)[0] == 0
    code, err = convert(inputs[1], out, failpoint="shard-committed")  # a worker kills itself after a shard
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len(error_lines(err)) == 1 and error_lines(err)[0].startswith("error: OutputError: A worker process died"), (
        err[-3000:]
    )
    assert "nothing was committed" in err
    assert ids(out) == list(range(ROWS))  # the old output, complete
    assert convert(inputs[1], out)[0] == 0
    assert ids(out) == list(range(100_000, 100_000 + ROWS)) and set(os.listdir(out)) == files_of(out)


@pytest.mark.timeout(600)
def test_orphans_of_a_killed_launcher_commit_nothing_and_a_rerun_at_once_is_exact(inputs, tmp_path):
    """A worker kills its launcher (SIGKILL) right after committing a shard; the other shards' workers live on
    as orphans and would rename their shards into the directory. The re-run starts at once, with other inputs."""
    out = tmp_path / "out"
    assert convert(inputs[0], out, multi=False)[0] == 0
    code, _ = convert(inputs[1], out, failpoint="shard-committed:launcher")
    assert code == -signal.SIGKILL
    assert ids(out) == list(range(ROWS))  # the old output is still the committed one
    code, err = convert(inputs[2], out, multi=False)  # at once: orphans may still be writing
    assert code == 0, err[-3000:]
    wait_for_no_orphans(out)
    assert ids(out) == list(range(200_000, 200_000 + ROWS))
    assert set(os.listdir(out)) == files_of(out)  # no shard of the killed run was renamed in


@pytest.mark.timeout(600)
def test_ctrl_c_stops_the_workers_and_is_one_line_with_status_130(inputs, tmp_path):
    out = tmp_path / "out"
    assert convert(inputs[0], out, multi=False)[0] == 0
    code, err = convert(inputs[1], out, failpoint="shard-committed:launcher:INT")  # Ctrl-C after a shard
    assert code == 130 and "Traceback" not in err, err[-3000:]
    assert len(error_lines(err)) == 1 and error_lines(err)[0].startswith("error: OutputError: Interrupted")
    assert not orphans(out)  # stopped before the launcher exited
    assert not (out / outdir.LOCK_FILE).exists()
    assert ids(out) == list(range(ROWS))
    assert convert(inputs[1], out, multi=False)[0] == 0
    assert ids(out) == list(range(100_000, 100_000 + ROWS)) and set(os.listdir(out)) == files_of(out)


def test_a_run_whose_lock_was_taken_over_commits_nothing(tmp_path, monkeypatch):
    """``sink.committed_file`` inside a held lock refuses to rename once another run's id is in the lock."""
    from tfrecord_etl.transforms.errors import OutputError
    from tfrecord_etl.transforms.output import sink

    lock = outdir.prepare(str(tmp_path), command="convert", options={}, files=["a.tfrecord"], overwrite=False)
    with lock:
        sink.write_file(str(tmp_path / "a.tfrecord"), b"first")
        record = json.loads((tmp_path / outdir.LOCK_FILE).read_text())
        (tmp_path / outdir.LOCK_FILE).write_text(json.dumps(dict(record, run_id="another")))
        with pytest.raises(OutputError, match="another run took its lock over"):
            sink.write_file(str(tmp_path / "a.tfrecord"), b"second")
        (tmp_path / outdir.LOCK_FILE).unlink()
        with pytest.raises(OutputError, match="its lock is gone"):
            sink.write_file(str(tmp_path / "a.tfrecord"), b"third")
    assert (tmp_path / "a.tfrecord").read_bytes() == b"first"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(outdir.TEMP_PREFIX)]
    assert outdir.RUN_ENV not in os.environ


def test_a_second_ctrl_c_during_the_cleanup_of_an_interrupted_run_still_releases_the_lock(tmp_path):
    """Each worker that commits a shard after a Ctrl-C, or the user pressing it twice, interrupts the launcher
    again while it removes what it wrote: the cleanup finishes and the lock is released all the same."""
    from tfrecord_etl.transforms.output import runlock

    lock = runlock.Lock(str(tmp_path), "a" * 32).acquire()
    done = []

    def discard():
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, in the middle of the cleanup
        done.append("discarded")

    lock.discard = discard
    with pytest.raises(KeyboardInterrupt):
        with lock:
            raise KeyboardInterrupt  # the first one
    assert done == ["discarded"]
    assert not (tmp_path / outdir.LOCK_FILE).exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_during_the_release_of_a_successful_run_is_raised_after_it(tmp_path, monkeypatch):
    from tfrecord_etl.transforms.output import runlock

    lock = runlock.Lock(str(tmp_path), "b" * 32).acquire()
    remove = runlock._remove

    def interrupted_remove(path, version):
        os.kill(os.getpid(), signal.SIGINT)
        remove(path, version)

    monkeypatch.setattr(runlock, "_remove", interrupted_remove)
    with pytest.raises(KeyboardInterrupt):
        with lock:
            pass
    assert not (tmp_path / outdir.LOCK_FILE).exists()


WORKER_SCRIPT = r"""
import os, sys
from apache_beam.internal import pickler
from tfrecord_etl.transforms.output import runlock
from tfrecord_etl.transforms.errors import OutputError
fn = pickler.loads(open(sys.argv[1]).read())
target = sys.argv[2]
runlock.check_commit(target)          # no run in this worker's environment: nothing to guard yet
print("before setup: unguarded", flush=True)
fn.setup()                            # what Beam calls first in every worker
try:
    runlock.check_commit(target)
    print("after setup: committed")
except OutputError as e:
    print("after setup: refused:", e.message)
"""


def test_dofns_carry_the_run_to_workers_started_without_the_launchers_environment(tmp_path, monkeypatch):
    """An SDK harness that a Flink or Spark worker pool starts never sees the launcher's environment, so
    ``check_commit`` had no run to guard there: a job that outlived its killed launcher went on renaming shards
    into a directory a re-run may be writing. Our DoFns carry the run they were built in (pickled with them, as
    Beam ships them to workers) and set it in ``setup``: the worker commits while the run holds its lock and
    commits nothing once it has lost it."""
    import inspect

    import apache_beam as beam
    from apache_beam.internal import pickler

    from tfrecord_etl.transforms.augment import beam as augment_beam, commit as augment_commit
    from tfrecord_etl.transforms.beam import (
        commit as beam_commit,
        encode as beam_encode,
        read as beam_read,
        write as beam_write,
    )

    for module in (
        beam_read,
        beam_encode,
        beam_write,
        beam_commit,
        augment_beam,
        augment_commit,
    ):  # every DoFn of ours that can commit a file carries the run
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, beam.DoFn) and cls.__module__ == module.__name__:
                assert issubclass(cls, runlock.CarriesRun), name
    out = tmp_path / "out"
    out.mkdir()
    lock = out / runlock.LOCK_FILE
    run = json.dumps({"lock": str(lock), "run_id": "run-1"})
    monkeypatch.setenv(runlock.RUN_ENV, run)  # the launcher builds the pipeline inside `with lock:`
    fn = beam_commit.WriteMetadataFn.__new__(beam_commit.WriteMetadataFn)
    monkeypatch.delenv(runlock.RUN_ENV)
    (tmp_path / "fn.pkl").write_bytes(pickler.dumps(fn))
    env = {k: v for k, v in os.environ.items() if k != runlock.RUN_ENV}

    def worker():
        proc = subprocess.run(
            [sys.executable, "-c", WORKER_SCRIPT, str(tmp_path / "fn.pkl"), str(out / "data-00000-of-00001.tfrecord")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    lock.write_text(json.dumps(runlock._lock_record("run-1")))  # held by a live launcher (this process)
    assert worker() == "before setup: unguarded\nafter setup: committed\n"
    lock.write_text(json.dumps(runlock._lock_record("run-2")))  # a re-run took the lock over
    said = worker()
    assert "after setup: refused:" in said and "another run took its lock over" in said, said
    lock.unlink()  # the launcher stopped and released it
    assert "its lock is gone" in worker()


# ------------------------------------------------------------------------------------------------------------------
# A job the runner reports failed after (or before) our commit ran: a Flink JobManager killed while its TaskManagers
# finish the job, commit included, before the job server reports it lost (configs/engines/test_flink.py runs it on
# a cluster). Here without one: the pipeline runs (or not), then the runner's failure is raised.
# ------------------------------------------------------------------------------------------------------------------

JOB_FAILED = "Pipeline BeamApp-root-1128-0001 failed in state FAILED: java.net.ConnectException: Connection refused"
HINT_RESTART = (
    "on a cluster, give the runner a restart strategy (Flink: restart-strategy: fixed-delay) so that a "
    "lost worker is retried"
)


def failing_runner(monkeypatch, *, commit: bool, finish_replacement: bool = True, stray: str | None = None):
    """Makes ``common.run_pipeline`` run the pipeline (``commit``; ``finish_replacement=False``: the worker that
    committed is lost before it removed the replaced output's files) or not, optionally leave a shard temporary
    and a shard named ``stray`` (a name of the failed plan), then raise what PortableRunner raises for a job the
    runner failed."""
    from tfrecord_etl.pipelines import common

    real = common.run_pipeline

    def run_pipeline(p):
        if commit:
            if finish_replacement:
                real(p)
            else:
                monkeypatch.setattr(outdir, "finish_replacement", lambda *a, **k: None)
                try:
                    real(p)
                finally:
                    monkeypatch.undo()
        if stray:
            out = pathlib.Path(json.loads(os.environ[runlock.RUN_ENV])["lock"]).parent
            (out / stray).write_bytes(b"a late shard")
            (out / f".tmp-{'0' * 32}-{outdir.name_key(stray)}").write_bytes(b"a killed attempt")
        raise RuntimeError(JOB_FAILED)

    monkeypatch.setattr(common, "run_pipeline", run_pipeline)


def convert_in_process(inp, out, *flags):
    from tfrecord_etl.pipelines import common, convert as convert_command

    return common.run_main(
        convert_command.main,
        [
            "--input",
            str(inp),
            "--output_dir",
            str(out),
            "--num_shards",
            "4",
            "--overwrite",
            "--runner=DirectRunner",
            "--direct_running_mode=in_memory",
            *flags,
        ],
    )


def the_error_line(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(error_lines(err)) == 1, err[-3000:]
    return error_lines(err)[0]


@pytest.mark.parametrize("finish_replacement", [True, False], ids=["replacement-done", "replacement-not-done"])
def test_a_job_the_runner_failed_after_its_commit_says_this_runs_output_is_complete(
    inputs, tmp_path, monkeypatch, capsys, finish_replacement
):
    out, want = tmp_path / "out", tmp_path / "want"
    assert convert(inputs[0], out, "--num_shards", "3", multi=False)[0] == 0  # the previous output
    assert convert(inputs[1], want, multi=False)[0] == 0  # this run, uninterrupted
    failing_runner(monkeypatch, commit=True, finish_replacement=finish_replacement)
    assert convert_in_process(inputs[1], out) == 2
    assert the_error_line(capsys) == (
        f"error: OutputError: The runner's job BeamApp-root-1128-0001 ended in state FAILED: "
        f"java.net.ConnectException: Connection refused; its commit ran before the failure: this run's output was "
        f"committed and is complete. Hint: check it with tfrecord-etl verify; {HINT_RESTART}"
    )
    assert ids(out) == list(range(100_000, 100_000 + ROWS))
    # this run's output only: the replaced output's shards are removed (also when the worker that committed was
    # lost before it removed them), nothing else is
    assert set(os.listdir(out)) == files_of(out)
    assert {n: (out / n).read_bytes() for n in os.listdir(out) if n.endswith(".tfrecord")} == {
        n: (want / n).read_bytes() for n in os.listdir(want) if n.endswith(".tfrecord")
    }


def test_a_job_the_runner_failed_before_its_commit_says_the_previous_output_is_complete(
    inputs, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    assert convert(inputs[0], out, multi=False)[0] == 0
    before = {n: (out / n).read_bytes() for n in os.listdir(out) if n != outdir.MARKER_FILE}
    stranger = out / "notes.txt"  # not ours: kept
    stranger.write_text("mine")
    # a shard of the failed plan (over a committed output of the same names: the next generation's) and a temporary
    failing_runner(monkeypatch, commit=False, stray="data-g1-00002-of-00004.tfrecord")
    assert convert_in_process(inputs[1], out) == 2
    assert the_error_line(capsys) == (
        f"error: OutputError: The runner's job BeamApp-root-1128-0001 ended in state FAILED: "
        f"java.net.ConnectException: Connection refused; nothing was committed: the previous output is complete. "
        f"Hint: run again; {HINT_RESTART}"
    )
    assert {
        n: (out / n).read_bytes()
        for n in os.listdir(out)  # (the marker is the failed run's: it lists what
        if n not in ("notes.txt", outdir.MARKER_FILE)
    } == before  # the run wrote, for the next run to remove)
    assert stranger.read_text() == "mine"
    assert ids(out) == list(range(ROWS))


def test_a_job_the_runner_failed_in_an_empty_directory_says_it_holds_no_output(inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    failing_runner(monkeypatch, commit=False, stray="data-00001-of-00004.tfrecord")
    assert convert_in_process(inputs[1], out) == 2
    assert the_error_line(capsys).endswith(
        f"Connection refused; nothing was committed: the output directory holds no output. Hint: run again; "
        f"{HINT_RESTART}"
    )
    assert sorted(os.listdir(out)) == [outdir.MARKER_FILE]  # the marker says what a failed run's files were
