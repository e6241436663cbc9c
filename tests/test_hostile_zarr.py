"""Hostile Zarr stores (hostile groups 13 and 14): shapes declaring far more chunks than the store holds, and codec
bombs inside the inner chunks of a shard. The stores are generated here and small: a "huge" array is a shape in its
metadata, a bomb a few KB of gzip.
"""

from __future__ import annotations

import gzip
import os
import struct
import tracemalloc
import zlib

import numpy as np
import pytest

from tests.conftest import convert
from tfrecord_etl.transforms import planning, reader
from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources import RowRange, SourceOptions, ZarrSource

zarr = pytest.importorskip("zarr")


def declared_huge(path, zarr_format=2):
    """A store declaring shape (10**15, 4) float64 (32 PB) in chunks of 1,000 rows, one chunk written."""
    a = zarr.create_array(
        str(path), shape=(10**15, 4), chunks=(1000, 4), dtype="<f8", zarr_format=zarr_format, fill_value=0
    )
    a[0:1000] = np.arange(4000.0).reshape(1000, 4)
    assert sum(len(f) for _, _, f in os.walk(path)) <= 3


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_shape_of_10_15_rows_with_one_chunk_is_refused_at_planning(tmp_path, capsys, zarr_format):
    """Hostile group 13: a store declaring (10**15, 4) with one chunk written grew convert's planning to 4.7 GB in
    120 s (--dry_run 2.1 GB in 30 s): a row range planned per 8 MiB of declared rows. Now planning counts the chunk
    files present (time and memory grow with them only) and refuses in one line naming the array, the declared shape
    and bytes, the bytes present, the first missing chunk and the flag."""
    store = tmp_path / "big.zarr"
    declared_huge(store, zarr_format)
    with pytest.raises(SourceError) as info:
        planning.plan_inputs(str(store), SourceOptions("zarr"))
    msg = str(info.value)
    assert "declares shape (1,000,000,000,000,000, 4), 32,000,000,000,000,000 bytes in 1,000,000,000,000 chunks" in msg
    assert "the store holds 1 of its chunk files (" in msg and "--allow_fill_value" in msg and "dataset='big'" in msg
    assert ("'1.0'" if zarr_format == 2 else "'c/1/0'") in msg
    code, _, err = convert(store, tmp_path / "out", "--dry_run", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "never written and would read as the fill value" in err, err


def test_with_allow_fill_value_the_plan_is_still_bounded(tmp_path):
    """Hostile group 13: with --allow_fill_value the same store is refused by the plan's bound on row ranges (2**20 of
    one file), naming the rows, the bytes and --target_range_mb, instead of listing 3.8 billion ranges."""
    store = tmp_path / "big.zarr"
    declared_huge(store)
    with pytest.raises(
        SourceError,
        match=r"declares 1,000,000,000,000,000 rows of 32 bytes .* 3,816,793,894 row "
        r"ranges .* more than the 1,048,576 one plan holds .*--target_range_mb",
    ):
        planning.plan_inputs(str(store), SourceOptions("zarr", allow_fill_value=True))


def test_missing_chunks_of_a_zip_store_are_refused_at_planning(tmp_path):
    """Hostile group 13: the same count for a zip store (its directory lists the members)."""
    store = tmp_path / "z.zarr.zip"
    zs = zarr.storage.ZipStore(str(store), mode="w")
    a = zarr.create_array(zs, shape=(10**12,), chunks=(10,), dtype="<i4", zarr_format=3, fill_value=0)
    a[:10] = np.arange(10)
    zs.close()
    with pytest.raises(SourceError, match=r"100,000,000,000 chunks, but the store holds 1 of its chunk files .*'c/1'"):
        ZarrSource(SourceOptions("zarr")).index(str(store))


def shard(chunks: list[bytes]) -> bytes:
    """A shard of ``chunks`` (inner chunks, in order) with its index at the end (offset, length per chunk, then the
    index's CRC32C), as zarr's sharding codec writes it."""
    import google_crc32c

    index, offset = b"", 0
    for c in chunks:
        index += struct.pack("<QQ", offset, len(c))
        offset += len(c)
    return b"".join(chunks) + index + struct.pack("<I", google_crc32c.value(index))


def gzip_bomb(mib: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(c.compress(b"\0" * 2**20) for _ in range(mib)) + c.flush()


@pytest.mark.parametrize("rows", [(15000, 20000), (10000, 20000)], ids=["inner-chunk-read", "whole-shard-read"])
def test_an_inner_gzip_chunk_of_a_shard_is_bounded_before_it_is_inflated(tmp_path, rows):
    """Hostile group 14: a shard whose inner gzip chunk inflates to 32 MiB (32 KB stored, for a chunk of 40,000
    bytes) was inflated whole before zarr refused its size (a 718 KB shard inflated to 738 MB: 1.74 GB peak). Now each
    inner chunk, read alone (a range of the shard) or with its whole shard, is inflated in steps of 1 MiB and refused
    once past its declared bytes: at most about 2 MiB is allocated (traced), and the error names the shard."""
    store = tmp_path / "s.zarr"
    a = zarr.create_array(
        str(store),
        shape=(20000,),
        chunks=(5000,),
        shards=(10000,),
        dtype="<f8",
        compressors=zarr.codecs.GzipCodec(),
        fill_value=0,
    )
    a[:] = np.arange(20000.0)
    good = gzip.compress(np.arange(10000, 15000, dtype="<f8").tobytes())
    (store / "c" / "1").write_bytes(
        shard([good, gzip_bomb(32)]) if rows[0] == 15000 else shard([gzip_bomb(32), gzip_bomb(32)])
    )
    source = ZarrSource(SourceOptions("zarr"))
    index = source.index(str(store))
    np.testing.assert_array_equal(source.read(RowRange(str(store), 0, 10, index.items))["s"], np.arange(10.0))
    if rows[0] == 15000:  # the shard's good inner chunk still reads alone
        np.testing.assert_array_equal(
            source.read(RowRange(str(store), 10000, 10010, index.items))["s"], np.arange(10000.0, 10010.0)
        )
    tracemalloc.start()
    try:
        with pytest.raises(
            SourceError,
            match=r"inner chunk 'c/1' of the store's root array decompresses \(gzip\) to "
            r"more than the 40,000 bytes",
        ):
            source.read(RowRange(str(store), *rows, index.items))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak  # the bomb is 32 MiB


def test_a_v2_chunk_behind_a_filter_is_bounded_too(tmp_path, capsys):
    """Hostile group 14: a v2 array with a filter (Delta) had no bound on its compressor's output; now at most 16
    times the chunk's bytes (the widest item size change of a filter), checked before zarr decompresses."""
    import numcodecs

    store = tmp_path / "d.zarr"
    zarr.create_array(
        str(store),
        shape=(2000,),
        chunks=(1000,),
        dtype="<i8",
        zarr_format=2,
        filters=[numcodecs.Delta("<i8")],
        compressors=numcodecs.GZip(),
    )[:] = np.arange(2000)
    (store / "1").write_bytes(gzip_bomb(8))
    code, _, err = convert(store, tmp_path / "out", capsys=capsys)
    assert code == 2 and "decompresses (gzip) to more than the 129,024 bytes" in err, err
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(store))[:1000]), np.arange(1000))


def test_a_store_whose_chunks_are_all_present_converts_and_inspect_still_lists_the_huge_one(tmp_path, capsys):
    """The count refuses nothing that is there: a store with every chunk (a partial last one) converts exactly;
    inspect lists the huge store's array from its metadata (it reads no chunk)."""
    store = tmp_path / "ok.zarr"
    zarr.create_array(str(store), shape=(23, 2), chunks=(7, 2), dtype="<i4", zarr_format=2)[:] = np.arange(46).reshape(
        23, 2
    )
    code, _, err = convert(store, tmp_path / "out", capsys=capsys)
    assert code == 0, err
    got = np.array([e["ok"] for e in reader.iter_numpy(str(tmp_path / "out"))])
    np.testing.assert_array_equal(got, np.arange(46).reshape(23, 2))
    from tfrecord_etl.transforms.sources.zarrtree import zarr_tree

    declared_huge(tmp_path / "big.zarr")
    tree = zarr_tree(str(tmp_path / "big.zarr"))
    assert tree["objects"][0]["shape"] == [10**15, 4]
