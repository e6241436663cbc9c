"""Zarr stores as a source: v2 and v3 directory stores and zip stores written by zarr, xarray and dask, every codec
the zarr package ships (blosc, zstd, gzip, lz4, bitshuffle, the v3 sharding codec), big-endian and Fortran-order
arrays, strings; values exact against ``zarr.open(...)[...]`` and read back with plain TensorFlow; row ranges
aligned to chunks from metadata only; hostile stores refused with one line."""

from __future__ import annotations

import gzip
import json
import os
import struct

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from tests.conftest import convert  # noqa: E402
from tfrecord_etl.transforms import planning, reader  # noqa: E402
from tfrecord_etl.transforms.errors import SourceError  # noqa: E402
from tfrecord_etl.transforms.sources import SourceOptions, format_of  # noqa: E402

PLANNED = ("--writer", "planned")


def rows_of(out) -> list[dict]:
    return list(reader.iter_numpy(str(out)))


def column(rows, name) -> np.ndarray:
    return np.stack([np.asarray(r[name]) for r in rows])


def plain_tf(out) -> list[dict]:
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    spec = reader.tf_feature_spec(str(out))
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    return [
        {k: v.numpy() for k, v in tf.io.parse_single_example(s, spec).items()} for s in tf.data.TFRecordDataset(files)
    ]


def run(store, out, *flags, capsys=None):
    code, _, err = convert(str(store), str(out), *PLANNED, *flags, beam=False, capsys=capsys)
    return code, err


def v3_store(path):
    """A v3 group: ``x`` (float32 on dimension t), ``label`` (int16 on t), strings ``name`` on t, and a sharded
    ``big`` (int64, 96 rows on dimension n)."""
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    x = g.create_array("x", shape=(10, 3), chunks=(4, 3), dtype="f4", dimension_names=["t", "c"])
    x[:] = np.arange(30, dtype="f4").reshape(10, 3) / 7
    lab = g.create_array("label", shape=(10,), chunks=(4,), dtype="i2", dimension_names=["t"])
    lab[:] = np.arange(10, dtype="i2") - 5
    name = g.create_array("name", shape=(10,), chunks=(4,), dtype=str, dimension_names=["t"])
    name[:] = np.array([f"row-{i}-é" for i in range(10)])
    big = g.create_array("big", shape=(96,), chunks=(8,), shards=(32,), dtype="i8", dimension_names=["n"])
    big[:] = np.arange(96) * 3
    return g


def test_v3_row_groups_strings_and_sharding(tmp_path, caplog):
    store = tmp_path / "a.zarr"
    v3_store(store)
    assert format_of(str(store), SourceOptions()) == "zarr"
    opened = zarr.open_group(str(store), mode="r")
    code, err = run(store, tmp_path / "o1")
    assert code == 0, err
    rows = rows_of(tmp_path / "o1")  # group 1: the largest (big: 768 bytes)
    np.testing.assert_array_equal(column(rows, "big"), opened["big"][:])
    assert "row groups" in caplog.text and "--row_group 2" in caplog.text
    code, err = run(store, tmp_path / "o2", "--row_group", "2")
    assert code == 0, err
    rows = rows_of(tmp_path / "o2")
    assert sorted(rows[0]) == ["label", "name", "x"]
    np.testing.assert_array_equal(column(rows, "x"), opened["x"][:])
    np.testing.assert_array_equal(column(rows, "label"), opened["label"][:])
    assert [r["name"].item() if np.ndim(r["name"]) == 0 else r["name"][0] for r in rows] == [
        s.encode() for s in opened["name"][:]
    ]
    tf_rows = plain_tf(tmp_path / "o2")
    np.testing.assert_array_equal(np.stack([r["x"] for r in tf_rows]), opened["x"][:])
    np.testing.assert_array_equal(np.stack([np.asarray(r["label"]).reshape(()) for r in tf_rows]), opened["label"][:])


def test_sharded_rows_ranges_align_to_shards(tmp_path):
    store = tmp_path / "s.zarr"
    v3_store(store)
    plan = planning.plan_inputs(str(store), SourceOptions(datasets=("big",), target_range_bytes=8 * 40))
    assert plan.indexes[0].chunk_rows == 32
    assert [(r.start, r.stop) for r in plan.ranges] == [(0, 32), (32, 64), (64, 96)]


