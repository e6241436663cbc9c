"""Reading a collection (collection.json + span-N/ output directories): the readers with spans=, verify and inspect
on a collection directory, TFDS per span and as one dataset. Collections are built as convert writes them: each
span converted into COLL/span-N with the convert command, then committed with collection.commit + add_span."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.conftest import convert, run_command
from tfrecord_etl.pipelines import common, inspect as inspect_main, verify as verify_main
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.errors import ConfigError, IncompleteOutputError, RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata
from tfrecord_etl.transforms.storage import fileio

ROWS = {3: 40, 4: 25, 7: 31}  # span -> rows: spans need not be contiguous


def span_arrays(span: int, rows: int) -> dict:
    rng = np.random.default_rng(span)
    return {
        "x": rng.standard_normal((rows, 3, 2)).astype(np.float32),
        "label": (np.arange(rows, dtype=np.int64) + 1000 * span),
    }


def inputs_of(pattern: str) -> list[dict]:
    """The ledger rows of a span's input files, as convert records them."""
    return [
        {"path": p, "size": s, "mtime_ns": os.stat(p).st_mtime_ns, "version": None} for p, s in fileio.match(pattern)
    ]


def add_span(coll, raw, span: int, arrays: dict, *flags, version=None, allow_schema_change=False):
    """Converts ``arrays`` into COLL/span-N[/version-V] with the convert command and commits the span."""
    day = raw / f"span-{span}" / (f"v{version}" if version is not None else "")
    day.mkdir(parents=True, exist_ok=True)
    np.savez(day / "part.npz", **arrays)
    out = coll / collection.span_dir_name(span, version)
    code, _, err = convert(day / "part.npz", out, "--num_shards", "2", "--index", *flags, capsys=None)
    assert code == 0, err
    entry = collection.span_entry(str(coll), span, version, inputs_of(str(day / "part.npz")))
    return collection.commit(str(coll), collection.add_span(entry, allow_schema_change))


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("coll")
    data = {span: span_arrays(span, rows) for span, rows in ROWS.items()}
    for span, arrays in data.items():
        add_span(tmp / "coll", tmp / "raw", span, arrays)
    return tmp / "coll", data


def expected(data, spans):
    return {k: np.concatenate([data[s][k] for s in spans]) for k in ("x", "label")}


def stacked(examples):
    return {k: np.stack([e[k] for e in examples]) for k in ("x", "label")}


@pytest.fixture(scope="module")
def tf():
    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def test_iter_numpy_reads_every_span_in_order_and_selections(coll):
    path, data = coll
    got = stacked(list(reader.iter_numpy(str(path))))
    want = expected(data, [3, 4, 7])
    np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(got["label"], want["label"])
    for spans, chosen in (
        ("latest", [7]),
        ("latest:2", [4, 7]),
        (4, [4]),
        ([7, 3], [3, 7]),
        (range(3, 5), [3, 4]),
        ("3-4", [3, 4]),
    ):
        got = stacked(list(reader.iter_numpy(str(path), spans=spans)))
        np.testing.assert_array_equal(got["label"], expected(data, chosen)["label"], err_msg=str(spans))
        np.testing.assert_array_equal(got["x"], expected(data, chosen)["x"], err_msg=str(spans))
    with pytest.raises(ConfigError, match="Span 5 is not in the collection"):
        list(reader.iter_numpy(str(path), spans=5))


def test_plain_tensorflow_and_to_tf_dataset_read_the_same_arrays(coll, tf):
    path, data = coll
    spans = collection.span_dirs(str(path), "latest:2")
    files = [p for d in spans for p in metadata.shard_paths(d, metadata.load(d))]
    spec = reader.tf_feature_spec(str(path), spans="latest:2")
    records = [r.numpy() for r in tf.data.TFRecordDataset(files)]
    parsed = tf.io.parse_example(tf.constant(records), spec)
    want = expected(data, [4, 7])
    np.testing.assert_array_equal(parsed["label"].numpy(), want["label"])
    assert tuple(spec["x"].shape) == (3, 2) and spec["x"].dtype == tf.float32  # auto: a typed float list for float32
    np.testing.assert_array_equal(parsed["x"].numpy(), want["x"])
    batches = list(reader.to_tf_dataset(str(path), batch_size=16, spans="latest:2"))
    got = {k: np.concatenate([b[k].numpy() for b in batches]) for k in ("x", "label")}
    np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(got["label"], want["label"])


