"""Container files with default options: row groups of HDF5 files, ``--container_mode datasets``, MATLAB v7.3
(column-major variables, cell arrays through object references), NetCDF-3 through SciPy, Keras weight files.

Files here are generated with the format's own writer where one is installed (SciPy's netcdf_file, Keras'
save_weights) or laid out as MATLAB writes them (user block, ``MATLAB_class``, ``/#refs#``); the real third-party
files are in tests/test_real_containers.py.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.conftest import convert, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import metadata


@pytest.fixture(scope="module")
def tf():
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def by_key(out) -> dict:
    return {np.asarray(e["key"]).item().decode(): e["array"] for e in reader.iter_numpy(str(out))}


def plain_tf_records(out, tf) -> list:
    """Every record of ``out`` parsed with plain TensorFlow and ``reader.tf_feature_spec``."""
    spec = reader.tf_feature_spec(str(out))
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    rows = []
    for serialized in tf.data.TFRecordDataset(files):
        parsed = tf.io.parse_single_example(serialized, spec)
        rows.append({k: v.numpy() for k, v in parsed.items() if not isinstance(v, tf.SparseTensor)})
    return rows


# ------------------------------------------------------------------------------------------ MATLAB v7.3


def matlab_file(path, nested_cell=False):
    """A MATLAB v7.3 layout: 512-byte user block with MATLAB's text, variables stored transposed with
    MATLAB_class, a 1x3 cell array of references into /#refs#, an empty array, a struct."""
    A = np.arange(20.0).reshape(4, 5)  # MATLAB 4x5
    labels = np.array([[1], [2], [3], [4]], dtype=np.int32)  # MATLAB 4x1 column vector
    cells = [np.arange(6.0).reshape(2, 3), np.array([[7, 8]], np.int16), np.eye(3, dtype=np.uint8)]
    with h5py.File(path, "w", userblock_size=512) as f:

        def var(where, name, value, cls):
            d = where.create_dataset(name, data=np.asarray(value).T)
            d.attrs["MATLAB_class"] = np.bytes_(cls)
            return d

        var(f, "A", A, "double")
        var(f, "labels", labels, "int32")
        refs = f.create_group("#refs#")
        targets = [
            var(refs, f"r{i}", c, {"f": "double", "i": "int16", "u": "uint8"}[c.dtype.kind])
            for i, c in enumerate(cells)
        ]
        if nested_cell:
            inner = refs.create_dataset("inner", data=np.array([[targets[0].ref]]), dtype=h5py.ref_dtype)
            inner.attrs["MATLAB_class"] = np.bytes_("cell")
            targets[2] = inner
        c = f.create_dataset("c", data=np.array([[t.ref] for t in targets]), dtype=h5py.ref_dtype)  # 1x3 cell
        c.attrs["MATLAB_class"] = np.bytes_("cell")
        sub = f.create_group("#subsystem#")  # MATLAB's own storage (class objects): never a variable
        sub.create_dataset("MCOS", data=np.arange(3, dtype=np.uint8)).attrs["MATLAB_class"] = np.bytes_("FileWrapper__")
        e = f.create_dataset("empty", data=np.array([0, 0], np.uint64))
        e.attrs["MATLAB_class"], e.attrs["MATLAB_empty"] = np.bytes_("double"), np.uint8(1)
        s = f.create_group("s")
        s.attrs["MATLAB_class"] = np.bytes_("struct")
        var(s, "w", np.arange(8.0).reshape(4, 2), "double")  # s.w: 4x2, the same 4 rows as A
    with open(path, "r+b") as fh:
        fh.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Tue Nov 24 2026 HDF5 schema 1.00 .")
    return A, labels, cells


