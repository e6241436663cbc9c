"""Each shard's size and CRC32C in metadata.json and the run marker, computed while it is written; checked by verify
(without --source), by the index readers (reader.RandomAccess, reader.get) and read back by plain TensorFlow.
Swapped, replaced and truncated shards are caught; outputs of earlier versions (no checksums) still read."""

from __future__ import annotations

import io
import json
import os
import shutil

import google_crc32c
import h5py
import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, run_command
from tfrecord_etl.pipelines import augment as augment_main, verify as verify_module
from tfrecord_etl.transforms import checksum, reader
from tfrecord_etl.transforms.codec import FeatureSpec, encode_columns
from tfrecord_etl.transforms.errors import RecordError, SchemaError
from tfrecord_etl.transforms.output import framing, metadata, outdir, tfrecord
from tfrecord_etl.transforms.reading import shardcheck

ROWS = 3000  # 3 shards of 1,000 rows


def crc_of(path) -> str:
    return google_crc32c.Checksum(open(path, "rb").read()).hexdigest().decode()


def make_rows(path, start=0, rows=ROWS, seed=0):
    """``id`` float32 (exact up to 2**24; a fixed 4 bytes in every encoding, so shards of equal rows have equal
    sizes), ``mask`` bool (4, 4), ``x`` float32 (3,)."""
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(start, start + rows, dtype="<f4")
        f["mask"] = rng.integers(0, 2, (rows, 4, 4)).astype(bool)
        f["x"] = rng.standard_normal((rows, 3)).astype("<f4")


def verify_run(out, capsys, *flags):
    return run_command(verify_module.main, [str(out), *flags], capsys)


ENCODINGS = {
    "list": ["--encoding", "list"],
    "tensor": ["--encoding", "tensor"],
    "packbits": ["--encoding", "list", "--feature_encodings", "mask=packbits"],
}


@pytest.mark.parametrize("writer", ["planned", "beam", "shuffled"])
@pytest.mark.parametrize("compression", ["none", "gzip", "zlib"])
def test_every_writer_records_each_shard_crc32c_and_size(tmp_path, writer, compression):
    make_rows(tmp_path / "in.h5", rows=300)
    out = tmp_path / "out"
    flags = ["--shuffle_seed", "5"] if writer == "shuffled" else ["--writer", writer]
    assert convert(tmp_path / "in.h5", out, "--num_shards", "3", "--compression", compression, *flags)[0] == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert len(meta["shards"]) == 3
    for shard in meta["shards"]:  # the file's bytes as stored: compressed ones for .gz / .deflate
        assert shard["crc32c"] == crc_of(out / shard["file"]) and shard["bytes"] == os.path.getsize(out / shard["file"])
    marker = json.loads((out / outdir.MARKER_FILE).read_text())
    assert marker["shards"] == [{k: s[k] for k in ("file", "records", "bytes", "crc32c")} for s in meta["shards"]]


def test_wide_rows_checksum_combined_from_record_crcs_across_ranges(tmp_path, monkeypatch):
    """Rows of 3,000+ bytes, tensor-encoded, several row ranges per shard: each range's CRC32C is combined from its
    record CRCs (checksum.frames_crc32c) into the shard's, which equals the CRC32C of the file."""
    combined = []
    frames_crc32c = checksum.frames_crc32c
    monkeypatch.setattr(checksum, "frames_crc32c", lambda *a: combined.append(frames_crc32c(*a)) or combined[-1])
    rng = np.random.default_rng(3)
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["image"] = rng.integers(0, 256, (500, 30, 25, 4), dtype=np.uint8)
        f["id"] = np.arange(500, dtype="<i8")
    out = tmp_path / "out"
    assert (
        convert(tmp_path / "in.h5", out, "--num_shards", "2", "--encoding", "tensor", "--target_range_mb", "0.1")[0]
        == 0
    )
    meta = json.loads((out / "metadata.json").read_text())
    assert {f["name"]: f["shape"] for f in meta["features"]}["image"] == [30, 25, 4] and len(meta["shards"]) == 2
    assert [s["crc32c"] for s in meta["shards"]] == [crc_of(out / s["file"]) for s in meta["shards"]]
    assert len(combined) > 2 and None not in combined  # more ranges than shards, none read again


