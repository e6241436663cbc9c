"""Shards created under their final names at once on s3:// and gs:// (``storage.objectcreate``): nothing visible
until the object is complete, nothing left after an error, another attempt's identical object kept, a different
one replaced; a convert to s3:// and gs:// writes each shard and index once (no temporary, no copy); a killed
writer's unfinished upload is aborted by the run's commit. Against moto's S3 server and the GCS emulator
(``tests/gcs_emulator.py``: with GCS's ``ifGenerationMatch``)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from tests import gcs_emulator
from tests.test_s3 import BUCKET, convert, keys, s3  # noqa: F401 - the moto server fixture
from tfrecord_etl.pipelines import common
from tfrecord_etl.transforms.output import outdir, sink
from tfrecord_etl.transforms.storage import fileio, objectcreate

GCS_BUCKET = "etl-create-test"
MIB = 1 << 20


@pytest.fixture(scope="module")
def s3_store(s3):
    client, flags = s3
    common.configure_filesystems(flags)
    return client, flags


@pytest.fixture(scope="module")
def gcs_store():
    with gcs_emulator.server(GCS_BUCKET) as port, gcs_emulator.emulator_host(f"http://127.0.0.1:{port}"):
        from google.cloud import storage

        yield storage.Client.create_anonymous_client().bucket(GCS_BUCKET)


def payload(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def write_in_pieces(obj, data: bytes, piece: int = 1_000_003) -> None:
    for i in range(0, len(data), piece):
        obj.write(data[i : i + piece])


def uploads(client, prefix):
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])]


def gcs_names(bucket, prefix):
    return sorted(b.name for b in bucket.client.list_blobs(bucket, prefix=prefix))


def gcs_read(bucket, name):
    return bucket.blob(name).download_as_bytes()


# ---------------------------------------------------------------- S3


@pytest.mark.parametrize("size", [0, 3 * MIB, 5 * MIB, 12 * MIB + 7])
def test_s3_object_appears_whole_only_at_finish(s3_store, size):
    client, _ = s3_store
    path = f"s3://{BUCKET}/create/{size}.bin"
    data = payload(size, size)
    obj = objectcreate.open_create(path, part_bytes=5 * MIB)
    write_in_pieces(obj, data)
    assert keys(client, f"create/{size}.bin") == []  # parts uploaded (above one part), no object yet
    checked = []
    obj.finish(lambda: checked.append(keys(client, f"create/{size}.bin")))
    assert checked == [[]]  # the guard ran before the object existed
    assert client.get_object(Bucket=BUCKET, Key=f"create/{size}.bin")["Body"].read() == data
    assert uploads(client, "create/") == []
    assert (obj.size, obj.crc32c) == (len(data), __import__("google_crc32c").value(data))


@pytest.mark.parametrize("where", ["writing", "guard"])
def test_s3_error_leaves_no_object_and_no_upload(s3_store, where):
    client, _ = s3_store
    path = f"s3://{BUCKET}/abort/{where}.bin"
    obj = objectcreate.open_create(path, part_bytes=5 * MIB)
    write_in_pieces(obj, payload(11 * MIB, 1))

    def guard():
        raise RuntimeError("the run no longer owns the output")

    with pytest.raises(RuntimeError, match="no longer owns"):
        try:
            if where == "writing":
                raise RuntimeError("the run no longer owns the output (raised while writing)")
            obj.finish(guard)
        except BaseException:
            obj.abort()
            raise
    assert keys(client, "abort/") == []
    assert uploads(client, "abort/") == []


@pytest.mark.parametrize("size", [2 * MIB, 11 * MIB])
def test_s3_second_attempt_with_the_same_bytes_keeps_the_first(s3_store, size, caplog):
    client, _ = s3_store
    path = f"s3://{BUCKET}/twice/{size}.bin"
    data = payload(size, 7)
    first, second = (objectcreate.open_create(path, part_bytes=5 * MIB) for _ in range(2))
    write_in_pieces(first, data)
    write_in_pieces(second, data)
    first.finish()
    etag = client.head_object(Bucket=BUCKET, Key=f"twice/{size}.bin")["ETag"]
    with caplog.at_level(logging.INFO, logger=objectcreate.__name__):
        second.finish()
    assert "another attempt of this write created the same" in caplog.text
    assert client.head_object(Bucket=BUCKET, Key=f"twice/{size}.bin")["ETag"] == etag  # not written again
    assert client.get_object(Bucket=BUCKET, Key=f"twice/{size}.bin")["Body"].read() == data
    assert uploads(client, "twice/") == []


@pytest.mark.parametrize("size", [2 * MIB, 11 * MIB])
def test_s3_other_bytes_under_the_name_are_replaced_once(s3_store, size, caplog):
    client, _ = s3_store
    key = f"other/{size}.bin"
    client.put_object(Bucket=BUCKET, Key=key, Body=b"another writer's bytes")
    data = payload(size, 9)
    obj = objectcreate.open_create(f"s3://{BUCKET}/{key}", part_bytes=5 * MIB)
    write_in_pieces(obj, data)
    with caplog.at_level(logging.WARNING, logger=objectcreate.__name__):
        obj.finish()
    assert "another object (22 bytes" in caplog.text and "replacing it" in caplog.text
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data
    assert uploads(client, "other/") == []


def test_s3_commit_aborts_a_killed_writers_upload_of_listed_names_only(s3_store, capsys):
    client, _ = s3_store
    directory = f"s3://{BUCKET}/killed"
    for name in ("data-00000-of-00002.tfrecord", "someone-else.bin"):
        upload = client.create_multipart_upload(Bucket=BUCKET, Key=f"killed/{name}")["UploadId"]
        client.upload_part(Bucket=BUCKET, Key=f"killed/{name}", UploadId=upload, PartNumber=1, Body=b"x" * 100)
    outdir.remove_temporaries(directory, ["data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord"])
    assert uploads(client, "killed/") == ["killed/someone-else.bin"]  # not ours: kept
    assert "aborted the unfinished uploads of killed attempts" in capsys.readouterr().err


def test_s3_convert_writes_each_shard_once(s3_store, tmp_path, monkeypatch):
    """No shard or index is renamed (a copy on the store): each is created under its final name."""
    client, flags = s3_store
    from tests.test_convert import make_h5

    src = tmp_path / "in.h5"
    make_h5(src, rows=2000)
    renamed = []
    real_rename = fileio.rename
    monkeypatch.setattr(fileio, "rename", lambda a, b: (renamed.append(b), real_rename(a, b)))
    out = f"s3://{BUCKET}/once"
    argv = ["--input", src, "--output_dir", out, "--num_shards", "3", "--index", "--runner=DirectRunner"]
    assert convert([*argv, "--direct_running_mode=in_memory", *flags])[0] == 0
    names = [k.split("/", 1)[1] for k in keys(client, "once/")]
    shards = [n for n in names if n.startswith("data-")]
    assert len(shards) == 6  # 3 shards and their 3 index files
    assert not [p for p in renamed if os.path.basename(p).startswith("data-")]
    assert not [n for n in names if n.startswith(sink.TEMP_PREFIX)]
    assert uploads(client, "once/") == []


# ---------------------------------------------------------------- GCS


@pytest.mark.parametrize("size", [0, 200_000, 1 << 20, 3 * (256 << 10) + 5])
def test_gcs_object_appears_whole_only_at_finish(gcs_store, size):
    bucket = gcs_store
    name = f"create/{size}.bin"
    data = payload(size, size)
    obj = objectcreate.open_create(f"gs://{GCS_BUCKET}/{name}", part_bytes=256 << 10)
    write_in_pieces(obj, data, piece=100_001)
    assert gcs_names(bucket, name) == []
    checked = []
    obj.finish(lambda: checked.append(gcs_names(bucket, name)))
    assert checked == [[]]
    assert gcs_read(bucket, name) == data


def test_gcs_error_leaves_no_object(gcs_store):
    bucket = gcs_store
    obj = objectcreate.open_create(f"gs://{GCS_BUCKET}/abort/x.bin", part_bytes=256 << 10)
    write_in_pieces(obj, payload(1 << 20, 3), piece=100_001)

    def guard():
        raise RuntimeError("the run no longer owns the output")

    with pytest.raises(RuntimeError):
        try:
            obj.finish(guard)
        except BaseException:
            obj.abort()
            raise
    assert gcs_names(bucket, "abort/") == []


@pytest.mark.parametrize("size", [100_000, 1 << 20])
@pytest.mark.parametrize("second_starts", ["before", "after"])
def test_gcs_second_attempt_with_the_same_bytes_keeps_the_first(gcs_store, size, second_starts, caplog):
    bucket = gcs_store
    name = f"twice/{size}-{second_starts}.bin"
    data = payload(size, 5)
    first, second = (objectcreate.open_create(f"gs://{GCS_BUCKET}/{name}", part_bytes=256 << 10) for _ in range(2))
    write_in_pieces(first, data, piece=100_001)
    if second_starts == "after":
        first.finish()
    write_in_pieces(second, data, piece=100_001)
    if second_starts == "before":
        first.finish()
    generation = bucket.get_blob(name).generation
    with caplog.at_level(logging.INFO, logger=objectcreate.__name__):
        second.finish()
    assert "another attempt of this write created the same" in caplog.text
    assert bucket.get_blob(name).generation == generation
    assert gcs_read(bucket, name) == data


def test_gcs_other_bytes_under_the_name_are_replaced_once(gcs_store, caplog):
    """One request (one chunk): the other object is deleted and ours created in its place."""
    bucket = gcs_store
    name = "other/small.bin"
    data = payload(100_000, 11)
    obj = objectcreate.open_create(f"gs://{GCS_BUCKET}/{name}", part_bytes=256 << 10)
    write_in_pieces(obj, data, piece=30_001)
    bucket.blob(name).upload_from_string(b"another writer's bytes")
    with caplog.at_level(logging.WARNING, logger=objectcreate.__name__):
        obj.finish()
    assert "another object (22 bytes" in caplog.text
    assert gcs_read(bucket, name) == data


def test_gcs_name_taken_before_the_session_fails_the_write_then_a_retry_creates_it(gcs_store):
    """A session refused at its start (412) sends nothing more; other bytes there are deleted and the write fails
    with one line, so the runner's retry of the bundle creates the object."""
    bucket = gcs_store
    name = "other/large.bin"
    data = payload(1 << 20, 13)
    bucket.blob(name).upload_from_string(b"another writer's bytes")
    obj = objectcreate.open_create(f"gs://{GCS_BUCKET}/{name}", part_bytes=256 << 10)
    write_in_pieces(obj, data, piece=100_001)
    with pytest.raises(OSError, match=r"\(22 bytes, CRC32C [0-9a-f]{8}\) took its name while it was written; it was"):
        obj.finish()
    assert gcs_names(bucket, "other/large") == []
    retry = objectcreate.open_create(f"gs://{GCS_BUCKET}/{name}", part_bytes=256 << 10)
    write_in_pieces(retry, data, piece=100_001)
    retry.finish()
    assert gcs_read(bucket, name) == data
