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
from tfrecord_etl.pipelines import common
from tfrecord_etl.pipelines import inspect as inspect_main
from tfrecord_etl.pipelines import verify as verify_main
from tfrecord_etl.transforms import collection, fileio, metadata, reader
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError

ROWS = {3: 40, 4: 25, 7: 31}  # span -> rows: spans need not be contiguous


def span_arrays(span: int, rows: int) -> dict:
    rng = np.random.default_rng(span)
    return {"x": rng.standard_normal((rows, 3, 2)).astype(np.float32),
            "label": (np.arange(rows, dtype=np.int64) + 1000 * span)}


def inputs_of(pattern: str) -> list[dict]:
    """The ledger rows of a span's input files, as convert records them."""
    return [{"path": p, "size": s, "mtime_ns": os.stat(p).st_mtime_ns, "version": None} for p, s in fileio.match(pattern)]


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
    for spans, chosen in (("latest", [7]), ("latest:2", [4, 7]), (4, [4]), ([7, 3], [3, 7]), (range(3, 5), [3, 4]),
                          ("3-4", [3, 4])):
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
    x = np.stack([np.frombuffer(b, "<f4").reshape(3, 2) for b in parsed["x"].numpy()])  # tensor encoding: raw bytes
    np.testing.assert_array_equal(x, want["x"])
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
    np.testing.assert_array_equal(got["label"], np.concatenate([span_arrays(11, 7)["label"],
                                                                span_arrays(2, 3)["label"]]))
