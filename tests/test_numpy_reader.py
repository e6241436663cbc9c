"""The NumPy readers of an output (reader.iter_numpy with and without batch_size, reader.RandomAccess and its
batched fetch): exactly the per-record decoder's values on a real output (strings, images, floats, bools, ints of
several varint widths; uncompressed and gzip), and each shard checked: two records swapped, the first record
duplicated and the last dropped, a shard cut at a record boundary, a corrupt record: a RecordError naming the shard,
before its rows are read (local shards) or at its end (remote ones). check_checksums=False is the opt-out."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest

from tests.conftest import convert
from tests.test_collection_read import coll, expected  # noqa: F401 - the collection fixture (3 spans)
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.codec import decode_example_lenient
from tfrecord_etl.transforms.errors import ConfigError, RecordError
from tfrecord_etl.transforms.output import metadata, tfrecord
from tfrecord_etl.transforms.reading import shardcheck
from tfrecord_etl.transforms.storage import fileio

ROWS = 300  # two shards of 150: ids 0..127 are one varint byte, 128.. two, so records differ in length


def make_npz(path):
    rng = np.random.default_rng(11)
    data = {
        "id": np.arange(ROWS, dtype=np.int64),
        "x": rng.standard_normal((ROWS, 3)).astype(np.float32),
        "image": rng.integers(0, 256, (ROWS, 4, 5), dtype=np.uint8),
        "w": np.arange(ROWS) / 7.0,
        "flag": np.arange(ROWS) % 3 == 0,
        "name": np.array([f"r\u00e9{i}" for i in range(ROWS)]),
        "code": np.array([b"c%d" % (i % 17) for i in range(ROWS)], dtype="S3"),
    }
    np.savez(path, **data)
    return data


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("npread")
    data = make_npz(tmp / "in.npz")
    outs = {}
    for compression in ("none", "gzip"):
        flags = ["--index"] if compression == "none" else ["--compression", "gzip"]
        code, _, _ = convert(tmp / "in.npz", tmp / compression, "--num_shards", "2", *flags)
        assert code == 0
        outs[compression] = tmp / compression
    return data, outs


def per_record(out) -> list[dict]:
    """Every example of ``out`` decoded record by record (the reference)."""
    meta = metadata.load(str(out))
    rows = []
    for path in metadata.shard_paths(str(out), meta):
        for _, _, record in reader.iter_records(path, meta["compression"]):
            rows.append(decode_example_lenient(record, meta["features"]))
    return rows


def assert_same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_rows_and_batches_equal_the_per_record_decoder(outputs, compression):
    data, outs = outputs
    out = str(outs[compression])
    want = per_record(out)
    assert [int(r["id"]) for r in want] == list(range(ROWS))
    rows = list(reader.iter_numpy(out))
    assert len(rows) == ROWS
    for got, ref in zip(rows, want):
        assert list(got) == list(ref)
        for name in ref:
            assert_same(got[name], ref[name])
    for batch_size in (1, 7, 150, 256, 1000):
        batches = list(reader.iter_numpy(out, batch_size=batch_size))
        assert [len(b["id"]) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
        assert 0 < len(batches[-1]["id"]) <= batch_size  # the last holds the rest, across the shard boundary
        for name in want[0]:
            assert_same(np.concatenate([b[name] for b in batches]), np.stack([r[name] for r in want]))
    np.testing.assert_array_equal(
        np.concatenate([b["image"] for b in reader.iter_numpy(out, batch_size=64)]), data["image"]
    )
    assert [b["name"].tolist() for b in reader.iter_numpy(out, batch_size=300, features=["name"])] == [
        data["name"].tolist()
    ]


def test_batch_size_must_be_a_positive_integer(outputs):
    _, outs = outputs
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="batch_size=.*expected a positive integer"):
            next(reader.iter_numpy(str(outs["none"]), batch_size=bad))


def test_random_access_getitems_and_batch_equal_getitem(outputs):
    data, outs = outputs
    out = str(outs["none"])
    ra = reader.RandomAccess(out)
    indices = [299, 0, 5, 150, 149, 128, 127, -1, 5]
    rows = ra.__getitems__(indices)
    for i, row in zip(indices, rows):
        one = ra[i]
        assert list(row) == list(one)
        assert type(row["code"]) is bytes and type(row["name"]) is str and row["name"] == data["name"][i]
        for name in ("id", "x", "image", "w", "flag"):
            assert_same(row[name], one[name])
    batch = ra.batch(indices)
    for name in ("id", "x", "image", "w", "flag", "name", "code"):
        np.testing.assert_array_equal(batch[name], data[name][indices])
    assert ra.batch([])["x"].shape == (0, 3)
    with pytest.raises(IndexError, match="record 300 of an output of 300 records"):
        ra.__getitems__([1, 300])


def test_random_access_keeps_one_handle_per_shard_and_reopens_after_fork_and_pickle(outputs, monkeypatch):
    _, outs = outputs
    ra = reader.RandomAccess(str(outs["none"]))
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert [int(ra[i]["id"]) for i in (0, 1, 200, 2, 299)] == [0, 1, 200, 2, 299]
    ra.__getitems__(list(range(0, 300, 3)))
    assert sorted(opened) == sorted(
        str(p) for p in metadata.shard_paths(str(outs["none"]), metadata.load(str(outs["none"])))
    )
    copy = pickle.loads(pickle.dumps(ra))  # a spawned DataLoader worker: no handle travels
    assert copy._fds == {} and int(copy[7]["id"]) == 7
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own handles (the parent's positions and handles are not shared)
        try:
            os.close(read)
            ok = int(ra[3]["id"]) == 3 and ra._pid == os.getpid() and len(ra._fds) == 1
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(read)
    assert int(ra[4]["id"]) == 4
    ra.close()
    assert ra._fds == {} and int(ra[5]["id"]) == 5


def test_random_access_is_a_grain_data_source(outputs):
    grain = pytest.importorskip("grain")
    _, outs = outputs
    ra = reader.RandomAccess(str(outs["none"]))
    assert isinstance(ra, grain.sources.RandomAccessDataSource)  # __len__ + __getitem__ (a runtime protocol)
    ds = grain.MapDataset.source(ra).shuffle(seed=3).batch(32)
    ids = np.concatenate([np.asarray(b["id"]) for b in ds])
    assert sorted(ids.tolist()) == list(range(ROWS)) and ids.tolist() != list(range(ROWS))


# -- shards changed at rest --------------------------------------------------------------------------------------
def frames(path) -> list[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 8], "little") + 16
        out.append(data[pos : pos + n])
        pos += n
    return out


def tamper(out, how: str, shard: int = 0) -> str:
    """Changes shard ``shard`` of ``out`` in place; returns its path."""
    path = metadata.shard_paths(str(out), metadata.load(str(out)))[shard]
    records = frames(path)
    if how == "swap":  # two records of the same size: frames intact, file size the same
        assert len(records[0]) == len(records[1])
        records[0], records[1] = records[1], records[0]
    elif how == "duplicate":  # the first record twice, the last dropped: same count, a few bytes shorter
        assert len(records[-1]) > len(records[0])
        records = [records[0]] + records[:-1]
    elif how == "cut":  # cut at a record boundary: the last record gone
        records = records[:-1]
    elif how == "corrupt":  # one byte of a record's values changed: size the same
        data = bytearray(records[3])
        data[-6] ^= 0xFF
        records[3] = bytes(data)
    with open(path, "wb") as f:
        f.write(b"".join(records))
    return path


def copy_of(outputs, tmp_path, compression="none"):
    out = tmp_path / "out"
    shutil.copytree(outputs[1][compression], out)
    return out


READERS = {
    "rows": lambda out, **kw: [int(r["id"]) for r in reader.iter_numpy(str(out), **kw)],
    "batches": lambda out, **kw: [
        i for b in reader.iter_numpy(str(out), batch_size=64, **kw) for i in b["id"].tolist()
    ],
    "random": lambda out, **kw: [
        int(r["id"]) for r in reader.RandomAccess(str(out), **kw).__getitems__(list(range(ROWS)))
    ],
}


@pytest.mark.parametrize("how", ["swap", "duplicate", "cut"])
@pytest.mark.parametrize("name", list(READERS))
def test_a_shard_changed_at_rest_is_refused_by_name(outputs, tmp_path, name, how, monkeypatch):
    out = copy_of(outputs, tmp_path)
    path = tamper(out, how)
    got = []
    with pytest.raises(RecordError, match="swapped|truncated") as e:
        got.extend(READERS[name](out))
    assert e.value.context["file"] == path and "verify" in e.value.hint
    assert got == []  # refused before any of its rows


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_remote_shard_is_checked_while_read_and_refused_at_its_end(outputs, tmp_path, monkeypatch, compression):
    """A shard read once (gs://, s3://): its CRC32C streamed while it is read; the rows come before the verdict."""
    out = copy_of(outputs, tmp_path, compression)
    path = metadata.shard_paths(str(out), metadata.load(str(out)))[1]
    if compression == "none":
        tamper(out, "swap", shard=1)
    else:  # the same records in another gzip stream of the same size: the stored bytes differ
        raw = open(path, "rb").read()
        swapped = bytearray(raw)
        swapped[4:8] = b"\x01\x00\x00\x00"  # the gzip header's mtime: the stream still decompresses
        open(path, "wb").write(bytes(swapped))
    monkeypatch.setattr(fileio, "is_local", lambda p: False)
    monkeypatch.setattr(shardcheck, "file_crc32c", lambda p: pytest.fail("the shard was read twice"))
    seen = []
    with pytest.raises(RecordError, match="Shard's CRC32C is .*metadata.json says") as e:
        for row in reader.iter_numpy(str(out)):
            seen.append(int(row["id"]))
    assert e.value.context["file"] == path
    assert len(seen) == ROWS  # shard 0, then shard 1's rows: the verdict comes at its end


def test_check_checksums_false_skips_the_crc32c_but_not_sizes_counts_and_record_crcs(outputs, tmp_path):
    out = copy_of(outputs, tmp_path)
    tamper(out, "swap")
    for name, read in READERS.items():
        ids = read(out, check_checksums=False)  # the documented opt-out: the swap is not seen
        assert ids[:3] == [1, 0, 2], name
    out2 = tmp_path / "two"
    shutil.copytree(outputs[1]["none"], out2)
    path = tamper(out2, "duplicate")
    for read in READERS.values():
        with pytest.raises(RecordError, match="bytes, metadata.json says"):
            read(out2, check_checksums=False)
    out3 = tmp_path / "three"
    shutil.copytree(outputs[1]["none"], out3)
    path = tamper(out3, "corrupt")
    for name in ("rows", "batches"):
        with pytest.raises(RecordError, match="Data CRC mismatch") as e:
            READERS[name](out3, check_checksums=False)
        assert e.value.context["file"] == path and e.value.context["record"] == 3
    with pytest.raises(RecordError, match="CRC32C is .*swapped"):
        READERS["batches"](out3)


def test_the_shard_crc32c_is_read_once_per_process_and_version(outputs, tmp_path, monkeypatch):
    out = copy_of(outputs, tmp_path)
    calls = []
    original = shardcheck.file_crc32c
    monkeypatch.setattr(shardcheck, "file_crc32c", lambda p: calls.append(p) or original(p))
    assert len(list(reader.iter_numpy(str(out)))) == ROWS
    assert len(calls) == 2
    assert len(list(reader.iter_numpy(str(out), batch_size=32))) == 10 and len(calls) == 2  # the next epoch
    reader.RandomAccess(str(out))[0]
    assert len(calls) == 2


def test_a_record_count_that_differs_from_the_metadata_is_refused(outputs, tmp_path):
    out = copy_of(outputs, tmp_path)
    meta_path = out / "metadata.json"
    import json

    meta = json.loads(meta_path.read_text())
    meta["shards"][0]["records"] += 1
    # the metadata's own counts kept consistent (else it is refused as edited before any shard is read): what is
    # tested is the reader counting the shard's frames
    meta["num_records"] += 1
    if "rows_read" in meta:
        meta["rows_read"] += 1
    del meta["shards"][0]["crc32c"]  # an output of an earlier version: size checked, then the count
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(RecordError, match="Shard holds 150 records, metadata says 151"):
        list(reader.iter_numpy(str(out), batch_size=10))
    assert tfrecord  # the framing module is what counts the frames
    assert fileio.size(str(out / meta["shards"][0]["file"])) == meta["shards"][0]["bytes"]


def test_batches_run_across_the_spans_of_a_collection(coll):
    """Batches of a collection: the spans' rows in span order, batches crossing span boundaries; RandomAccess's
    batched fetch across spans."""
    path, data = coll
    want = expected(data, [3, 4, 7])
    batches = list(reader.iter_numpy(str(path), batch_size=16))
    assert [len(b["label"]) for b in batches] == [16] * 6  # 40 + 25 + 31 rows
    for name in ("x", "label"):
        np.testing.assert_array_equal(np.concatenate([b[name] for b in batches]), want[name])
    got = reader.RandomAccess(str(path), spans="latest:2").batch([30, 0, 55, 24, 25])
    np.testing.assert_array_equal(got["label"], expected(data, [4, 7])["label"][[30, 0, 55, 24, 25]])
