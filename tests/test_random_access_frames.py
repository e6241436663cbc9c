"""reader.RandomAccess's per-record path: the frame header of a record length is checked once, then compared, and
each record's data CRC is still checked; the block decoder's one-record layout match; the local shard CRC32C read
into one buffer. Exact values against iter_numpy, and a corrupt record or header still raises a RecordError naming
the record."""

from __future__ import annotations

import shutil

import google_crc32c
import numpy as np
import pytest

from tests.conftest import convert
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.codec.block import BlockDecoder
from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import metadata

ROWS = 200  # ids 0..127 one varint byte, 128.. two: two record lengths


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ra")
    rng = np.random.default_rng(5)
    np.savez(
        tmp / "in.npz",
        id=np.arange(ROWS, dtype=np.int64),
        x=rng.standard_normal((ROWS, 4)).astype(np.float32),
        image=rng.integers(0, 256, (ROWS, 3, 2), dtype=np.uint8),
    )
    assert convert(tmp / "in.npz", tmp / "out", "--num_shards", "1", "--index")[0] == 0
    return tmp / "out"


def _frames(out):
    meta = metadata.load(str(out))
    offsets, frames = [], []
    for line in (out / meta["shards"][0]["index"]).read_text().split("\n"):
        if line:
            o, n = map(int, line.split())
            offsets.append(o)
            frames.append(n)
    return out / meta["shards"][0]["file"], offsets, frames


def test_random_reads_equal_iter_numpy_in_any_order(out):
    in_order = list(reader.iter_numpy(str(out)))
    ra = reader.RandomAccess(str(out))
    order = np.random.default_rng(0).permutation(ROWS).tolist() + [0, 199, 128, 127, -1]
    for i in order:
        got = ra[i]
        assert got.keys() == in_order[i].keys()
        for name, want in in_order[i].items():
            assert got[name].dtype == want.dtype and np.array_equal(got[name], want), (i, name)
        assert ra.record(i) == ra.record(i)


def test_corrupt_data_and_header_after_a_checked_record_of_the_same_length(out, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    path, offsets, frames = _frames(copy)
    j = next(j for j in range(ROWS - 3) if len(set(frames[j : j + 4])) == 1)  # 4 records of one length
    raw = bytearray(path.read_bytes())
    raw[offsets[j + 1] + 20] ^= 0x01  # a data byte
    raw[offsets[j + 2] + 3] ^= 0x01  # a length byte
    path.write_bytes(bytes(raw))
    in_order = list(reader.iter_numpy(str(out)))
    ra = reader.RandomAccess(str(copy), check_checksums=False)  # size only: the records' own CRCs are the check
    for i in (j, j + 3):  # the header of this length is known after the first
        assert np.array_equal(ra[i]["image"], in_order[i]["image"]) and int(ra[i]["id"]) == int(in_order[i]["id"])
    with pytest.raises(RecordError, match="Data CRC mismatch") as e:
        ra[j + 1]
    assert e.value.context.get("record") == j + 1 and e.value.context.get("offset") == offsets[j + 1]
    with pytest.raises(RecordError, match="The frame at the indexed offset is not a record of") as e:
        ra[j + 2]
    assert e.value.context.get("record") == j + 2
    with pytest.raises(RecordError, match="CRC32C"):  # the default: the shard's checksum first
        reader.RandomAccess(str(copy))[0]


def test_one_record_layout_match_falls_back_on_another_layout(out):
    ra = reader.RandomAccess(str(out))
    decoder = BlockDecoder(ra._specs)
    rec = ra.record(5)
    first = decoder.decode_one(rec)  # prepares the layout of this length
    assert decoder._layouts[len(rec)].matches_one(rec)
    other = bytearray(rec)
    layout = decoder._layouts[len(rec)]
    start, nbytes, width = layout.vector["id"]
    assert width == 1 and nbytes == 1
    other[start] |= 0x80  # the id's varint would continue: not this layout
    assert not layout.matches_one(bytes(other))
    _a, b = layout.ranges[0]
    other = bytearray(rec)
    other[b - 1] ^= 0x01  # a structural byte
    assert not layout.matches_one(bytes(other))
    assert all(np.array_equal(first[k], v) for k, v in decoder.decode_one(rec).items())


@pytest.mark.parametrize("size", [0, 1, reader.CRC_CHUNK - 1, reader.CRC_CHUNK, 2 * reader.CRC_CHUNK + 7])
def test_file_crc32c_of_a_local_file_is_google_crc32c_of_its_bytes(tmp_path, size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(data)
    assert reader.file_crc32c(str(tmp_path / "f")) == (size, google_crc32c.Checksum(data).hexdigest().decode())