def test_random_access_has_one_index_across_span_boundaries(coll):
    path, data = coll
    ra = reader.RandomAccess(str(path))
    want = expected(data, [3, 4, 7])
    assert len(ra) == sum(ROWS.values())
    for i in (0, 39, 40, 64, 65, 95, -1, -31, -32):
        np.testing.assert_array_equal(ra[i]["x"], want["x"][i])
        assert int(ra[i]["label"]) == int(want["label"][i])
    with pytest.raises(IndexError):
        ra[len(ra)]
    assert int(reader.get(str(path), 25, spans="latest:2")["label"]) == 7000
    assert len(reader.RandomAccess(str(path), spans=[3, 7])) == 71


def test_spans_on_a_plain_output_directory_is_a_config_error(coll):
    path, _ = coll
    one = collection.span_dirs(str(path), 3)[0]
    assert len(list(reader.iter_numpy(one))) == 40
    with pytest.raises(ConfigError, match="needs a collection directory"):
        list(reader.iter_numpy(one, spans="latest"))
    with pytest.raises(ConfigError, match="needs a collection directory"):
        reader.RandomAccess(one, spans=3)


def test_schema_mismatch_between_spans_names_them(tmp_path):
    coll = tmp_path / "coll"
    add_span(coll, tmp_path / "raw", 1, span_arrays(1, 5))
    other = span_arrays(2, 6)
    other["x"] = other["x"].astype(np.float64)
    add_span(coll, tmp_path / "raw", 2, other, allow_schema_change=True)
    with pytest.raises(SchemaError, match="Spans 1 and 2 have different schemas"):
        list(reader.iter_numpy(str(coll)))
    with pytest.raises(SchemaError, match="Spans 1 and 2 have different schemas"):
        reader.RandomAccess(str(coll))
    assert len(list(reader.iter_numpy(str(coll), spans=2))) == 6  # each side of the change reads


def test_features_differing_behind_one_fingerprint_are_refused(tmp_path):
    """schema.pbtxt does not tell a tensor feature's dtype (it is bytes): the features read are compared too."""
    coll = tmp_path / "coll"
    add_span(coll, tmp_path / "raw", 1, span_arrays(1, 5))
    other = span_arrays(2, 6)
    other["x"] = other["x"].astype(np.float64)
    add_span(coll, tmp_path / "raw", 2, other, allow_schema_change=True)
    c = collection.load(str(coll))
    for s in c["spans"]:
        s["schema"] = c["spans"][0]["schema"]
    collection.commit(str(coll), lambda _: c)
    with pytest.raises(SchemaError, match="Spans 1 and 2 record different features: 'x'"):
        list(reader.iter_numpy(str(coll)))
    assert len(list(reader.iter_numpy(str(coll), features=["label"]))) == 11


def test_latest_version_of_a_span_is_read(tmp_path):
    coll = tmp_path / "coll"
    add_span(coll, tmp_path / "raw", 1, span_arrays(1, 5), version=1)
    add_span(coll, tmp_path / "raw", 1, span_arrays(11, 7), version=2)
    add_span(coll, tmp_path / "raw", 2, span_arrays(2, 3))
    got = stacked(list(reader.iter_numpy(str(coll))))
    np.testing.assert_array_equal(
        got["label"], np.concatenate([span_arrays(11, 7)["label"], span_arrays(2, 3)["label"]])
    )


# -- verify -------------------------------------------------------------------------------------------------------


def copy_collection(coll, tmp_path):
    path, data = coll
    shutil.copytree(path, tmp_path / "coll")
    return tmp_path / "coll", data


def run_verify(target, *flags, capsys):
    return run_command(verify_main.main, [target, *flags], capsys)


def test_verify_a_collection_one_line_per_span_and_source(coll, tmp_path, capsys):
    path, _ = coll
    code, out, err = run_verify(path, "--source", str(path.parent / "raw" / "*" / "*.npz"), capsys=capsys)
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0] == "OK: span 3: 40 records in 2 files, 2 shard CRC32Cs, 40 rows compared with the source"
    assert lines[1].startswith("OK: span 4: 25 records") and lines[2].startswith("OK: span 7: 31 records")
    assert lines[-1].startswith(f"OK: {path}: collection, 3 spans, 96 records, 0 problems")
    code, out, _ = run_verify(path, "--spans", "latest:2", "--json", capsys=capsys)
    report = json.loads(out)
    assert code == 0 and [s["span"] for s in report["spans"]] == [4, 7] and report["num_records"] == 56
    # a --source that does not name a span's inputs: that span is not compared, and says so
    code, out, _ = run_verify(
        path, "--spans", "3,4", "--source", str(path.parent / "raw" / "span-3" / "*.npz"), capsys=capsys
    )
    assert code == 1 and "Span 4 has 1 of its 1 input files outside the --source files" in out