def test_v2_big_endian_fortran_order_and_fixed_strings(tmp_path):
    store = tmp_path / "b.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    a = g.create_array("be", shape=(9, 2, 3), chunks=(4, 2, 2), dtype=">f8", order="F")
    a[:] = np.arange(54, dtype=">f8").reshape(9, 2, 3) * 1.5
    s = g.create_array("code", shape=(9,), chunks=(5,), dtype="S4")
    s[:] = np.array([b"a%d" % i for i in range(9)])
    meta = json.loads((store / "be" / ".zarray").read_text())
    assert meta["order"] == "F" and meta["dtype"] == ">f8"
    code, err = run(store, tmp_path / "o")
    assert code == 0, err
    rows = rows_of(tmp_path / "o")
    np.testing.assert_array_equal(column(rows, "be"), zarr.open_array(str(store / "be"), mode="r")[:])
    assert [np.asarray(r["code"]).item() for r in rows] == list(g["code"][:])


CODECS_V3 = {
    "zstd": lambda: [zarr.codecs.ZstdCodec(level=3)],
    "gzip": lambda: [zarr.codecs.GzipCodec(level=5)],
    "blosc-lz4-bitshuffle": lambda: [zarr.codecs.BloscCodec(cname="lz4", shuffle="bitshuffle")],
    "blosc-zstd-shuffle": lambda: [zarr.codecs.BloscCodec(cname="zstd", shuffle="shuffle")],
    "crc32c-after-zstd": lambda: [zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()],
}


@pytest.mark.parametrize("codec", sorted(CODECS_V3))
def test_v3_codecs(tmp_path, codec):
    store = tmp_path / "c.zarr"
    data = (np.arange(4000, dtype="<i4") % 97).reshape(400, 10)
    a = zarr.create_array(str(store), shape=data.shape, chunks=(64, 10), dtype="i4", compressors=CODECS_V3[codec]())
    a[:] = data
    code, err = run(store, tmp_path / "o")
    assert code == 0, err
    np.testing.assert_array_equal(column(rows_of(tmp_path / "o"), "c"), zarr.open_array(str(store), mode="r")[:])


def v2_compressors():
    import numcodecs

    return {
        "blosc": numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE),
        "zstd": numcodecs.Zstd(),
        "gzip": numcodecs.GZip(),
        "zlib": numcodecs.Zlib(),
        "lz4": numcodecs.LZ4(),
        "bz2": numcodecs.BZ2(),
        "lzma": numcodecs.LZMA(),
    }


@pytest.mark.parametrize("codec", ["blosc", "zstd", "gzip", "zlib", "lz4", "bz2", "lzma"])
def test_v2_codecs(tmp_path, codec):
    store = tmp_path / "c.zarr"
    data = np.sin(np.arange(3000, dtype="f8")).reshape(300, 10)
    a = zarr.create_array(
        str(store), shape=data.shape, chunks=(64, 10), dtype="f8", zarr_format=2, compressors=v2_compressors()[codec]
    )
    a[:] = data
    code, err = run(store, tmp_path / "o")
    assert code == 0, err
    np.testing.assert_array_equal(column(rows_of(tmp_path / "o"), "c"), data)


def test_zip_store(tmp_path):
    path = tmp_path / "z.zarr.zip"
    store = zarr.storage.ZipStore(str(path), mode="w")
    g = zarr.open_group(store, mode="w")
    g.create_array("v", shape=(12, 2), chunks=(5, 2), dtype="u2")[:] = np.arange(24, dtype="u2").reshape(12, 2)
    store.close()
    assert format_of(str(path), SourceOptions()) == "zarr"
    code, err = run(path, tmp_path / "o")
    assert code == 0, err
    np.testing.assert_array_equal(column(rows_of(tmp_path / "o"), "v"), np.arange(24).reshape(12, 2))


def test_an_npz_is_not_taken_for_a_zip_store(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.arange(3))
    assert format_of(str(tmp_path / "a.npz"), SourceOptions()) == "npz"


