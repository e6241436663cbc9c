"""Two ``python -m pipelines.convert`` launchers started together on one gs:// or s3:// collection (the same
``--span 1``, or two ``--incremental`` runs that both plan the same next span): the span's output-directory lock
lets one convert; the other fails with one line naming why (or, when it starts only after the first released the
lock, re-converts the span or finds nothing new, and the collection commit refuses an entry whose directory it
replaced: ``collection.commit``). Whatever the order, the collection then lists the span once, its entry is the
span's committed metadata.json, and every row of the inputs reads back (our reader, and plain TensorFlow over the
downloaded shards). On the GCS emulator with preconditions (``tests/gcs_emulator.py``) and on moto."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np

from tests.conftest import BEAM_FLAGS, ROOT
from tests.test_s3 import s3  # noqa: F401
from tests.test_store_races import gcs_server, store  # noqa: F401 - the object-store fixtures
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.output import metadata, runlock

ROWS = {"a.npy": 0, "b.npy": 1000}  # file -> the first id of its 30 rows
LOST_LOCK = "is writing this output directory"  # the loser of the lock: "Another run (host, pid, since) ..."
REPLACED = "Span {span} is not committed: its directory span-{span} now holds another run's output"


def put_inputs(store, prefix: str) -> list[int]:
    for name, start in ROWS.items():
        buf = io.BytesIO()
        np.save(buf, np.arange(start, start + 30, dtype="<i8"))
        store.put(store.key(store.path(prefix, name)), buf.getvalue())
    return sorted(i for start in ROWS.values() for i in range(start, start + 30))


def launch_two(store, *argv) -> list[subprocess.CompletedProcess]:
    """Starts two identical convert launchers at once and waits for both."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **store.environ)
    env.pop(runlock.FAILPOINT_ENV, None)
    command = [sys.executable, "-m", "pipelines.convert", *argv, *BEAM_FLAGS, *store.flags]
    procs = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def check_outcomes(runs, span: int, nothing_new_allowed: bool = False) -> None:
    """At least one run committed; a failed one ended with one clear line (no traceback) saying why."""
    ok = [r for r in runs if r.returncode == 0]
    assert ok, [r.stderr[-2000:] for r in runs]
    for r in runs:
        if r.returncode == 0:
            continue
        error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert len(error) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert (
            error[0].startswith("error: ConfigError: Another run (host ") and LOST_LOCK in error[0]
        ) or REPLACED.format(span=span) in error[0], error[0]
    if not nothing_new_allowed:
        assert all("nothing new" not in r.stdout + r.stderr for r in runs)


def check_collection(store, coll: str, span: int, inputs: list[str], ids: list[int], tmp_path) -> None:
    """The collection lists ``span`` once, holding ``inputs``; its entry is the span's committed metadata.json;
    every id reads back with our reader and with plain TensorFlow."""
    loaded = collection.load(coll)
    assert [s["span"] for s in loaded["spans"]] == [span]
    entry = loaded["spans"][0]
    assert sorted(i["path"] for i in entry["inputs"]) == sorted(inputs)
    assert all(i["version"] for i in entry["inputs"])  # ETag / generation: the ledger of a remote input
    span_dir = f"{coll}/span-{span}"
    meta, digest = metadata.load_with_digest(span_dir)
    assert entry["metadata"] == digest and entry["num_records"] == meta["num_records"] == len(ids)
    assert sorted(int(e["array"]) for e in reader.iter_numpy(span_dir)) == ids
    import tensorflow as tf

    local = []
    for shard in meta["shards"]:
        path = tmp_path / shard["file"]
        path.write_bytes(store.get(store.key(f"{span_dir}/{shard['file']}")))
        local.append(str(path))
    spec = {"array": tf.io.FixedLenFeature([], tf.int64)}
    got = [
        int(v)
        for batch in tf.data.TFRecordDataset(local).batch(64)
        for v in tf.io.parse_example(batch, spec)["array"].numpy()
    ]
    assert sorted(got) == ids


def test_two_launchers_converting_the_same_span_into_one_collection(store, tmp_path):
    ids = put_inputs(store, "raw/span-1")
    coll = store.path("coll")
    runs = launch_two(store, "--input", store.path("raw", "span-{SPAN}", "*.npy"), "--output_dir", coll, "--span", "1")
    check_outcomes(runs, 1)
    check_collection(store, coll, 1, [store.path("raw/span-1", n) for n in ROWS], ids, tmp_path)


def test_two_incremental_launchers_on_one_growing_directory(store, tmp_path):
    ids = put_inputs(store, "inc")
    coll = store.path("inc-coll")
    runs = launch_two(store, "--input", store.path("inc", "*.npy"), "--output_dir", coll, "--incremental")
    check_outcomes(runs, 0, nothing_new_allowed=True)
    check_collection(store, coll, 0, [store.path("inc", n) for n in ROWS], ids, tmp_path)