def test_matlab_variables_convert_in_matlab_orientation_by_default(tmp_path, caplog, tf):
    path = tmp_path / "data.mat"
    A, labels, _ = matlab_file(path)
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        code, _, err = convert(path, tmp_path / "out")
    assert code == 0, err
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "1 matlab-cell (/c)" in said and "1 matlab-empty (/empty)" in said and "--container_mode datasets" in said, (
        said
    )
    examples = list(reader.iter_numpy(str(tmp_path / "out")))
    assert len(examples) == 4  # MATLAB's rows, not HDF5's leading axis (5)
    np.testing.assert_array_equal(np.stack([e["A"] for e in examples]), A)
    np.testing.assert_array_equal(np.stack([e["labels"] for e in examples]), labels)
    np.testing.assert_array_equal(np.stack([e["s/w"] for e in examples]), np.arange(8.0).reshape(4, 2))
    rows = plain_tf_records(tmp_path / "out", tf)
    assert np.frombuffer(rows[2]["A"], "<f8").tolist() == A[2].tolist()
    code, _out, err = run_command(
        __import__("tfrecord_etl.pipelines.verify", fromlist=["main"]).main,
        [str(tmp_path / "out"), "--source", str(path)],
    )
    assert code == 0, err


def test_matlab_cells_become_one_example_each_in_datasets_mode(tmp_path):
    path = tmp_path / "data.mat"
    A, _labels, cells = matlab_file(path)
    code, _, err = convert(path, tmp_path / "out", "--container_mode", "datasets")
    assert code == 0, err
    got = by_key(tmp_path / "out")
    assert sorted(got) == ["/A", "/c{1}", "/c{2}", "/c{3}", "/labels", "/s/w"]  # /empty and /#refs# skipped
    np.testing.assert_array_equal(got["/A"], A)
    for k, cell in enumerate(cells, 1):
        np.testing.assert_array_equal(got[f"/c{{{k}}}"], cell)
        assert got[f"/c{{{k}}}"].dtype == cell.dtype
    from tfrecord_etl.pipelines import verify

    code, _, err = run_command(verify.main, [str(tmp_path / "out"), "--source", str(path)])
    assert code == 0, err


def test_a_nested_cell_is_skipped_or_refused_naming_it(tmp_path, capsys, caplog):
    path = tmp_path / "nested.mat"
    matlab_file(path, nested_cell=True)
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        code, _, err = convert(path, tmp_path / "out", "--container_mode", "datasets", capsys=capsys)
    assert code == 0, err  # walking the file: the cell that cannot be converted is named and skipped
    assert "1 unconvertible cell (/c{3})" in " ".join(r.getMessage() for r in caplog.records)
    assert sorted(by_key(tmp_path / "out")) == ["/A", "/c{1}", "/c{2}", "/labels", "/s/w"]
    code, _, err = convert(path, tmp_path / "named", "--container_mode", "datasets", "--datasets", "/c", capsys=capsys)
    assert code == 2 and "Cell /c{3} holds a nested cell array" in err and "nested.mat" in err  # named: refused
    code, _, err = convert(path, tmp_path / "out2", "--datasets", "/c", capsys=capsys)
    assert code == 2 and "object references (a MATLAB cell array?)" in err and "--container_mode datasets" in err
    assert "variable-length numeric" not in err  # the earlier message, which hid the cause


@pytest.mark.parametrize(
    "dataset, attr, value",
    [
        ("/A", "MATLAB_class", np.array([1, 2, 3])),  # a numeric array: NumPy's truth-value ValueError before
        ("/labels", "MATLAB_class", np.int32(7)),  # a number: read as MATLAB (transposed) before
        ("/#refs#/r1", "MATLAB_class", np.array([1.5, 2.5])),  # a cell's target, reached through /c
        ("/empty", "MATLAB_empty", np.array([1, 1], np.uint8)),
    ],
)
@pytest.mark.parametrize("mode", ["auto", "datasets"])
def test_a_matlab_attribute_of_the_wrong_type_is_one_error_naming_file_and_dataset(
    tmp_path, capsys, dataset, attr, value, mode
):
    path = tmp_path / "bad.mat"
    matlab_file(path)
    with h5py.File(path, "r+") as f:
        del f[dataset].attrs[attr]
        f[dataset].attrs[attr] = value
    code, _, err = convert(path, tmp_path / "out", "--container_mode", mode, capsys=capsys)
    if mode == "auto" and dataset == "/#refs#/r1":  # rows mode never looks into the cells
        assert code == 0, err
        return
    assert code == 2 and err.startswith(f"error: SourceError: The dataset's {attr} attribute is "), err
    assert f"file='{path}', dataset='{dataset}'" in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "out" / "metadata.json").exists()
    if dataset.startswith("/#refs#"):
        return  # inspect does not list MATLAB's own storage
    from tfrecord_etl.pipelines import inspect

    code, out, err = run_command(inspect.main, [path], capsys)  # inspect lists it, as convert refuses it
    assert code == 0 and f"{dataset}  [unreadable: The dataset's {attr} attribute is" in out, out + err