def test_augment_rewrite_and_sidecar_shards_record_their_crc32c(tmp_path):
    make_rows(tmp_path / "in.h5", rows=300)
    assert convert(tmp_path / "in.h5", tmp_path / "out", "--num_shards", "2", "--compression", "gzip")[0] == 0
    for mode in ("rewrite", "sidecar"):
        aug = tmp_path / mode
        code, _, _ = run_command(
            augment_main.main,
            ["--input", tmp_path / "out", "--output_dir", aug, "--mode", mode, "--constants", "tag=7", *BEAM_FLAGS],
        )
        assert code == 0
        meta = json.loads((aug / "metadata.json").read_text())
        assert [s["crc32c"] for s in meta["shards"]] == [crc_of(aug / s["file"]) for s in meta["shards"]]
        assert [s["bytes"] for s in meta["shards"]] == [os.path.getsize(aug / s["file"]) for s in meta["shards"]]
    manifest = json.loads((tmp_path / "sidecar" / "manifest.json").read_text())  # the inputs' checksums, as before
    assert [s["crc32c"] for s in manifest["shards"]] == [crc_of(s["input"]) for s in manifest["shards"]]


class WriteOnly:
    """A stream that can only be written: the checksum cannot come from reading the file back."""

    def __init__(self):
        self.data = bytearray()

    def write(self, b):
        self.data += bytes(b)
        return len(b)

    def flush(self):
        pass


@pytest.mark.parametrize("compression", tfrecord.COMPRESSIONS)
def test_shard_writer_checksums_the_bytes_it_writes(compression):
    raw = WriteOnly()
    writer = tfrecord.ShardWriter(raw, compression)
    writer.write_batch([b"a" * 10, b"", b"xyz" * 1000])
    batches = [
        encode_columns(
            {"x": np.random.default_rng(n).integers(0, 256, (rows, n), dtype=np.uint8)},
            [FeatureSpec("x", "|u1", (n,), "tensor")],
            rows,
        )
        for n, rows in ((64, 4), (3000, 5))
    ]
    for batch in batches:  # framed in place in a NumPy buffer; narrow ones checksummed by extend, wide ones
        assert batch.tails is None  # combined from their record CRCs (checksum.frames_crc32c)
        writer.write_encoded(batch)
    writer.write_batch([b"tail"])
    writer.close()
    assert writer.bytes_out == len(raw.data) > 0
    assert writer.crc32c == google_crc32c.Checksum(bytes(raw.data)).hexdigest().decode()
    records = [
        r for _, _, r in tfrecord.iter_records(tfrecord.open_decompressed(io.BytesIO(bytes(raw.data)), compression))
    ]
    assert records == [b"a" * 10, b"", b"xyz" * 1000, *batches[0].records(), *batches[1].records(), b"tail"]


@pytest.mark.parametrize(
    "width, rows", [(1024, 1), (1024, 3), (1500, 2), (4096, 7), (12_808, 655), (2000, 4097), (1024, 0)]
)
def test_frames_crc32c_is_the_crc32c_of_the_framed_bytes(width, rows):
    """The CRC32C combined from the record CRCs equals google-crc32c over the framed bytes (frame positions grown by
    doubling past 1, 2, 4, ... 4096)."""
    block = np.random.default_rng(width + rows).integers(0, 256, (rows, width), dtype=np.uint8)
    framed, crcs, masked = framing.framed(rows, width, lambda view: view.__setitem__(Ellipsis, block))
    assert checksum.frames_crc32c(width, crcs, masked) == google_crc32c.value(framed.tobytes())
    assert checksum.frames_crc32c(width, crcs[:2], masked[:2]) == google_crc32c.value(framed[:2].tobytes())
    assert checksum.frames_crc32c(100, crcs, masked) is None  # narrow records: extend is as cheap
    head, tail = b"0123456789" * 7, framed.tobytes()
    assert checksum.combine(google_crc32c.value(head), google_crc32c.value(tail), len(tail)) == google_crc32c.value(
        head + tail
    )


