"""A real TFX pipeline on ArraysExampleGen (run by configs/tfx/run_tfx_test.sh in .venv-tfx, not by the main suite).

ArraysExampleGen -> StatisticsGen -> SchemaGen -> ExampleValidator -> Transform on LocalDagRunner with a SQLite ML
Metadata store, over real HDF5 files (an image uint8 array, a float and an int feature) in two spans
(``span-{SPAN}/``), each span chosen by ``range_config``. Checked: every example read back exactly against the
source (plain TensorFlow over TFX's ``Split-*/data_tfrecord-*.gz``, our decoder, our verify), the split of every
example equal to ``--splits train=3,eval=1 --split_key id`` (``transforms.splits`` and a convert run), the
statistics' and SchemaGen's types, no anomalies, the Transform output (a z-scored float, a decoded image), the spans
in MLMD, the cache reused by a rerun of a span, our schema beside the examples, and our one-line error for a bad
input. Also: input_config splits (one npz pattern per split), the schema infer_schema gives before the run, and
input splits of different layouts refused while the pipeline is built. The executor's own Do (our planned writer)
against TFX's base Do over the same records: the same records in every split, and TFX's ``_PartitionFn`` giving each
record we wrote its split, with and without ``partition_feature_name``; dead letters inside the component (records +
rows dead-lettered = rows), and a read error without them failing the component with nothing published.
"""

from __future__ import annotations

import glob
import json
import os
import textwrap

import h5py
import numpy as np
import pytest

tfx = pytest.importorskip("tfx")
import apache_beam as beam  # noqa: E402
import tensorflow as tf  # noqa: E402
from tfx import v1 as tfx_v1  # noqa: E402
from tfx.orchestration import metadata as tfx_metadata, pipeline as tfx_pipeline  # noqa: E402
from tfx.orchestration.local.local_dag_runner import LocalDagRunner  # noqa: E402
from tfx.proto import example_gen_pb2, range_config_pb2  # noqa: E402

from tfrecord_etl import ConvertToTFRecord, iter_numpy  # noqa: E402
from tfrecord_etl.tfx import ArraysExampleGen, read_split  # noqa: E402
from tfrecord_etl.transforms import splits as splits_lib  # noqa: E402
from tfrecord_etl.transforms.errors import SchemaError, SourceError  # noqa: E402
from tfrecord_etl.transforms.verify import verify  # noqa: E402

ROWS = 120
PREPROCESSING = textwrap.dedent("""
    import tensorflow as tf
    import tensorflow_transform as tft

    def preprocessing_fn(inputs):
        image = tf.io.decode_raw(tf.reshape(inputs["image"], [-1]), tf.uint8)  # the tensor encoding's raw bytes
        image = tf.reshape(image, [-1, 8, 8, 3])
        return {"x_scaled": tft.scale_to_z_score(tf.reshape(inputs["x"], [-1])),
                "image_sum": tf.reduce_sum(tf.cast(image, tf.int64), axis=[1, 2, 3]),
                "id": tf.reshape(inputs["id"], [-1])}
""")


def make_span(base, span: int) -> dict:
    rng = np.random.default_rng(span)
    data = {
        "image": rng.integers(0, 256, (ROWS, 8, 8, 3), dtype=np.uint8),
        "x": rng.normal(10.0, 3.0, ROWS).astype(np.float32),
        "id": np.arange(span * 1000, span * 1000 + ROWS, dtype=np.int64),
    }
    os.makedirs(os.path.join(base, f"span-{span}"))
    with h5py.File(os.path.join(base, f"span-{span}", "data.h5"), "w") as f:
        for name, value in data.items():
            f.create_dataset(name, data=value, chunks=True)
    return data


