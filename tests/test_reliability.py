"""Dead letters, counts that always add up, and crash safety (SIGKILL at random points, then re-run)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT, convert
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import IncompleteOutputError


def corrupt_h5(path, rows=1000, bad_chunk=3):
    data = np.arange(rows * 256, dtype="<f8").reshape(rows, 256)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(100, 256), compression="gzip")
        f.create_dataset("y", data=np.arange(rows), chunks=(100,))
    with h5py.File(path) as f:
        info = f["x"].id.get_chunk_info(bad_chunk)
    raw = bytearray(path.read_bytes())
    raw[info.byte_offset + 10 : info.byte_offset + 60] = b"\x00" * 50
    path.write_bytes(bytes(raw))
    return data


@pytest.mark.parametrize("writer", ["planned", "beam"])
def test_corrupt_chunk_is_dead_lettered_and_counts_add_up(tmp_path, capsys, writer):
    data = corrupt_h5(tmp_path / "in.h5")
    out, dead = tmp_path / "out", tmp_path / "dead"
    code, stdout, err = convert(
        tmp_path / "in.h5",
        out,
        "--dead_letter_dir",
        dead,
        "--target_range_mb",
        "0.2",
        "--writer",
        writer,
        "--provenance",
        capsys=capsys,
    )
    assert code == 0, err
    letters = [json.loads(line) for f in sorted(dead.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert len(letters) == 1
    (letter,) = letters
    assert letter["file"] == str(tmp_path / "in.h5") and letter["datasets"] == ["/x", "/y"]
    assert (letter["start"], letter["stop"], letter["rows"]) == (300, 400, 100)
    assert letter["error"] == "SourceError" and "Cannot read rows 300-399" in letter["message"]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["rows_read"] == 1000 and meta["rows_dead_lettered"] == 100 and meta["num_records"] == 900
    assert "rows dead-lettered: 100" in stdout
    rows = sorted(int(e["_source/row"]) for e in reader.iter_numpy(str(out), features=["_source/row"]))
    assert rows == [r for r in range(1000) if not 300 <= r < 400]
    for e in reader.iter_numpy(str(out), features=["x", "_source/row"]):
        np.testing.assert_array_equal(e["x"], data[int(e["_source/row"])])


def test_without_dead_letter_dir_the_job_stops_with_the_precise_error(tmp_path, capsys):
    corrupt_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    code, _, err = convert(tmp_path / "in.h5", out, "--target_range_mb", "0.2", capsys=capsys)
    assert code == 2
    assert "SourceError" in err and "rows 300-399" in err and "dataset='/x'" in err and "in.h5" in err
    assert not (out / "metadata.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith("data-")]  # no final-looking shard of it


def _command(src, out):
    return [
        sys.executable,
        "-m",
        "pipelines.convert",
        "--input",
        str(src),
        "--output_dir",
        str(out),
        "--target_range_mb",
        "2",
        "--num_shards",
        "6",
        "--compression",
        "gzip",
        "--provenance",
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ]


def _run(cmd, home, kill_after=None):
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    if kill_after is None:
        _out, err = proc.communicate(timeout=300)
        return proc.returncode, err.decode()
    try:
        proc.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its Beam worker processes
    proc.communicate()
    return proc.returncode, ""


def _check_complete(out, rows):
    got = sorted(int(e["_source/row"]) for e in reader.iter_numpy(str(out), features=["_source/row"]))
    assert got == list(range(rows))


def test_sigkill_at_random_points_then_rerun(tmp_path):
    rows = 6000
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset(
            "img",
            data=np.random.default_rng(0).integers(0, 255, (rows, 32, 32, 3), np.uint8),
            chunks=(200, 32, 32, 3),
            compression="gzip",
        )
    out = tmp_path / "out"
    cmd = _command(tmp_path / "in.h5", out)
    rng = random.Random(7)
    points = sorted(rng.uniform(0.5, 6.0) for _ in range(4))
    outcomes = []
    for point in points:
        _run(cmd, tmp_path, kill_after=point)
        if (out / "metadata.json").exists():
            outcomes.append("complete")
            _check_complete(out, rows)
        else:
            outcomes.append("incomplete")
            if out.exists():
                with pytest.raises(IncompleteOutputError, match="incomplete"):
                    next(reader.iter_numpy(str(out)))
        code, err = _run(cmd, tmp_path)  # the same command, no --overwrite, no manual cleanup
        assert code == 0, err
        _check_complete(out, rows)
        assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]
    assert "incomplete" in outcomes, (points, outcomes)


@pytest.mark.parametrize("stage", ["lock-written", "lock-linked"])
def test_a_launcher_killed_while_it_creates_the_lock_leaves_none_or_a_complete_one(tmp_path, stage):
    """The local lock is created in one step a kill cannot split (its record written to a temporary, hard-linked to
    ``.tf-etl.lock``): killed before the link, no lock; after it, a complete lock whose process is gone, stale at
    once. The same command run again at once succeeds and leaves nothing of ours behind. With ``O_CREAT|O_EXCL``
    then a write, a kill between the two left an empty lock that refused the re-run for a minute as "Another run
    (unknown: the lock file is empty or unreadable)" (found by the random kills above)."""
    rows = 600
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("x", data=np.arange(rows, dtype="<i8"))
    out = tmp_path / "out"
    cmd = _command(tmp_path / "in.h5", out)
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT), TFRECORD_ETL_FAILPOINT=stage)
    killed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    lock, temps = out / ".tf-etl.lock", [p.name for p in out.iterdir() if p.name.startswith(".tf-etl.lock.")]
    assert lock.exists() == (stage == "lock-linked") and len(temps) == 1, (lock.exists(), temps)
    if lock.exists():
        assert json.loads(lock.read_text())["host"]  # a whole record
    code, err = _run(cmd, tmp_path)  # at once: no minute's wait for a stale lock
    assert code == 0, err
    _check_complete(out, rows)
    assert not [p.name for p in out.iterdir() if p.name.startswith((".tf-etl.lock", ".tmp-"))]


def test_worker_failure_in_multi_processing_is_one_line(tmp_path):
    corrupt_h5(tmp_path / "in.h5")
    cmd = [
        sys.executable,
        "-m",
        "pipelines.convert",
        "--input",
        str(tmp_path / "in.h5"),
        "--output_dir",
        str(tmp_path / "out"),
        "--target_range_mb",
        "0.2",
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ]
    code, err = _run(cmd, tmp_path)
    assert code == 2
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: SourceError: Cannot read rows 300-399")
