"""One side of a race on an object store (``tests/test_store_races.py``): a process started with multiprocessing's
``spawn`` (a fresh interpreter: no state shared with the test) that, for each job, waits at a barrier shared with
the other side, so both make their request at the same moment, and reports what it got."""

from __future__ import annotations

import json
import os

SPECS_JSON = [{"name": "id", "dtype": "<i8", "shape": [1], "encoding": "list"}]


def _configure(environ: dict, flags: list) -> None:
    os.environ.update(environ)
    from tfrecord_etl.pipelines import common

    common.configure_filesystems(flags)  # with STORAGE_EMULATOR_HOST: anonymous, no search for credentials


def _lock(name: str, directory: str, payload) -> tuple[str, object]:
    from tfrecord_etl.transforms.errors import ConfigError
    from tfrecord_etl.transforms.output import runlock

    lock = runlock.Lock(directory, payload)
    try:
        lock.acquire()
    except ConfigError as e:
        return f"ConfigError: {e}", lock
    return "held", lock


def _metadata(name: str, directory: str, payload) -> tuple[str, None]:
    from tfrecord_etl.transforms.codec import FeatureSpec
    from tfrecord_etl.transforms.errors import OutputError
    from tfrecord_etl.transforms.output import metadata

    expected, meta = payload
    specs = [FeatureSpec.from_json(s) for s in SPECS_JSON]
    try:
        metadata.write(directory, meta, specs, expected_version=expected)
    except OutputError as e:
        return f"OutputError: {e}", None
    return "committed", None


def _collection(name: str, directory: str, payload) -> tuple[str, None]:
    from tfrecord_etl.transforms.collections import collection
    from tfrecord_etl.transforms.errors import OutputError, SchemaError

    try:
        collection.commit(directory, collection.add_span(payload))
    except (OutputError, SchemaError) as e:
        return f"{type(e).__name__}: {e}", None
    return "committed", None


SIDES = {"lock": _lock, "metadata": _metadata, "collection": _collection}


def side(kind: str, name: str, environ: dict, flags: list, jobs: list, barrier, results) -> None:
    """Runs ``jobs`` ([(directory, payload)]) of ``kind`` as the side ``name``: per job, waits at ``barrier``,
    makes the request, puts ``(directory, name, outcome)`` on ``results``, waits for the other side to have
    done the same, reads what the store holds (``lock``: the lock's run id, then releases a lock it holds)."""
    _configure(environ, flags)
    from tfrecord_etl.transforms.output import runlock

    for directory, payload in jobs:
        barrier.wait(120)
        try:
            outcome, lock = SIDES[kind](name, directory, payload)
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            outcome, lock = f"unexpected {type(e).__name__}: {e}", None
        barrier.wait(120)  # both sides made their request
        holder = None
        if kind == "lock":
            holder = (runlock.read_json(f"{directory}/{runlock.LOCK_FILE}") or {}).get("run_id")
        results.put((directory, name, outcome, holder))
        barrier.wait(120)  # both sides read the lock before either releases it
        if lock is not None and lock.held:
            lock.release()
    results.put(("done", name, json.dumps(None), None))
