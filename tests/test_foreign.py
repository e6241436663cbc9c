"""Foreign collections with missing values: Examples written by TFX ExampleGen (empty CSV cells
as empty or kind-less Features, optional features left out). The features recorded are the ones every record
satisfies (``varlen`` where a record lacks a value), never a sample's guess; augment, verify, inspect, both readers,
the merged sidecar readers and ``--fn_inputs`` read them as TensorFlow does (``tf.io.VarLenFeature``)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.conftest import fixture_file, run_command
from tests.test_augment import run_augment, tf  # noqa: F401 - the shared command helper and TF fixture
from tfrecord_etl.pipelines import inspect as inspect_main, verify as verify_main
from tfrecord_etl.transforms import codec, reader
from tfrecord_etl.transforms.codec import FeatureSpec, FeatureStats
from tfrecord_etl.transforms.errors import RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata, schemafile

TAXI = "tfx/components/testdata/csv_example_gen/Split-train"  # TFX's Chicago taxi ExampleGen output: 9,909 records
TAXI_SCHEMA = "tfx/examples/chicago_taxi_pipeline/data/user_provided_schema/schema.pbtxt"  # TFX's own schema of it
TAXI_RECORDS = 9909


def taxi_pattern() -> str:
    return str(fixture_file(TAXI) / "*.gz")


def taxi_records(tf) -> list[bytes]:
    files = sorted(fixture_file(TAXI).glob("*.gz"))
    return [r.numpy() for r in tf.data.TFRecordDataset([str(f) for f in files], compression_type="GZIP")]


def varlen_spec(tf, specs):
    """The plain TensorFlow parse spec of the features as TF users write it by hand: VarLen for every feature."""
    kinds = {"<i8": tf.int64, "<f4": tf.float32, "bytes": tf.string}
    return {s.name: tf.io.VarLenFeature(kinds[s.dtype]) for s in specs}


def plain_tf_values(tf, records, specs):
    """Per record {name: list of values} parsed by plain tf.io.parse_example with VarLenFeature."""
    parsed = tf.io.parse_example(tf.constant(records), varlen_spec(tf, specs))
    columns = {k: tf.RaggedTensor.from_sparse(v).to_list() for k, v in parsed.items()}
    return [{k: columns[k][i] for k in columns} for i in range(len(records))]


# -- FeatureStats: the C++ batch path learns what the Python walk learns ------------------------------------------


def _example(features: dict) -> bytes:
    """A serialized Example from {name: (kind or None, values)}, built with the codec's wire primitives."""
    from tfrecord_etl.transforms.codec import encode_varint, length_delimited_field

    entries = b""
    for name, (kind, values) in features.items():
        if kind is None:
            feature = b""
        elif kind == "bytes":
            feature = length_delimited_field(1, b"".join(length_delimited_field(1, v) for v in values))
        elif kind == "int64":
            packed = b"".join(encode_varint(v & 0xFFFFFFFFFFFFFFFF) for v in values)
            feature = length_delimited_field(3, length_delimited_field(1, packed) if values else b"")
        else:
            packed = np.asarray(values, "<f4").tobytes()
            feature = length_delimited_field(2, length_delimited_field(1, packed) if values else b"")
        entries += length_delimited_field(
            1, length_delimited_field(1, name.encode()) + length_delimited_field(2, feature)
        )
    return length_delimited_field(1, entries)


_KINDS = {"a": "int64", "b": "float", "c": "bytes", "d": "int64"}
_value = {
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "bytes": st.binary(max_size=4),
}
_feature = {
    name: st.one_of(st.none(), st.just((None, [])), st.lists(_value[kind], max_size=3).map(lambda v, k=kind: (k, v)))
    for name, kind in _KINDS.items()
}
_record = st.fixed_dictionaries(_feature).map(lambda d: {k: v for k, v in d.items() if v is not None})


