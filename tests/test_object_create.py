"""Shards created under their final names at once on s3:// and gs:// (``storage.objectcreate``): nothing visible
until the object is complete, nothing left after an error, another attempt's identical object kept, a different
one replaced; a convert to s3:// and gs:// writes each shard and index once (no temporary, no copy); a killed
writer's unfinished upload is aborted by the run's commit.

Here against moto's S3 server and the GCS emulator (``tests/gcs_emulator.py``: with GCS's ``ifGenerationMatch``);
``configs/engines/test_object_create_stores.py`` runs the same tests against SeaweedFS and fake-gcs-server (its
``store`` fixture gives a :class:`Store` of theirs)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import google_crc32c
import numpy as np
import pytest

from tests import gcs_emulator
from tests.test_s3 import BUCKET, convert, s3  # noqa: F401 - the moto server fixture
from tfrecord_etl.pipelines import common
from tfrecord_etl.transforms.output import outdir, sink
from tfrecord_etl.transforms.storage import fileio, objectcreate

GCS_BUCKET = "etl-create-test"
MIB = 1 << 20


class Store:
    """One bucket of an S3 or GCS server, as these tests see it: ``scheme`` (``s3`` / ``gs``), ``part`` (the part
    size the tests create objects with: S3's 5 MiB minimum, GCS's 256 KiB chunk), the command's ``flags``, and the
    store's own client calls (``put``, ``read``, ``names``, ``uploads``: unfinished S3 multipart uploads' keys)."""

    def __init__(self, scheme: str, bucket: str, flags: list[str], client):
        self.scheme, self.bucket, self.flags, self.client = scheme, bucket, flags, client
        self.part = 5 * MIB if scheme == "s3" else 256 << 10

    def path(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "s3":
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        else:
            self.client.bucket(self.bucket).blob(key).upload_from_string(data)

    def read(self, key: str) -> bytes:
        if self.scheme == "s3":
            return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return self.client.bucket(self.bucket).blob(key).download_as_bytes()

    def version(self, key: str) -> str:
        if self.scheme == "s3":
            return self.client.head_object(Bucket=self.bucket, Key=key)["ETag"]
        return str(self.client.bucket(self.bucket).get_blob(key).generation)

    def names(self, prefix: str) -> list[str]:
        if self.scheme == "s3":
            found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix).get("Contents", [])
            return sorted(o["Key"] for o in found)
        return sorted(b.name for b in self.client.list_blobs(self.bucket, prefix=prefix))

    def uploads(self, prefix: str) -> list[str]:
        if self.scheme != "s3":
            return []  # a GCS resumable session holds no object and cannot be listed
        found = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix).get("Uploads", [])
        return sorted(u["Key"] for u in found)


@pytest.fixture(scope="module", params=["s3", "gs"])
def store(request):
    if request.param == "s3":
        client, flags = request.getfixturevalue("s3")
        common.configure_filesystems(flags)
        yield Store("s3", BUCKET, flags, client)
        return
    with gcs_emulator.server(GCS_BUCKET) as port, gcs_emulator.emulator_host(f"http://127.0.0.1:{port}"):
        from google.cloud import storage

        yield Store("gs", GCS_BUCKET, [], storage.Client.create_anonymous_client())


def payload(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def written(store: Store, key: str, data: bytes, piece: int = 1_000_003):
    """An :class:`objectcreate.ObjectCreate` of ``key`` with ``data`` written to it in pieces, not finished."""
    obj = objectcreate.open_create(store.path(key), part_bytes=store.part)
    for i in range(0, len(data), piece):
        obj.write(data[i : i + piece])
    return obj


def finished(obj, guard: Callable[[], None] = lambda: None) -> None:
    """``obj.finish(guard)``, and ``obj.abort()`` on any error (what ``sink.committed_file`` does)."""
    try:
        obj.finish(guard)
    except BaseException:
        obj.abort()
        raise


def sizes(store: Store) -> list[int]:
    """Empty, one request, exactly one part, and several parts with a short last one."""
    return [0, 100_000, store.part, 2 * store.part + store.part // 3 + 7]


@pytest.mark.parametrize("which", range(4))
def test_the_object_appears_whole_only_when_finished(store, which):
    size = sizes(store)[which]
    key = f"create/{store.scheme}-{size}.bin"
    data = payload(size, size)
    obj = written(store, key, data)
    assert store.names(key) == []  # parts sent (past one part), no object yet
    seen = []
    finished(obj, lambda: seen.append(store.names(key)))
    assert seen == [[]]  # the commit guard ran before the object existed
    assert store.read(key) == data
    assert store.uploads("create/") == []
    assert (obj.size, obj.crc32c) == (len(data), google_crc32c.value(data))


@pytest.mark.parametrize("where", ["writing", "guard"])
def test_an_error_leaves_no_object_and_no_upload(store, where):
    key = f"abort/{where}.bin"

    def guard():
        raise RuntimeError("the run no longer owns the output")

    with pytest.raises(RuntimeError, match="no longer owns"):
        obj = written(store, key, payload(2 * store.part + 11, 1))
        if where == "writing":
            obj.abort()
            raise RuntimeError("the run no longer owns the output (raised while writing)")
        finished(obj, guard)
    assert store.names("abort/") == []
    assert store.uploads("abort/") == []


@pytest.mark.parametrize("size", ["one request", "parts"])
@pytest.mark.parametrize("second_starts", ["before", "after"])
def test_a_second_attempt_with_the_same_bytes_keeps_the_first(store, size, second_starts, caplog):
    """The second attempt starts before the first finishes (refused when it completes) or after (GCS: refused when
    its session starts); either way the first object stays, not written again."""
    key = f"twice/{size}-{second_starts}.bin"
    data = payload(100_000 if size == "one request" else 2 * store.part + 5, 7)
    first = written(store, key, data)
    if second_starts == "after":
        finished(first)
    second = written(store, key, data)
    if second_starts == "before":
        finished(first)
    version = store.version(key)
    with caplog.at_level(logging.INFO, logger=objectcreate.__name__):
        finished(second)
    assert "another attempt of this write created the same" in caplog.text
    assert store.version(key) == version
    assert store.read(key) == data
    assert store.uploads("twice/") == []


@pytest.mark.parametrize("size", ["one request", "parts"])
def test_other_bytes_under_the_name_are_replaced_once(store, size, caplog):
    """Another object takes the name while the shard is written: it is deleted and the shard created in its place;
    where the bytes can no longer be sent (a GCS session refused at its start, or dropped with its refusal) the write
    fails with one line and a retry creates it."""
    key = f"other/{size}.bin"
    data = payload(100_000 if size == "one request" else 2 * store.part + 5, 11)
    obj = written(store, key, data)
    store.put(key, b"another writer's bytes")
    with caplog.at_level(logging.WARNING, logger=objectcreate.__name__):
        try:
            finished(obj)
        except OSError as e:
            assert store.scheme == "gs" and size == "parts", e
            assert f"Cannot create {store.path(key)}: another object (22 bytes, CRC32C" in str(e)
            assert "it was deleted: run the job again" in str(e)
            assert store.names(key) == []
            finished(written(store, key, data))  # the runner's retry
    assert "another object (22 bytes" in caplog.text
    assert store.read(key) == data
    assert store.uploads("other/") == []


def test_a_name_taken_before_the_upload_started(store):
    """S3 evaluates the condition at the completion only: the other object is replaced. GCS refuses the session at
    its start: the bytes are counted, not sent, and the write fails after deleting the other object."""
    key = "taken/early.bin"
    store.put(key, b"another writer's bytes")
    data = payload(2 * store.part + 5, 13)
    obj = written(store, key, data)
    if store.scheme == "s3":
        finished(obj)
    else:
        with pytest.raises(OSError, match=r"\(22 bytes, CRC32C [0-9a-f]{8}\) took its name while it was written"):
            finished(obj)
        assert store.names(key) == []
        finished(written(store, key, data))
    assert store.read(key) == data


def test_the_commit_aborts_a_killed_writers_upload_of_its_names_only(store, capsys):
    if store.scheme != "s3":
        pytest.skip("GCS resumable sessions cannot be listed: one never finalized holds no object and expires")
    for name in ("data-00000-of-00002.tfrecord", "someone-else.bin"):
        upload = store.client.create_multipart_upload(Bucket=store.bucket, Key=f"killed/{name}")["UploadId"]
        store.client.upload_part(
            Bucket=store.bucket, Key=f"killed/{name}", UploadId=upload, PartNumber=1, Body=b"x" * 100
        )
    outdir.remove_temporaries(store.path("killed"), ["data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord"])
    assert store.uploads("killed/") == ["killed/someone-else.bin"]  # not one of the run's names: kept
    assert "aborted the unfinished uploads of killed attempts" in capsys.readouterr().err


def test_a_convert_writes_each_shard_once(store, tmp_path, monkeypatch):
    """No shard or index is renamed (a copy on the store): each is created under its final name."""
    from tests.test_convert import make_h5

    src = tmp_path / "in.h5"
    make_h5(src, rows=2000)
    renamed = []
    real_rename = fileio.rename
    monkeypatch.setattr(fileio, "rename", lambda a, b: (renamed.append(b), real_rename(a, b)))
    out = store.path("once")
    argv = ["--input", src, "--output_dir", out, "--num_shards", "3", "--index", "--runner=DirectRunner"]
    assert convert([*argv, "--direct_running_mode=in_memory", *store.flags])[0] == 0
    names = [k.split("/", 1)[1] for k in store.names("once/")]
    assert len([n for n in names if n.startswith("data-")]) == 6  # 3 shards and their 3 index files
    assert not [p for p in renamed if os.path.basename(p).startswith("data-")]
    assert not [n for n in names if n.startswith(sink.TEMP_PREFIX)]
    assert store.uploads("once/") == []
