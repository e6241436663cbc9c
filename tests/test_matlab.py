"""MATLAB v4/v6/v7 .mat files (scipy.io.loadmat) convert to the same records as their v7.3 twins (HDF5, h5py).

Real twins: pymatreader's v7/v7.3 pairs (its sdist, fetched by .ci/env.sh) and SciPy's testdouble files of MATLAB
4.2c-7.4 beside its one v7.3 file. SciPy's other shipped test files get a v7.3 twin written by hdf5storage (a
MATLAB v7.3 writer) from scipy.io.loadmat's values. Expected values come from loadmat / h5py, never our reader.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import scipy
import scipy.io
import scipy.sparse
from scipy.io import loadmat, savemat

from tests.conftest import convert, fixture_file, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import metadata

SCIPY_MAT = os.path.join(os.path.dirname(scipy.__file__), "io", "matlab", "tests", "data")
MATLAB = "pymatreader-tests/"


def converted(tmp_path, source, *flags, name="out", capsys=None):
    out = tmp_path / name
    code, _, err = convert(source, out, *flags, capsys=capsys)
    assert code == 0, err
    return out


def assert_same_records(a, b):
    """Both outputs hold the same shard files, byte for byte, and the same schema."""
    meta = [metadata.load(str(d)) for d in (a, b)]
    names = [s["file"] for s in meta[0]["shards"]]
    assert names and names == [s["file"] for s in meta[1]["shards"]]
    for name in names + ["schema.pbtxt"]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert [s.to_json() for s in meta[0]["features"]] == [s.to_json() for s in meta[1]["features"]]


def verified(out, source, *flags):
    from tfrecord_etl.pipelines import verify

    code, _, err = run_command(verify.main, [str(out), "--source", str(source), *flags])
    assert code == 0, err


def by_key(out) -> dict:
    return {np.asarray(e["key"]).item().decode(): e["array"] for e in reader.iter_numpy(str(out))}


@pytest.mark.parametrize("mode", ["rows", "datasets"])
def test_pymatreader_v7_equals_its_v73_twin_record_for_record(tmp_path, mode):
    flags = ["--container_mode", mode]
    v7 = converted(tmp_path, fixture_file(MATLAB + "v7.mat"), *flags, name="v7")
    v73 = converted(tmp_path, fixture_file(MATLAB + "v73.mat"), *flags, name="v73")
    assert_same_records(v7, v73)
    verified(v7, fixture_file(MATLAB + "v7.mat"))
    twin = loadmat(fixture_file(MATLAB + "v7.mat"))  # an independent read of the values
    if mode == "rows":  # the 100-row group: MATLAB's rows of a_matrix and the struct's matrices beside it
        rows = list(reader.iter_numpy(str(v7)))
        np.testing.assert_array_equal(np.stack([e["a_matrix"] for e in rows]), twin["a_matrix"])
        np.testing.assert_array_equal(
            np.stack([e["a_struct/second_level/matrix"] for e in rows]),
            twin["a_struct"][0, 0]["second_level"][0, 0]["matrix"],
        )
        return
    got = by_key(v7)
    for name in ("a_complex_matrix", "a_complex_3d_single_matrix", "a_unit64"):
        assert got[f"/{name}"].dtype == twin[name].dtype.newbyteorder("<"), name
        np.testing.assert_array_equal(got[f"/{name}"], twin[name])
    for k, cell in enumerate(twin["a_cell_array"].ravel(order="F"), 1):
        np.testing.assert_array_equal(got[f"/a_cell_array{{{k}}}"], cell)
    assert got["/a_string"].dtype.kind == "U" and got["/a_string"].tolist() == list(twin["a_string"])  # char: strings


def test_pymatreader_cells_and_struct_arrays_equal_their_v73_twin(tmp_path):
    v7 = converted(tmp_path, fixture_file(MATLAB + "cell_struct_v7.mat"), name="v7")  # auto: each cell one Example
    v73 = converted(tmp_path, fixture_file(MATLAB + "cell_struct_v73.mat"), name="v73")
    assert_same_records(v7, v73)
    structs = loadmat(fixture_file(MATLAB + "cell_struct_v7.mat"))["a_struct_array"].ravel(order="F")
    got = by_key(v7)
    for k in range(1, 6):
        np.testing.assert_array_equal(got[f"/a_struct_array/matrix{{{k}}}"], structs[k - 1]["matrix"])
    verified(v7, fixture_file(MATLAB + "cell_struct_v7.mat"))


def test_scipy_testdouble_of_matlab_4_to_7_equals_the_v73_file(tmp_path):
    v73 = converted(tmp_path, os.path.join(SCIPY_MAT, "testhdf5_7.4_GLNX86.mat"), name="v73")  # testdouble, 1x9
    for version in ("4.2c_SOL2", "6.1_SOL2", "6.5.1_GLNX86", "7.1_GLNX86", "7.4_GLNX86"):  # v4, v6 big-endian, v7
        out = converted(tmp_path, os.path.join(SCIPY_MAT, f"testdouble_{version}.mat"), name=version)
        assert_same_records(out, v73)


# SciPy's shipped v4/v6/v7 files of arrays, chars, logicals, cells and structs (sparse, objects and functions apart)
SCIPY_TWINS = (
    [
        f"{name}_{version}"
        for name in (
            "testmatrix",
            "test3dmatrix",
            "testcomplex",
            "testminus",
            "teststring",
            "teststringarray",
            "testonechar",
            "testcell",
            "teststruct",
            "teststructarr",
            "teststructnest",
            "testcellnest",
        )
        for version in ("7.4_GLNX86",)
    ]
    + [
        f"{name}_6.1_SOL2"
        for name in (  # big-endian, uncompressed
            "testmatrix",
            "testcomplex",
            "teststringarray",
            "teststruct",
            "testcell",
        )
    ]
    + [
        "testemptycell_5.3_SOL2",
        "testemptycell_7.4_GLNX86",
        "testmatrix_4.2c_SOL2",
        "testcomplex_4.2c_SOL2",
        "teststringarray_4.2c_SOL2",
        "testmulti_7.1_GLNX86",
        "testunicode_7.4_GLNX86",
        "testbool_8_WIN64",
        "testscalarcell_7.4_GLNX86",
        "testsimplecell",
        "big_endian",
        "little_endian",
        "miuint32_for_miint32",
    ]
)


def in_class(typed, plain):
    """loadmat's value in its MATLAB class (``typed``: read with mat_dtype=True; MATLAB stores a double array of
    small integers as uint8 bytes), complex values taken from ``plain`` (read without it, which keeps them)."""
    if type(plain) is np.ndarray and plain.dtype.kind == "c":
        return plain.astype(np.result_type(typed.dtype, np.complex64))
    if type(typed) is not np.ndarray or (typed.dtype.kind != "O" and not typed.dtype.names):
        return typed
    out = typed.copy()
    for i in np.ndindex(typed.shape):
        if typed.dtype.names:
            for n in typed.dtype.names:
                out[i][n] = in_class(typed[i][n], plain[i][n])
        else:
            out[i] = in_class(typed[i], plain[i])
    return out


def write_v73_twin(v5_path, path) -> None:
    """A MATLAB v7.3 file (hdf5storage) holding what scipy.io.loadmat reads from ``v5_path`` in MATLAB's classes:
    chars as char arrays, cells and structs as MATLAB's."""
    import hdf5storage

    with warnings.catch_warnings():  # mat_dtype drops imaginary parts (with a ComplexWarning): taken from plain
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        typed = loadmat(v5_path, chars_as_strings=False, mat_dtype=True)
    plain = loadmat(v5_path, chars_as_strings=False)
    values = {k: in_class(v, plain[k]) for k, v in typed.items() if not k.startswith("__")}
    hdf5storage.savemat(str(path), values, format="7.3", matlab_compatible=True, oned_as="row")


