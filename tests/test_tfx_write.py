"""The planned writer of ArraysExampleGen's examples artifact (transforms.tfx.write) and TFX's record-hash split
assignment (splits.SplitPlan by_record), without TFX: the assignment against TFX's ``_PartitionFn`` formula
(transcribed, as test_splits_tfds does; configs/tfx/test_tfx_pipeline.py checks it against TFX's own function), the
batches split by record, and the Split-NAME files read back with plain TensorFlow, with dead letters."""

from __future__ import annotations

import glob
import json
import os

import apache_beam as beam
import h5py
import numpy as np
import pytest

from tests.test_augment import tf  # noqa: F401 - the shared TF fixture
from tests.test_reliability import corrupt_h5
from tests.test_splits_tfds import tfx_split
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.codec import FeatureSpec, encode_columns
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import ConfigError, RecordError
from tfrecord_etl.transforms.splits import SplitPlan
from tfrecord_etl.transforms.tfx import write as tfx_write
from tfrecord_etl.transforms.verify import verify

N = 300
SPECS = [
    FeatureSpec("image", "|u1", (4, 4, 3), "tensor"),
    FeatureSpec("id", "<i8", (), "list"),
    FeatureSpec("x", "<f4", (), "list"),
    FeatureSpec("vec", "<i8", (3,), "list"),
]


def columns(kind: str, n: int = N):
    """Columns and specs whose encoded batch takes the form ``kind`` of ``codec.EncodedBatch``."""
    rng = np.random.default_rng(1)
    cols = {
        "image": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
        "id": np.arange(n, dtype=np.int64) + 10**6,
        "x": rng.normal(size=n).astype(np.float32),
        "vec": rng.integers(0, 100, (n, 3)),
    }
    specs = list(SPECS)
    if kind == "parts":  # ids whose varints change length in a few runs
        cols["id"] = np.arange(n, dtype=np.int64)
    elif kind == "padded":  # byte strings of several lengths
        cols["name"] = [b"n" * int(k) for k in rng.integers(0, 20, n)]
        specs.append(FeatureSpec("name", "bytes", (), "list"))
    elif kind == "tails":  # one row far longer than the others: laid out without padding
        cols["name"] = [b"n" * (17 << 20 if i == 1 else i) for i in range(n)]
        specs.append(FeatureSpec("name", "bytes", (), "list"))
    return cols, specs


def form(batch) -> str:
    return (
        "parts"
        if batch.parts is not None
        else "padded"
        if batch.padded is not None
        else "tails"
        if batch.tails is not None
        else "fixed"
    )


@pytest.mark.parametrize(
    "kind,key",
    [
        (kind, key)
        for kind in ("fixed", "parts", "padded", "tails")
        for key in (None, "id", "vec", "image", "name")
        if key != "name" or kind in ("padded", "tails")
    ],
)
def test_records_go_to_the_split_tfx_gives_them(kind, key, tf):
    n = 4 if kind == "tails" else N
    cols, specs = columns(kind, n)
    batch = encode_columns(cols, specs, n)
    assert form(batch) == kind
    records = batch.records()
    plan = SplitPlan(("train", "eval", "test"), (5, 2, 1), key=key, by_record=True)
    if key is None:  # TFX's key for a record given as bytes: the record
        want = [tfx_split(r, [5, 7, 8]) for r in records]
    else:  # with partition_feature_name: the parsed Example's Feature, serialized deterministically
        want = [
            tfx_split(
                tf.train.Example.FromString(r).features.feature[key].SerializeToString(deterministic=True), [5, 7, 8]
            )
            for r in records
        ]
    parts = plan.split_batch(batch)
    got = np.zeros(n, np.int64)
    for k, rows, part in parts:
        rows = np.arange(n) if rows is None else rows
        got[rows] = k
        assert part.records() == [records[i] for i in rows.tolist()]  # the split's records, in row order
    np.testing.assert_array_equal(got, want)
    if n == N:
        assert len(set(want)) == 3  # every split holds records


def test_a_single_split_takes_the_batch_as_it_is():
    cols, specs = columns("fixed")
    batch = encode_columns(cols, specs, N)
    ((k, rows, part),) = SplitPlan(("all",), (1,), by_record=True).split_batch(batch)
    assert (k, rows) == (0, None) and part.records() == batch.records()


