"""pandas ``HDFStore`` tables (``df.to_hdf(path, key="df", format="table")``, PyTables) with categorical columns:
the codes in ``/df/table`` are written as the names of ``/df/meta/<field>/meta/table`` by default, as the codes with
``--categoricals codes``; convert takes ``/df/table`` (not PyTables' search indexes, not pandas' category tables).

The files are written by pandas + PyTables; expected values come from ``pd.read_hdf`` of the same file.
"""

from __future__ import annotations

import pickle

import h5py
import numpy as np
import pytest

from tests.conftest import convert, run_command
from tests.test_categoricals import converted, feature, verified

pd = pytest.importorskip("pandas")
pytest.importorskip("tables")  # PyTables: pandas' HDFStore writer (setup.py's "test" extra)

LABELS = ["cat", "dog", None, "Müller", "cat", "bird"]  # None: a missing value, code -1
NUMBERS = [10, 20, 10, 30, 20, 10]


def frame():
    return pd.DataFrame(
        {
            "label": pd.Categorical(LABELS),
            "num": pd.Categorical(NUMBERS),
            "x": np.arange(6, dtype=np.float64) / 4,
        }
    )


def write(path, df=None, **kwargs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PyTables' NaturalNameWarning and the like)
        (frame() if df is None else df).to_hdf(path, key="df", format="table", **kwargs)
    return path


def as_names(series) -> list[bytes]:
    """What pandas reads, as the feature holds it: each name's UTF-8 bytes (numbers as their decimal text), b""
    for a missing value."""
    return [b"" if pd.isna(v) else str(v).encode() for v in series]


def parsed_with_tensorflow(out, spec: dict) -> dict:
    """Every Example of ``out`` parsed by plain TensorFlow (no tfrecord_etl code): ``{name: [values]}``."""
    import tensorflow as tf

    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    got = {k: [] for k in spec}
    for record in tf.data.TFRecordDataset(files):
        example = tf.io.parse_single_example(record, spec)
        for k in spec:
            got[k].append(example[k].numpy())
    return got


def test_categoricals_are_written_as_their_names(tmp_path):
    """Two categorical columns (strings with a missing value, integers) and a float column: convert takes
    ``/df/table`` by default; ``label`` and ``num`` come out as ``df/table/label`` and ``df/table/num``, one name
    per row, equal to pd.read_hdf's; the mapping in metadata.json and schema.pbtxt; verify --source agrees."""
    source = write(tmp_path / "a.h5")
    expected = pd.read_hdf(source, "df")
    got = converted(source, tmp_path / "out")
    assert sorted(got) == ["df/table/index", "df/table/label", "df/table/num", "df/table/values_block_2"]
    assert got["df/table/label"].tolist() == as_names(expected["label"])
    assert got["df/table/label"][2] == b"" and got["df/table/label"][3].decode() == "Müller"
    assert got["df/table/num"].tolist() == as_names(expected["num"]) == [str(n).encode() for n in NUMBERS]
    assert got["df/table/values_block_2"][:, 0].tolist() == expected["x"].tolist()
    assert got["df/table/index"].tolist() == expected.index.tolist()
    label = feature(tmp_path / "out", "df/table/label")
    assert label["shape"] == [] and label["dtype"] == f"|S{len('Müller'.encode())}"
    assert label["categories"] == {
        "values": list(expected["label"].cat.categories),
        "codes": [0, 1, 2, 3],
        "ordered": False,
        "written": "strings",
        "missing": -1,
        "origin": "/df/meta/values_block_0/meta/table",
    }
    assert feature(tmp_path / "out", "df/table/num")["categories"]["values"] == ["10", "20", "30"]
    schema = (tmp_path / "out" / "schema.pbtxt").read_text()
    assert 'tag: "tfrecord_etl.categorical:strings"' in schema and 'value: "bird"' in schema
    verified(tmp_path / "out", source)

    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    spec = {
        "df/table/label": tf.io.FixedLenFeature([], tf.string),
        "df/table/num": tf.io.FixedLenFeature([], tf.string),
    }
    parsed = parsed_with_tensorflow(tmp_path / "out", spec)
    assert parsed["df/table/label"] == as_names(expected["label"])
    assert parsed["df/table/num"] == as_names(expected["num"])


def test_data_columns_are_fields_of_their_own(tmp_path):
    """``data_columns=True``: each column a field named after it, its names in ``/df/meta/<column>/meta/table``;
    the features have the same names as in the block layout."""
    source = write(tmp_path / "d.h5", data_columns=True)
    with h5py.File(source, "r") as f:
        assert {"label", "num", "x"} <= set(f["df/table"].dtype.names) and "df/meta/label/meta/table" in f
    expected = pd.read_hdf(source, "df")
    got = converted(source, tmp_path / "out")
    assert sorted(got) == ["df/table/index", "df/table/label", "df/table/num", "df/table/x"]
    assert got["df/table/label"].tolist() == as_names(expected["label"])
    assert got["df/table/num"].tolist() == as_names(expected["num"])
    assert got["df/table/x"].tolist() == expected["x"].tolist()
    assert feature(tmp_path / "out", "df/table/label")["categories"]["origin"] == "/df/meta/label/meta/table"
    verified(tmp_path / "out", source)


def test_codes_mode_keeps_the_codes_under_the_fields_name(tmp_path):
    source = write(tmp_path / "a.h5")
    expected = pd.read_hdf(source, "df")
    got = converted(source, tmp_path / "out", "--categoricals", "codes")
    assert "df/table/label" not in got
    assert got["df/table/values_block_0"][:, 0].tolist() == expected["label"].cat.codes.tolist()
    assert got["df/table/values_block_1"][:, 0].tolist() == expected["num"].cat.codes.tolist()
    spec = feature(tmp_path / "out", "df/table/values_block_0")
    assert spec["dtype"] == "|i1" and spec["shape"] == [1]
    assert spec["categories"]["written"] == "codes"
    assert spec["categories"]["values"] == list(expected["label"].cat.categories)
    assert "is_categorical: true" in (tmp_path / "out" / "schema.pbtxt").read_text()
    verified(tmp_path / "out", source)


def test_a_series_and_a_categorical_index(tmp_path):
    """A Series (``series_table``: its field named after it) and a CategoricalIndex (``index_meta`` category, its
    names in ``/df/meta/index/meta/table``)."""
    series = write(tmp_path / "s.h5", pd.Series(pd.Categorical(["x", None, "y"]), name="s"))
    got = converted(series, tmp_path / "s")
    assert got["df/table/s"].tolist() == [b"x", b"", b"y"]
    index = pd.DataFrame({"v": [1.0, 2.0, 3.0]}, index=pd.CategoricalIndex(["p", "q", "p"], name="k"))
    got = converted(write(tmp_path / "i.h5", index), tmp_path / "i")
    assert got["df/table/index"].tolist() == [b"p", b"q", b"p"]
    assert pd.read_hdf(tmp_path / "i.h5", "df").index.tolist() == ["p", "q", "p"]


def test_a_code_naming_no_category_is_refused_with_its_row(tmp_path, capsys):
    source = write(tmp_path / "a.h5")
    with h5py.File(source, "r+") as f:
        table = f["df/table"][()]
        table["values_block_0"][4] = 7
        f["df/table"][...] = table
    code, _, err = convert(str(source), str(tmp_path / "out"), capsys=capsys)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "code 7 at row 4 names none of its 4 categories (/df/meta/values_block_0/meta/table)" in line
    assert "Hint: pass --categoricals codes" in line
    got = converted(source, tmp_path / "codes", "--categoricals", "codes")
    assert got["df/table/values_block_0"][4, 0] == 7


def test_inspect_lists_the_categorical_columns(tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect

    source = write(tmp_path / "a.h5")
    code, out, err = run_command(inspect.main, [str(source)], capsys)
    assert code == 0, err
    assert (
        "  df/table/label (codes in 'df/table/values_block_0'): 4 categories from "
        "/df/meta/values_block_0/meta/table: Müller, bird, cat, dog\n" in out
    )
    assert "  df/table/num (codes in 'df/table/values_block_1'): 3 categories from " in out
    assert "[pandas category names: convert writes its table's column as them]" in out
    assert "[PyTables search index: skipped by convert]" in out
    assert "  group 1: 6 rows, 1 dataset, " in out and "--datasets /df/table\n" in out
    assert "default: convert takes group 1: the only row group" in out


class Boom:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled')",))


@pytest.mark.parametrize(
    "raw, names",
    [
        (b"(lp0\nVlabel\np1\na.", ("label",)),  # PyTables' protocol 0, as pandas' F_kind holds it
        (pickle.dumps(["a", "b"], 0), ("a", "b")),
        (pickle.dumps(("a", "é"), 4), ("a", "é")),
        (pickle.dumps([], 2), ()),
        (pickle.dumps(["a", 1], 0), None),
        (pickle.dumps([["a"]], 0), None),
        (pickle.dumps({"a": "b"}, 0), None),
        (pickle.dumps(None, 0), None),
        (pickle.dumps([Boom()], 0), None),  # a call: refused, never run
        (b"integer", None),  # (index_kind: a plain string)
        (b"(lp0\nVlab", None),  # truncated
    ],
)
def test_pickled_names_reads_only_lists_of_strings(raw, names):
    from tfrecord_etl.transforms.sources.pdcategoricals import pickled_names

    assert pickled_names(np.bytes_(raw)) == names


def test_a_column_of_missing_values_only_has_no_categories(tmp_path):
    """pandas writes no category table for a column without categories (all missing) and reads zero categories:
    every row is the empty string, verify --source agrees."""
    source = write(tmp_path / "n.h5", pd.DataFrame({"c": pd.Categorical([None, None], categories=[])}))
    got = converted(source, tmp_path / "out")
    assert got["df/table/c"].tolist() == [b"", b""] and pd.read_hdf(source, "df")["c"].isna().all()
    assert feature(tmp_path / "out", "df/table/c")["categories"]["values"] == []
    verified(tmp_path / "out", source)


def test_categories_of_dates_leave_the_codes_with_a_warning(tmp_path, caplog):
    """Dates are stored as integers pandas converts back (microseconds here): no names, the codes are written."""
    dates = pd.Categorical(pd.to_datetime(["2020-01-01", "2021-06-30", "2020-01-01"]))
    source = write(tmp_path / "t.h5", pd.DataFrame({"t": dates}))
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        got = converted(source, tmp_path / "out")
    assert got["df/table/values_block_0"][:, 0].tolist() == [0, 1, 0]
    assert "categories" not in feature(tmp_path / "out", "df/table/values_block_0")
    assert any("are datetime64" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_column_name_that_is_no_list_of_strings_leaves_the_fields_name(tmp_path):
    """``values_block_0_kind`` replaced by a pickle that would run code: never unpickled; the names are still
    written, under the field's name."""
    source = write(tmp_path / "a.h5")
    with h5py.File(source, "r+") as f:
        f["df/table"].attrs["values_block_0_kind"] = np.bytes_(pickle.dumps([Boom()], 0))
    got = converted(source, tmp_path / "out")
    assert "df/table/label" not in got
    assert got["df/table/values_block_0"].tolist() == as_names(frame()["label"])
    assert feature(tmp_path / "out", "df/table/values_block_0")["shape"] == []