def test_xarray_to_zarr_with_coordinates_values_as_stored(tmp_path):
    xr = pytest.importorskip("xarray")
    time = np.arange(12)
    ds = xr.Dataset(
        {
            "temp": (("time", "lat"), np.linspace(250, 300, 48).reshape(12, 4)),
            "count": (("time",), np.arange(12, dtype="i4")),
        },
        coords={"time": time, "lat": [10.0, 20.0, 30.0, 40.0]},
    )
    ds["temp"].encoding = {"dtype": "i2", "scale_factor": 0.01, "add_offset": 273.15, "_FillValue": -999}
    ds["temp"].attrs["units"] = "K"
    store = tmp_path / "x.zarr"
    ds.to_zarr(str(store), zarr_format=2, consolidated=True)
    code, err = run(store, tmp_path / "o")
    assert code == 0, err
    rows = rows_of(tmp_path / "o")
    assert sorted(rows[0]) == ["count", "temp", "time"]  # the time group: coordinate with its variables
    raw = zarr.open_group(str(store), mode="r")
    np.testing.assert_array_equal(column(rows, "temp"), raw["temp"][:])  # the stored int16, not decoded
    assert column(rows, "temp").dtype == np.int16
    np.testing.assert_array_equal(column(rows, "time"), raw["time"][:])
    code, err = run(store, tmp_path / "lat", "--datasets", "lat")
    assert code == 0, err
    np.testing.assert_array_equal(column(rows_of(tmp_path / "lat"), "lat"), [10.0, 20.0, 30.0, 40.0])


def test_consolidated_metadata_is_all_planning_reads(tmp_path):
    """Planning reads the consolidated metadata only: the per-array metadata and every chunk removed, it plans (with
    --allow_fill_value: a local store's chunk files are counted at planning, and none is there)."""
    xr = pytest.importorskip("xarray")
    ds = xr.Dataset({"v": (("t",), np.arange(50.0))})
    store = tmp_path / "c.zarr"
    ds.to_zarr(str(store), zarr_format=2, consolidated=True, encoding={"v": {"chunks": (8,)}})
    for name in os.listdir(store / "v"):
        os.remove(store / "v" / name)
    with pytest.raises(SourceError, match="holds 0 of its chunk files"):
        planning.plan_inputs(str(store), SourceOptions(target_range_bytes=8 * 20))
    plan = planning.plan_inputs(str(store), SourceOptions(target_range_bytes=8 * 20, allow_fill_value=True))
    assert plan.indexes[0].num_rows == 50 and plan.indexes[0].chunk_rows == 8
    assert [(r.start, r.stop) for r in plan.ranges] == [(0, 16), (16, 32), (32, 48), (48, 50)]


def test_dask_irregular_last_chunk(tmp_path):
    da = pytest.importorskip("dask.array")
    data = da.arange(23 * 2, chunks=14).reshape(23, 2).rechunk((7, 2))
    store = tmp_path / "d.zarr"
    data.to_zarr(str(store))
    plan = planning.plan_inputs(str(store), SourceOptions(target_range_bytes=8 * 2 * 10))
    assert [(r.start, r.stop) for r in plan.ranges] == [(0, 7), (7, 14), (14, 21), (21, 23)]
    code, err = run(store, tmp_path / "o", "--target_range_mb", "0.0002")
    assert code == 0, err
    np.testing.assert_array_equal(column(rows_of(tmp_path / "o"), "d"), np.arange(46).reshape(23, 2))


def test_datasets_mode(tmp_path):
    store = tmp_path / "m.zarr"
    v3_store(store)
    code, err = run(store, tmp_path / "o", "--container_mode", "datasets")
    assert code == 0, err
    got = {np.asarray(r["key"]).item().decode(): r["array"] for r in rows_of(tmp_path / "o")}
    assert sorted(got) == ["big", "label", "x"]  # strings skipped in datasets mode
    np.testing.assert_array_equal(got["x"], zarr.open_group(str(store), mode="r")["x"][:])


def test_unwritten_chunks_refused_unless_allowed(tmp_path, capsys):
    store = tmp_path / "f.zarr"
    a = zarr.create_array(str(store), shape=(20,), chunks=(5,), dtype="i4", fill_value=-1)
    a[:10] = np.arange(10)  # chunks 2 and 3 never written
    code, err = run(store, tmp_path / "o", capsys=capsys)
    assert code != 0
    assert "never written" in err and "--allow_fill_value" in err and "'c/2'" in err
    code, err = run(store, tmp_path / "o2", "--allow_fill_value")
    assert code == 0, err
    np.testing.assert_array_equal(column(rows_of(tmp_path / "o2"), "f"), np.r_[np.arange(10), [-1] * 10])


