"""--format parquet: Parquet, Feather v2 and Arrow IPC files (pyarrow's own test files, TFX's Chicago taxi
Parquet file and generated ones), converted with default options and read back with our reader and plain
TensorFlow, every value compared with pyarrow's reader; row groups as row ranges, both writers, verify --source,
an augment join, and the refusals (truncated files, footers larger than the file, compressed bombs, tensor shapes
that do not match their storage, nulls no feature carries) by type and message."""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from tests.conftest import BEAM_FLAGS, convert, fixture_file, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import RowRange, SourceOptions, format_of, make_source

PYARROW_DATA = os.path.join(os.path.dirname(pa.__file__), "tests", "data")
TAXI = "tfx/components/testdata/external/parquet/data.parquet"
N = 50


def every_kind(n: int = N) -> pa.Table:
    """A table with a column of every kind the source reads."""
    tensor = pa.fixed_shape_tensor(pa.float32(), [2, 2])
    return pa.table(
        {
            "i8": pa.array(np.arange(n, dtype=np.int8)),
            "u64": pa.array(np.arange(n, dtype=np.uint64) * 2**40),
            "f4": pa.array(np.linspace(0, 1, n, dtype=np.float32)),
            "f8": pa.array(np.linspace(0, 1, n) / 3),
            "b": pa.array(np.arange(n) % 2 == 0),
            "nullable": pa.array([None if i % 7 == 0 else i - 20 for i in range(n)], pa.int64()),
            "nstr": pa.array([None if i % 5 == 0 else f"s{i}" for i in range(n)]),
            "s": pa.array([f"ü{i}" for i in range(n)]),
            "cat": pa.array([["a", "bb", "ccc"][i % 3] for i in range(n)]).dictionary_encode(),
            "img": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 6, dtype=np.uint16)), 3), 2
            ),
            "vl": pa.array([list(range(i % 4)) for i in range(n)], pa.list_(pa.int32())),
            "vs": pa.array([["x"] * (i % 3) for i in range(n)], pa.list_(pa.string())),
            "ts": pa.array(np.arange(n).astype("datetime64[ms]")),
            "ten": pa.ExtensionArray.from_storage(
                tensor, pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.float32)), 4)
            ),
            "st": pa.StructArray.from_arrays(
                [pa.array(np.arange(n)), pa.array([b"x%d" % i for i in range(n)])], ["k", "v"]
            ),
        }
    )


def expected(table: pa.Table) -> dict[str, list]:
    """Each feature's rows as pyarrow's own reader gives them, in our form: numbers as arrays, strings as UTF-8
    bytes, null rows of a scalar column as the empty list, structs' fields as ``NAME/FIELD``."""
    out = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_struct(column.type):
            for field, child in zip(column.type, column.flatten()):
                out[f"{name}/{field.name}"] = child.to_pylist()
        elif isinstance(column.type, pa.BaseExtensionType):
            out[name] = list(column.to_numpy_ndarray())
        else:
            out[name] = column.to_pylist()
    return out


def same(got, want) -> bool:
    """One row: ours (a NumPy value) against pyarrow's (Python value, None for null)."""
    if want is None:  # a null row: no value
        return np.asarray(got).size == 0
    if np.shape(got) == (1,) and not isinstance(want, list):  # a nullable scalar column's row: 1 value
        got = np.asarray(got)[0]
    if isinstance(want, str):
        want = want.encode()
    if isinstance(want, list) and want and isinstance(want[0], str):
        want = [w.encode() for w in want]
    if hasattr(want, "isoformat"):
        want = np.datetime64(want)
    got = np.asarray(got)
    if got.dtype == object:
        return got.tolist() == want
    return np.array_equal(got, np.asarray(want))


def check_output(out, table: pa.Table, order=None) -> None:
    want = expected(table)
    rows = list(reader.iter_numpy(str(out)))
    if order is not None:
        rows = sorted(rows, key=order)
    assert len(rows) == table.num_rows
    for name, values in want.items():
        bad = [i for i, (r, w) in enumerate(zip(rows, values)) if not same(r[name], w)]
        assert bad == [], f"{name}: rows {bad[:5]} differ, e.g. {rows[bad[0]][name]!r} vs {values[bad[0]]!r}"