def test_a_partition_feature_that_tfx_refuses_is_a_record_error():
    cols, specs = columns("fixed")
    batch = encode_columns(cols, specs, N)
    with pytest.raises(
        RecordError, match="Partition feature 'x' must be a bytes_list or int64_list with a value, not float_list"
    ):
        SplitPlan(("a", "b"), (1, 1), key="x", by_record=True).split_batch(batch)
    with pytest.raises(RecordError, match=r"Partition feature 'nope' is not in the record .*'id', 'image'"):
        SplitPlan(("a", "b"), (1, 1), key="nope", by_record=True).split_batch(batch)


def make_h5(path, n=N):
    rng = np.random.default_rng(3)
    data = {
        "image": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
        "id": np.arange(n, dtype=np.int64),
        "x": rng.normal(size=n).astype(np.float32),
    }
    with h5py.File(path, "w") as f:
        for name, value in data.items():
            f.create_dataset(name, data=value, chunks=True)
    return data


def cfg_of(pattern, uri, **options):
    return ConvertConfig(
        input=str(pattern),
        output_dir=str(uri),
        compression="gzip",
        feature_encodings={"image": "tensor", "id": "list", "x": "list"},
        **options,
    )


def run(uri, jobs):
    info = {"inputs": {job.name: {"rows": job.plan.inputs.num_rows} for job in jobs}}
    with beam.Pipeline() as p:
        _ = p | tfx_write.WriteExampleSplits(str(uri), jobs, info, {"name": "zlib", "level": 6})
    return json.loads((uri / "tfrecord_etl.json").read_text())


def read_tf(tf, files):
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "id": tf.io.FixedLenFeature([], tf.int64),
        "x": tf.io.FixedLenFeature([], tf.float32),
    }
    out = {}
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        ex = tf.io.parse_single_example(record, spec)
        out[int(ex["id"])] = (
            np.frombuffer(ex["image"].numpy(), np.uint8).reshape(4, 4, 3),
            ex["x"].numpy(),
            record.numpy(),
        )
    return out


def test_hash_splits_are_written_as_tfx_names_them_and_read_back_exactly(tmp_path, tf):
    data = make_h5(tmp_path / "in.h5")
    uri = tmp_path / "examples"
    job = tfx_write.plan_job("single_split", cfg_of(tmp_path / "in.h5", uri, num_shards=2), [("train", 2), ("eval", 1)])
    info = run(uri, [job])
    assert sorted(os.path.relpath(p, uri) for p in glob.glob(str(uri / "**" / "*"), recursive=True)) == [
        "Split-eval",
        "Split-eval/data_tfrecord-00000-of-00002.gz",
        "Split-eval/data_tfrecord-00001-of-00002.gz",
        "Split-train",
        "Split-train/data_tfrecord-00000-of-00002.gz",
        "Split-train/data_tfrecord-00001-of-00002.gz",
        "tfrecord_etl.json",
    ]
    seen = {}
    for k, split in enumerate(("train", "eval")):
        files = sorted(glob.glob(str(uri / f"Split-{split}" / "*.gz")))
        got = read_tf(tf, files)
        for i, (image, x, record) in got.items():
            np.testing.assert_array_equal(image, data["image"][i])
            assert x == data["x"][i]
            assert tfx_split(record, [2, 3]) == k  # TFX's assignment of the record as written
        assert info["splits"][split]["records"] == len(got) == sum(f["records"] for f in info["splits"][split]["files"])
        assert [f["file"] for f in info["splits"][split]["files"]] == [os.path.relpath(f, uri) for f in files]
        report = verify(str(uri / f"Split-{split}" / "*.gz"))
        assert report.ok and sum(f.records for f in report.files) == len(got)
        assert sum(1 for _ in reader.iter_records(files[0], "gzip")) == info["splits"][split]["files"][0]["records"]
        seen.update(got)
    assert sorted(seen) == list(range(N))  # every row once
    assert list(info["splits"]) == ["train", "eval"]
    assert info["inputs"]["single_split"] == {"rows": N, "records": N, "rows_dead_lettered": 0, "dead_letters": []}


