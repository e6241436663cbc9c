"""Two launchers racing on one gs:// or s3:// output directory or collection cannot both commit: each store's
conditional requests decide (GCS ``ifGenerationMatch`` on the emulator of ``tests/gcs_emulator.py``, which honours
it as GCS documents; S3 ``If-None-Match`` / ``If-Match`` on a moto server, writes serialized as S3 evaluates
them atomically: ``tests.test_s3.AtomicMotoServer``).

The races are real: two processes (multiprocessing ``spawn``, ``tests/race_worker.py``) wait at a barrier and
make their requests at the same moment, several rounds each. The single-process tests replay one interleaving
exactly (another run acts between this run's read and its write or delete), the one each conditional request
exists for.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import uuid

import pytest

from tests import gcs_emulator, race_worker
from tests.test_s3 import (
    BUCKET as S3_BUCKET,
    s3,  # noqa: F401 - the moto server fixture
)
from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.errors import ConfigError, OutputError
from tfrecord_etl.transforms.output import metadata, runlock
from tfrecord_etl.transforms.storage import conditional, fileio

pytest.importorskip("gcp_storage_emulator", reason="pip install -e .[test]")
GCS_BUCKET = "etl-races"
ROUNDS = 4


@dataclasses.dataclass
class Store:
    """One object store of the tests: ``root`` (a fresh gs:// or s3:// prefix per test), what a process needs to
    reach it (``environ``, Beam ``flags``), and raw access that bypasses our code (``put``, ``get``, ``keys``)."""

    scheme: str
    root: str
    environ: dict
    flags: list
    put: object
    get: object
    keys: object

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def key(self, path: str) -> str:
        return path.split("/", 3)[3]


@pytest.fixture(scope="module")
def gcs_server():
    with gcs_emulator.server(GCS_BUCKET) as port, gcs_emulator.emulator_host(f"http://127.0.0.1:{port}") as host:
        yield host


@pytest.fixture(params=["gs", "s3"])
def store(request):
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    if request.param == "gs":
        host = request.getfixturevalue("gcs_server")
        from google.cloud import storage

        bucket = storage.Client.create_anonymous_client().bucket(GCS_BUCKET)

        def get(key):
            blob = bucket.get_blob(key)
            return None if blob is None else blob.download_as_bytes()

        yield Store(
            "gs",
            f"gs://{GCS_BUCKET}/{prefix}",
            {"STORAGE_EMULATOR_HOST": host},
            [],
            lambda key, data: bucket.blob(key).upload_from_string(data),
            get,
            lambda p: sorted(b.name for b in bucket.list_blobs(prefix=p)),
        )
        return
    client, flags = request.getfixturevalue("s3")
    from tfrecord_etl.pipelines import common

    common.configure_filesystems(flags)

    def get(key):
        try:
            return client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read()
        except client.exceptions.NoSuchKey:
            return None

    environ = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    yield Store(
        "s3",
        f"s3://{S3_BUCKET}/{prefix}",
        environ,
        flags,
        lambda key, data: client.put_object(Bucket=S3_BUCKET, Key=key, Body=data),
        get,
        lambda p: sorted(o["Key"] for o in client.list_objects_v2(Bucket=S3_BUCKET, Prefix=p).get("Contents", [])),
    )


def race(store: Store, kind: str, jobs_a: list, jobs_b: list) -> dict:
    """Runs two sides of ``kind`` (``race_worker.side``) in their own processes, job by job at a barrier;
    returns ``{directory: {side name: (outcome, lock holder)}}``."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    sides = [
        ctx.Process(target=race_worker.side, args=(kind, name, store.environ, store.flags, jobs, barrier, results))
        for name, jobs in (("a", jobs_a), ("b", jobs_b))
    ]
    for p in sides:
        p.start()
    import queue

    got: dict = {}
    done = 0
    try:
        while done < 2:
            try:
                directory, name, outcome, holder = results.get(timeout=5)
            except queue.Empty:
                assert all(p.exitcode in (None, 0) for p in sides), [p.exitcode for p in sides]
                continue
            if directory == "done":
                done += 1
            else:
                got.setdefault(directory, {})[name] = (outcome, holder)
    finally:
        for p in sides:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in sides] == [0, 0]
    return got