@pytest.mark.parametrize("name", SCIPY_TWINS)
def test_scipy_mat_files_equal_their_v73_twins(tmp_path, name, caplog):
    source = os.path.join(SCIPY_MAT, f"{name}.mat")
    write_v73_twin(source, tmp_path / "twin.mat")
    for mode in ("auto", "datasets"):
        with caplog.at_level("WARNING", logger="tfrecord_etl"):
            v5 = converted(tmp_path, source, "--container_mode", mode, name=f"v5-{mode}")
            v73 = converted(tmp_path, tmp_path / "twin.mat", "--container_mode", mode, name=f"v73-{mode}")
        assert_same_records(v5, v73)
    said = " ".join(r.getMessage().replace(str(tmp_path / "twin.mat"), source) for r in caplog.records)
    assert "sparse" not in said and "unsupported" not in said


def test_plain_tensorflow_reads_a_v5_conversion(tmp_path):
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    source = os.path.join(SCIPY_MAT, "teststringarray_6.1_SOL2.mat")  # big-endian SPARC, a 3x5 char array
    out = converted(tmp_path, source)
    expected = loadmat(source, chars_as_strings=False)["teststringarray"]  # 3 rows of 5 characters
    spec = reader.tf_feature_spec(str(out))
    shards = sorted(str(p) for p in out.glob("*.tfrecord"))
    rows = [tf.io.parse_single_example(r, spec)["teststringarray"].numpy() for r in tf.data.TFRecordDataset(shards)]
    assert [np.asarray(r).item().decode() for r in rows] == ["".join(row) for row in expected]  # one string per row