def test_input_splits_are_one_output_split_each(tmp_path, tf):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    make_h5(tmp_path / "a" / "in.h5", 50)
    make_h5(tmp_path / "b" / "in.h5", 20)
    uri = tmp_path / "examples"
    jobs = [tfx_write.plan_job(name, cfg_of(tmp_path / name / "*.h5", uri)) for name in ("a", "b")]
    info = run(uri, jobs)
    assert [f["file"] for f in info["splits"]["a"]["files"]] == ["Split-a/data_tfrecord-00000-of-00001.gz"]
    assert [sorted(read_tf(tf, sorted(glob.glob(str(uri / f"Split-{s}" / "*.gz"))))) for s in "ab"] == [
        list(range(50)),
        list(range(20)),
    ]
    assert (info["splits"]["a"]["records"], info["splits"]["b"]["records"]) == (50, 20)
    assert info["inputs"]["b"]["records"] == 20


def test_a_partition_feature_that_is_missing_or_float_is_refused_at_planning(tmp_path):
    make_h5(tmp_path / "in.h5")
    cfg = cfg_of(tmp_path / "in.h5", tmp_path / "examples")
    with pytest.raises(ConfigError, match=r"partition_feature_name 'nope' is not a feature of the examples"):
        tfx_write.plan_job("all", cfg, [("train", 1), ("eval", 1)], "nope")
    with pytest.raises(ConfigError, match=r"'x' is a float feature; TFX partitions by bytes_list and int64_list"):
        tfx_write.plan_job("all", cfg, [("train", 1), ("eval", 1)], "x")


def test_dead_letters_are_counted_per_input_split_and_the_rest_written(tmp_path, tf):
    data = corrupt_h5(tmp_path / "in.h5")  # rows 300-399 cannot be read
    uri, dead = tmp_path / "examples", tmp_path / "dead"
    cfg = ConvertConfig(
        input=str(tmp_path / "in.h5"),
        output_dir=str(uri),
        compression="gzip",
        dead_letter_dir=str(dead),
        target_range_mb=0.2,
        provenance=True,
        num_shards=3,
    )
    job = tfx_write.plan_job("single_split", cfg, [("train", 2), ("eval", 1)])
    info = run(uri, [job])
    letters = [json.loads(line) for f in sorted(dead.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert [(d["start"], d["stop"], d["error"]) for d in letters] == [(300, 400, "SourceError")]
    entry = info["inputs"]["single_split"]
    assert (entry["rows"], entry["records"], entry["rows_dead_lettered"]) == (1000, 900, 100)
    assert [(d["start"], d["stop"], d["rows"]) for d in entry["dead_letters"]] == [(300, 400, 100)]
    assert info["splits"]["train"]["records"] + info["splits"]["eval"]["records"] == 900
    rows = []
    spec = {"x": tf.io.FixedLenFeature([], tf.string), "_source/row": tf.io.FixedLenFeature([], tf.int64)}
    for split in ("train", "eval"):
        for record in tf.data.TFRecordDataset(sorted(glob.glob(str(uri / f"Split-{split}" / "*.gz"))), "GZIP"):
            ex = tf.io.parse_single_example(record, spec)
            row = int(ex["_source/row"])
            np.testing.assert_array_equal(np.frombuffer(ex["x"].numpy(), "<f8"), data[row])
            rows.append(row)
    assert sorted(rows) == [r for r in range(1000) if not 300 <= r < 400]


def test_counts_that_do_not_add_up_commit_no_info(tmp_path):
    expected = {"all": {"rows": 10, "files": 2, "outputs": ["train", "eval"]}}
    entries = [
        (
            "all",
            {
                "file": "Split-train/data_tfrecord-00000-of-00001.gz",
                "split": "train",
                "records": 6,
                "bytes": 1,
                "crc32c": "0",
                "dead_rows": 0,
            },
        ),
        (
            "all",
            {
                "file": "Split-eval/data_tfrecord-00000-of-00001.gz",
                "split": "eval",
                "records": 3,
                "bytes": 1,
                "crc32c": "0",
                "dead_rows": 0,
            },
        ),
    ]
    with pytest.raises(
        RecordError,
        match="Input split 'all': 10 rows planned in 2 files, but 2 files hold 9 records and 0 rows were dead-lettered",
    ):
        tfx_write.write_info(entries, str(tmp_path), {}, expected)
    assert not (tmp_path / "tfrecord_etl.json").exists()
    entries[1][1]["dead_rows"] = 1
    assert tfx_write.write_info(entries, str(tmp_path), {}, expected)["splits"]["eval"]["records"] == 3