def test_verify_catches_a_swapped_shard_in_one_span(coll, tmp_path, capsys):
    """Span 3's two shards hold 20 records of the same size each: swapped, only their CRC32Cs tell them apart."""
    path, _ = copy_collection(coll, tmp_path)
    span3 = path / "span-3"
    a, b = span3 / "data-00000-of-00002.tfrecord", span3 / "data-00001-of-00002.tfrecord"
    assert a.stat().st_size == b.stat().st_size
    a.rename(span3 / "tmp")
    b.rename(a)
    (span3 / "tmp").rename(b)
    code, out, _ = run_verify(path, capsys=capsys)
    lines = out.splitlines()
    assert code == 1
    assert lines[0].startswith("FAILED: span 3: 40 records in 2 files")
    assert "[checksum]" in out and "span-3/data-00000-of-00002.tfrecord" in out and "[index]" not in out
    assert [line for line in lines if line.startswith(("OK", "FAILED"))][1:] == [
        line for line in lines if line.startswith(("OK: span 4", "OK: span 7", f"FAILED: {path}: collection"))
    ]
    with pytest.raises(RecordError, match="CRC32C"):  # readers refuse it too
        reader.RandomAccess(str(path), spans=3)[0]
    assert int(reader.get(str(path), 0, spans=4)["label"]) == 4000  # the other spans read


def test_verify_a_listed_span_dir_missing_and_an_unlisted_one(coll, tmp_path, capsys):
    path, _data = copy_collection(coll, tmp_path)
    shutil.copytree(path / "span-7", path / "span-9")  # a run that wrote span 9 and did not commit the collection
    code, out, _ = run_verify(path, capsys=capsys)
    assert code == 0, out
    assert "uncommitted: span-9: a span directory collection.json does not list" in out
    assert sum(1 for _ in reader.iter_numpy(str(path))) == 96  # readers never read it
    shutil.rmtree(path / "span-4")
    code, out, _ = run_verify(path, capsys=capsys)
    assert code == 1
    assert (
        "FAILED: span 4: not verified" in out
        and "Span 4 is listed in collection.json but its directory is missing" in out
    )
    assert "OK: span 7" in out


def test_a_span_recommitted_without_the_collection_is_refused_until_listed_or_trusted(coll, tmp_path, capsys):
    """A re-run committed span 3's directory (new metadata.json) and crashed before committing the collection:
    readers refuse the span (its metadata.json is not the one collection.json lists) in one line naming it and the
    ways on; trust_spans=True reads the directory; verify reports the difference; committing the span (what the
    re-run of its convert does) makes it readable again. Before, readers read the unlisted directory silently."""
    path, _data = copy_collection(coll, tmp_path)
    raw = tmp_path / "raw3"
    raw.mkdir()
    np.savez(raw / "part.npz", **span_arrays(33, 12))
    assert convert(raw / "part.npz", path / "span-3", "--num_shards", "2", "--index", "--overwrite")[0] == 0
    with pytest.raises(
        IncompleteOutputError,
        match=r"Span 3's metadata.json is not the one collection.json lists.* "
        r"Hint: run the convert of span 3 again .*trust_spans=True",
    ) as e:
        list(reader.iter_numpy(str(path)))
    assert e.value.context["file"] == str(path / "span-3" / "metadata.json") and "\n" not in str(e.value)
    got = stacked(list(reader.iter_numpy(str(path), spans=3, trust_spans=True)))
    np.testing.assert_array_equal(got["label"], span_arrays(33, 12)["label"])
    assert len(list(reader.iter_numpy(str(path), spans=[4, 7]))) == ROWS[4] + ROWS[7]  # the other spans read
    code, out, _ = run_verify(path, capsys=capsys)
    assert code == 1
    assert "Span 3's metadata.json is not the one collection.json lists" in out
    assert "Span 3 holds 12 records, collection.json says 40" in out
    assert "OK: span 4" in out
    entry = collection.span_entry(str(path), 3, None, inputs_of(str(raw / "part.npz")))
    collection.commit(str(path), collection.add_span(entry))
    got = stacked(list(reader.iter_numpy(str(path), spans=3)))
    np.testing.assert_array_equal(got["label"], span_arrays(33, 12)["label"])