def test_complex_logical_int_and_char_values_in_cells_and_structs(tmp_path):
    """Complex arrays inside cells and structs keep their imaginary part (SciPy's mat_dtype would drop it);
    logical -> uint8, char -> strings, int classes as they are; records equal the v7.3 twin's."""
    import hdf5storage

    cells = np.empty((1, 3), object)
    cells[0, 0], cells[0, 1], cells[0, 2] = np.array([[5 - 6j]]), np.array([["h", "i"]]), np.array([[True]])
    values = {
        "z": np.array([[1 + 2j, 3 - 4j]]),
        "zs": np.array([[1.5 - 1j]], np.complex64),
        "mask": np.array([[True, False, True]]),
        "i16": np.arange(6, dtype=np.int16).reshape(3, 2),
        "c": cells,
        "s": {"w": np.array([[2j, 1.0]], np.complex64), "u": np.arange(4, dtype=np.uint32).reshape(2, 2)},
    }
    savemat(tmp_path / "v5.mat", values, do_compression=True)
    hdf5storage.savemat(str(tmp_path / "v73.mat"), values, format="7.3", matlab_compatible=True)
    for mode in ("rows", "datasets"):
        a = converted(tmp_path, tmp_path / "v5.mat", "--container_mode", mode, name=f"v5-{mode}")
        b = converted(tmp_path, tmp_path / "v73.mat", "--container_mode", mode, name=f"v73-{mode}")
        assert_same_records(a, b)
    got = by_key(tmp_path / "v5-datasets")
    np.testing.assert_array_equal(got["/c{1}"], [[5 - 6j]])
    np.testing.assert_array_equal(got["/s/w"], values["s"]["w"])
    assert got["/s/w"].dtype == np.complex64 and got["/mask"].dtype == np.uint8 and got["/c{2}"].dtype == "<U2"
    assert got["/c{2}"].tolist() == ["hi"]
    np.testing.assert_array_equal(got["/mask"], [[1, 0, 1]])