def swap(a, b):
    tmp = a.with_name(".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


@pytest.fixture
def indexed(tmp_path, request):
    """A 3-shard output of ids 0..2999 with --index, in the encoding of the test's parameter."""
    make_rows(tmp_path / "in.h5")
    out = tmp_path / "out"
    code, _, _ = convert(tmp_path / "in.h5", out, "--num_shards", "3", "--index", *ENCODINGS[request.param])
    assert code == 0
    shards = sorted(out.glob("data-*.tfrecord"))
    return out, shards


@pytest.mark.parametrize("indexed", list(ENCODINGS), indirect=True)
def test_two_equal_size_shards_swapped_are_caught_without_source(indexed, capsys):
    out, shards = indexed
    assert os.path.getsize(shards[0]) == os.path.getsize(shards[1])  # what made the swap invisible
    assert float(reader.get(str(out), 1500)["id"]) == 1500.0  # checked, and remembered for this process
    assert float(reader.RandomAccess(str(out))[0]["id"]) == 0.0
    swap(shards[0], shards[1])
    with pytest.raises(RecordError, match="CRC32C is .*metadata.json says .*swapped") as e:
        reader.get(str(out), 1500)
    assert e.value.context["file"] == str(shards[1])
    with pytest.raises(RecordError, match="swapped"):
        reader.RandomAccess(str(out))[0]
    assert float(reader.get(str(out), 2500)["id"]) == 2500.0  # the shard left alone still reads
    code, stdout, _ = verify_run(out, capsys)
    assert code == 1 and stdout.count("[checksum]") == 2
    assert f"[checksum] {shards[0]}: File's CRC32C is {crc_of(shards[0])}" in stdout and str(shards[1]) in stdout
    swap(shards[0], shards[1])  # put back: the same files, a new rename (new change time): checked again, fine
    assert float(reader.get(str(out), 1500)["id"]) == 1500.0
    assert verify_run(out, capsys)[0] == 0


@pytest.mark.parametrize("indexed", ["tensor"], indirect=True)
def test_a_shard_replaced_by_another_of_the_same_size_is_caught(indexed, tmp_path, capsys):
    out, shards = indexed
    make_rows(tmp_path / "other.h5", start=10_000, seed=1)
    code, _, _ = convert(
        tmp_path / "other.h5", tmp_path / "other", "--num_shards", "3", "--index", "--encoding", "tensor"
    )
    assert code == 0
    assert float(reader.get(str(out), 1500)["id"]) == 1500.0
    shutil.copyfile(tmp_path / "other" / shards[1].name, shards[1])  # same inode, new bytes of the same size
    with pytest.raises(RecordError, match="replaced by another file"):
        reader.get(str(out), 1500)
    code, stdout, _ = verify_run(out, capsys)
    assert code == 1 and f"[checksum] {shards[1]}" in stdout and "[size]" not in stdout


@pytest.mark.parametrize("indexed", ["list"], indirect=True)
def test_a_truncated_shard_is_caught_by_its_size(indexed, capsys, monkeypatch):
    out, shards = indexed
    size = os.path.getsize(shards[1])
    with open(shards[1], "r+b") as f:
        f.truncate(size - 100)
    read = []
    monkeypatch.setattr(shardcheck, "file_crc32c", lambda path: read.append(path))
    with pytest.raises(
        RecordError, match=f"Shard holds {size - 100} bytes, metadata.json says {size}: it was truncated"
    ):
        reader.get(str(out), 1500)
    assert read == []  # refused on its size: not read
    code, stdout, _ = verify_run(out, capsys)
    assert code == 1 and f"[size] {shards[1]}: File holds {size - 100} bytes, metadata.json says {size}" in stdout


@pytest.mark.parametrize("indexed", ["tensor"], indirect=True)
def test_the_checksum_is_read_once_per_process_and_file_version(indexed, monkeypatch):
    out, shards = indexed
    calls = []
    original = shardcheck.file_crc32c
    monkeypatch.setattr(shardcheck, "file_crc32c", lambda path: calls.append(path) or original(path))
    shardcheck.CHECKED.clear()
    assert [float(reader.get(str(out), i)["id"]) for i in (1500, 1501, 1999)] == [1500.0, 1501.0, 1999.0]
    assert calls == [str(shards[1])]  # one read of the shard for three gets
    ra = reader.RandomAccess(str(out))
    assert [float(ra[i]["id"]) for i in (0, 2999)] == [0.0, 2999.0]
    assert calls == [str(shards[1]), str(shards[0]), str(shards[2])]
    os.utime(shards[1])  # touched: another version of the file, read again
    assert float(reader.get(str(out), 1000)["id"]) == 1000.0 and calls[-1] == str(shards[1]) and len(calls) == 4
    swap(shards[0], shards[1])  # without the checksum: size only, as documented (the swap is not seen)
    assert float(reader.get(str(out), 1500, check_checksums=False)["id"]) == 500.0 and len(calls) == 4


def test_outputs_without_checksums_still_read_and_verify_says_it_could_not_check(tmp_path, capsys, tf_module):
    make_rows(tmp_path / "in.h5", rows=300)
    out = tmp_path / "out"
    assert convert(tmp_path / "in.h5", out, "--num_shards", "2", "--index", "--encoding", "tensor")[0] == 0
    meta = json.loads((out / "metadata.json").read_text())
    for shard in meta["shards"]:  # as an earlier version wrote it
        del shard["crc32c"]
    (out / "metadata.json").write_text(json.dumps(meta))
    assert float(reader.get(str(out), 200)["id"]) == 200.0
    assert [float(e["id"]) for e in reader.iter_numpy(str(out))] == list(range(300))
    code, stdout, _ = verify_run(out, capsys)
    assert code == 0 and "shard CRC32Cs" not in stdout
    assert (
        "warning: 2 of 2 shards have no CRC32C in metadata.json (an output of an earlier version): a shard "
        "swapped with, or replaced by, another of the same size could not be detected without --source" in stdout
    )
    code, stdout, _ = verify_run(out, capsys, "--json")
    assert code == 0 and json.loads(stdout)["checksums"] == 0
    ds = tf_module.data.TFRecordDataset([str(p) for p in metadata.shard_paths(str(out), meta)])
    assert sum(1 for _ in ds) == 300


def test_verify_reports_the_shards_it_checked(tmp_path, capsys):
    make_rows(tmp_path / "in.h5", rows=300)
    out = tmp_path / "out"
    assert convert(tmp_path / "in.h5", out, "--num_shards", "2", "--compression", "gzip")[0] == 0
    code, stdout, _ = verify_run(out, capsys)
    assert code == 0 and "shard CRC32Cs (2 of 2)" in stdout and "warning" not in stdout
    code, stdout, _ = verify_run(out, capsys, "--json")
    assert json.loads(stdout)["checksums"] == 2


def test_a_bad_crc32c_in_metadata_is_refused(tmp_path):
    make_rows(tmp_path / "in.h5", rows=30)
    out = tmp_path / "out"
    assert convert(tmp_path / "in.h5", out, "--num_shards", "1")[0] == 0
    meta = json.loads((out / "metadata.json").read_text())
    meta["shards"][0]["crc32c"] = "not hex!"
    (out / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="bad crc32c 'not hex!' \\(8 hex digits expected\\)"):
        metadata.load(str(out))


@pytest.fixture(scope="module")
def tf_module():
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    return tf