def build(root, input_base, span: int, module_file: str) -> tfx_pipeline.Pipeline:
    example_gen = ArraysExampleGen(
        input_base=input_base,
        input_config=example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name="all", pattern="span-{SPAN}/*.h5")]
        ),
        output_config=example_gen_pb2.Output(
            split_config=example_gen_pb2.SplitConfig(
                splits=[
                    example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=3),
                    example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=1),
                ],
                partition_feature_name="id",
            )
        ),
        range_config=range_config_pb2.RangeConfig(
            static_range=range_config_pb2.StaticRange(start_span_number=span, end_span_number=span)
        ),
        source_options={"feature_encodings": {"image": "tensor", "x": "list", "id": "list"}},
    )
    stats = tfx_v1.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema = tfx_v1.components.SchemaGen(statistics=stats.outputs["statistics"], infer_feature_shape=True)
    validator = tfx_v1.components.ExampleValidator(
        statistics=stats.outputs["statistics"], schema=schema.outputs["schema"]
    )
    transform = tfx_v1.components.Transform(
        examples=example_gen.outputs["examples"], schema=schema.outputs["schema"], module_file=module_file
    )
    return tfx_pipeline.Pipeline(
        pipeline_name="arrays",
        pipeline_root=os.path.join(root, "pipeline_root"),
        components=[example_gen, stats, schema, validator, transform],
        enable_cache=True,
        metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(os.path.join(root, "mlmd.sqlite")),
        beam_pipeline_args=["--direct_running_mode=in_memory", "--direct_num_workers=1"],
    )


def plain_tf_read(files) -> dict:
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "x": tf.io.FixedLenFeature([], tf.float32),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    out = {}
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        ex = tf.io.parse_single_example(record, spec)
        out[int(ex["id"])] = (np.frombuffer(ex["image"].numpy(), np.uint8).reshape(8, 8, 3), ex["x"].numpy())
    return out


def latest(store, type_name):
    return sorted(store.get_artifacts_by_type(type_name), key=lambda a: a.id)