# ------------------------------------------------------------------------------------------ HDF5 row groups


def test_row_group_flag_and_its_conflicts(tmp_path, capsys):
    path = tmp_path / "two.h5"
    with h5py.File(path, "w") as f:
        f["X"] = np.arange(12.0).reshape(4, 3)
        f["var/names"] = np.array([b"a", b"b", b"c"])
    code, _, err = convert(path, tmp_path / "g2", "--row_group", "2", capsys=capsys)
    assert code == 0, err
    assert [e["var/names"] for e in reader.iter_numpy(str(tmp_path / "g2"))] == [b"a", b"b", b"c"]
    code, _, err = convert(path, tmp_path / "bad", "--row_group", "2", "--datasets", "/X", capsys=capsys)
    assert code == 2 and "row_group" in err and "cannot be combined with datasets" in err


def test_datasets_mode_takes_every_dataset_including_scalars_and_coordinates(tmp_path, tf):
    path = tmp_path / "mixed.h5"
    with h5py.File(path, "w") as f:
        f["X"] = np.arange(12, dtype=">i4").reshape(4, 3)
        f["s"] = np.float64(2.5)
        f["lat"] = np.linspace(0, 1, 3)
        f["lat"].make_scale("lat")
        f["names"] = np.array([b"a", b"b"], dtype=h5py.string_dtype())
    code, _, err = convert(path, tmp_path / "out", "--container_mode", "datasets")
    assert code == 0, err
    got = by_key(tmp_path / "out")
    assert sorted(got) == ["/X", "/lat", "/s"]  # the vlen string dataset is skipped with a warning
    np.testing.assert_array_equal(got["/X"], np.arange(12).reshape(4, 3))
    assert got["/s"].shape == () and got["/s"] == 2.5
    np.testing.assert_array_equal(got["/lat"], np.linspace(0, 1, 3))
    meta = metadata.load(str(tmp_path / "out"))
    assert [(s.name, s.dtype, s.shape) for s in meta["features"]] == [("key", "bytes", ()), ("array", None, None)]


# ------------------------------------------------------------------------------------------ Keras weights


def test_keras_weight_file_converts_one_example_per_weight(tmp_path, tf):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1"), keras.layers.Dense(2, name="d2")])
    path = tmp_path / "model.weights.h5"
    model.save_weights(path)
    code, _, err = convert(path, tmp_path / "out")  # rows mode: weights of different lengths -> largest group
    assert code == 0, err
    code, _, err = convert(path, tmp_path / "each", "--container_mode", "datasets")
    assert code == 0, err
    got = by_key(tmp_path / "each")
    expected = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: expected.__setitem__("/" + n, o[()]) if isinstance(o, h5py.Dataset) else None)
    assert sorted(got) == sorted(expected) and len(got) == 4
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value)
    weights = {w.path if hasattr(w, "path") else w.name: w.numpy() for w in model.weights}
    assert sorted(np.concatenate([v.ravel() for v in got.values()]).tolist()) == sorted(
        np.concatenate([v.ravel() for v in weights.values()]).tolist()
    )


# ------------------------------------------------------------------------------------------ NetCDF-3


