"""Categorical columns carry their categories: AnnData (0.6 compounds with ``/uns/<name>_categories``, 0.7 datasets
referencing ``/obs/__categories/<name>``, >= 0.8 ``encoding-type: categorical`` groups) and CF flag variables
(``flag_values`` + ``flag_meanings``, netCDF-4 and NetCDF-3) are written as their category names by default, as
their codes with ``--categoricals codes``, with the mapping in ``metadata.json`` and ``schema.pbtxt`` either way.

Expected values are computed by hand with h5py / SciPy (``categories[codes]``, as pandas and anndata give them;
neither anndata nor PyTables is installed here).
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.conftest import FIXTURES, convert, run_command
from tfrecord_etl.transforms import reader

PBMC = FIXTURES / "scanpy" / "datasets" / "10x_pbmc68k_reduced.h5ad"
PBMC_COLUMNS = ("bulk_labels", "phase", "louvain")


def metadata(out) -> dict:
    return json.loads((out / "metadata.json").read_text())


def feature(out, name) -> dict:
    return next(f for f in metadata(out)["features"] if f["name"] == name)


def rows(out) -> dict:
    """Every feature of ``out`` read back whole, rows concatenated."""
    batches = list(reader.iter_numpy(str(out), batch_size=10_000))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def converted(source, out, *flags) -> dict:
    code, _, err = convert(str(source), str(out), *flags)
    assert code == 0, err
    return rows(out)


def verified(out, source) -> None:
    from tfrecord_etl.pipelines import verify

    code, stdout, err = run_command(verify.main, [str(out), "--source", str(source)])
    assert code == 0, stdout + err


def names_of(categories, codes, missing=-1) -> np.ndarray:
    """``categories[codes]`` as UTF-8 bytes, ``b""`` for the missing code: what pandas' Categorical gives (NaN)."""
    table = [c.encode() if isinstance(c, str) else bytes(c) for c in categories]
    return np.array([b"" if c == missing else table[c] for c in np.asarray(codes).ravel()]).reshape(np.shape(codes))


def schema_feature(out, name) -> str:
    text = (out / "schema.pbtxt").read_text()
    start = text.index(f'  name: "{name}"\n')
    return text[start : text.index("\n}\n", start)]


# -------------------------------------------------------------------------------------- the tour's own AnnData file


@pytest.fixture(scope="module")
def pbmc():
    if not PBMC.exists():
        pytest.skip(f"{PBMC} is missing: run ./run_tests.sh, which installs the fixture packages")
    with h5py.File(PBMC, "r") as f:
        obs = f["obs"][()]
        categories = {c: list(f[f"uns/{c}_categories"][()]) for c in PBMC_COLUMNS}
    return obs, categories


def test_anndata_06_columns_are_written_as_their_category_names(tmp_path, pbmc):
    """scanpy's 10x_pbmc68k_reduced.h5ad (AnnData 0.6): /obs's int8 fields bulk_labels, phase and louvain come out
    as the names of /uns/<field>_categories, exactly, with the mapping in metadata.json and a StringDomain in
    schema.pbtxt; verify --source agrees."""
    obs, categories = pbmc
    got = converted(PBMC, tmp_path / "out")
    for column in PBMC_COLUMNS:
        name = f"obs/{column}"
        expected = names_of(categories[column], obs[column])
        width = max(len(c) for c in categories[column])
        assert got[name].dtype == np.dtype(f"S{width}") and got[name].tolist() == expected.tolist()
        spec = feature(tmp_path / "out", name)
        assert spec["dtype"] == f"|S{width}" and spec["encoding"] == "list"
        assert spec["categories"] == {
            "values": [c.decode() for c in categories[column]],
            "codes": list(range(len(categories[column]))),
            "ordered": False,
            "written": "strings",
            "missing": -1,
            "origin": f"/uns/{column}_categories",
        }
        text = schema_feature(tmp_path / "out", name)
        assert "type: BYTES" in text and 'tag: "tfrecord_etl.categorical:strings"' in text
        assert text.count("    value: ") == len(categories[column])
    assert got["obs/louvain"][:5].tolist() == [b"1", b"1", b"3", b"9", b"2"]
    assert got["obs/n_genes"].tolist() == obs["n_genes"].tolist()  # the other fields as before
    verified(tmp_path / "out", PBMC)