@pytest.mark.parametrize("kind", ["parquet", "feather"])
def test_every_kind_of_column_round_trips_exactly(tmp_path, capsys, kind):
    table = every_kind()
    src = tmp_path / f"t.{kind}"
    if kind == "parquet":
        pq.write_table(table, src, row_group_size=16)
    else:
        feather.write_feather(table, src, chunksize=16)
    out = tmp_path / "out"
    code, _, err = convert(src, out, "--num_shards", "3", capsys=capsys)
    assert code == 0, err
    check_output(out, pq.read_table(src) if kind == "parquet" else feather.read_table(src))
    import json

    features = {f["name"]: f for f in json.loads((out / "metadata.json").read_text())["features"]}
    assert (features["img"]["shape"], features["img"]["dtype"]) == ([2, 3], "<u2")
    assert (features["ten"]["shape"], features["ten"]["dtype"]) == ([2, 2], "<f4")
    assert {n: features[n]["encoding"] for n in ("nullable", "nstr", "vl", "vs", "f8", "u64")} == {
        "nullable": "varlen",  # TFX's form of a null: the feature with no value
        "nstr": "varlen",
        "vl": "varlen",
        "vs": "varlen",
        "f8": "tensor",  # exact (a float_list is float32)
        "u64": "tensor",
    }


def test_plain_tensorflow_reads_the_features_as_tfx_would(tmp_path, capsys):
    import tensorflow as tf

    table = every_kind()
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=16)
    out = tmp_path / "out"
    assert convert(tmp_path / "t.parquet", out, "--num_shards", "1", capsys=capsys)[0] == 0
    spec = {
        "i8": tf.io.FixedLenFeature([], tf.int64),
        "s": tf.io.FixedLenFeature([], tf.string),
        "img": tf.io.FixedLenFeature([2, 3], tf.int64),
        "nullable": tf.io.VarLenFeature(tf.int64),
        "vs": tf.io.VarLenFeature(tf.string),
        "f8": tf.io.FixedLenFeature([], tf.string),
    }
    files = sorted(str(p) for p in out.glob("*.tfrecord*"))
    batch = next(iter(tf.data.TFRecordDataset(files).batch(N).map(lambda r: tf.io.parse_example(r, spec))))
    want = expected(table)
    assert batch["i8"].numpy().tolist() == want["i8"]
    assert [v.decode() for v in batch["s"].numpy()] == want["s"]
    assert np.array_equal(batch["img"].numpy(), np.asarray(want["img"]))
    nullable = tf.RaggedTensor.from_sparse(batch["nullable"]).to_list()
    assert nullable == [[] if v is None else [v] for v in want["nullable"]]
    assert tf.RaggedTensor.from_sparse(batch["vs"]).to_list() == [[x.encode() for x in v] for v in want["vs"]]
    f8 = tf.io.decode_raw(batch["f8"], tf.float64, little_endian=True).numpy()[:, 0]
    assert np.array_equal(f8, np.asarray(want["f8"]))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(PYARROW_DATA, "*", "*.parquet"))))
def test_pyarrows_own_parquet_files_convert_by_default(tmp_path, capsys, path):
    out = tmp_path / "out"
    code, _, err = convert(path, out, capsys=capsys)
    assert code == 0, err
    table = pq.read_table(path)
    index = [c for c in table.column_names if c.startswith("__index_level_")]
    check_output(out, table.drop_columns(index))
    assert not any(k.startswith("__index_level_") for k in next(iter(reader.iter_numpy(str(out)))))


def test_pyarrows_own_compressed_feather_file(tmp_path, capsys):
    path = os.path.join(PYARROW_DATA, "feather", "v0.17.0.version.2-compression.lz4.feather")
    assert format_of(path, SourceOptions()) == "parquet"
    out = tmp_path / "out"
    assert convert(path, out, capsys=capsys)[0] == 0
    check_output(out, feather.read_table(path))