def test_arrays_example_gen_in_a_tfx_pipeline(tmp_path):
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

    input_base = str(tmp_path / "data")
    sources = {span: make_span(input_base, span) for span in (1, 2)}
    module_file = str(tmp_path / "preprocessing.py")
    with open(module_file, "w") as f:
        f.write(PREPROCESSING)

    for span in (1, 2, 1):  # the second run of span 1 must come from the cache
        LocalDagRunner().run(build(str(tmp_path), input_base, span, module_file))

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(tmp_path / "mlmd.sqlite")
    store = metadata_store.MetadataStore(config)
    examples = latest(store, "Examples")
    gen_examples = [
        a
        for a in examples
        if "span" in a.custom_properties
        and "Split-" not in a.uri
        and os.path.exists(os.path.join(a.uri, "tfrecord_etl.json"))
    ]
    assert [a.custom_properties["span"].int_value for a in gen_examples] == [1, 2]  # two spans, no third artifact
    executions = sorted(store.get_executions(), key=lambda e: e.id)
    gen_runs = [
        e
        for e in executions
        if e.type_id == store.get_execution_types_by_id([executions[0].type_id])[0].id
        and "ArraysExampleGen" in store.get_execution_types_by_id([e.type_id])[0].name
    ]
    assert [metadata_store_pb2.Execution.State.Name(e.last_known_state) for e in gen_runs] == [
        "COMPLETE",
        "COMPLETE",
        "CACHED",
    ]

    for artifact, span in zip(gen_examples, (1, 2)):
        src = sources[span]
        uri = artifact.uri
        by_split = {}
        for split in ("train", "eval"):
            files = sorted(glob.glob(os.path.join(uri, f"Split-{split}", "data_tfrecord-*.gz")))
            assert files, split
            by_split[split] = plain_tf_read(files)
            ours = list(read_split(uri, split))
            assert sorted(int(e["id"][()]) for e in ours) == sorted(by_split[split])
            for e in ours:
                i = int(e["id"][()]) - span * 1000
                np.testing.assert_array_equal(e["image"], src["image"][i])
                assert e["x"].dtype == np.float32 and e["x"][()] == src["x"][i]
            report = verify(os.path.join(uri, f"Split-{split}", "*.gz"))
            assert report.ok, report.problems
            assert sum(f.records for f in report.files) == len(by_split[split])
        every = {**by_split["train"], **by_split["eval"]}
        assert sorted(every) == list(src["id"])  # every row once
        for k, (image, x) in every.items():
            np.testing.assert_array_equal(image, src["image"][k - span * 1000])
            assert x == src["x"][k - span * 1000]
        # TFX's hash buckets on partition_feature_name == our --splits train=3,eval=1 --split_key id
        plan = splits_lib.SplitPlan(("train", "eval"), (3, 1), key="id")
        ours = plan.assign_keys(splits_lib.key_bytes("id", src["id"], ROWS))
        tfx_split = np.array([0 if int(i) in by_split["train"] else 1 for i in src["id"]])
        np.testing.assert_array_equal(ours, tfx_split)
        assert 0 < tfx_split.sum() < ROWS
        # ... and the convert command's own output with those flags holds the same ids in each split
        out = str(tmp_path / f"convert-{span}")
        with beam.Pipeline() as p:
            p | ConvertToTFRecord(
                glob.glob(os.path.join(input_base, f"span-{span}", "*.h5"))[0],
                out,
                splits={"train": 3, "eval": 1},
                split_key="id",
                num_shards=2,
            )
        for split in ("train", "eval"):
            assert sorted(int(e["id"][()]) for e in iter_numpy(out, split=split)) == sorted(by_split[split])
        # our schema beside the examples, and the artifact's property naming it
        ours_schema = schema_pb2.Schema()
        from google.protobuf import text_format

        text_format.Parse(open(os.path.join(uri, "schema.pbtxt")).read(), ours_schema)
        assert {f.name: f.type for f in ours_schema.feature} == {
            "image": schema_pb2.BYTES,
            "x": schema_pb2.FLOAT,
            "id": schema_pb2.INT,
        }
        assert artifact.custom_properties["tfrecord_etl_schema"].string_value == os.path.join(uri, "schema.pbtxt")

    stats = latest(store, "ExampleStatistics")[0]
    raw = open(os.path.join(stats.uri, "Split-train", "FeatureStats.pb"), "rb").read()
    lst = statistics_pb2.DatasetFeatureStatisticsList.FromString(raw)
    types = {f.path.step[0]: statistics_pb2.FeatureNameStatistics.Type.Name(f.type) for f in lst.datasets[0].features}
    # TFDV's statistics call every bytes feature STRING (its BYTES type is for features a schema marks as images or
    # non-UTF-8 domains); the schemas below call it BYTES, the schema type of a tf.string feature
    assert types == {"image": "STRING", "x": "FLOAT", "id": "INT"}
    image = next(f for f in lst.datasets[0].features if f.path.step[0] == "image")
    assert image.string_stats.avg_length == 8 * 8 * 3  # one value of 192 raw bytes per example
    assert lst.datasets[0].num_examples == sum(1 for _ in read_split(gen_examples[0].uri, "train"))
    schema = schema_pb2.Schema()
    from google.protobuf import text_format

    text_format.Parse(open(os.path.join(latest(store, "Schema")[0].uri, "schema.pbtxt")).read(), schema)
    assert {f.name: f.type for f in schema.feature} == {
        "image": schema_pb2.BYTES,
        "x": schema_pb2.FLOAT,
        "id": schema_pb2.INT,
    }
    anomalies_artifact = latest(store, "ExampleAnomalies")[0]
    for split in ("train", "eval"):
        path = os.path.join(anomalies_artifact.uri, f"Split-{split}", "SchemaDiff.pb")
        anomalies = anomalies_pb2.Anomalies.FromString(open(path, "rb").read())
        assert not anomalies.anomaly_info, anomalies

    transformed = [
        a for a in examples if a not in gen_examples and glob.glob(os.path.join(a.uri, "Split-train", "*.gz"))
    ][0]  # Transform's transformed_examples of span 1
    src = sources[1]
    train_ids = sorted(
        by_split_first := plain_tf_read(sorted(glob.glob(os.path.join(gen_examples[0].uri, "Split-train", "*.gz"))))
    )
    xs = np.array([by_split_first[i][1] for i in train_ids], np.float64)
    mean, std = xs.mean(), xs.std()
    spec = {
        "x_scaled": tf.io.FixedLenFeature([], tf.float32),
        "image_sum": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    seen = 0
    for record in tf.data.TFRecordDataset(
        sorted(glob.glob(os.path.join(transformed.uri, "Split-train", "*.gz"))), compression_type="GZIP"
    ):
        ex = tf.io.parse_single_example(record, spec)
        i = int(ex["id"]) - 1000
        assert int(ex["image_sum"]) == int(src["image"][i].astype(np.int64).sum())
        assert abs(float(ex["x_scaled"]) - (float(src["x"][i]) - mean) / std) < 1e-4
        seen += 1
    assert seen == len(train_ids)


def test_a_bad_input_fails_the_component_with_our_error(tmp_path):
    base = tmp_path / "data"
    (base / "span-1").mkdir(parents=True)
    (base / "span-1" / "broken.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)  # an HDF5 signature, no file
    gen = ArraysExampleGen(
        input_base=str(base),
        input_config=example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name="all", pattern="span-{SPAN}/*.h5")]
        ),
    )
    p = tfx_pipeline.Pipeline(
        pipeline_name="bad",
        pipeline_root=str(tmp_path / "root"),
        components=[gen],
        metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(str(tmp_path / "mlmd.sqlite")),
    )
    with pytest.raises(SourceError) as e:
        LocalDagRunner().run(p)
    assert "broken.h5" in str(e.value) and "\n" not in str(e.value)