def test_verify_spans_on_a_plain_output_is_refused(coll, capsys):
    path, _ = coll
    code, _, err = run_verify(path / "span-3", "--spans", "latest", capsys=capsys)
    assert code == 2 and "needs a collection directory" in err
    code, _, err = run_verify(path, "--original", path / "span-3", capsys=capsys)
    assert code == 2 and "--original needs a sidecar collection: this is a collection directory" in err


# -- inspect ------------------------------------------------------------------------------------------------------


def test_inspect_a_collection_and_one_span(coll, tmp_path, capsys):
    path, _ = copy_collection(coll, tmp_path)
    shutil.copytree(path / "span-7", path / "span-8")
    code, out, _ = run_command(inspect_main.main, [path], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"{path}: collection of 3 spans; 3 selected, 96 records"
    assert [line.split()[0] for line in lines[2:5]] == ["3", "4", "7"]
    assert [int(line.split()[4]) for line in lines[2:5]] == [40, 25, 31]
    assert "uncommitted: span-8" in out
    code, out, _ = run_command(inspect_main.main, [path, "--spans", "3,7", "--tf_read"], capsys)
    assert code == 0 and "read back with tf.data: 71 records (matches collection.json)" in out
    code, out, _ = run_command(inspect_main.main, [path, "--spans", "4", "--json"], capsys)
    summary = json.loads(out)
    assert code == 0 and [s["span"] for s in summary["spans"]] == [4] and summary["num_records"] == 25
    assert summary["span"]["num_records"] == 25 and summary["span"]["num_shards"] == 2
    assert summary["span"]["sample"]["label"].endswith(" 4000")
    code, out, _ = run_command(inspect_main.main, [path, "--spans", "4"], capsys)
    assert f"{path / 'span-4'}: 25 examples in 2 shards" in out
    code, _, err = run_command(inspect_main.main, [path / "span-4", "--spans", "4"], capsys)
    assert code == 2 and "needs a collection directory" in err


def test_inspect_shows_recorded_schema_changes(tmp_path, capsys):
    coll = tmp_path / "coll"
    add_span(coll, tmp_path / "raw", 1, span_arrays(1, 5))
    other = span_arrays(2, 6)
    other["x"] = other["x"].astype(np.float64)
    c = add_span(coll, tmp_path / "raw", 2, other, allow_schema_change=True)
    code, out, _ = run_command(inspect_main.main, [coll], capsys)
    change = c["schema_changes"][0]
    assert (
        code == 0
        and f"schema change at span 2: {change['previous'][:12]} -> {change['schema'][:12]} (previous span 1)" in out
    )


# -- TFDS ---------------------------------------------------------------------------------------------------------


def test_tfds_per_span_and_as_one_dataset(tmp_path):
    common.preload_tensorflow()
    import tensorflow_datasets as tfds

    from tfrecord_etl.transforms.reading import collection_reader

    coll = tmp_path / "coll"
    data = {span: span_arrays(span, rows) for span, rows in ((1, 12), (2, 7), (5, 9))}
    for span, arrays in data.items():
        add_span(coll, tmp_path / "raw", span, arrays, "--tfds_name", "toy", "--split", "train", "--writer", "planned")
    in_order = tfds.ReadConfig(interleave_cycle_length=1)

    def read(builder, split="train"):
        got = list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False, read_config=in_order)))
        return np.array([e["label"] for e in got]), np.stack([e["x"] for e in got])

    for span, directory in zip(data, collection.span_dirs(str(coll))):  # each span: builder_from_directory
        labels, x = read(tfds.builder_from_directory(directory))
        np.testing.assert_array_equal(labels, data[span]["label"])
        np.testing.assert_array_equal(x, data[span]["x"])
    builder = collection_reader.tfds_builder(str(coll))  # all spans: tfds.builder_from_directories
    assert builder.info.splits["train"].num_examples == 28
    labels, x = read(builder)
    np.testing.assert_array_equal(labels, expected(data, [1, 2, 5])["label"])
    np.testing.assert_array_equal(x, expected(data, [1, 2, 5])["x"])
    labels, _ = read(builder, "train[10:14]")  # a slice across the span boundary
    np.testing.assert_array_equal(labels, [1010, 1011, 2000, 2001])
    labels, _ = read(collection_reader.tfds_builder(str(coll), spans="latest:2"))
    np.testing.assert_array_equal(labels, expected(data, [2, 5])["label"])
    add_span(coll, tmp_path / "raw", 6, span_arrays(6, 3))  # a span without --tfds_name
    with pytest.raises(ConfigError, match="Span 6 is not a TFDS directory"):
        collection_reader.tfds_builder(str(coll))


