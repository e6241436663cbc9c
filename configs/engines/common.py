"""What the engine tests share: running a command against an engine (a subprocess, with a time limit), the
DirectRunner reference run of the same command, and the byte-for-byte comparison of two outputs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from configs.engines.engines import PYTHON, ROOT

DIRECT = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
# TFRECORD_ETL_ENGINES_FULL=1: every variant (more parallelism, inputs, failure kinds); by default the stage runs
# one test per deliverable (each engine's convert and augment, dead letters, a lost worker, a killed JobManager)
FULL = os.environ.get("TFRECORD_ETL_ENGINES_FULL") == "1"
# a test (or a parameter: ``pytest.param(..., marks=full_only)``) that runs only with TFRECORD_ETL_ENGINES_FULL=1:
# another variant of what the default set covers
full_only = pytest.mark.skipif(not FULL, reason="a variant: TFRECORD_ETL_ENGINES_FULL=1 runs it")


def run(module: str, args, engine_flags, timeout: float = 420, env: dict | None = None):
    """``python -m pipelines.<module> ARGS ENGINE_FLAGS`` from the checkout; returns the CompletedProcess (text)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}  # env wins
    full_env.pop("TFRECORD_ETL_FAILPOINT", None)
    started = time.monotonic()
    proc = subprocess.run(
        [PYTHON, "-m", f"pipelines.{module}", *map(str, args), *engine_flags],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    # where a test's time goes (pytest -s, or a failed test's captured stderr)
    print(f"[engines] {module} {' '.join(map(str, args))[:160]}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    return proc


def start(module: str, args, engine_flags, log: pathlib.Path):
    """Like :func:`run` but in the background (its own process group); stdout and stderr go to ``log``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TFRECORD_ETL_FAILPOINT", None)
    with open(log, "wb") as f:
        return subprocess.Popen(
            [PYTHON, "-m", f"pipelines.{module}", *map(str, args), *engine_flags],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def ok(proc) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    return proc.stdout


def files(out) -> dict[str, bytes]:
    """Every file of an output directory (recursively) except the run marker and metadata.json (compared apart) and
    what a failed run keeps for ``--resume`` (:func:`kept_for_resume`: never listed by metadata.json)."""
    out = pathlib.Path(out)
    kept = kept_for_resume(out)
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in (".tf-etl-run.json", "metadata.json", "manifest.json") and p.name not in kept
    }


def kept_for_resume(out) -> set[str]:
    """The shard receipts (``.tf-etl-done-NNNNN.json``) in ``out`` and the files they name: the shards a failed run
    committed and keeps for ``--resume``; each is checked not to be listed by ``metadata.json``."""
    out, kept = pathlib.Path(out), set()
    for receipt in out.glob(".tf-etl-done-*.json"):
        kept |= {receipt.name, *json.loads(receipt.read_text()).get("stamps", {})}
    listed = {s["file"] for s in metadata(out).get("shards", [])} if (out / "metadata.json").exists() else set()
    assert not kept & listed, f"files kept for --resume listed by metadata.json: {sorted(kept & listed)}"
    return kept


def metadata(out, name="metadata.json") -> dict:
    meta = json.loads((pathlib.Path(out) / name).read_text())
    for key in ("created", "options", "runner"):
        meta.pop(key, None)
    for span in meta.get("spans", []):  # collection.json: what differs between any two runs (ids, times, and the
        for key in ("metadata", "run_id", "committed"):  # hash of a metadata.json that holds its time)
            span.pop(key, None)
    return meta


def assert_same_output(got, want) -> None:
    """Shards (every byte), schema, dead letters and metadata (less its time and options) equal."""
    got_files, want_files = files(got), files(want)
    assert sorted(got_files) == sorted(want_files), f"files differ: {sorted(got_files)} != {sorted(want_files)}"
    for name in want_files:
        assert got_files[name] == want_files[name], f"{name} differs from the DirectRunner's"
    for name in ("metadata.json", "manifest.json"):
        if (pathlib.Path(want) / name).exists():
            assert metadata(got, name) == metadata(want, name), f"{name} differs"


def metadata_mapped(out, name: str, paths: dict[str, str]) -> dict:
    """:func:`metadata` of ``out/name`` with each key of ``paths`` (an input location, e.g. ``s3://b/inputs``)
    replaced by its value (the same inputs' local folder) in the text: an output of remote inputs compared with
    the output of the same inputs as local files."""
    text = (pathlib.Path(out) / name).read_text()
    for remote, local in paths.items():
        text = text.replace(remote, local)
    tmp = pathlib.Path(out) / f".mapped-{name}"
    tmp.write_text(text)
    try:
        return metadata(out, tmp.name)
    finally:
        tmp.unlink()


def assert_same_output_mapped(got, want, paths: dict[str, str]) -> None:
    """:func:`assert_same_output` where ``got`` was written from the remote copies of ``want``'s inputs
    (``paths``: remote location -> local folder, for the metadata)."""
    got_files, want_files = files(got), files(want)
    got_files = {k: v for k, v in got_files.items() if not k.startswith(".mapped-")}
    assert sorted(got_files) == sorted(want_files), f"files differ: {sorted(got_files)} != {sorted(want_files)}"
    for name in want_files:
        assert got_files[name] == want_files[name], f"{name} differs from the DirectRunner's"
    for name in ("metadata.json", "manifest.json"):
        if (pathlib.Path(want) / name).exists():
            assert metadata_mapped(got, name, paths) == metadata(want, name), f"{name} differs"


def leftovers(out) -> list[str]:
    """Temporaries, Beam temp dirs and the lock: none may remain once a run has ended."""
    return sorted(
        p.name
        for p in pathlib.Path(out).iterdir()
        if p.name.startswith((".tmp-", "beam-temp-", ".tf-etl.lock")) or p.name.endswith(".tmp")
    )


def tf_read(out, compression="GZIP") -> list[bytes]:
    """Every record of the output's shards, read with plain TensorFlow."""
    import tensorflow as tf

    shards = sorted(str(p) for p in pathlib.Path(out).glob("*.tfrecord*"))
    return [r.numpy() for r in tf.data.TFRecordDataset(shards, compression_type=compression)]


def wait_until(condition, timeout: float, what: str, proc=None):
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def committed_shards(out) -> int:
    out = pathlib.Path(out)
    return len(list(out.glob("data-*.tfrecord*"))) if out.exists() else 0


# an augment that runs for a while on any engine (240 examples x 0.25 s: about 30 s on 2 slots or cores), for the
# tests that stop a job mid-way: Ctrl-C, a killed job server
SLOW_AUGMENT = ["--fn", "tests.augment_fns:slow_add_one", "--fn_inputs", "id"]


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def start_over_previous(converted, out: pathlib.Path, engine_flags, log: pathlib.Path):
    """A previous output in ``out`` (a copy of ``converted``), then the slow augment of ``converted`` over it
    (``--overwrite``), started in the background; returns (the process, the previous output: files, metadata)."""
    import shutil

    shutil.copytree(converted, out)
    previous = files(out), metadata(out)
    args = ["--input", converted, "--output_dir", out, *SLOW_AUGMENT, "--overwrite"]
    return start("augment", args, engine_flags, log), previous


def wait_for_temporary(out: pathlib.Path, proc) -> None:
    """Until a shard temporary is in ``out`` (the job is writing)."""
    wait_until(lambda: any(p.name.startswith(".tmp-") for p in out.iterdir()), 300, "a shard temporary", proc)


def assert_previous_output_stays(out, previous, settle_s: float = 10) -> None:
    """The previous output, byte for byte, and no temporary, ``settle_s`` after the launcher exited: no task of the
    stopped job wrote anything after it."""
    time.sleep(settle_s)
    assert (files(out), metadata(out)) == previous
    assert leftovers(out) == [], sorted(p.name for p in pathlib.Path(out).iterdir())


def finish(proc, timeout: float) -> int:
    """``proc``'s exit status within ``timeout`` seconds; SIGKILLed (its group) if it is still running then."""
    import signal

    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