def one_winner(outcomes: dict, win: str) -> str:
    """The name of the one side whose outcome is ``win``; fails unless exactly one has it."""
    winners = [name for name, (outcome, _) in outcomes.items() if outcome == win]
    assert len(winners) == 1, outcomes
    return winners[0]


def dead_pid() -> int:
    """The pid of a process of this host that has exited (a launcher that is gone)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def stale_record(run_id: str = "gone") -> bytes:
    return json.dumps(
        {
            "host": socket.gethostname(),
            "pid": dead_pid(),
            "start": "1",
            "run_id": run_id,
            "since": "2026-01-01T00:00:00Z",
        }
    ).encode()


# ------------------------------------------------------------------ the lock


def test_two_launchers_creating_one_lock_exactly_one_holds_it(store):
    dirs = [store.path(f"create-{r}") for r in range(ROUNDS)]
    got = race(store, "lock", [(d, "run-a") for d in dirs], [(d, "run-b") for d in dirs])
    for d in dirs:
        winner = one_winner(got[d], "held")
        loser = got[d]["b" if winner == "a" else "a"][0]
        assert loser.startswith("ConfigError: Another run (host ") and "is writing this output directory" in loser
        assert {holder for _, holder in got[d].values()} == {f"run-{winner}"}
        assert store.get(store.key(d + "/" + runlock.LOCK_FILE)) is None  # released by its holder


def test_two_launchers_taking_over_one_stale_lock_exactly_one_holds_it(store):
    dirs = [store.path(f"stale-{r}") for r in range(ROUNDS)]
    for d in dirs:
        store.put(store.key(d + "/" + runlock.LOCK_FILE), stale_record())
    got = race(store, "lock", [(d, "run-a") for d in dirs], [(d, "run-b") for d in dirs])
    for d in dirs:
        winner = one_winner(got[d], "held")
        assert got[d]["b" if winner == "a" else "a"][0].startswith("ConfigError: Another run (host ")
        assert {holder for _, holder in got[d].values()} == {f"run-{winner}"}


def test_a_stale_lock_taken_over_meanwhile_is_not_taken_twice(store, monkeypatch):
    """Launcher B has read the stale lock; before B replaces it, launcher A takes it over: B must not replace A's
    lock (it did: a delete and a create, after which both held the directory)."""
    out = store.path("stale-interleaved")
    store.put(store.key(out + "/" + runlock.LOCK_FILE), stale_record())
    first = runlock.Lock(out, "run-a")
    original = runlock._is_stale
    calls = []

    def a_takes_it_over_first(record, path):
        if not calls:
            calls.append(path)
            monkeypatch.setattr(runlock, "_is_stale", original)
            first.acquire()
            monkeypatch.setattr(runlock, "_is_stale", a_takes_it_over_first)
        return original(record, path)

    monkeypatch.setattr(runlock, "_is_stale", a_takes_it_over_first)
    second = runlock.Lock(out, "run-b")
    with pytest.raises(ConfigError, match="Another run"):
        second.acquire()
    assert first.held and not second.held
    assert json.loads(store.get(store.key(first.path)))["run_id"] == "run-a"
    first.release()
    assert store.get(store.key(first.path)) is None


@pytest.fixture
def another_run_takes_the_lock(store, monkeypatch):
    """Makes another run write its own lock (a live one, of another host) at ``path`` just before this run's next
    conditional or plain write or delete of an object: the moment between this run's read and its request."""
    theirs = json.dumps({"host": "elsewhere", "pid": 1, "start": "1", "run_id": "theirs", "since": "now"}).encode()
    armed = []

    def before(original):
        def call(path, *args, **kwargs):
            if armed and armed[0] in (path if isinstance(path, list) else [path]):
                store.put(store.key(armed.pop()), theirs)
            return original(path, *args, **kwargs)

        return call

    for module, name in (
        (fileio, "delete"),
        (conditional, "delete_if_version"),
        (fileio, "write_bytes"),
        (conditional, "write_if_version"),
    ):
        monkeypatch.setattr(module, name, before(getattr(module, name)))
    return lambda path: armed.append(path), theirs