@pytest.mark.parametrize("writer", ["planned", "beam"])
def test_tfx_taxi_parquet_converts_as_tfx_example_gen_writes_it(tmp_path, capsys, writer):
    """TFX's ParquetExecutor writes each row with ``dict_to_example``: an int as a 1-value int64_list, a string
    as a bytes_list, a null as a feature with no value. Ours agrees on every int and string column (this file's nulls are in
    float64 columns; test_plain_tensorflow... checks int nulls); float64 columns keep their exact value (tensor) where TFX casts them to float32."""
    path = fixture_file(TAXI)
    out = tmp_path / "out"
    code, _, err = convert(path, out, "--num_shards", "3", "--writer", writer, "--provenance", capsys=capsys)
    assert code == 0, err
    table = pq.read_table(path)
    check_output(out, table, order=lambda e: int(e["_source/row"]))
    import tensorflow as tf

    records = [
        tf.train.Example.FromString(r.numpy())
        for r in tf.data.TFRecordDataset(sorted(map(str, out.glob("*.tfrecord*"))))
    ]
    if writer == "beam":
        records.sort(key=lambda e: e.features.feature["_source/row"].int64_list.value[0])
    rows = table.to_pylist()
    typed = {f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_string(f.type)}
    for record, row in zip(records[:500], rows[:500]):
        for name, value in row.items():
            feature = record.features.feature[name]
            if name not in typed:  # float64: our tensor, exact (checked by check_output above)
                continue
            if value is None:  # dict_to_example: Feature() (no kind); ours: an empty varlen list
                assert not (feature.int64_list.value or feature.float_list.value or feature.bytes_list.value)
            elif isinstance(value, int):
                assert list(feature.int64_list.value) == [value], name
            elif isinstance(value, str):
                assert list(feature.bytes_list.value) == [value.encode()], name


def test_a_row_range_reads_across_row_groups(tmp_path):
    table = every_kind()
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    source = make_source("parquet", SourceOptions())
    index = source.index(str(tmp_path / "t.parquet"))
    assert (index.num_rows, index.chunk_rows) == (N, 7)
    got = source.read(RowRange(str(tmp_path / "t.parquet"), 5, 23, index.items))
    want = expected(table.slice(5, 18))
    for name, values in want.items():
        assert all(same(g, w) for g, w in zip(got[name], values)) and len(got[name]) == 18, name
    source.close()


def test_datasets_names_the_columns(tmp_path, capsys):
    pq.write_table(every_kind(), tmp_path / "t.parquet")
    out = tmp_path / "out"
    assert convert(tmp_path / "t.parquet", out, "--datasets", "img,s", capsys=capsys)[0] == 0
    assert sorted(next(iter(reader.iter_numpy(str(out))))) == ["img", "s"]
    with pytest.raises(SchemaError, match=r"No column 'nope' in the table \(its columns: i8, u64,"):
        make_source("parquet", SourceOptions(datasets=("nope",))).index(str(tmp_path / "t.parquet"))


def test_verify_source_compares_every_value_and_an_augment_join_reads_a_table(tmp_path, capsys):
    from tfrecord_etl.pipelines import augment, verify

    table = every_kind()
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=16)
    out = tmp_path / "out"
    assert convert(tmp_path / "t.parquet", out, capsys=capsys)[0] == 0
    code, stdout, _ = run_command(verify.main, [out, "--source", tmp_path / "t.parquet"], capsys)
    assert code == 0, stdout
    changed = table.set_column(table.column_names.index("vl"), "vl", pa.array([[9]] * N, pa.list_(pa.int32())))
    pq.write_table(changed, tmp_path / "t.parquet", row_group_size=16)
    code, stdout, _ = run_command(verify.main, [out, "--source", tmp_path / "t.parquet"], capsys)
    assert code == 1 and "vl" in stdout
    pq.write_table(pa.table({"label": np.arange(N, dtype=np.int64) % 3}), tmp_path / "labels.parquet")
    argv = ["--input", out, "--output_dir", tmp_path / "side", "--mode", "sidecar"]
    argv += ["--join_input", tmp_path / "labels.parquet", "--join_fields", "label", *BEAM_FLAGS]
    code, _, err = run_command(augment.main, argv, capsys)
    assert code == 0, err
    got = [int(e["label"]) for e in reader.iter_numpy_merged(str(out), str(tmp_path / "side"))]
    assert got == (np.arange(N) % 3).tolist()