SPARSE_FILES = [
    "testsparse_4.2c_SOL2",
    "testsparsecomplex_4.2c_SOL2",
    "testsparse_6.1_SOL2",  # big-endian; SciPy loads its values as uint8: they come back double
    "testsparsecomplex_6.1_SOL2",
    "testsparse_6.5.1_GLNX86",
    "testsparse_7.1_GLNX86",
    "testsparse_7.4_GLNX86",
    "testsparsecomplex_7.4_GLNX86",
    "testsparsefloat_7.4_GLNX86",
    "logical_sparse",
]


@pytest.mark.parametrize("name", SPARSE_FILES)
def test_sparse_matrices_convert_dense_exactly(tmp_path, capsys, name):
    """Was: 'The file holds no variable with rows (skipped matlab-sparse: /testsparse)' (rows mode) and 'The file
    holds no variable to convert' (datasets mode). A sparse matrix converts as full(S): rows are MATLAB's first
    dimension, values exactly scipy.io.loadmat's toarray(), in MATLAB's class (double, complex, logical)."""
    from tfrecord_etl.pipelines import inspect, verify

    source = os.path.join(SCIPY_MAT, f"{name}.mat")
    (var, expected), *others = [(k, v) for k, v in loadmat(source).items() if not k.startswith("__")]
    assert not others and scipy.sparse.issparse(expected)
    expected = expected.toarray()
    dtype = {"b": np.uint8, "c": np.complex128}.get(expected.dtype.kind, np.float64)
    out = converted(tmp_path, source, capsys=capsys)
    got = np.stack([e[var] for e in reader.iter_numpy(str(out))])
    assert got.dtype == dtype and got.shape == expected.shape and np.array_equal(got, expected)
    out = converted(tmp_path, source, "--container_mode", "datasets", name="datasets", capsys=capsys)
    (example,) = reader.iter_numpy(str(out))
    assert example["key"].item() == f"/{var}".encode() and example["array"].dtype == dtype
    assert np.array_equal(example["array"], expected)
    code, out_text, err = run_command(verify.main, [tmp_path / "out", "--source", source], capsys)
    assert code == 0, out_text + err
    code, out_text, err = run_command(inspect.main, [source], capsys)  # inspect agrees: one row group, the matrix
    assert code == 0 and f"group 1: {expected.shape[0]} rows, 1 dataset" in out_text and "skipped" not in out_text


def test_a_sparse_matrix_beside_arrays_and_over_the_limit(tmp_path, capsys, caplog, monkeypatch):
    """A sparse matrix joins the row group of its rows; its dense size is checked from the header before anything is
    loaded (--max_mat_variable_mb), with the find(S) triplets as the way out; one inside a struct stays skipped."""
    eye = scipy.sparse.eye(3, format="csc")
    savemat(tmp_path / "mixed.mat", {"x": np.arange(6.0).reshape(3, 2), "sp": eye, "s": {"inner": eye}})
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        out = converted(tmp_path, tmp_path / "mixed.mat", capsys=capsys)
    assert "1 matlab-sparse (/s/inner)" in " ".join(r.getMessage() for r in caplog.records)
    examples = list(reader.iter_numpy(str(out)))
    np.testing.assert_array_equal([e["sp"] for e in examples], np.eye(3))
    np.testing.assert_array_equal([e["x"] for e in examples], np.arange(6.0).reshape(3, 2))
    savemat(tmp_path / "big.mat", {"S": scipy.sparse.eye(1024, format="csc")}, do_compression=True)  # 8 MiB dense
    monkeypatch.setattr(scipy.io, "loadmat", lambda *a, **k: pytest.fail("loadmat called"))
    for mode in ("rows", "datasets"):
        code, _, err = convert(
            tmp_path / "big.mat", tmp_path / mode, "--container_mode", mode, "--max_mat_variable_mb", "1", capsys=capsys
        )
        assert code == 2 and "The sparse matrix converts dense (full(S), 1024 x 1024 float64)" in err, err
        assert "8,388,608 bytes" in err and "'/S'" in err and "find(S)" in err and "big.mat" in err