def test_options_tfx_owns_are_refused_when_the_component_is_built():
    from tfrecord_etl.transforms.errors import ConfigError

    with pytest.raises(ConfigError, match=r"source_options \['compression', 'index'\]: TFX decides"):
        ArraysExampleGen(input_base="/x", source_options={"index": True, "compression": "gzip"})
    ArraysExampleGen(input_base="/x", source_options={"num_shards": 4, "compression_level": 1})  # our shards'
    with pytest.raises(ConfigError, match="ArraysExampleGen writes tf.train.Example records, not output_data_format"):
        ArraysExampleGen(input_base="/x", output_data_format=example_gen_pb2.FORMAT_TF_SEQUENCE_EXAMPLE)

    with pytest.raises(ConfigError, match="Invalid ArraysExampleGen source_options: .*encoding"):
        ArraysExampleGen(input_base="/x", source_options={"encoding": "nope"})


def test_input_config_splits_from_npz_files_and_the_schema_known_ahead(tmp_path):
    from tfrecord_etl.tfx import infer_schema, load_info

    rng = np.random.default_rng(7)
    data = {}
    for split, rows in (("train", 50), ("eval", 20)):
        (tmp_path / "data" / split).mkdir(parents=True)
        data[split] = {
            "x": rng.normal(size=(rows, 4)).astype(np.float32),
            "key": np.arange(rows, dtype=np.int64) + (0 if split == "train" else 100),
        }
        np.savez(tmp_path / "data" / split / "part.npz", **data[split])
    options = {"encoding": "list"}
    gen = ArraysExampleGen(
        input_base=str(tmp_path / "data"),
        source_options=options,
        input_config=example_gen_pb2.Input(
            splits=[
                example_gen_pb2.Input.Split(name="train", pattern="train/*.npz"),
                example_gen_pb2.Input.Split(name="eval", pattern="eval/*.npz"),
            ]
        ),
    )
    LocalDagRunner().run(
        tfx_pipeline.Pipeline(
            pipeline_name="npz",
            pipeline_root=str(tmp_path / "root"),
            components=[gen],
            metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(str(tmp_path / "mlmd.sqlite")),
        )
    )
    uri = glob.glob(str(tmp_path / "root" / "ArraysExampleGen" / "examples" / "*"))[0]
    for split in ("train", "eval"):
        got = sorted(read_split(uri, split), key=lambda e: int(e["key"][()]))
        assert [int(e["key"][()]) for e in got] == list(data[split]["key"])
        np.testing.assert_array_equal(np.stack([e["x"] for e in got]), data[split]["x"])
    info = load_info(uri)
    assert {name: entry["rows"] for name, entry in info["inputs"].items()} == {"train": 50, "eval": 20}
    assert info["options"] == options
    ahead = infer_schema(str(tmp_path / "data" / "train" / "*.npz"), options, str(tmp_path / "ahead.pbtxt"))
    assert open(os.path.join(uri, "schema.pbtxt")).read() == ahead == open(tmp_path / "ahead.pbtxt").read()
    assert 'name: "x"' in ahead and "type: FLOAT" in ahead and "type: INT" in ahead