def test_inspect_shows_what_convert_makes_of_a_table(tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect

    code, stdout, err = run_command(inspect.main, [fixture_file(TAXI)], capsys)
    assert code == 0, err
    assert "format parquet (Parquet, Feather and Arrow IPC tables): convert makes 10000 Examples" in stdout
    assert "trip_seconds" in stdout and "[None]" in stdout


def source():
    return make_source("parquet", SourceOptions())


def test_a_truncated_file_is_one_line_naming_it(tmp_path):
    pq.write_table(every_kind(), tmp_path / "t.parquet")
    data = (tmp_path / "t.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError) as e:
        source().index(str(tmp_path / "cut.parquet"))
    assert "Not a readable Parquet file" in str(e.value) and str(tmp_path / "cut.parquet") in str(e.value)
    assert "\n" not in str(e.value)


def test_a_footer_longer_than_the_file_is_refused(tmp_path):
    pq.write_table(every_kind(), tmp_path / "t.parquet")
    data = bytearray((tmp_path / "t.parquet").read_bytes())
    data[-8:-4] = (2**31 - 1).to_bytes(4, "little")  # the footer's length, then PAR1
    (tmp_path / "t.parquet").write_bytes(bytes(data))
    with pytest.raises(SourceError, match="Not a readable Parquet file: .*(footer|metadata|size)"):
        source().index(str(tmp_path / "t.parquet"))


def test_a_compressed_bomb_is_refused_before_reading(tmp_path, capsys):
    pq.write_table(pa.table({"z": np.zeros(4_000_000, np.int64)}), tmp_path / "bomb.parquet", compression="zstd")
    size = (tmp_path / "bomb.parquet").stat().st_size
    assert size < 64 * 1024  # 32 MB of zeros
    with pytest.raises(SourceError) as e:
        source().index(str(tmp_path / "bomb.parquet"))
    assert "more than --max_compression_ratio 500 times its size (a compressed bomb" in str(e.value)
    code, _, err = convert(tmp_path / "bomb.parquet", tmp_path / "out", "--max_compression_ratio", "1e6", capsys=capsys)
    assert code == 0, err


def test_a_tensor_shape_that_does_not_match_its_storage_is_refused(tmp_path):
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 4)
    meta = {
        b"ARROW:extension:name": b"arrow.fixed_shape_tensor",
        b"ARROW:extension:metadata": b'{"shape":[3,3]}',
    }
    schema = pa.schema([pa.field("t", storage.type, metadata=meta)])
    pq.write_table(pa.Table.from_arrays([storage], schema=schema), tmp_path / "t.parquet")
    with pytest.raises(SourceError) as e:  # pyarrow refuses the type when it reads the schema
        source().index(str(tmp_path / "t.parquet"))
    assert "Not a readable Parquet file: Product of shape dimensions (9) does not match FixedSizeList size (4)" in str(
        e.value
    )
    assert str(tmp_path / "t.parquet") in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "column, message",
    [
        (pa.array([[1, 2], None, [3, 4]], pa.list_(pa.int64(), 2)), "Column 'c' holds a null row at row 1"),
        (pa.array([[1, 2], [3, None]], pa.list_(pa.int64(), 2)), "holds a null value inside a fixed-size row at row 1"),
        (pa.array([[1], [2, None, 3]], pa.list_(pa.int64())), "holds a null value inside a list at row 1"),
    ],
)
def test_nulls_no_feature_carries_name_the_column_and_row(tmp_path, column, message):
    """(In Feather: pyarrow 25 cannot read back a Parquet file of a fixed-size list column with a null row.)"""
    feather.write_feather(pa.table({"c": column}), tmp_path / "t.feather")
    s = source()
    index = s.index(str(tmp_path / "t.feather"))
    with pytest.raises(SourceError, match=message):
        s.read(RowRange(str(tmp_path / "t.feather"), 0, index.num_rows, index.items))


def test_a_type_no_feature_carries_is_refused_naming_the_column(tmp_path):
    import decimal

    pq.write_table(pa.table({"price": pa.array([decimal.Decimal("1.10")], pa.decimal128(5, 2))}), tmp_path / "d.pq")
    with pytest.raises(SchemaError, match=r"Column 'price' is of Arrow type decimal128\(5, 2\)"):
        source().index(str(tmp_path / "d.pq"))


def test_a_feather_v1_file_is_named_with_the_way_out(tmp_path):
    feather.write_feather(pa.table({"x": [1, 2]}), tmp_path / "old.feather", version=1)
    with pytest.raises(SourceError, match="Feather v1 file"):
        format_of(str(tmp_path / "old.feather"), SourceOptions())
    with pytest.raises(SourceError, match="Feather v1 files \\(FEA1"):
        source().index(str(tmp_path / "old.feather"))
