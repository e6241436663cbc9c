"""MATLAB v7.3 sparse matrices convert as their dense twin full(S), as v4-v7 ones do: the same records, byte for byte,
as the v5 file of the same matrix; the same size bound and message; inspect describes them alike.

hdf5storage cannot write a sparse matrix (NotImplementedError for csc_matrix) and no package here ships a v7.3
sparse file, so the v7.3 files are written with h5py in MATLAB's layout (MathWorks, "MAT-File Versions"; what
MATLAB's ``save -v7.3`` writes): a 512-byte user block with MATLAB's header text; the variable a group with the
attributes ``MATLAB_class`` (``double`` or ``logical``) and ``MATLAB_sparse`` (uint64: the number of rows), holding
``data`` (the nonzeros; a ``real``/``imag`` compound when complex; uint8 when logical), ``ir`` (their 0-based rows,
uint64) and ``jc`` (uint64 column starts, one more than the columns); an all-zero matrix has ``jc`` only.
"""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import scipy.io
import scipy.sparse
from scipy.io import loadmat, savemat

from tests.conftest import convert, run_command
from tests.test_matlab import SCIPY_MAT, SPARSE_FILES, assert_same_records, converted
from tfrecord_etl.transforms import reader


def write_v73(path, variables: dict) -> None:
    """A MATLAB v7.3 file of ``variables``: scipy.sparse matrices in MATLAB's sparse layout (see the module
    docstring), dense 2-D float arrays as MATLAB's column-major datasets."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, value in variables.items():
            if not scipy.sparse.issparse(value):
                f.create_dataset(name, data=np.asarray(value, np.float64).T).attrs["MATLAB_class"] = np.bytes_("double")
                continue
            S = scipy.sparse.csc_matrix(value)
            S.sort_indices()
            logical = S.dtype == bool
            group = f.create_group(name)
            group.attrs["MATLAB_class"] = np.bytes_("logical" if logical else "double")
            group.attrs["MATLAB_sparse"] = np.uint64(S.shape[0])
            if S.nnz:
                data = S.data.astype(np.uint8 if logical else np.result_type(S.dtype, np.float64))
                if data.dtype.kind == "c":
                    pairs = np.empty(data.shape, [("real", "<f8"), ("imag", "<f8")])
                    pairs["real"], pairs["imag"] = data.real, data.imag
                    data = pairs
                group.create_dataset("data", data=data)
                group.create_dataset("ir", data=S.indices.astype(np.uint64))
            group.create_dataset("jc", data=S.indptr.astype(np.uint64))
    with open(path, "r+b") as f:
        f.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Dec  7 18:00:00 2026 HDF5 schema 1.00 .")


def from_hdf5(path, name) -> np.ndarray:
    """The dense matrix of the v7.3 sparse variable ``name``, read with h5py and SciPy alone (the reference)."""
    with h5py.File(path, "r") as f:
        g = f[name]
        shape = (int(g.attrs["MATLAB_sparse"]), len(g["jc"]) - 1)
        data = g["data"][()] if "data" in g else np.zeros(0)
        if data.dtype.names:
            data = data["real"] + 1j * data["imag"]
        ir = g["ir"][()] if "ir" in g else np.zeros(0, np.int64)
        return scipy.sparse.csc_matrix((data, ir, g["jc"][()]), shape=shape).toarray()


def inspect_line(path, var, capsys) -> str:
    from tfrecord_etl.pipelines import inspect

    code, out, err = run_command(inspect.main, [str(path)], capsys)
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"  /{var} ")]
    return line


@pytest.mark.parametrize("name", SPARSE_FILES)
def test_v73_sparse_matrices_convert_as_their_v5_twins(tmp_path, capsys, name):
    """Was: the group's compressed-column arrays converted as rows (/S/data and /S/ir, the largest row group),
    the matrix itself nowhere. Now each of SciPy's MATLAB-written sparse files (v4, v6, v7; double, complex,
    logical) and its v7.3 twin give the same records byte for byte in both modes; the rows are exactly
    csc_matrix((data, ir, jc), shape).toarray() of the v7.3 file (MATLAB's rows: no transposition left over);
    verify --source agrees; inspect describes the variable with the v5 file's dtype, shape and class."""
    from tfrecord_etl.pipelines import verify

    source = os.path.join(SCIPY_MAT, f"{name}.mat")
    ((var, matrix),) = [(k, v) for k, v in loadmat(source).items() if not k.startswith("__")]
    twin = tmp_path / "twin.mat"
    write_v73(twin, {var: matrix})
    expected = from_hdf5(twin, var)
    assert np.array_equal(expected, matrix.toarray())
    for mode in ("auto", "datasets"):
        v5 = converted(tmp_path, source, "--container_mode", mode, name=f"v5-{mode}", capsys=capsys)
        v73 = converted(tmp_path, twin, "--container_mode", mode, name=f"v73-{mode}", capsys=capsys)
        assert_same_records(v5, v73)
    got = np.stack([e[var] for e in reader.iter_numpy(str(tmp_path / "v73-auto"))])
    dtype = {"b": np.uint8, "c": np.complex128}.get(matrix.dtype.kind, np.float64)
    assert got.dtype == dtype and got.shape == expected.shape and np.array_equal(got, expected)
    code, out, err = run_command(verify.main, [str(tmp_path / "v73-auto"), "--source", str(twin)], capsys)
    assert code == 0, out + err
    v5_line, v73_line = inspect_line(source, var, capsys), inspect_line(twin, var, capsys)
    assert v5_line.split()[:3] == v73_line.split()[:3]  # path, dtype, MATLAB shape
    assert v5_line.split("class ")[1] == v73_line.split("class ")[1]  # class sparse (converted dense: full(S))


def test_v73_sparse_beside_arrays_all_zero_named_and_over_the_limit(tmp_path, capsys, monkeypatch):
    """A v7.3 sparse matrix joins the row group of its rows with dense variables and an all-zero sparse matrix (no
    data, no ir), as in the v5 file savemat writes of the same values (same records; a 0 x 3 one skipped as empty
    in both, and listed alike by inspect); --datasets names it; its dense size is checked against
    --max_mat_variable_mb before anything is read, with the v5 file's message."""
    rng = np.random.default_rng(7)
    a = rng.random((5, 3))
    a[a < 0.5] = 0
    values = {
        "a": scipy.sparse.csc_matrix(a),
        "x": np.arange(10.0).reshape(5, 2),
        "z": scipy.sparse.csc_matrix((5, 4)),
        "mask": scipy.sparse.csc_matrix(a > 0.8),
        "e": scipy.sparse.csc_matrix((0, 3)),  # empty: skipped in both files
    }
    savemat(tmp_path / "v5.mat", values)
    write_v73(tmp_path / "v73.mat", values)
    for i, flags in enumerate([(), ("--datasets", "/a,/z"), ("--container_mode", "datasets")]):
        v5 = converted(tmp_path, tmp_path / "v5.mat", *flags, name=f"v5-{i}", capsys=capsys)
        v73 = converted(tmp_path, tmp_path / "v73.mat", *flags, name=f"v73-{i}", capsys=capsys)
        assert_same_records(v5, v73)
    examples = list(reader.iter_numpy(str(tmp_path / "v73-0")))
    np.testing.assert_array_equal(np.stack([e["a"] for e in examples]), a)
    np.testing.assert_array_equal(np.stack([e["z"] for e in examples]), np.zeros((5, 4)))
    np.testing.assert_array_equal(np.stack([e["mask"] for e in examples]), (a > 0.8).astype(np.uint8))
    np.testing.assert_array_equal(np.stack([e["x"] for e in examples]), values["x"])
    assert sorted(examples[0]) == ["a", "mask", "x", "z"]
    empty = [inspect_line(tmp_path / f, "e", capsys) for f in ("v5.mat", "v73.mat")]
    assert empty[0].split()[:3] == empty[1].split()[:3] == ["/e", "-", "[]"]
    assert empty[0].split("class ")[1] == empty[1].split("class ")[1]  # ... [matlab-empty: skipped by convert]

    big = {"S": scipy.sparse.eye(1024, format="csc")}  # 8 MiB dense
    savemat(tmp_path / "big5.mat", big)
    write_v73(tmp_path / "big73.mat", big)
    monkeypatch.setattr(scipy.sparse, "csc_matrix", lambda *a, **k: pytest.fail("the matrix was read"))
    for mode in ("rows", "datasets"):
        errors = []
        for file in ("big5.mat", "big73.mat"):
            code, _, err = convert(
                tmp_path / file, tmp_path / f"{mode}-{file}", "--container_mode", mode, "--max_mat_variable_mb", "1",
                capsys=capsys,
            )  # fmt: skip
            assert code == 2 and "The sparse matrix converts dense (full(S), 1024 x 1024 float64)" in err, err
            assert "8,388,608 bytes" in err and "'/S'" in err and "find(S)" in err and file in err
            errors.append(err.replace(file, "FILE"))
        assert errors[0] == errors[1]


def test_a_damaged_v73_sparse_matrix_is_refused_in_one_line(tmp_path, capsys):
    """Row indices beyond MATLAB_sparse's rows, or data and ir of different lengths: one line naming the file and
    the variable, exit 2, nothing written."""
    write_v73(tmp_path / "bad.mat", {"S": scipy.sparse.eye(3, format="csc")})
    with h5py.File(tmp_path / "bad.mat", "r+") as f:
        f["S"].attrs["MATLAB_sparse"] = np.uint64(2)  # row index 2 is out of range now
    code, _, err = convert(tmp_path / "bad.mat", tmp_path / "out", capsys=capsys)
    assert code == 2, err
    assert "The MATLAB sparse matrix cannot be read: its ir and jc arrays do not describe a 2 x 3 matrix" in err
    assert "bad.mat" in err and "'/S'" in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.tfrecord"))
    with h5py.File(tmp_path / "bad.mat", "r+") as f:
        f["S"].attrs["MATLAB_sparse"] = np.uint64(3)
        del f["S/ir"]
        f["S"].create_dataset("ir", data=np.zeros(2, np.uint64))
    code, _, err = convert(tmp_path / "bad.mat", tmp_path / "out2", capsys=capsys)
    assert code == 2 and "its data and ir datasets differ in length" in err and "'/S'" in err, err