def test_input_splits_of_different_layouts_fail_while_the_pipeline_is_built(tmp_path):
    for split, width in (("train", 4), ("eval", 5)):
        (tmp_path / "data" / split).mkdir(parents=True)
        np.savez(tmp_path / "data" / split / "part.npz", x=np.zeros((10, width), np.float32))
    gen = ArraysExampleGen(
        input_base=str(tmp_path / "data"),
        input_config=example_gen_pb2.Input(
            splits=[
                example_gen_pb2.Input.Split(name="train", pattern="train/*.npz"),
                example_gen_pb2.Input.Split(name="eval", pattern="eval/*.npz"),
            ]
        ),
    )
    with pytest.raises(SchemaError, match="Input splits 'train' and 'eval' have different features") as e:
        LocalDagRunner().run(
            tfx_pipeline.Pipeline(
                pipeline_name="mixed",
                pipeline_root=str(tmp_path / "root"),
                components=[gen],
                metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(str(tmp_path / "m.sqlite")),
            )
        )
    assert "eval/*.npz" in str(e.value) and "\n" not in str(e.value)
    # raised while the executor plans its input splits, before its Beam pipeline is built
    assert e.traceback[-2].name == "_plan_jobs", [entry.name for entry in e.traceback]
    assert not glob.glob(str(tmp_path / "root" / "ArraysExampleGen" / "examples" / "*"))  # TFX removed the URI


def run_executor(executor_cls, input_base, uri, **component_args):
    """``executor_cls().Do`` on the exec properties of ``ArraysExampleGen(input_base, **component_args)`` with
    its examples artifact at ``uri``: the executor alone, as TFX's launcher calls it (no ML Metadata)."""
    from tfx.types import standard_artifacts

    gen = ArraysExampleGen(input_base=str(input_base), **component_args)
    examples = standard_artifacts.Examples()
    examples.uri = str(uri)
    os.makedirs(uri)
    executor_cls().Do({}, {"examples": [examples]}, dict(gen.exec_properties))
    return examples


def read_raw(uri, split) -> list[bytes]:
    files = sorted(glob.glob(os.path.join(uri, f"Split-{split}", "*")))
    assert files and all(f.endswith(".gz") and "/data_tfrecord-" in f for f in files), files
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]


@pytest.mark.parametrize("feature", [None, "id", "name"])
def test_splits_are_tfxs_partition_fn_and_tfxs_own_executor_example_by_example(tmp_path, feature):
    """Our Do against TFX's: the same records in each split (TFX's base Do over our records), and TFX's own
    _PartitionFn giving every record we wrote the split it is in."""
    from tfx.components.example_gen import base_example_gen_executor as base

    from tfrecord_etl.tfx import Executor, load_info

    class TfxWrites(Executor):  # TFX's base Do (Reshuffle, Beam's WriteToTFRecord) over our records
        Do = base.BaseExampleGenExecutor.Do

    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(5)
    src = {
        "image": rng.integers(0, 256, (ROWS, 8, 8, 3), dtype=np.uint8),
        "id": np.arange(ROWS, dtype=np.int64) * 7,
        "name": np.array([f"row-{i}".encode() for i in range(ROWS)]),
        "x": rng.normal(size=ROWS).astype(np.float32),
    }
    with h5py.File(tmp_path / "data" / "part.h5", "w") as f:
        for name, value in src.items():
            f.create_dataset(name, data=value)
    split_config = example_gen_pb2.SplitConfig(
        splits=[
            example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=5),
            example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=2),
            example_gen_pb2.SplitConfig.Split(name="test", hash_buckets=1),
        ],
        partition_feature_name=feature,
    )
    args = {
        "output_config": example_gen_pb2.Output(split_config=split_config),
        "source_options": {
            "feature_encodings": {"image": "tensor", "id": "list", "name": "list", "x": "list"},
            "num_shards": 2,
        },
    }
    ours = run_executor(Executor, tmp_path / "data", tmp_path / "ours", **args)
    theirs = run_executor(TfxWrites, tmp_path / "data", tmp_path / "theirs", **args)
    assert ours.split_names == theirs.split_names == '["train", "eval", "test"]'
    for key in ("payload_format", "file_format"):
        assert ours.get_string_custom_property(key) == theirs.get_string_custom_property(key) != ""
    canonical = lambda r: tf.train.Example.FromString(r).SerializeToString(deterministic=True)  # noqa: E731
    every = []
    for k, split in enumerate(("train", "eval", "test")):
        mine = read_raw(ours.uri, split)
        assert sorted(mine) == sorted(canonical(r) for r in read_raw(theirs.uri, split))  # TFX's own split
        for record in mine:  # TFX's partitioner, record by record
            given = record if feature is None else tf.train.Example.FromString(record)
            assert base._PartitionFn(given, 3, [5, 7, 8], split_config) == k
        assert len(mine) > 0 and load_info(ours.uri)["splits"][split]["records"] == len(mine)
        assert sorted(int(e["id"][()]) for e in read_split(ours.uri, split)) == sorted(
            int(tf.train.Example.FromString(r).features.feature["id"].int64_list.value[0]) for r in mine
        )
        assert verify(os.path.join(ours.uri, f"Split-{split}", "*.gz")).ok
        every += mine
    assert len(every) == ROWS and len(glob.glob(os.path.join(ours.uri, "Split-train", "*.gz"))) == 2