@settings(max_examples=60, deadline=None)
@given(st.lists(_record, min_size=1, max_size=12))
def test_feature_stats_batch_path_equals_the_record_walk(records):
    """One C++ decode per batch (tfx_bsl) and the Python walk record by record give the same stats and specs:
    absent, kind-less, empty and varying lists; every record's features checked against the plain TF parse."""
    serialized = [_example(r) for r in records]
    fast, walk = FeatureStats(), FeatureStats()
    fast.observe_records(serialized)
    for s in serialized:
        walk.observe(codec.parse_example(s))
    assert fast.records == walk.records == len(records)
    norm = lambda stats: {n: (sorted(k), p, lo, hi) for n, (k, p, lo, hi) in stats.features.items()}  # noqa: E731
    assert norm(fast) == norm(walk)
    assert {s.name: s for s in fast.specs()} == {s.name: s for s in walk.specs()}
    for spec in fast.specs():
        holding = [r.get(spec.name, (None, []))[0] is not None for r in records]
        lengths = {len(r[spec.name][1]) for r, h in zip(records, holding) if h}
        fixed = all(holding) and len(lengths) == 1
        assert spec.encoding == ("list" if fixed else "varlen"), (spec, records)
        for s, r in zip(serialized, records):  # every record decodes, to exactly its values
            got = codec.decode_example(s, [spec])[spec.name]
            kind, values = r.get(spec.name, (None, []))
            want = np.asarray(values, {"int64": "<i8", "float": "<f4"}.get(kind, object)) if kind else []
            assert list(got) == list(want)


def test_feature_stats_merge_is_the_stats_of_all_records():
    first = [_example({"x": ("int64", [1]), "s": ("bytes", [b"a"])})] * 3
    later = [_example({"x": ("int64", []), "s": ("bytes", [b"b"]), "new": ("float", [1.0, 2.0])})]
    a, b, whole = FeatureStats(), FeatureStats(), FeatureStats()
    a.observe_records(first)
    b.observe_records(later)
    whole.observe_records(first + later)
    merged = FeatureStats.from_json(json.loads(json.dumps(a.to_json()))).merge(FeatureStats.from_json(b.to_json()))
    assert merged.to_json() == whole.to_json()
    assert merged.specs() == (
        FeatureSpec("x", "<i8", (None,), "varlen"),
        FeatureSpec("s", "bytes", (1,), "list"),
        FeatureSpec("new", "<f4", (None,), "varlen"),
    )
    assert a.specs()[0] == FeatureSpec("x", "<i8", (1,), "list")  # the first records alone would have guessed fixed
    mixed = FeatureStats()
    with pytest.raises(SchemaError, match="Feature 'x' holds float and int64 lists"):
        mixed.observe_records(first + [_example({"x": ("float", [1.0])})])
    with pytest.raises(RecordError, match="tf.train.Example") as e:
        FeatureStats().observe_records(first + [b"\x12\x03abc"])  # field 2: a SequenceExample, not an Example
    assert e.value.context["record"] == 3


def test_varlen_encoding_writes_no_shape_companion_and_reads_like_tf(tf):
    spec = FeatureSpec("v", "<i4", (None,), "varlen")
    rows = [np.array([1, -2, 3], "<i4"), np.zeros(0, "<i4"), np.array([7], "<i4")]
    records = codec.encode_batch({"v": rows}, [spec], 3)
    assert all("v/shape" not in codec.split_features(r) for r in records)
    for r, want in zip(records, rows):
        got = codec.decode_example(r, [spec])["v"]
        assert got.dtype == np.dtype("<i4") and got.tolist() == want.tolist()
    absent = codec.decode_example(b"", [spec])["v"]  # a record without the feature: the empty list, as VarLen
    assert absent.dtype == np.dtype("<i4") and absent.size == 0
    parsed = tf.io.parse_example(tf.constant(records), {"v": tf.io.VarLenFeature(tf.int64)})["v"]
    assert tf.sparse.to_dense(parsed).numpy().tolist() == [[1, -2, 3], [0, 0, 0], [7, 0, 0]]
    with pytest.raises(SchemaError, match="varlen encoding carries 1-D rows"):
        codec.check_spec(FeatureSpec("m", "<i8", (2, None), "varlen"))
    assert "presence {\n    min_fraction: 0.0\n    min_count: 0\n  }" in schemafile.schema_text([spec])


# -- the real TFX ExampleGen collection ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def taxi_outputs(tmp_path_factory):
    """augment rewrite and sidecar of TFX's Chicago taxi ExampleGen output (empty CSV cells), no --schema."""
    base = tmp_path_factory.mktemp("taxi")
    out = {}
    for mode in ("rewrite", "sidecar"):
        out[mode] = base / mode
        code, _, _ = run_augment(taxi_pattern(), out[mode], "--mode", mode, "--constants", "source=tfx")
        assert code == 0
    return out