# -- more reader cases: compression per span, splits per span, a source changed after one span -------------------


def test_spans_of_different_compressions_read_as_one_dataset(tmp_path, tf):
    coll = tmp_path / "coll"
    data = {1: span_arrays(1, 6), 2: span_arrays(2, 5), 3: span_arrays(3, 4)}
    add_span(coll, tmp_path / "raw", 1, data[1])
    raw = tmp_path / "raw" / "span-2"
    raw.mkdir(parents=True)
    np.savez(raw / "part.npz", **data[2])  # gzip shards (no --index: it needs uncompressed shards)
    assert convert(raw / "part.npz", coll / "span-2", "--compression", "gzip")[0] == 0
    collection.commit(
        str(coll), collection.add_span(collection.span_entry(str(coll), 2, None, inputs_of(str(raw / "part.npz"))))
    )
    add_span(coll, tmp_path / "raw", 3, data[3])
    got = list(reader.to_tf_dataset(str(coll)))
    np.testing.assert_array_equal(np.stack([e["x"].numpy() for e in got]), expected(data, [1, 2, 3])["x"])
    np.testing.assert_array_equal([int(e["label"]) for e in got], expected(data, [1, 2, 3])["label"])
    np.testing.assert_array_equal(
        stacked(list(reader.iter_numpy(str(coll))))["label"], expected(data, [1, 2, 3])["label"]
    )
    with pytest.raises(ConfigError, match="Random access needs uncompressed shards; these are gzip") as e:
        reader.RandomAccess(str(coll))
    assert e.value.context["file"].endswith("span-2")
    assert len(reader.RandomAccess(str(coll), spans=[1, 3])) == 10


def test_split_is_selected_in_every_span(tmp_path):
    coll = tmp_path / "coll"
    data = {1: span_arrays(1, 30), 2: span_arrays(2, 20)}
    for span, arrays in data.items():
        add_span(coll, tmp_path / "raw", span, arrays, "--splits", "train=3,test=1", "--writer", "planned")
    for split in ("train", "test"):
        want = np.concatenate(
            [[int(e["label"]) for e in reader.iter_numpy(d, split=split)] for d in collection.span_dirs(str(coll))]
        )
        got = [int(e["label"]) for e in reader.iter_numpy(str(coll), split=split)]
        np.testing.assert_array_equal(got, want)
        assert 0 < len(got) < 50
        assert len(reader.RandomAccess(str(coll), split=split)) == len(got)
    assert sorted(int(e["label"]) for s in ("train", "test") for e in reader.iter_numpy(str(coll), split=s)) == sorted(
        expected(data, [1, 2])["label"].tolist()
    )
    with pytest.raises(SchemaError, match="No split 'validation'"):
        list(reader.iter_numpy(str(coll), split="validation"))


def test_verify_source_finds_the_span_whose_input_changed(tmp_path, capsys):
    coll = tmp_path / "coll"
    for span in (1, 2):
        add_span(coll, tmp_path / "raw", span, span_arrays(span, 8))
    changed = span_arrays(2, 8)
    changed["label"][5] = -1
    np.savez(tmp_path / "raw" / "span-2" / "part.npz", **changed)
    capsys.readouterr()  # convert's summaries
    code, out, _ = run_verify(coll, "--source", str(tmp_path / "raw" / "*" / "*.npz"), capsys=capsys)
    lines = out.splitlines()
    assert code == 1
    assert lines[0] == "OK: span 1: 8 records in 2 files, 2 shard CRC32Cs, 8 rows compared with the source"
    assert lines[1].startswith("FAILED: span 2:") and "[source]" in lines[2] and "label" in lines[2]