def netcdf3_file(path, version=1):
    from scipy.io import netcdf_file

    temp = np.arange(5 * 3 * 2, dtype=">f4").reshape(5, 3, 2)
    with netcdf_file(path, "w", version=version) as f:
        f.createDimension("time", None)  # the record (unlimited) dimension
        f.createDimension("lat", 3)
        f.createDimension("lon", 2)
        variables = {
            name: f.createVariable(name, dtype, dims)
            for name, dtype, dims in [
                ("time", ">f8", ("time",)),
                ("temp", ">f4", ("time", "lat", "lon")),
                ("lat", ">f4", ("lat",)),
                ("lon", ">f4", ("lon",)),
                ("station", ">i2", ("lat",)),
            ]
        }
        variables["time"][:] = np.arange(5.0) * 1.5
        variables["temp"][:] = temp
        variables["temp"].scale_factor = 0.5  # stays an attribute: values are converted as stored
        variables["lat"][:] = [10.0, 20.0, 30.0]
        variables["lon"][:] = [1.0, 2.0]
        variables["station"][:] = [7, 8, 9]
        # (no 0-d variable: SciPy 1.17's writer fails on assignValue and corrupts the record section with
        # .data[()] = value, the netCDF C library refuses that file; 0-d variables are in the real files' tests)
    return temp


@pytest.mark.parametrize("version", [1, 2])
def test_netcdf3_by_magic_bytes_row_groups_by_dimension(tmp_path, caplog, version, tf):
    path = tmp_path / "climate.nc"
    temp = netcdf3_file(path, version)
    assert path.read_bytes()[:4] == b"CDF" + bytes([version])
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        code, _, err = convert(path, tmp_path / "out")
    assert code == 0, err
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "converting group 1: 5 rows on dimension 'time'" in said and "--row_group 2" in said
    examples = list(reader.iter_numpy(str(tmp_path / "out")))
    np.testing.assert_array_equal(np.stack([e["temp"] for e in examples]), temp)
    np.testing.assert_array_equal([e["time"] for e in examples], np.arange(5.0) * 1.5)
    assert metadata.load(str(tmp_path / "out"))["options"]["input"] == str(path)
    rows = plain_tf_records(tmp_path / "out", tf)
    assert np.frombuffer(rows[4]["temp"], "<f4").tolist() == temp[4].ravel().tolist()
    # the lat group: lat and station share the dimension 'lat'
    code, _, err = convert(path, tmp_path / "lat", "--row_group", "2")
    assert code == 0, err
    lat = list(reader.iter_numpy(str(tmp_path / "lat")))
    assert [(float(e["lat"]), int(e["station"])) for e in lat] == [(10.0, 7), (20.0, 8), (30.0, 9)]
    from tfrecord_etl.pipelines import verify

    code, _, err = run_command(verify.main, [str(tmp_path / "lat"), "--source", str(path)])
    assert code == 0, err


def test_netcdf3_datasets_mode_and_errors(tmp_path, capsys):
    path = tmp_path / "climate.nc"
    temp = netcdf3_file(path)
    code, _, err = convert(path, tmp_path / "out", "--container_mode", "datasets", capsys=capsys)
    assert code == 0, err
    got = by_key(tmp_path / "out")
    assert sorted(got) == ["lat", "lon", "station", "temp", "time"]
    np.testing.assert_array_equal(got["temp"], temp)
    np.testing.assert_array_equal(got["station"], [7, 8, 9])
    code, _, err = convert(path, tmp_path / "x", "--datasets", "nope", capsys=capsys)
    assert code == 2 and "No such variable" in err and "climate.nc" in err
    code, _, err = convert(path, tmp_path / "y", "--format", "hdf5", capsys=capsys)
    assert code == 2 and "it is a NetCDF-3 file: use --format netcdf3" in err
    truncated = tmp_path / "cut.nc"
    truncated.write_bytes(path.read_bytes()[:150])
    code, _, err = convert(truncated, tmp_path / "z", capsys=capsys)
    assert code == 2 and "NetCDF-3" in err and "cut.nc" in err
    assert not (tmp_path / "z" / "metadata.json").exists()