def test_release_never_deletes_a_lock_another_run_holds_now(store, another_run_takes_the_lock):
    arm, theirs = another_run_takes_the_lock
    lock = runlock.Lock(store.path("release"), "run-a").acquire()
    arm(lock.path)
    lock.release()
    assert store.get(store.key(lock.path)) == theirs


def test_a_failed_run_closes_only_its_own_lock_and_removes_nothing_of_another_run(store, another_run_takes_the_lock):
    arm, theirs = another_run_takes_the_lock
    lock = runlock.Lock(store.path("closed"), "run-a").acquire()
    removed = []
    lock.discard = lambda: removed.append("this run's uncommitted files")
    arm(lock.path)
    with pytest.raises(RuntimeError):
        with lock:
            raise RuntimeError("the run fails")
    assert store.get(store.key(lock.path)) == theirs  # not overwritten with this run's ':closed' id, not deleted
    assert removed == []  # the files may be the other run's


def test_a_failed_run_closes_and_releases_its_own_lock(store):
    lock = runlock.Lock(store.path("closed-own"), "run-a").acquire()
    seen = []
    lock.discard = lambda: seen.append(json.loads(store.get(store.key(lock.path)))["run_id"])
    with pytest.raises(RuntimeError):
        with lock:
            raise RuntimeError("the run fails")
    assert seen == ["run-a" + runlock.CLOSED]  # closed before its files were removed
    assert store.get(store.key(lock.path)) is None


def test_a_stale_legacy_lock_rewritten_meanwhile_is_kept(store, another_run_takes_the_lock):
    arm, theirs = another_run_takes_the_lock
    out = store.path("legacy")
    legacy = out + "/" + runlock.LEGACY_LOCK_FILE
    store.put(store.key(legacy), stale_record())
    arm(legacy)
    with pytest.raises(ConfigError, match="Another run"):
        runlock.Lock(out, "run-a").acquire()
    assert store.get(store.key(legacy)) == theirs
    assert store.get(store.key(out + "/" + runlock.LOCK_FILE)) is None


# ------------------------------------------------------------------ metadata.json


def test_two_runs_committing_one_output_directory_one_commits(store):
    jobs = {"a": [], "b": []}
    dirs = [store.path(f"meta-{r}") for r in range(ROUNDS)]
    for r, d in enumerate(dirs):
        if r % 2:  # half the rounds replace a committed output, half create the first one
            store.put(store.key(d + "/metadata.json"), b'{"committed_by": "an earlier run"}')
        expected = conditional.version(d + "/metadata.json")
        for name in jobs:
            jobs[name].append(
                (d, (expected, {"format": metadata.FORMAT, "shards": [], "num_records": 0, "committed_by": name}))
            )
    got = race(store, "metadata", jobs["a"], jobs["b"])
    for d in dirs:
        winner = one_winner(got[d], "committed")
        assert got[d]["b" if winner == "a" else "a"][0].startswith(
            "OutputError: Another run committed this output directory while this run wrote it"
        )
        assert json.loads(store.get(store.key(d + "/metadata.json")))["committed_by"] == winner


# ------------------------------------------------------------------ collection.json


def span_dir(store: Store, coll: str, span: int, tag: str) -> dict:
    """Commits a span directory (its metadata.json, tagged) and returns the collection entry describing it."""
    body = json.dumps({"span": span, "tag": tag}).encode()
    store.put(store.key(f"{coll}/span-{span}/metadata.json"), body)
    return entry(span, tag, metadata.digest(body), inputs=[f"raw/{span}-{tag}.npy"])


def entry(span: int, tag: str, digest: str, inputs: list[str]) -> dict:
    return {
        "span": span,
        "version": None,
        "dir": f"span-{span}",
        "date": None,
        "inputs": [{"path": p, "size": 1, "mtime_ns": None, "version": "1"} for p in inputs],
        "num_records": 10 * span,
        "schema": "s" * 64,
        "metadata": digest,
        "run_id": tag,
        "committed": "now",
    }


def test_two_runs_adding_different_spans_both_are_listed(store):
    colls = [store.path(f"coll-diff-{r}") for r in range(ROUNDS)]
    jobs_a = [(c, span_dir(store, c, 1, "a")) for c in colls]
    jobs_b = [(c, span_dir(store, c, 2, "b")) for c in colls]
    got = race(store, "collection", jobs_a, jobs_b)
    for c, (_, a), (_, b) in zip(colls, jobs_a, jobs_b):
        assert got[c] == {"a": ("committed", None), "b": ("committed", None)}
        assert collection.load(c)["spans"] == [a, b]  # the compare-and-swap retried: nothing lost