def test_augment_records_the_features_every_record_satisfies(taxi_outputs, tf):
    """The first 1,000 records hold one trip_seconds each; 3 of 9,909 hold none: varlen, not a fixed [1] guess."""
    meta = metadata.load(str(taxi_outputs["rewrite"]))
    specs = {s.name: s for s in meta["features"]}
    assert meta["num_records"] == TAXI_RECORDS
    assert specs["trip_seconds"] == FeatureSpec("trip_seconds", "<i8", (None,), "varlen")
    assert specs["fare"] == FeatureSpec("fare", "<f4", (1,), "list")
    assert specs["pickup_census_tract"] == FeatureSpec("pickup_census_tract", "<i8", (None,), "varlen")
    assert [c.split(":")[0] for c in meta["augment"]["input_features_corrected"]] == [
        "'pickup_census_tract'",
        "'trip_seconds'",
    ]
    # what the metadata says is what every record holds: check against plain TensorFlow, record by record
    records = taxi_records(tf)
    empty = [i for i, v in enumerate(plain_tf_values(tf, records, [specs["trip_seconds"]])) if not v["trip_seconds"]]
    assert len(empty) == 3 and min(empty) >= 1000
    schema = (taxi_outputs["rewrite"] / "schema.pbtxt").read_text()
    block = schema[schema.index('name: "trip_seconds"') :].split("feature {")[0]
    assert "min_fraction: 0.0" in block  # TFMD: optional


def test_augment_summary_says_which_guesses_were_wrong(tmp_path, capsys):
    code, out, err = run_augment(taxi_pattern(), tmp_path / "o", "--constants", "source=tfx", capsys=capsys)
    assert code == 0 and err == ""
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("input features:"))
    assert (
        "learned from every record" in line
        and "'trip_seconds': list <i8 [1] in the first records, but "
        "missing or empty in 3 of 9,909 records: recorded as varlen <i8 [None]"
        in line
    )


def test_readers_verify_and_inspect_read_the_rewrite_output_like_tf(taxi_outputs, tf, capsys):
    out = str(taxi_outputs["rewrite"])
    specs = [s for s in metadata.load(out)["features"] if s.name != "source"]
    want = plain_tf_values(tf, taxi_records(tf), specs)
    got = list(reader.iter_numpy(out))
    assert len(got) == TAXI_RECORDS
    for g, w in zip(got, want):
        assert {k: g[k].reshape(-1).tolist() for k in w} == w and g["source"] == b"tfx"
    tf_rows = list(reader.to_tf_dataset(out))
    assert len(tf_rows) == TAXI_RECORDS
    for g, w in zip(tf_rows, want):
        assert {k: g[k].numpy().reshape(-1).tolist() for k in w} == w
    code, text, _ = run_command(verify_main.main, [out], capsys)
    assert code == 0 and text.startswith("OK:")
    code, text, _ = run_command(inspect_main.main, [out, "--json"], capsys)
    assert (
        code == 0
        and {"name": "trip_seconds", "dtype": "<i8", "shape": [None], "encoding": "varlen"}
        in json.loads(text)["features"]
    )


def test_verify_and_inspect_of_the_raw_collection_learn_from_every_record(capsys):
    code, text, _ = run_command(verify_main.main, [taxi_pattern(), "--json"], capsys)
    report = json.loads(text)
    assert code == 0 and report["ok"] and report["inferred"]
    assert {"name": "trip_seconds", "dtype": "<i8", "shape": [None], "encoding": "varlen"} in report["features"]
    code, text, _ = run_command(inspect_main.main, [taxi_pattern(), "--json"], capsys)
    s = json.loads(text)
    assert code == 0 and s["inferred"]["from_records"] == TAXI_RECORDS
    assert {"name": "trip_seconds", "dtype": "<i8", "shape": [None], "encoding": "varlen"} in s["features"]


def test_merged_sidecar_readers_read_missing_values_like_tf(taxi_outputs, tf):
    side = taxi_outputs["sidecar"]
    manifest = json.loads((side / "manifest.json").read_text())
    assert {"name": "trip_seconds", "dtype": "<i8", "shape": [None], "encoding": "varlen"} in manifest["features"]
    specs = [FeatureSpec.from_json(f) for f in manifest["features"]]
    want = plain_tf_values(tf, taxi_records(tf), specs)
    merged = list(reader.iter_numpy_merged(taxi_pattern(), str(side)))
    assert len(merged) == TAXI_RECORDS
    for g, w in zip(merged, want):
        assert {k: g[k].reshape(-1).tolist() for k in w} == w and g["source"] == b"tfx"
    rows = list(reader.to_tf_dataset_merged(taxi_pattern(), str(side)))
    assert len(rows) == TAXI_RECORDS
    for g, w in zip(rows, want):
        assert {k: g[k].numpy().reshape(-1).tolist() for k in w} == w