# ------------------------------------------------------------------------------------------------ hostile stores


def one_line_refusal(err: str, *fragments: str) -> None:
    """Exactly one line of ``err`` holds every fragment (the refusal names what and where, no traceback)."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if all(f in line for f in fragments)]
    assert len(lines) == 1, err


def test_chunk_larger_than_declared_refused(tmp_path, capsys):
    store = tmp_path / "h.zarr"
    zarr.create_array(str(store), shape=(10,), chunks=(5,), dtype="i4", zarr_format=2)[:] = np.arange(10)
    with open(store / "0", "ab") as f:
        f.write(b"\0" * 100_000)
    code, err = run(store, tmp_path / "o", capsys=capsys)
    assert code != 0
    one_line_refusal(err, "'0' holds 1", "more than any encoding of what its metadata declares")


def test_gzip_bomb_refused(tmp_path, capsys):
    store = tmp_path / "bomb.zarr"
    import numcodecs

    zarr.create_array(
        str(store), shape=(2000,), chunks=(1000,), dtype="f8", zarr_format=2, compressors=numcodecs.GZip()
    )[:] = 1.0
    bomb = gzip.compress(b"\0" * (8 * 2**20))  # 8 MiB from 8 KB, for a chunk of 8,000 bytes
    assert len(bomb) < 9000
    (store / "1").write_bytes(bomb)
    code, err = run(store, tmp_path / "o", capsys=capsys)
    assert code != 0
    one_line_refusal(err, "decompresses (gzip) to more than the 8,000 bytes", "codec bomb")


def test_blosc_header_bomb_refused(tmp_path, capsys):
    store = tmp_path / "bb.zarr"
    zarr.create_array(str(store), shape=(100,), chunks=(50,), dtype="i4", compressors=[zarr.codecs.BloscCodec()])[:] = (
        np.arange(100)
    )
    chunk = bytearray((store / "c" / "1").read_bytes())
    struct.pack_into("<I", chunk, 4, 2**31)  # declares 2 GiB decoded
    (store / "c" / "1").write_bytes(bytes(chunk))
    code, err = run(store, tmp_path / "o", capsys=capsys)
    assert code != 0
    one_line_refusal(err, "decompresses (blosc) to more than the 200 bytes")


def test_dotdot_key_in_consolidated_metadata_refused(tmp_path, capsys):
    outside = tmp_path / "secret"
    zarr.create_array(str(outside), shape=(4,), chunks=(4,), dtype="i4", zarr_format=2)[:] = 7
    store = tmp_path / "evil.zarr"
    store.mkdir()
    (store / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    meta = {
        "zarr_consolidated_format": 1,
        "metadata": {".zgroup": {"zarr_format": 2}, "../secret/.zarray": json.loads((outside / ".zarray").read_text())},
    }
    (store / ".zmetadata").write_text(json.dumps(meta))
    code, err = run(store, tmp_path / "o", capsys=capsys)
    assert code != 0
    one_line_refusal(err, "../secret", "leads outside the store")
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.tfrecord"))


def test_symlink_outside_the_store_refused(tmp_path, capsys):
    store = tmp_path / "l.zarr"
    zarr.create_array(str(store), shape=(8,), chunks=(4,), dtype="u1", zarr_format=2)[:] = 1
    (tmp_path / "elsewhere").write_bytes(b"\x02" * 4)
    os.remove(store / "1")
    os.symlink(tmp_path / "elsewhere", store / "1")
    code, err = run(store, tmp_path / "o", capsys=capsys)
    assert code != 0
    one_line_refusal(err, "symbolic link leading outside the store", "--follow_symlinks")


def test_not_a_store_directory(tmp_path):
    (tmp_path / "empty.zarr").mkdir()
    with pytest.raises(SourceError, match="Not a Zarr store"):
        planning.plan_inputs(str(tmp_path / "empty.zarr"), SourceOptions(format="zarr"))


# ------------------------------------------------------------------------------------------ inspect and verify


def test_inspect_lists_the_store_tree(tmp_path, capsys):
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import inspect as inspect_module

    store = tmp_path / "t.zarr"
    v3_store(store)
    code, out, _ = run_command(inspect_module.main, [str(store)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"Zarr v3 file {store}: 4 objects"
    big = next(line for line in lines if line.strip().startswith("big "))
    assert "int64" in big and "[96]" in big and "chunks [8], shards [32]" in big and "dims n" in big
    x = next(line for line in lines if line.strip().startswith("x "))
    assert "float32" in x and "[10, 3]" in x and "codecs zstd" in x and "dims t, c" in x and "fill 0.0" in x
    assert "--datasets big" in out and "--datasets label,name,x" in out
    code, out, _ = run_command(inspect_module.main, [str(store), "--json"], capsys)
    tree = json.loads(out)
    assert [g["datasets"] for g in tree["row_groups"]] == [["big"], ["label", "name", "x"]]


def test_verify_source_compares_against_the_store(tmp_path, capsys):
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import verify as verify_module

    store = tmp_path / "v.zarr"
    v3_store(store)
    code, err = run(store, tmp_path / "o", "--row_group", "2")
    assert code == 0, err
    code, out, err = run_command(verify_module.main, [str(tmp_path / "o"), "--source", str(store)], capsys)
    assert code == 0, out + err
    assert "exact values against the source (10 of 10 rows compared" in out
    x = zarr.open_array(str(store / "x"), mode="r+")
    x[3] = [99, 99, 99]  # the store changes after the conversion: verify names the row
    code, out, err = run_command(verify_module.main, [str(tmp_path / "o"), "--source", str(store)], capsys)
    assert code != 0, out + err
    print(out + err)
    assert "record 3" in out + err and "'x'" in out + err


def test_augment_join_input_takes_a_zarr_array(tmp_path, capsys):
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import augment as augment_main

    np.save(tmp_path / "in.npy", np.arange(40, dtype="<i8"))
    code, err = run(tmp_path / "in.npy", tmp_path / "conv", "--num_shards", "2")
    assert code == 0, err
    store = tmp_path / "labels.zarr"
    g = zarr.open_group(str(store), mode="w")
    g.create_array("label", shape=(40,), chunks=(16,), dtype=">i4")[:] = np.arange(40) * 10
    code, _, err = run_command(
        augment_main.main,
        ["--input", str(tmp_path / "conv"), "--output_dir", str(tmp_path / "aug"), "--join_input", str(store)],
        capsys,
    )
    assert code == 0, err
    rows = rows_of(tmp_path / "aug")
    np.testing.assert_array_equal(column(rows, "label"), np.arange(40) * 10)
    assert sorted(rows[0]) == ["array", "label"]
    np.testing.assert_array_equal(column(rows, "array"), np.arange(40))


def test_planning_a_1000_chunk_consolidated_store_reads_only_its_root_metadata(tmp_path, monkeypatch):
    """Planning reads the root's metadata documents and nothing else (no chunk, no per-array document, no listing of
    nodes; a local store's chunk files are counted), whatever the chunk count: a remote store is planned in a few
    requests."""
    from tfrecord_etl.transforms.sources import zarrbounded

    store = tmp_path / "k.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=3)
    for name in ("a", "b"):
        g.create_array(name, shape=(1000, 4), chunks=(2, 4), dtype="i4", dimension_names=["t", "c"])[:] = 1
    zarr.consolidate_metadata(str(store))
    assert sum(len(files) for _, _, files in os.walk(store)) > 1000
    read, listed = [], []
    real_get = zarrbounded.BoundedStore.get_sync
    monkeypatch.setattr(
        zarrbounded.BoundedStore,
        "get_sync",
        lambda self, key, byte_range=None: (read.append(key), real_get(self, key, byte_range))[1],
    )
    monkeypatch.setattr(zarrbounded.BoundedStore, "children", lambda self, prefix: listed.append(prefix) or [])
    plan = planning.plan_inputs(str(store), SourceOptions(target_range_bytes=16 * 100))
    assert plan.indexes[0].items == ("a", "b") and plan.indexes[0].num_rows == 1000
    assert set(read) <= {"zarr.json", ".zgroup", ".zattrs", ".zmetadata"} and "zarr.json" in read, read
    assert listed == []
    assert [(r.start, r.stop) for r in plan.ranges][:2] == [(0, 50), (50, 100)]
