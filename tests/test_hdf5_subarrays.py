"""HDF5 subarray dtypes (HDF5 array types): PyTables' multidimensional atoms, AnnData-style compounds with subarray
fields, arrays of compounds and MATLAB-attributed arrays convert exactly, in rows and datasets modes.

h5py reads a dataset of dtype ``('<f8', (3,))`` as float64 with an extra trailing axis, so the dtype of what it
returns differs from the dataset's own: the source must decide conversions from the dataset's dtype, never by
comparing the two. Expected values come from h5py; outputs are read back with our reader and with plain
``tf.io.parse_example``.
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.conftest import convert, fixture_file, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.planning import plan_inputs
from tfrecord_etl.transforms.sources import SourceOptions

TABLES = "tables/tests/"


@pytest.fixture(scope="module")
def tf():
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def converted(out, source, *flags):
    code, _, err = convert(source, out, *flags)
    assert code == 0, err
    return list(reader.iter_numpy(str(out)))


def features(out) -> dict:
    return {
        f["name"]: (f["dtype"], tuple(f["shape"])) for f in json.loads((out / "metadata.json").read_text())["features"]
    }


def plain_tf_rows(out, tf) -> list[dict]:
    """Every record of ``out`` (shards in the metadata's order) parsed by plain ``tf.io.parse_example`` with
    ``reader.tf_feature_spec``, decoded with NumPy alone from the metadata's dtype and shape: ``tensor`` features
    are raw little-endian bytes, ``list`` features their values."""
    meta = json.loads((out / "metadata.json").read_text())
    spec = reader.tf_feature_spec(str(out))
    rows = []
    for batch in tf.data.TFRecordDataset([str(out / s["file"]) for s in meta["shards"]]).batch(16):
        parsed = tf.io.parse_example(batch, spec)
        for i in range(int(batch.shape[0])):
            row = {}
            for f in meta["features"]:
                value = parsed[f["name"]][i].numpy()
                assert f["encoding"] in ("tensor", "list"), f
                row[f["name"]] = (
                    np.frombuffer(value, f["dtype"]).reshape(f["shape"])
                    if f["encoding"] == "tensor"
                    else np.asarray(value).astype(f["dtype"]).reshape(f["shape"])
                )
            rows.append(row)
    return rows


def verified(out, source):
    from tfrecord_etl.pipelines import verify

    code, stdout, err = run_command(verify.main, [str(out), "--source", str(source)])
    assert code == 0, stdout + err


def assert_exact(got: np.ndarray, expected: np.ndarray):
    assert got.shape == expected.shape and got.dtype == expected.dtype.newbyteorder("<")
    assert got.tobytes() == np.ascontiguousarray(expected, expected.dtype.newbyteorder("<")).tobytes()


# ------------------------------------------------------------------------------------------ real PyTables files


@pytest.mark.parametrize(
    "name,dataset,subarray",
    [("array_mdatom.h5", "/arr", ("<f8", (3,))), ("ex-noattr.h5", "/columns/pressure", ("<f8", (10,)))],
)
def test_pytables_multidimensional_atom_converts_exactly(tmp_path, tf, name, dataset, subarray):
    """PyTables stores an Array of a multidimensional atom as an HDF5 array type: array_mdatom.h5's /arr is a
    (5, 5, 5) dataset of ('<f8', (3,)); each of its 5 rows becomes a (5, 5, 3) float64 feature."""
    path = fixture_file(TABLES + name)
    with h5py.File(path) as f:
        dset = f[dataset]
        assert dset.dtype == np.dtype(subarray) and dset.id.get_type().get_class() == h5py.h5t.ARRAY
        data = dset[()]  # h5py: the subarray's axes after the dataset's
    assert data.shape == dset.shape + subarray[1]
    feature = dataset.strip("/")
    examples = converted(tmp_path / "rows", path, "--datasets", dataset)
    assert features(tmp_path / "rows") == {feature: ("<f8", data.shape[1:])}
    assert len(examples) == len(data)
    assert_exact(np.stack([e[feature] for e in examples]), data)
    assert_exact(np.stack([r[feature] for r in plain_tf_rows(tmp_path / "rows", tf)]), data)
    verified(tmp_path / "rows", path)

    (whole,) = converted(tmp_path / "datasets", path, "--container_mode", "datasets", "--datasets", dataset)
    assert whole["key"].item() == dataset.encode()
    assert_exact(whole["array"], data)  # one Example: the whole dataset, subarray axes last


# ------------------------------------------------------------------------------------------ generated files


def array_type_dataset(group, name: str, dtype, data, matlab_class: str | None = None):
    """A dataset whose HDF5 type is an array type of ``dtype`` (a subarray dtype), as PyTables writes one (h5py's
    create_dataset would expand the subarray into extra axes instead)."""
    dtype = np.dtype(dtype)
    shape = data.shape[: data.ndim - len(dtype.shape)]
    dset = h5py.Dataset(
        h5py.h5d.create(group.id, name.encode(), h5py.h5t.py_create(dtype), h5py.h5s.create_simple(shape))
    )
    dset[...] = data
    if matlab_class:
        dset.attrs["MATLAB_class"] = np.bytes_(matlab_class)
    return dset


def test_array_types_of_numbers_and_compounds_in_rows_and_datasets_modes(tmp_path):
    rows = 30
    rng = np.random.default_rng(3)
    vec = rng.normal(size=(rows, 3))
    comp = np.dtype([("a", "<i4"), ("b", ">f4", (2,))])
    cells = np.zeros((rows, 4), comp)
    cells["a"], cells["b"] = rng.integers(-9, 9, (rows, 4)), rng.normal(size=(rows, 4, 2))
    grid = rng.integers(0, 1000, (2, rows, 2, 2)).astype(">i2")  # HDF5 (2, rows) of (2, 2): MATLAB rows x 2
    path = tmp_path / "arrays.h5"
    with h5py.File(path, "w") as f:
        array_type_dataset(f, "vec", ("<f8", (3,)), vec)
        array_type_dataset(f, "cells", (comp, (4,)), cells)
        array_type_dataset(f, "grid", (">i2", (2, 2)), grid, matlab_class="int16")
    plan = plan_inputs(str(path), SourceOptions(datasets=("/vec", "/cells", "/grid"), target_range_bytes=200))
    assert {s.name: (s.dtype, s.shape) for s in plan.specs} == {
        "vec": ("<f8", (3,)),
        "cells/a": ("<i4", (4,)),
        "cells/b": ("<f4", (4, 2)),
        "grid": ("<i2", (2, 2, 2)),
    }
    assert len(plan.ranges) > 3
    parts = [plan.source.read(r) for r in plan.ranges]
    got = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    np.testing.assert_array_equal(got["vec"], vec)
    np.testing.assert_array_equal(got["cells/a"], cells["a"])
    np.testing.assert_array_equal(got["cells/b"], cells["b"])
    # MATLAB orientation: HDF5's axes reversed (rows first), the subarray's axes stay last
    np.testing.assert_array_equal(got["grid"], grid.transpose(1, 0, 2, 3))

    plan = plan_inputs(str(path), SourceOptions(container_mode="datasets"))
    assert list(plan.ranges[0].items) == ["/grid", "/vec"]  # (an array of compounds is skipped there, as compounds)
    whole = plan.source.read(plan.ranges[0])
    np.testing.assert_array_equal(whole["array"][0], grid.transpose(1, 0, 2, 3))
    np.testing.assert_array_equal(whole["array"][1], vec)


def anndata_style_file(path, n_obs=40, n_vars=6):
    """The AnnData 0.6 layout of an ``.h5ad``: /X, compounds /obs and /var, and /obsm, a compound whose fields are
    subarrays (one embedding per field, as AnnData wrote obsm before 0.7)."""
    rng = np.random.default_rng(11)
    obsm = np.zeros(n_obs, np.dtype([("X_pca", "<f4", (5,)), ("X_umap", ">f8", (2,)), ("leiden", "<i8", (1,))]))
    obsm["X_pca"], obsm["X_umap"] = rng.normal(size=(n_obs, 5)), rng.normal(size=(n_obs, 2))
    obsm["leiden"] = rng.integers(0, 8, (n_obs, 1))
    obs = np.zeros(n_obs, np.dtype([("index", "S8"), ("n_genes", "<i4")]))
    obs["index"], obs["n_genes"] = [b"cell%d" % i for i in range(n_obs)], rng.integers(100, 900, n_obs)
    var = np.zeros(n_vars, np.dtype([("index", "S8"), ("means", "<f4")]))
    data = {"X": rng.normal(size=(n_obs, n_vars)).astype("<f4"), "obs": obs, "obsm": obsm, "var": var}
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            f.create_dataset(k, data=v)
        f.attrs["encoding-type"] = "anndata"
    return data


def test_anndata_style_compound_with_subarray_fields(tmp_path, tf):
    path = tmp_path / "cells.h5ad"
    data = anndata_style_file(path)
    out = tmp_path / "out"
    examples = converted(out, path)  # the largest row group: n_obs rows of /X, /obs and /obsm
    assert features(out) == {
        "X": ("<f4", (6,)),
        "obs/index": ("|S8", ()),
        "obs/n_genes": ("<i4", ()),
        "obsm/X_pca": ("<f4", (5,)),
        "obsm/X_umap": ("<f8", (2,)),
        "obsm/leiden": ("<i8", (1,)),
    }
    expected = {
        "X": data["X"],
        "obs/n_genes": data["obs"]["n_genes"],
        **{f"obsm/{k}": data["obsm"][k] for k in data["obsm"].dtype.names},
    }
    plain = plain_tf_rows(out, tf)
    assert len(examples) == len(plain) == 40
    for name, values in expected.items():
        assert_exact(np.stack([e[name] for e in examples]), values)
        assert_exact(np.stack([r[name] for r in plain]), values)
    assert (
        [e["obs/index"].item() for e in examples]
        == [r["obs/index"].item() for r in plain]
        == list(data["obs"]["index"])
    )
    verified(out, path)