def test_two_runs_committing_the_same_span_entry_both_succeed(store):
    colls = [store.path(f"coll-same-{r}") for r in range(ROUNDS)]
    jobs = [(c, span_dir(store, c, 5, "same")) for c in colls]
    got = race(store, "collection", jobs, jobs)
    for c, (_, e) in zip(colls, jobs):
        assert got[c] == {"a": ("committed", None), "b": ("committed", None)}
        assert collection.load(c)["spans"] == [e]


def test_two_runs_committing_the_same_span_differently_only_the_one_its_directory_holds_commits(store):
    """Both converted span 5; the span's directory holds b's output (b's commit replaced a's): a's entry would
    describe files that are gone, so a's collection commit is refused, whatever the order."""
    colls = [store.path(f"coll-conflict-{r}") for r in range(ROUNDS)]
    jobs_a, jobs_b = [], []
    for c in colls:
        first = span_dir(store, c, 5, "a")
        jobs_a.append((c, first))
        jobs_b.append((c, span_dir(store, c, 5, "b")))  # replaces span-5/metadata.json
    got = race(store, "collection", jobs_a, jobs_b)
    for c, (_, b) in zip(colls, jobs_b):
        assert got[c]["b"] == ("committed", None)
        outcome = got[c]["a"][0]
        assert outcome.startswith(
            "OutputError: Span 5 is not committed: its directory span-5 now holds another run's output"
        ), outcome
        assert collection.load(c)["spans"] == [b]


def test_two_spans_holding_the_same_input_only_one_commits(store):
    colls = [store.path(f"coll-inputs-{r}") for r in range(ROUNDS)]
    jobs_a, jobs_b = [], []
    for c in colls:
        a, b = span_dir(store, c, 7, "a"), span_dir(store, c, 8, "b")
        a["inputs"] = b["inputs"] = [{"path": "raw/shared.npy", "size": 1, "mtime_ns": None, "version": "1"}]
        jobs_a.append((c, a))
        jobs_b.append((c, b))
    got = race(store, "collection", jobs_a, jobs_b)
    for c, (_, a), (_, b) in zip(colls, jobs_a, jobs_b):
        winner = one_winner(got[c], "committed")
        loser = got[c]["b" if winner == "a" else "a"][0]
        assert loser.startswith("OutputError: 1 input file(s) of span ") and "raw/shared.npy" in loser, loser
        assert collection.load(c)["spans"] == [a if winner == "a" else b]


def test_a_collection_commit_refuses_an_entry_its_span_directory_no_longer_holds(store):
    coll = store.path("coll-replaced")
    mine = span_dir(store, coll, 3, "mine")
    span_dir(store, coll, 3, "theirs")  # another run replaced span 3's output after this run committed it
    with pytest.raises(OutputError, match="Span 3 is not committed: its directory span-3 now holds another run"):
        collection.commit(coll, collection.add_span(mine))
    assert not collection.is_collection(coll)


def test_a_local_collection_commit_refuses_an_entry_its_span_directory_no_longer_holds(tmp_path):
    coll = str(tmp_path / "coll")
    os.makedirs(f"{coll}/span-3")
    bodies = {tag: json.dumps({"span": 3, "tag": tag}).encode() for tag in ("mine", "theirs")}
    mine = entry(3, "mine", metadata.digest(bodies["mine"]), inputs=["raw/3.npy"])
    with open(f"{coll}/span-3/metadata.json", "wb") as f:
        f.write(bodies["theirs"])  # another run replaced span 3's output after this run committed it
    with pytest.raises(OutputError, match="Span 3 is not committed: its directory span-3 now holds another run"):
        collection.commit(coll, collection.add_span(mine))
    assert not collection.is_collection(coll)
    with open(f"{coll}/span-3/metadata.json", "wb") as f:
        f.write(bodies["mine"])
    assert collection.commit(coll, collection.add_span(mine))["spans"] == [mine]
    assert collection.load(coll)["spans"] == [mine]