def streaming(path, cut: int = 0):
    """``path`` with numrecs set to STREAMING (0xFFFFFFFF), the last ``cut`` bytes dropped; returns the new path."""
    data = bytearray(path.read_bytes())
    assert data[4:8] != b"\xff\xff\xff\xff"
    data[4:8] = b"\xff\xff\xff\xff"
    out = path.with_name("streaming-" + path.name)
    out.write_bytes(bytes(data[: len(data) - cut]))
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_netcdf3_streaming_numrecs_counts_the_records_from_the_file_size(tmp_path, capsys, caplog, version, tf):
    """numrecs = 0xFFFFFFFF (STREAMING, allowed by the NetCDF classic specification) read as 0 rows before: inspect
    showed 0 rows, convert wrote 0 examples with exit 0."""
    from scipy.io import netcdf_file

    temp = netcdf3_file(tmp_path / "climate.nc", version)  # two record variables: records padded to 4 bytes
    with netcdf_file(tmp_path / "one.nc", "w", version=version) as f:  # one short record variable: unpadded
        f.createDimension("time", None)
        f.createDimension("x", 3)
        f.createVariable("s", ">i2", ("time", "x"))[:] = np.arange(15, dtype=">i2").reshape(5, 3)
    for name, feature, want in (("climate.nc", "temp", temp), ("one.nc", "s", np.arange(15).reshape(5, 3))):
        path = streaming(tmp_path / name)
        code, _, err = convert(path, tmp_path / f"out-{name}", capsys=capsys)
        assert code == 0, err
        got = [e[feature] for e in reader.iter_numpy(str(tmp_path / f"out-{name}"))]
        np.testing.assert_array_equal(np.stack(got), want)
        rows = plain_tf_records(tmp_path / f"out-{name}", tf)  # plain TensorFlow: the same 5 records
        assert len(rows) == 5 and np.asarray(rows[4][feature]).ravel().tolist() == want[4].ravel().tolist()
        from tfrecord_etl.pipelines import inspect, verify

        code, out, _ = run_command(inspect.main, [path], capsys)
        assert code == 0 and "group 1: 5 rows on 'time'" in out, out
        code, _, err = run_command(verify.main, [tmp_path / f"out-{name}", "--source", path], capsys)
        assert code == 0, err
    torn = streaming(tmp_path / "one.nc", cut=4)  # a writer stopped inside the last record: 4 whole records
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        code, _, err = convert(torn, tmp_path / "torn", capsys=capsys)
    assert code == 0, err
    got = [e["s"] for e in reader.iter_numpy(str(tmp_path / "torn"))]
    np.testing.assert_array_equal(np.stack(got), np.arange(12).reshape(4, 3))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "numrecs is STREAMING: 4 records counted from the file size; the 2 bytes after them" in said, said


# ------------------------------------------------------------------------------------------ encodings said


def test_list_encoding_with_a_varying_dtype_says_it_stays_tensor(tmp_path, caplog):
    np.savez(tmp_path / "mixed.npz", a=np.arange(3, dtype=np.int32), b=np.ones(2, np.float32))
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        code, _, err = convert(tmp_path / "mixed.npz", tmp_path / "out", "--npz_mode", "arrays", "--encoding", "list")
    assert code == 0, err
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "--encoding list: feature(s) array keep the tensor encoding, their dtype varies" in said
    features = {f.name: f.encoding for f in metadata.load(str(tmp_path / "out"))["features"]}
    assert features == {"key": "list", "array": "tensor"}


def test_allow_lossy_records_the_stored_dtype(tmp_path):
    import json

    np.save(tmp_path / "f.npy", np.array([0.1, 1e-50, 3.0]))
    code, _, err = convert(tmp_path / "f.npy", tmp_path / "out", "--encoding", "list", "--allow_lossy", "array")
    assert code == 0, err
    entry = json.loads((tmp_path / "out" / "metadata.json").read_text())["features"][0]
    assert entry["dtype"] == "<f8" and entry["stored_dtype"] == "<f4"  # was: only '<f8'
    got = [float(e["array"]) for e in reader.iter_numpy(str(tmp_path / "out"))]
    assert got == [float(np.float32(0.1)), 0.0, 3.0]  # what float32 holds, as the metadata now says