def corrupt_hdf5(path, rows=1000, bad_chunk=3):
    """An HDF5 file that plans (its index is intact) but whose chunk ``bad_chunk`` (rows 300-399) cannot be read."""
    data = np.arange(rows * 64, dtype="<f8").reshape(rows, 64)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(100, 64), compression="gzip")
        f.create_dataset("id", data=np.arange(rows), chunks=(100,))
    with h5py.File(path) as f:
        info = f["x"].id.get_chunk_info(bad_chunk)
    raw = bytearray(open(path, "rb").read())
    raw[info.byte_offset + 10 : info.byte_offset + 40] = b"\x00" * 30
    open(path, "wb").write(bytes(raw))
    return data


def test_dead_letters_inside_the_component_and_counts_that_add_up(tmp_path):
    from tfrecord_etl.tfx import Executor, load_info

    (tmp_path / "data").mkdir()
    data = corrupt_hdf5(tmp_path / "data" / "in.h5")
    dead = tmp_path / "dead"
    examples = run_executor(
        Executor,
        tmp_path / "data",
        tmp_path / "out",
        source_options={"dead_letter_dir": str(dead), "target_range_mb": 0.05, "num_shards": 3},
    )
    letters = [
        json.loads(line) for f in sorted((dead / "single_split").glob("*.jsonl")) for line in f.read_text().splitlines()
    ]
    assert [(d["file"], d["start"], d["stop"], d["error"]) for d in letters] == [
        (str(tmp_path / "data" / "in.h5"), 300, 400, "SourceError")
    ]
    info = load_info(examples.uri)
    entry = info["inputs"]["single_split"]
    assert (entry["rows"], entry["records"], entry["rows_dead_lettered"]) == (1000, 900, 100)  # in = out + dead
    assert [(d["start"], d["stop"], d["rows"]) for d in entry["dead_letters"]] == [(300, 400, 100)]
    ids = []
    for split in ("train", "eval"):
        got = list(read_split(examples.uri, split))
        assert info["splits"][split]["records"] == len(got) == len(read_raw(examples.uri, split))
        for e in got:
            np.testing.assert_array_equal(e["x"], data[int(e["id"][()])])
            ids.append(int(e["id"][()]))
    assert sorted(ids) == [i for i in range(1000) if not 300 <= i < 400]


def test_a_read_error_without_dead_letters_fails_the_component_and_publishes_nothing(tmp_path):
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    (tmp_path / "data").mkdir()
    corrupt_hdf5(tmp_path / "data" / "in.h5")
    gen = ArraysExampleGen(input_base=str(tmp_path / "data"), source_options={"target_range_mb": 0.05})
    with pytest.raises(SourceError, match="Cannot read rows 300-399"):
        LocalDagRunner().run(
            tfx_pipeline.Pipeline(
                pipeline_name="bad_rows",
                pipeline_root=str(tmp_path / "root"),
                components=[gen],
                metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(str(tmp_path / "m.sqlite")),
            )
        )
    assert not glob.glob(str(tmp_path / "root" / "ArraysExampleGen" / "examples" / "*"))  # TFX removed the URI
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(tmp_path / "m.sqlite")
    store = metadata_store.MetadataStore(config)
    assert not [a for a in store.get_artifacts_by_type("Examples") if a.state == metadata_store_pb2.Artifact.LIVE]