def test_fn_inputs_of_a_foreign_collection_are_varlen(tmp_path, tf):
    """--fn gets trip_seconds as tf.io.VarLenFeature gives it: 1-D, empty in the 3 records without a value."""
    code, _, _ = run_augment(
        taxi_pattern(), tmp_path / "o", "--fn", "tests.augment_fns:count_values", "--fn_inputs", "trip_seconds,company"
    )
    assert code == 0
    got = [(ex["n_trip_seconds"].item(), ex["n_company"].item()) for ex in reader.iter_numpy(str(tmp_path / "o"))]
    want = plain_tf_values(
        tf,
        taxi_records(tf),
        [FeatureSpec("trip_seconds", "<i8", (None,), "varlen"), FeatureSpec("company", "bytes", (None,), "varlen")],
    )
    assert got == [(len(w["trip_seconds"]), len(w["company"])) for w in want]
    assert sum(n == 0 for n, _ in got) == 3


# -- --schema: a TFMD schema (TFX SchemaGen / user-provided) instead of learning ----------------------------------


def test_schema_flag_takes_the_tfx_schema_and_checks_every_record(tmp_path, capsys):
    schema = fixture_file(TAXI_SCHEMA)
    code, out, err = run_augment(
        taxi_pattern(), tmp_path / "o", "--constants", "source=tfx", "--schema", schema, capsys=capsys
    )
    assert code == 0, err
    declared = schemafile.specs_from_schema(schema.read_text())
    meta = metadata.load(str(tmp_path / "o"))
    assert tuple(meta["features"][:-1]) == declared and meta["augment"]["input_schema"] == str(schema)
    assert "every record checked" in out
    assert run_command(verify_main.main, [tmp_path / "o"])[0] == 0
    # the same schema with trip_seconds required: three records contradict it, nothing is committed
    text = schema.read_text()
    at = text.index("min_count: 1", text.index('name: "trip_seconds"'))
    bad = tmp_path / "required.pbtxt"
    bad.write_text(text[:at] + "min_fraction: 1.0\n    " + text[at:])
    code, _, err = run_augment(
        taxi_pattern(), tmp_path / "bad", "--constants", "source=tfx", "--schema", bad, capsys=capsys
    )
    *said, line = err.strip().splitlines()  # before the error: the shards this failed run wrote, removed
    assert all(s.startswith("[tfrecord-etl] removing") for s in said), said
    assert (
        code == 2
        and line.startswith(
            "error: SchemaError: The records contradict --schema: 'trip_seconds' is missing or empty in 1 of"
        )
        and "data_tfrecord-0000" in line
    )
    assert not (tmp_path / "bad" / "metadata.json").exists()


def test_schema_flag_errors(tmp_path, capsys):
    code, _, err = run_augment(
        taxi_pattern(), tmp_path / "a", "--constants", "s=1", "--schema", tmp_path / "nope", capsys=capsys
    )
    assert code == 2 and "ConfigError: --schema names no file" in err
    junk = tmp_path / "junk.pbtxt"
    junk.write_text("feature { name: 'x' type: WHAT }")
    code, _, err = run_augment(taxi_pattern(), tmp_path / "b", "--constants", "s=1", "--schema", junk, capsys=capsys)
    assert code == 2 and "SchemaError: Not a tensorflow_metadata Schema in text format" in err
    seq = fixture_file("tfx/components/testdata/schema_gen_sequence/schema.pbtxt")
    with pytest.raises(SchemaError, match="type STRUCT"):
        schemafile.specs_from_schema(seq.read_text(), str(seq))


# -- a collection generated by ExampleGen's own CSV code path --------------------------------------------------------


