"""Real third-party files (PyTables, pvlib, matplotlib, numpy test data) convert and read back byte-exact.

The files are installed by run_tests.sh with `pip install --no-deps --target .fixtures/site ...`.
"""

from __future__ import annotations

import pathlib

import h5py
import numpy as np
import pytest

from tests.conftest import convert, fixture_file
from tfrecord_etl.transforms import reader

TABLES = "tables/tests/"
SAMPLE_DATA = "matplotlib/mpl-data/sample_data/"


def converted(tmp_path, source, *flags):
    out = tmp_path / "out"
    code, _, err = convert(source, out, *flags)
    assert code == 0, err
    return list(reader.iter_numpy(str(out)))


def assert_rows_equal(expected: np.ndarray, examples, name):
    got = np.stack([e[name] for e in examples])
    assert got.shape == expected.shape
    if expected.dtype.kind == "V":
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
    else:
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == expected.dtype.newbyteorder("<") or expected.dtype.itemsize == 1


@pytest.mark.parametrize("kind", ["f64", "i32", "i64"])
def test_big_endian_files_equal_their_little_endian_twins(tmp_path, kind):
    be, le = fixture_file(f"{TABLES}smpl_{kind}be.h5"), fixture_file(f"{TABLES}smpl_{kind}le.h5")
    with h5py.File(be) as f:
        source = f["TestArray"][()]
    assert source.dtype.byteorder == ">"
    got_be = converted(tmp_path / "be", be)
    got_le = converted(tmp_path / "le", le)
    assert_rows_equal(source, got_be, "TestArray")
    assert [e["TestArray"].tobytes() for e in got_be] == [e["TestArray"].tobytes() for e in got_le]


@pytest.mark.parametrize(
    "name,dataset", [("smpl_compound_chunked.h5", "CompoundChunked"), ("ex-noattr.h5", "detector/table")]
)
def test_compound_tables_one_feature_per_field(tmp_path, name, dataset):
    path = fixture_file(TABLES + name)
    with h5py.File(path) as f:
        dset = f[dataset]
        table = dset[()]
    examples = converted(tmp_path, path, "--datasets", "/" + dataset)
    assert len(examples) == len(table)
    for field in table.dtype.names:
        assert_rows_equal(table[field], examples, f"{dataset}/{field}")


def test_szip_dataset(tmp_path):
    path = fixture_file(TABLES + "test_szip.h5")
    with h5py.File(path) as f:
        (name,) = list(f.keys())
        data = f[name][()]
    assert_rows_equal(data, converted(tmp_path, path), name)


def test_jacksboro_npz_arrays_mode_with_scalars(tmp_path):
    path = fixture_file(SAMPLE_DATA + "jacksboro_fault_dem.npz")
    with np.load(path) as npz:
        members = {k: npz[k] for k in npz.files}
    examples = converted(tmp_path, path, "--npz_mode", "arrays")
    got = {e["key"].item().decode(): e["array"] for e in examples}
    assert set(got) == set(members)
    for k, v in members.items():
        assert got[k].shape == v.shape and got[k].dtype == v.dtype
        assert got[k].tobytes() == v.tobytes()


def test_goog_npz_structured_with_datetime_rows_mode(tmp_path):
    path = fixture_file(SAMPLE_DATA + "goog.npz")
    with np.load(path) as npz:
        prices = npz["price_data"]
    examples = converted(tmp_path, path, "--provenance")
    examples.sort(key=lambda e: int(e["_source/row"]))
    for field in prices.dtype.names:
        assert_rows_equal(prices[field], examples, f"price_data/{field}")
    assert examples[0]["price_data/date"].dtype == np.dtype("<M8[D]")


def test_linke_turbidities_gzip_demo_input(tmp_path):
    path = fixture_file("pvlib/data/LinkeTurbidities.h5")
    out = tmp_path / "out"
    code, _, err = convert(path, out, "--provenance", "--target_range_mb", "16", "--compression", "gzip")
    assert code == 0, err
    seen = 0
    with h5py.File(path) as f:
        dset = f["LinkeTurbidity"]
        for e in reader.iter_numpy(str(out), features=["LinkeTurbidity", "_source/row"]):
            row = int(e["_source/row"])
            if row % 97 == 0:
                np.testing.assert_array_equal(e["LinkeTurbidity"], dset[row])
            seen += 1
    assert seen == 2160


@pytest.mark.parametrize(
    "relative,error,words",
    [
        (TABLES + "Tables_lzo1.h5", "SourceError", "filter 305"),
        (TABLES + "times-nested-be.h5", "SchemaError", "TypeTimeID"),
        (TABLES + "float.h5", "SchemaError", "float128"),
    ],
)
def test_real_unsupported_hdf5_files_are_refused(tmp_path, capsys, relative, error, words):
    out = tmp_path / "out"
    code, _, err = convert(fixture_file(relative), out, capsys=capsys)
    assert code == 2
    assert error in err and words in err and relative.split("/")[-1] in err
    assert not (out / "metadata.json").exists()


def test_numpy_pickled_object_array_is_refused(tmp_path, capsys):
    objarr = pathlib.Path(np.__file__).parent / "lib" / "tests" / "data" / "py2-objarr.npy"
    code, _, err = convert(objarr, tmp_path / "out", capsys=capsys)
    assert code == 2 and "never unpickled" in err and "py2-objarr.npy" in err