def test_codes_mode_keeps_the_codes_and_the_mapping(tmp_path, pbmc, capsys):
    obs, categories = pbmc
    got = converted(PBMC, tmp_path / "out", "--categoricals", "codes")
    for column in PBMC_COLUMNS:
        name = f"obs/{column}"
        assert got[name].dtype == np.int8 and got[name].tolist() == obs[column].tolist()
        spec = feature(tmp_path / "out", name)
        assert spec["dtype"] == "|i1" and spec["categories"]["written"] == "codes"
        assert spec["categories"]["values"] == [c.decode() for c in categories[column]]
        text = schema_feature(tmp_path / "out", name)
        assert "type: INT" in text and "is_categorical: true" in text
        assert f"max: {len(categories[column]) - 1}\n" in text and "min: -1\n" in text
    verified(tmp_path / "out", PBMC)
    from tfrecord_etl.pipelines import inspect

    capsys.readouterr()
    code, out, err = run_command(inspect.main, [str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert "list, categorical: 3 names from /uns/phase_categories, written as codes\n" in out


def test_to_tf_dataset_reads_the_names(tmp_path, pbmc):
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    obs, categories = pbmc
    converted(PBMC, tmp_path / "out", "--num_shards", "1")
    ds = reader.to_tf_dataset(str(tmp_path / "out"), batch_size=700, features=["obs/phase"])
    batch = next(iter(ds))
    assert batch["obs/phase"].numpy().tolist() == names_of(categories["phase"], obs["phase"]).tolist()


def test_inspect_names_the_categorical_columns(capsys, pbmc):
    from tfrecord_etl.pipelines import inspect

    code, out, err = run_command(inspect.main, [str(PBMC)], capsys)
    assert code == 0, err
    assert "categorical columns (convert writes each row's category name" in out
    assert "  obs/phase: 3 categories from /uns/phase_categories: G1, G2M, S\n" in out
    assert "  obs/louvain: 11 categories from /uns/louvain_categories: 0, 1, 2, 3, 4, ...\n" in out


# --------------------------------------------------------------------------------------------- AnnData 0.7 and 0.8

CELL_TYPES = ["B cell", "T cell", "Müller glia", "NK"]  # a name beyond ASCII: written as its UTF-8 bytes
CODES = np.array([0, 2, -1, 1, 3, 2, 0, -1, 1, 1], np.int8)  # -1: a missing value (pandas' NaN category)


def anndata_08(path, codes=CODES, categories=CELL_TYPES, ordered=True):
    """An AnnData >= 0.8 file as anndata writes it: obs a dataframe group, the categorical column a group with
    ``codes``, ``categories`` (variable-length strings) and ``ordered``."""
    with h5py.File(path, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        f.attrs["encoding-version"] = "0.1.0"
        f["X"] = np.arange(len(codes) * 3, dtype=np.float32).reshape(len(codes), 3)
        obs = f.create_group("obs")
        obs.attrs.update({"encoding-type": "dataframe", "_index": "_index", "column-order": ["cell_type"]})
        obs["_index"] = np.array([f"cell{i}".encode() for i in range(len(codes))], dtype=h5py.string_dtype())
        group = obs.create_group("cell_type")
        group.attrs.update({"encoding-type": "categorical", "encoding-version": "0.2.0", "ordered": ordered})
        group["codes"] = codes
        group["categories"] = np.array(categories, dtype=h5py.string_dtype())
        var = f.create_group("var")
        var.attrs.update({"encoding-type": "dataframe", "_index": "_index"})
        var["_index"] = np.array([b"g1", b"g2", b"g3"], dtype=h5py.string_dtype())
    return path


def test_anndata_08_categorical_group(tmp_path):
    """A categorical group (anndata >= 0.8) is written under the group's name, ``obs/cell_type``, as its names;
    code -1 (a missing value) as the empty string; ``ordered`` kept."""
    source = anndata_08(tmp_path / "a.h5ad")
    got = converted(source, tmp_path / "out")
    expected = names_of(CELL_TYPES, CODES)
    assert "obs/cell_type/codes" not in got
    assert got["obs/cell_type"].tolist() == expected.tolist() and got["obs/cell_type"].dtype == np.dtype("S12")
    assert got["obs/cell_type"][2] == b"" and got["obs/cell_type"][5].decode() == "Müller glia"
    cats = feature(tmp_path / "out", "obs/cell_type")["categories"]
    assert cats["values"] == CELL_TYPES and cats["ordered"] is True and cats["origin"] == "/obs/cell_type/categories"
    verified(tmp_path / "out", source)
    codes = converted(source, tmp_path / "codes", "--categoricals", "codes")  # as stored, under the dataset's name
    assert codes["obs/cell_type/codes"].tolist() == CODES.tolist() and "obs/cell_type" not in codes
    assert feature(tmp_path / "codes", "obs/cell_type/codes")["categories"]["values"] == CELL_TYPES
    verified(tmp_path / "codes", source)


def test_anndata_07_categories_reference(tmp_path):
    """AnnData 0.7: the codes dataset's ``categories`` attribute references ``/obs/__categories/<name>``."""
    source = tmp_path / "a07.h5ad"
    with h5py.File(source, "w") as f:
        f["X"] = np.zeros((len(CODES), 2), np.float32)
        obs = f.create_group("obs")
        obs["index"] = np.array([f"c{i}".encode() for i in range(len(CODES))])
        cats = obs.create_group("__categories")
        cats["cell_type"] = np.array(CELL_TYPES, dtype=h5py.string_dtype())
        obs["cell_type"] = CODES
        obs["cell_type"].attrs["categories"] = cats["cell_type"].ref
        f.create_group("var")["index"] = np.array([b"g1", b"g2"])
    got = converted(source, tmp_path / "out")
    assert got["obs/cell_type"].tolist() == names_of(CELL_TYPES, CODES).tolist()
    assert feature(tmp_path / "out", "obs/cell_type")["categories"]["origin"] == "/obs/__categories/cell_type"
    verified(tmp_path / "out", source)


def test_a_code_naming_no_category_is_refused_with_its_row(tmp_path, capsys):
    source = anndata_08(tmp_path / "bad.h5ad", codes=np.array([0, 1, 7, 2], np.int8))
    code, _, err = convert(str(source), str(tmp_path / "out"), capsys=capsys)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "code 7 at row 2 names none of its 4 categories (/obs/cell_type/categories)" in line
    assert "Hint: pass --categoricals codes" in line
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_an_empty_category_name_is_refused_in_strings_mode(tmp_path, capsys):
    """An empty name could not be told from a missing value: refused, with the codes mode as the way out."""
    source = anndata_08(tmp_path / "empty.h5ad", categories=["a", "", "b", "c"])
    code, _, err = convert(str(source), str(tmp_path / "out"), capsys=capsys)
    assert code == 2
    assert "Categorical column 'obs/cell_type/codes' (/obs/cell_type/categories) has an empty name" in err
    assert "Hint: pass --categoricals codes" in err
    got = converted(source, tmp_path / "codes", "--categoricals", "codes")
    assert got["obs/cell_type/codes"].tolist() == CODES.tolist()


def test_files_with_other_categories_are_refused(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    anndata_08(tmp_path / "in" / "a.h5ad")
    anndata_08(tmp_path / "in" / "b.h5ad", categories=["B cell", "T cell", "Muller glia", "NK"])
    code, _, err = convert(str(tmp_path / "in" / "*.h5ad"), str(tmp_path / "out"), capsys=capsys)
    assert code == 2
    assert "Categorical column 'obs/cell_type' has other categories in" in err


# --------------------------------------------------------------------------------------------------- CF flag values

FLAGS = np.array([[0, 1, 2], [2, 4, 0], [-127, 1, 4], [0, 0, 0]], np.int8)  # -127: the _FillValue
MEANINGS = ["clear", "cloud", "cloud_shadow"]


def test_netcdf4_flag_values_are_written_as_their_meanings(tmp_path):
    """CF 3.5: flag_values 0, 2, 4 with flag_meanings "clear cloud cloud_shadow" (1 is none of them here: refused
    unless codes); the _FillValue is a missing value. A variable with flag_masks (bit fields) keeps its values."""
    source = tmp_path / "flags.nc"
    with h5py.File(source, "w") as f:
        ds = f.create_dataset("quality", data=np.where(FLAGS == 1, 0, FLAGS).astype(np.int8))
        ds.attrs.update({"flag_values": np.array([0, 2, 4], np.int8), "flag_meanings": "clear cloud cloud_shadow"})
        ds.attrs["_FillValue"] = np.int8(-127)
        bits = f.create_dataset("bits", data=np.array([[1, 3, 2]] * 4, np.uint8))
        bits.attrs.update({"flag_masks": np.array([1, 2], np.uint8), "flag_meanings": "a b"})
        bits.attrs["flag_values"] = np.array([1, 2], np.uint8)
    got = converted(source, tmp_path / "out")
    stored = np.where(FLAGS == 1, 0, FLAGS)
    table = {0: b"clear", 2: b"cloud", 4: b"cloud_shadow", -127: b""}
    assert got["quality"].tolist() == [[table[v] for v in row] for row in stored.tolist()]
    assert got["bits"].tolist() == [[1, 3, 2]] * 4  # bit fields: values as stored
    cats = feature(tmp_path / "out", "quality")["categories"]
    assert (cats["values"], cats["codes"], cats["missing"]) == (MEANINGS, [0, 2, 4], -127)
    assert "categories" not in feature(tmp_path / "out", "bits")
    verified(tmp_path / "out", source)


def test_netcdf3_flag_values(tmp_path, capsys):
    from scipy.io import netcdf_file

    source = tmp_path / "flags3.nc"
    with netcdf_file(source, "w") as f:
        f.createDimension("time", 4)
        f.createDimension("x", 3)
        var = f.createVariable("quality", "b", ("time", "x"))
        var[:] = np.where(FLAGS == -127, 4, np.where(FLAGS == 1, 2, FLAGS))
        var.flag_values = np.array([0, 2, 4], np.int8)
        var.flag_meanings = "clear cloud cloud_shadow"
        temp = f.createVariable("temp", "f", ("time", "x"))
        temp[:] = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = converted(source, tmp_path / "out", "--datasets", "quality,temp")
    from tfrecord_etl.pipelines import inspect

    capsys.readouterr()
    code, out, _err = run_command(inspect.main, [str(source)], capsys)
    assert code == 0 and "  quality: 3 categories from quality flag_meanings: clear, cloud, cloud_shadow\n" in out, out
    with netcdf_file(source, "r", mmap=False) as f:
        stored = f.variables["quality"].data.copy()
    table = {0: b"clear", 2: b"cloud", 4: b"cloud_shadow"}
    assert got["quality"].tolist() == [[table[v] for v in row] for row in stored.tolist()]
    verified(tmp_path / "out", source)
    codes = converted(source, tmp_path / "codes", "--datasets", "quality,temp", "--categoricals", "codes")
    assert codes["quality"].tolist() == stored.tolist()


def test_a_column_of_many_names_has_them_in_metadata_not_in_the_schema(tmp_path, monkeypatch):
    """Over ``MAX_DOMAIN_VALUES`` names (AnnData keeps cell ids as categoricals), schema.pbtxt has no StringDomain;
    over ``MAX_CATEGORIES`` the column keeps its codes (a warning says so)."""
    from tfrecord_etl.transforms.output import schemafile
    from tfrecord_etl.transforms.sources import categoricals

    monkeypatch.setattr(schemafile, "MAX_DOMAIN_VALUES", 3)
    source = anndata_08(tmp_path / "a.h5ad")
    got = converted(source, tmp_path / "out")
    assert got["obs/cell_type"].tolist() == names_of(CELL_TYPES, CODES).tolist()
    assert feature(tmp_path / "out", "obs/cell_type")["categories"]["values"] == CELL_TYPES
    text = schema_feature(tmp_path / "out", "obs/cell_type")
    assert "string_domain" not in text and 'tag: "tfrecord_etl.categorical:strings"' in text
    verified(tmp_path / "out", source)
    monkeypatch.setattr(categoricals, "MAX_CATEGORIES", 3)
    got = converted(source, tmp_path / "codes")
    assert got["obs/cell_type/codes"].tolist() == CODES.tolist()
    assert "categories" not in feature(tmp_path / "codes", "obs/cell_type/codes")


def test_verify_source_of_an_output_written_before_categoricals(tmp_path, pbmc):
    """An output written before categorical columns were mapped holds their codes and records no
    ``categoricals`` option: ``verify --source`` compares it with the codes, and says OK."""
    from tfrecord_etl.transforms.codec import spec_from_json
    from tfrecord_etl.transforms.output import schemafile

    out = tmp_path / "old"
    converted(PBMC, out, "--categoricals", "codes")
    doc = metadata(out)
    del doc["options"]["categoricals"]
    for f in doc["features"]:
        f.pop("categories", None)
    (out / "metadata.json").write_text(json.dumps(doc))
    (out / "schema.pbtxt").write_text(schemafile.schema_text([spec_from_json(f) for f in doc["features"]]))
    verified(out, PBMC)


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda g: g.create_dataset("categories", data=np.zeros((2, 2), np.int8)), "are a 2-d int8 dataset"),
        (lambda g: g.create_dataset("categories", data=np.array([b"\xff\xfe", b"ok"])), "holds no category names"),
        (lambda g: g.create_group("categories"), "are not a dataset"),
    ],
)
def test_categories_that_are_not_names_leave_the_codes_with_a_warning(tmp_path, caplog, make, said):
    source = anndata_08(tmp_path / "a.h5ad")
    with h5py.File(source, "a") as f:
        del f["obs/cell_type/categories"]
        make(f["obs/cell_type"])
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        got = converted(source, tmp_path / "out")
    assert got["obs/cell_type/codes"].tolist() == CODES.tolist()
    assert "categories" not in feature(tmp_path / "out", "obs/cell_type/codes")
    assert any(said in r.getMessage() and "obs/cell_type/codes" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
