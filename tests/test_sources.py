"""Each source on small generated files: indexing, row-range planning and exact reads."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from tfrecord_etl.transforms import sources
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.planning import plan_inputs
from tfrecord_etl.transforms.sources import SourceOptions, npyformat
from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions


def read_all(plan) -> dict:
    parts = [plan.source.read(r) for r in plan.ranges]
    out = {}
    for name in parts[0]:
        vals = [p[name] for p in parts]
        out[name] = np.concatenate(vals) if isinstance(vals[0], np.ndarray) else [x for v in vals for x in v]
    return out


@pytest.fixture
def h5_file(tmp_path):
    path = tmp_path / "data.h5"
    inner = np.dtype([("c", ">f4", (2,)), ("d", "S5")])
    comp = np.dtype([("a", "<i2"), ("b", inner)])
    rows = 1000
    z = np.zeros(rows, comp)
    z["a"] = np.arange(rows)
    z["b"]["c"] = np.arange(rows * 2).reshape(rows, 2)
    z["b"]["d"] = [b"r%d" % i for i in range(rows)]
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "x", data=np.arange(rows * 3, dtype=">f8").reshape(rows, 3), chunks=(64, 3), compression="gzip"
        )
        f.create_group("g").create_group("h").create_dataset(
            "y", data=np.arange(rows, dtype="<i4"), chunks=(100,), compression="lzf"
        )
        f.create_dataset("z", data=z)
        f.create_dataset("s", data=np.array([b"abc", b"de"] * (rows // 2), dtype=object), dtype=h5py.string_dtype())
        f.create_dataset("scalar", data=1.5)
    return path, z


def test_hdf5_all_datasets_compound_nested_subarray_vlen_and_chunked(h5_file):
    path, z = h5_file
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=30000))
    names = {s.name: s for s in plan.specs}
    assert set(names) == {"g/h/y", "s", "x", "z/a", "z/b/c", "z/b/d"}  # the 0-d dataset is skipped
    assert names["z/b/c"].dtype == "<f4" and names["z/b/c"].shape == (2,)
    assert names["s"].dtype == "bytes" and names["x"].dtype == "<f8"
    assert len(plan.ranges) > 3 and all(r.start % 100 == 0 for r in plan.ranges)  # aligned to chunk rows
    got = read_all(plan)
    np.testing.assert_array_equal(got["x"], np.arange(3000).reshape(1000, 3))
    np.testing.assert_array_equal(got["g/h/y"], np.arange(1000))
    np.testing.assert_array_equal(got["z/b/c"], z["b"]["c"])
    np.testing.assert_array_equal(got["z/b/d"], z["b"]["d"])
    assert list(got["s"][:3]) == [b"abc", b"de", b"abc"]


def test_hdf5_datasets_option_and_errors(h5_file, tmp_path):
    path, _ = h5_file
    plan = plan_inputs(str(path), SourceOptions(datasets=("/g/h/y",)))
    assert [s.name for s in plan.specs] == ["g/h/y"]
    with pytest.raises(SourceError, match="No such dataset") as err:
        plan_inputs(str(path), SourceOptions(datasets=("/nope",)))
    assert err.value.context["dataset"] == "/nope" and str(path) in str(err.value)
    with pytest.raises(SchemaError, match="scalar"):
        plan_inputs(str(path), SourceOptions(datasets=("/scalar",)))
    other = tmp_path / "uneven.h5"
    with h5py.File(other, "w") as f:
        f["a"] = np.zeros(5)
        f["b"] = np.zeros(6)
    with pytest.raises(SchemaError, match=r"different leading lengths \('/a': 5, '/b': 6\)"):
        plan_inputs(str(other), SourceOptions(datasets=("/a", "/b")))
    # with no --datasets the largest row group is read, --row_group N another
    assert [s.name for s in plan_inputs(str(other), SourceOptions()).specs] == ["b"]
    assert [s.name for s in plan_inputs(str(other), SourceOptions(row_group=2)).specs] == ["a"]
    with pytest.raises(SchemaError, match="--row_group 3 asked, but the file holds 2 row group"):
        plan_inputs(str(other), SourceOptions(row_group=3))


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_rows_and_arrays(tmp_path, save):
    path = tmp_path / "d.npz"
    a = np.arange(40, dtype=">i8").reshape(20, 2)
    b = np.asfortranarray(np.arange(20 * 6, dtype="<f4").reshape(20, 3, 2))
    save(path, a=a, b=b)
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=100, formats=(NumpyOptions(npz_mode="rows"),)))
    assert len(plan.ranges) > 1
    got = read_all(plan)
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)
    plan = plan_inputs(str(path), SourceOptions(formats=(NumpyOptions(npz_mode="arrays"),)))
    got = read_all(plan)
    assert got["key"] == [b"a", b"b"]
    np.testing.assert_array_equal(got["array"][1], b)
    spec = {s.name: s for s in plan.specs}["array"]
    assert spec.dtype is None and spec.shape is None  # int64 (20, 2) and float32 (20, 3, 2) differ


def test_npz_rows_refuses_uneven_members(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, a=np.zeros(3), b=np.zeros(4))
    with pytest.raises(SchemaError, match="npz_mode arrays"):
        plan_inputs(str(path), SourceOptions(format="npz"))


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [">f8", "<i2", ">u4"])
def test_npy_rows_big_endian_and_fortran(tmp_path, order, dtype):
    arr = np.array(np.arange(50 * 4 * 3).reshape(50, 4, 3), dtype=dtype, order=order)
    path = tmp_path / "a.npy"
    np.save(path, arr)
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=200))
    assert len(plan.ranges) > 5
    first = plan.source.read(plan.ranges[1])["array"]
    assert first.dtype == np.dtype(dtype) and first.flags.c_contiguous  # byte order kept until encoding
    got = read_all(plan)["array"]
    np.testing.assert_array_equal(got, arr)


def test_strided_fortran_read_matches_numpy(tmp_path):
    """The seek-per-column path used for remote (non-mmap) .npy files."""
    arr = np.asfortranarray(np.arange(30 * 4 * 5, dtype=">i4").reshape(30, 4, 5))
    path = tmp_path / "f.npy"
    np.save(path, arr)
    with open(path, "rb") as f:
        h = npyformat.read_npy_header(f, str(path))
        assert h.fortran
        np.testing.assert_array_equal(npyformat.read_rows(f, h, 7, 19, str(path)), arr[7:19])


def test_npy_files_mode(tmp_path):
    arrays = {"one": np.arange(3, dtype="<f4"), "two": np.arange(6, dtype="<f4").reshape(2, 3)}
    for k, v in arrays.items():
        np.save(tmp_path / f"{k}.npy", v)
    plan = plan_inputs(str(tmp_path / "*.npy"), SourceOptions(formats=(NumpyOptions(npy_mode="files"),)))
    got = read_all(plan)
    assert got["key"] == [b"one", b"two"]
    np.testing.assert_array_equal(got["array"][1], arrays["two"])
    spec = {s.name: s for s in plan.specs}["array"]
    assert spec.dtype == "<f4" and spec.shape is None


def test_object_npy_is_refused_without_unpickling(tmp_path):
    path = tmp_path / "o.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(SchemaError, match="never unpickled"):
        plan_inputs(str(path), SourceOptions())


def test_row_ranges_cover_every_row_once():
    idx = sources.FileIndex("f", 1001, (), row_bytes=10, chunk_rows=7)
    ranges = sources.plan_row_ranges(idx, 500)
    rows = [i for r in ranges for i in range(r.start, r.stop)]
    assert rows == list(range(1001))
    assert all(r.num_rows == 49 for r in ranges[:-1])  # 50 rows rounded down to a multiple of 7


def test_balanced_shard_plans_cut_at_chunk_aligned_boundaries_and_cover_every_row_once():
    from tfrecord_etl.transforms.collections.sharding import plan_balanced_shards

    files = [
        sources.FileIndex("a.h5", 1001, (), row_bytes=10, chunk_rows=7),
        sources.FileIndex("b.h5", 50, (), row_bytes=30),
        sources.FileIndex("c.h5", 0, (), row_bytes=10),
    ]
    for n in (1, 2, 3, 7, 2000):
        shards = plan_balanced_shards(files, n, 500)
        assert [s.index for s in shards] == list(range(n)) and all(s.num_shards == n for s in shards)
        rows = [(r.path, i) for s in shards for r in s.ranges for i in range(r.start, r.stop)]
        assert rows == [("a.h5", i) for i in range(1001)] + [("b.h5", i) for i in range(50)], n
        assert all(r.num_rows * (10 if r.path == "a.h5" else 30) <= 500 for s in shards for r in s.ranges)
        # every cut inside a.h5 falls on a chunk boundary (multiple of 7 rows) or at its end
        assert all(r.start % 7 == 0 for s in shards for r in s.ranges if r.path == "a.h5")
        if n <= 7:  # equal bytes within one chunk of rows (70 bytes) plus one row of b.h5 (30 bytes)
            sizes = [s.num_bytes for s in shards]
            assert max(sizes) - min(sizes) <= 100, sizes
    # whole-range grouping would give 3 ranges to one shard and 2 to another (a 1.5x spread)
    assert [s.num_rows for s in plan_balanced_shards([files[0]], 2, 50)] == [497, 504]
    assert plan_balanced_shards([sources.FileIndex("m.npz", 3, (), 8, sizes=(8, 9, 10))], 2, 10) is None


def test_shard_plans_are_contiguous_and_balanced():
    from tfrecord_etl.transforms.collections.sharding import plan_shards

    ranges = [sources.RowRange("f", i * 10, i * 10 + 10) for i in range(10)]
    shards = plan_shards(ranges, [100] * 10, 3)
    assert [len(s.ranges) for s in shards] == [3, 4, 3]
    assert [r for s in shards for r in s.ranges] == ranges  # contiguous, in order, each range once
    shards = plan_shards(ranges[:4], [333, 333, 333, 1], 3)
    assert [s.num_rows for s in shards] == [10, 10, 20]
    assert [s.file_name("data", ".tfrecord") for s in shards][0] == "data-00000-of-00003.tfrecord"


# ---------------------------------------------------------------- the source registry


@pytest.mark.parametrize("name,cls", sorted(sources.REGISTRY.items()))
def test_registered_sources_declare_name_suffixes_and_modes(name, cls):
    assert cls.format_name == name and cls.modes and cls.modes[0] in ("rows", "files")
    assert cls.suffixes or name == "files"  # files is chosen with --format only
    assert all(s.startswith(".") and s == s.lower() for s in cls.suffixes)
    for suffix in cls.suffixes:  # every registered suffix selects its source, in any letter case; a shared suffix
        owners = [n for n, c in sources.REGISTRY.items() if suffix in c.suffixes]  # (.nc) the first, unless magic
        assert sources.format_of(f"dir/file{suffix.upper()}", SourceOptions()) == owners[0]
        assert owners[0] == name or cls.magic
    assert isinstance(sources.make_source(name, SourceOptions()), cls)


def test_formats_and_config_choices_come_from_the_registry():
    import typing

    from tfrecord_etl.transforms.config import ConvertConfig

    assert sources.FORMATS == (
        "hdf5",
        "netcdf3",
        "npz",
        "npy",
        "raw",
        "files",
        "matlab",
        "zarr",
        "envi",
        "nifti",
        "parquet",
        "fits",
    )
    choices = typing.get_args(typing.get_args(ConvertConfig.model_fields["format"].annotation)[0])
    assert set(choices) == set(sources.FORMATS)
    suffixes = [s for cls in sources.REGISTRY.values() for s in cls.suffixes]
    shared = {s for s in suffixes if suffixes.count(s) > 1}
    assert shared == {".nc", ".mnc"}  # netCDF-4 / MINC2 (HDF5) and NetCDF-3 / MINC1: the file's magic bytes decide
    assert all(cls.magic for cls in sources.REGISTRY.values() if shared & set(cls.suffixes))


def test_unknown_suffix_names_the_registered_ones():
    """Every registered format's first suffix and name, in registry order (the first formats spelled out: the list is
    the registry's, so a new format needs no line here)."""
    suffixes = "/".join(cls.suffixes[0] for cls in sources.REGISTRY.values() if cls.suffixes)
    with pytest.raises(SourceError) as e:
        sources.format_of("data.csv", SourceOptions())
    assert f"name it {suffixes} or pass --format one of {sources.FORMATS}" in str(e.value)
    assert suffixes.startswith(".h5/.nc/.npz/.npy/.raw/.mat/.zarr/.img")
    assert sources.FORMATS[:9] == ("hdf5", "netcdf3", "npz", "npy", "raw", "files", "matlab", "zarr", "envi")