def _example_gen(tf, csv_path, out_path):
    """TFX CsvExampleGen's conversion (tfx/components/example_gen/csv_example_gen/executor.py, 1.21): tfx_bsl's
    ParseCSVLine and ColumnTypeInferrer, then one Feature per cell: an empty typed list for an empty cell, a
    Feature with no kind for a column whose type is unknown (every cell empty)."""
    from tfx_bsl.coders import csv_decoder

    lines = csv_path.read_text().splitlines()
    names = lines[0].split(",")
    parse = csv_decoder.ParseCSVLine(",")
    parse.setup()
    parsed = [next(iter(parse.process(line)))[0] for line in lines[1:]]
    inferrer = csv_decoder.ColumnTypeInferrer(names, skip_blank_lines=True)
    acc = inferrer.create_accumulator()
    for row in parsed:
        acc = inferrer.add_input(acc, row)
    infos = inferrer.extract_output(acc)
    handlers = {
        csv_decoder.ColumnType.INT: lambda c: tf.train.Feature(
            int64_list=tf.train.Int64List(value=[int(c)] if c else [])
        ),
        csv_decoder.ColumnType.FLOAT: lambda c: tf.train.Feature(
            float_list=tf.train.FloatList(value=[float(c)] if c else [])
        ),
        csv_decoder.ColumnType.STRING: lambda c: tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[c] if c else [])
        ),
    }
    with tf.io.TFRecordWriter(str(out_path), "GZIP") as w:
        for row in parsed:
            feature = {
                i.name: handlers[i.type](c) if i.type in handlers else tf.train.Feature() for c, i in zip(row, infos)
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_generated_example_gen_collection_with_late_empty_cells(tmp_path, tf, capsys):
    """1,500 CSV rows: 'age' is empty only after the first 1,000 (beyond the sample), 'note' in every other row,
    'unused' in every row (no kind). augment records them varlen, and every value reads back exactly."""
    rows = [
        {
            "id": i,
            "age": "" if i in (1200, 1499) else 20 + i % 50,
            "note": f"n{i}" if i % 2 else "",
            "score": f"{i / 8:.3f}",
            "unused": "",
        }
        for i in range(1500)
    ]
    path = tmp_path / "data.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["id", "age", "note", "score", "unused"])
        w.writeheader()
        w.writerows(rows)
    src = tmp_path / "Split-train"
    src.mkdir()
    _example_gen(tf, path, src / "data_tfrecord-00000-of-00001.gz")
    code, out, _ = run_augment(
        str(src / "*.gz"), tmp_path / "o", "--mode", "sidecar", "--constants", "k=1", capsys=capsys
    )
    assert code == 0
    specs = {f["name"]: f for f in json.loads((tmp_path / "o" / "manifest.json").read_text())["features"]}
    assert specs["id"]["encoding"] == "list" and specs["id"]["shape"] == [1]
    assert specs["age"]["encoding"] == specs["note"]["encoding"] == specs["unused"]["encoding"] == "varlen"
    assert specs["unused"]["dtype"] == "bytes" and "'age': list <i8 [1] in the first records" in out
    got = list(reader.iter_numpy_merged(str(src / "*.gz"), str(tmp_path / "o")))
    assert [g["id"].tolist() for g in got] == [[r["id"]] for r in rows]
    assert [g["age"].tolist() for g in got] == [[r["age"]] if r["age"] != "" else [] for r in rows]
    assert [g["note"].tolist() for g in got] == [[r["note"].encode()] if r["note"] else [] for r in rows]
    assert all(g["unused"].size == 0 for g in got)
    assert np.allclose([g["score"][0] for g in got], [float(r["score"]) for r in rows])


def test_tfxio_reads_the_varlen_features_with_the_written_schema(taxi_outputs):
    """TFX's reader (TFXIO) with our schema.pbtxt: typed features, varlen ones as sparse/ragged, fixed ones dense."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.public import tfxio

    out = taxi_outputs["rewrite"]
    schema = text_format.Parse((out / "schema.pbtxt").read_text(), schema_pb2.Schema())
    source = tfxio.TFExampleRecord(file_pattern=str(out / "*.gz"), schema=schema)
    specs = source.TensorAdapter().OriginalTypeSpecs()
    assert type(specs["trip_seconds"]).__name__ == "SparseTensorSpec"
    assert type(specs["fare"]).__name__ == "TensorSpec" and specs["fare"].shape.as_list() == [None, 1]
    total = 0
    for batch in source.RecordBatches(tfxio.RecordBatchesOptions(batch_size=2048, shuffle=False, num_epochs=1)):
        total += batch.num_rows
        assert batch.schema.field("trip_seconds").type.value_type.bit_width == 64
    assert total == TAXI_RECORDS


def test_schema_flag_needs_a_collection_without_metadata(tmp_path, capsys):
    import h5py

    from tests.conftest import convert

    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(10)
    assert convert(str(tmp_path / "a.h5"), tmp_path / "c")[0] == 0
    code, _, err = run_augment(
        str(tmp_path / "c"), tmp_path / "o", "--constants", "s=1", "--schema", fixture_file(TAXI_SCHEMA), capsys=capsys
    )
    assert code == 2 and "ConfigError: --schema is for collections without metadata.json" in err