def test_a_variable_over_the_size_limit_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    savemat(
        tmp_path / "big.mat",
        {"x": np.zeros((4096, 64)), "c": np.array([[np.zeros((512, 512))]], object)},
        do_compression=True,
    )  # 2 MiB each, compressed to a few KiB
    import scipy.io

    loaded = []
    monkeypatch.setattr(scipy.io, "loadmat", lambda *a, **k: loaded.append(a) or pytest.fail("loadmat called"))
    code, _, err = convert(tmp_path / "big.mat", tmp_path / "out", "--max_mat_variable_mb", "1", capsys=capsys)
    assert code == 2 and "'/x'" in err and "big.mat" in err
    assert "holds 2,097,152 bytes (2.0 MiB), over the limit of 1 MiB" in err and "--max_mat_variable_mb" in err
    code, _, err = convert(
        tmp_path / "big.mat",
        tmp_path / "cells",
        "--container_mode",
        "datasets",
        "--datasets",
        "c",
        "--max_mat_variable_mb",
        "1",
        capsys=capsys,
    )
    assert code == 2 and "over the limit of 1 MiB" in err and "'/c'" in err  # inflated and counted, not loaded
    assert not loaded and not (tmp_path / "out").exists()
    monkeypatch.undo()
    out = converted(tmp_path, tmp_path / "big.mat", "--max_mat_variable_mb", "3", name="raised")
    assert sum(1 for _ in reader.iter_numpy(str(out))) == 4096


def test_unreadable_and_foreign_mat_files_say_what_they_are(tmp_path, capsys):
    source = fixture_file(MATLAB + "v7.mat")
    cut = tmp_path / "cut.mat"
    cut.write_bytes(source.read_bytes()[:3000])
    code, _, err = convert(cut, tmp_path / "a", capsys=capsys)
    assert code == 2 and "cut.mat" in err and ("Not a readable MATLAB" in err or "Cannot read" in err)
    code, _, err = convert(source, tmp_path / "b", "--format", "hdf5", capsys=capsys)  # was: signature not found
    assert code == 2 and "it is a MATLAB v5/v7 .mat file: use --format matlab" in err
    code, _, err = convert(fixture_file(MATLAB + "v73.mat"), tmp_path / "c", "--format", "matlab", capsys=capsys)
    assert code == 2 and "it is an HDF5 file" in err and "use --format hdf5" in err
    from tfrecord_etl.pipelines import inspect, verify

    code, out, err = run_command(inspect.main, [source], capsys)  # inspect lists the variables and row groups
    assert code == 0 and out.startswith("MATLAB v4-v7 .mat file") and "/a_struct/second_level/matrix" in out
    assert (
        "group 1: 100 rows, 3 datasets" in out and "[MATLAB cell: --container_mode datasets converts each cell]" in out
    )
    code, out, _ = run_command(verify.main, [source], capsys)
    assert code == 1 and "it starts like a MATLAB v5/v7 .mat file" in out


def test_row_groups_datasets_and_row_group_as_for_v73(tmp_path, capsys):
    v7, v73 = fixture_file(MATLAB + "v7.mat"), fixture_file(MATLAB + "v73.mat")
    for flags in (["--row_group", "2"], ["--datasets", "/a_float,a_struct/int"]):
        assert_same_records(converted(tmp_path, v7, *flags, name="a"), converted(tmp_path, v73, *flags, name="b"))
        for d in ("a", "b"):
            import shutil

            shutil.rmtree(tmp_path / d)
    code, _, err = convert(v7, tmp_path / "x", "--datasets", "a_cell_array", capsys=capsys)
    assert code == 2 and "cell array" in err and "--container_mode datasets" in err
    code, _, err = convert(v7, tmp_path / "y", "--datasets", "nope", capsys=capsys)
    assert code == 2 and "No such variable" in err and "dataset='nope'" in err
    code, _, err = convert(v7, tmp_path / "z", "--datasets", "a_struct", capsys=capsys)
    assert code == 2 and "a struct? name its fields" in err
