"""transforms.planning (the plan of a conversion, no pipeline) and transforms.output.sink (the commit protocol), unit by
unit; and ConvertToTFRecord applied in a pipeline a user writes."""

from __future__ import annotations

import itertools
import os

import h5py
import numpy as np
import pytest

from tfrecord_etl.transforms import planning, reader
from tfrecord_etl.transforms.collections import sharding
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import ConfigError, SchemaError
from tfrecord_etl.transforms.output import outdir, sink, tfrecord
from tfrecord_etl.transforms.sources import SourceOptions
from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions

# -- the shard-count policy --------------------------------------------------------------------------------


def test_num_shards_policy():
    mib = 2**20
    assert planning.num_shards(1000, 10 * mib, requested=7) == 7
    with pytest.raises(ConfigError, match="more than the 5 rows"):
        planning.num_shards(5, mib, requested=6)
    assert planning.num_shards(10**6, 1000 * mib, target_shard_bytes=192 * mib) == 6  # ceil(1000 / 192)
    assert planning.num_shards(10**6, 1000 * mib, target_shard_bytes=100 * mib) == 10
    assert planning.num_shards(10**6, mib) == 1
    assert planning.num_shards(10**6, 525 * 10**6) == 3  # ceil(500.7 / 192): no rounding to any worker count
    assert planning.num_shards(7, 1000 * mib, target_shard_bytes=mib) == 7  # never more than the rows
    assert planning.num_shards(0, 0) == 1
    assert planning.num_shards(10**9, 10**15, target_shard_bytes=1) == sharding.MAX_SHARDS


RUNNER_OPTIONS = {
    "DirectRunner": ["--direct_num_workers", "2"],
    "DirectRunner, multi_processing": ["--direct_running_mode", "multi_processing", "--direct_num_workers", "4"],
    "Flink": ["--runner", "FlinkRunner", "--flink_master", "[local]", "--parallelism", "4"],
    "Spark": ["--runner", "SparkRunner", "--parallelism", "2"],
    "Prism": ["--runner", "PrismRunner"],
    "Dataflow": ["--runner", "DataflowRunner", "--num_workers", "5", "--max_num_workers", "7"],
}


@pytest.mark.parametrize("runner", list(RUNNER_OPTIONS))
def test_default_shard_count_is_the_same_on_every_runner(tmp_path, capsys, runner):
    """The same input and flags plan the same shards (count, rows, files) whatever the runner and its parallelism:
    once 2 shards on DirectRunner and Flink, 1 on Spark and Prism for one file. The plan printed by --dry_run."""
    from tfrecord_etl.pipelines import convert

    src = tmp_path / "x.npy"
    np.save(src, np.arange(3 * 2**18, dtype="<f4").reshape(-1, 64))  # 3 MiB: 3 shards of --target_shard_mb 1
    argv = ["--input", str(src), "--output_dir", str(tmp_path / "out"), "--target_shard_mb", "1", "--dry_run"]
    assert convert.main(argv + RUNNER_OPTIONS[runner]) == 0
    lines = capsys.readouterr().out.splitlines()
    shards = [line.strip() for line in lines if line.strip().startswith("shards:")]
    assert shards == ["shards: 3 (3 files, e.g. data-00000-of-00003.tfrecord)"], lines


@pytest.fixture
def h5(tmp_path):
    path = tmp_path / "in.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(1000 * 4, dtype="<f4").reshape(1000, 4), chunks=(50, 4))
        f["y"] = np.arange(1000, dtype=">i8")
    return path


def test_plan_convert_plans_once_and_names_the_files(h5, tmp_path):
    cfg = ConvertConfig(
        input=str(h5),
        output_dir=str(tmp_path / "o"),
        num_shards=3,
        target_range_mb=0.004,
        feature_encodings={"y": "list"},
        provenance=True,
    )
    plan = planning.plan_convert(cfg)
    assert plan.num_shards == 3 and len(plan.shards) == 3
    assert plan.output_files == (
        "data-00000-of-00003.tfrecord",
        "data-00001-of-00003.tfrecord",
        "data-00002-of-00003.tfrecord",
    )
    assert {s.name: s.encoding for s in plan.specs} == {
        "x": "list",
        "y": "list",
        "_source/file": "list",
        "_source/row": "list",
    }
    rows = [(r.start, r.stop) for s in plan.shards for r in s.ranges]  # contiguous, every row once, in order
    assert rows[0][0] == 0 and rows[-1][1] == 1000 and all(a[1] == b[0] for a, b in itertools.pairwise(rows))
    assert all(r.num_rows * 20 <= 0.004 * 2**20 + 20 for s in plan.shards for r in s.ranges)
    sizes = [s.num_rows for s in plan.shards]
    assert max(sizes) - min(sizes) <= 50  # within one HDF5 chunk of rows
    beam = planning.plan_convert(cfg.model_copy(update={"writer": "beam", "compression": "gzip"}))
    assert beam.shards is None and beam.output_files[-1] == "data-00002-of-00003.tfrecord.gz"


def test_plan_convert_refuses_before_anything_is_written(h5, tmp_path):
    out = tmp_path / "o"
    with pytest.raises(ConfigError, match="unknown features"):
        planning.plan_convert(ConvertConfig(input=str(h5), output_dir=str(out), feature_encodings={"z": "list"}))
    with pytest.raises(SchemaError, match="packbits"):
        planning.plan_convert(ConvertConfig(input=str(h5), output_dir=str(out), feature_encodings={"x": "packbits"}))
    with pytest.raises(ConfigError, match="more than the 1000 rows"):
        planning.plan_convert(ConvertConfig(input=str(h5), output_dir=str(out), num_shards=1001))
    assert not out.exists()


def test_files_of_per_row_sizes_are_split_finer_when_fewer_ranges_than_shards(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"a{i}.npy", np.zeros((10 + i, 2), np.int16))
    inputs = planning.plan_inputs(str(tmp_path / "*.npy"), SourceOptions(formats=(NumpyOptions(npy_mode="files"),)))
    assert len(inputs.ranges) == 1
    shards = inputs.shards(3)
    assert [s.num_rows for s in shards] == [1, 1, 1]
    assert [f for s in shards for r in s.ranges for f in r.items] == [str(tmp_path / f"a{i}.npy") for i in range(3)]


def test_shards_continuing_a_deflated_member_are_written_by_one_worker_in_order(tmp_path, monkeypatch):
    """On object storage, a deflated .npz member cannot be entered in the middle, so the shards that continue it are
    grouped with the shard before them (one unit of work, one stream: every compressed byte decompressed once);
    a stored member and the other files stay one shard per unit. The shards are the same files either way."""
    from tfrecord_etl.transforms.beam import write as beam_write
    from tfrecord_etl.transforms.beam.encode import EncodeSettings
    from tfrecord_etl.transforms.beam.write import ShardOutput
    from tfrecord_etl.transforms.sources import npz

    x = np.arange(4000 * 8, dtype="<f4").reshape(4000, 8)
    np.savez_compressed(tmp_path / "a.npz", x=x)
    np.savez(tmp_path / "b.npz", x=x)
    inputs = planning.plan_inputs(str(tmp_path / "*.npz"), SourceOptions(target_range_bytes=16_000))
    assert [i.sequential for i in inputs.indexes] == [True, False]
    shards = inputs.shards(6)
    groups = sharding.group_sequential(shards, [i.path for i in inputs.indexes if i.sequential])
    assert [[s.index for s in g] for g in groups] == [[0, 1, 2], [3], [4], [5]]
    assert sharding.group_sequential(shards, []) == [(s,) for s in shards]
    # one group written by one WriteShardFn call: the member's stream is opened once and read forward only
    opened = []
    real_open = npz.NpzSource._member_stream

    def counting(self, arc, member, slot=-1):
        if (member, slot) not in arc.members:
            opened.append(member)
        return real_open(self, arc, member, slot)

    monkeypatch.setattr(npz.NpzSource, "_member_stream", counting)
    specs = planning.choose_encodings(inputs.specs, "tensor", {})
    fn = beam_write.WriteShardFn(
        inputs.source, EncodeSettings(specs), ShardOutput(str(tmp_path / "out"), "data", "none")
    )
    (tmp_path / "out").mkdir()
    written = [e for g in groups[:1] for e in fn.process(g)]
    assert [e["records"] for e in written] == [s.num_rows for s in groups[0]] and opened == ["x.npy"]
    # byte-identical to the same shards written one per call (each rereading the member from its start)
    (tmp_path / "one").mkdir()
    alone = beam_write.WriteShardFn(
        inputs.source, EncodeSettings(specs), ShardOutput(str(tmp_path / "one"), "data", "none")
    )
    assert [e for s in groups[0] for e in alone.process(s)] == written
    for e in written:
        assert (tmp_path / "out" / e["file"]).read_bytes() == (tmp_path / "one" / e["file"]).read_bytes()
    assert opened == ["x.npy"] * 4


# -- the commit protocol -------------------------------------------------------------------------------------


def test_committed_file_renames_only_when_complete(tmp_path):
    final = str(tmp_path / "f.json")
    with open(final, "wb") as f:
        f.write(b"old")
    with pytest.raises(RuntimeError):
        with sink.committed_file(final) as f:
            f.write(b"half")
            assert [
                n for n in os.listdir(tmp_path) if n.startswith(".tmp-") and n.endswith("-" + outdir.name_key("f.json"))
            ]
            raise RuntimeError("killed")
    assert open(final, "rb").read() == b"old" and os.listdir(tmp_path) == ["f.json"]
    sink.write_json(final, {"a": 1})
    assert open(final).read() == '{\n "a": 1\n}' and os.listdir(tmp_path) == ["f.json"]


def test_shard_writer_commits_a_readable_shard_and_abandons_a_bad_one(tmp_path):
    import tensorflow as tf

    final = str(tmp_path / "s.tfrecord.gz")
    with sink.shard_writer(final, "gzip") as w:
        w.write_batch([b"a", b"bc", b""])
    assert [r.numpy() for r in tf.data.TFRecordDataset(final, compression_type="GZIP")] == [b"a", b"bc", b""]
    assert [r for _, _, r in reader.iter_records(final)] == [b"a", b"bc", b""]
    with pytest.raises(ValueError, match="count mismatch"):
        with sink.shard_writer(str(tmp_path / "t.tfrecord"), "none") as w:
            w.write_batch([b"x"])
            raise ValueError("count mismatch")
    assert sorted(os.listdir(tmp_path)) == ["s.tfrecord.gz"]


# -- ConvertToTFRecord in a user's own pipeline --------------------------------------------------------------


def test_convert_to_tfrecord_in_a_user_pipeline(h5, tmp_path):
    import apache_beam as beam
    import tensorflow as tf
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrecord_etl.transforms.convert import ConvertToTFRecord

    out = tmp_path / "out"
    os.makedirs(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not written by tfrecord-etl|notes.txt"):
        ConvertToTFRecord(str(h5), str(out))
    with pytest.raises(ConfigError, match="Invalid ConvertToTFRecord options"):
        ConvertToTFRecord(str(h5), str(out), num_shards=-1)
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])) as p:
        done = p | ConvertToTFRecord(
            str(h5),
            str(out),
            overwrite=True,
            num_shards=2,
            compression="gzip",
            encoding="tensor",
            feature_encodings={"y": "list"},
        )
        done | beam.Map(lambda d: open(os.path.join(d, "committed"), "w").close())
    assert (out / "notes.txt").read_text() == "mine" and (out / "committed").exists()
    got = list(reader.iter_numpy(str(out)))
    assert len(got) == 1000 and all(
        int(e["y"]) == i and e["x"].tolist() == [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3] for i, e in enumerate(got)
    )
    files = sorted(str(p) for p in out.glob("*.tfrecord.gz"))
    spec = {"y": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([], tf.string)}
    ys = [int(tf.io.parse_single_example(r, spec)["y"]) for r in tf.data.TFRecordDataset(files, "GZIP")]
    assert ys == list(range(1000))
    assert not os.path.exists(out / ".tf-etl.lock")  # the lock is not held past construction
    assert tfrecord.compression_from_path(files[0]) == "gzip"


def test_augment_tfrecord_in_a_user_pipeline(h5, tmp_path):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrecord_etl.transforms.augment import AugmentTFRecord
    from tfrecord_etl.transforms.convert import ConvertToTFRecord

    flags = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"])
    src, side = tmp_path / "src", tmp_path / "side"
    with beam.Pipeline(options=flags) as p:
        p | ConvertToTFRecord(str(h5), str(src), num_shards=2)
    labels = tmp_path / "labels.npy"
    np.save(labels, (np.arange(1000) % 7).astype(np.uint8))
    with pytest.raises(ConfigError, match="Invalid AugmentTFRecord options"):
        AugmentTFRecord(str(src), str(side), mode="both")
    with beam.Pipeline(options=flags) as p:
        p | AugmentTFRecord(
            str(src),
            str(side),
            mode="sidecar",
            join_input=str(labels),
            join_by="position",
            join_fields={"array": "label"},
            constants={"tag": "v1"},
        )
    got = list(reader.iter_numpy_merged(str(src), str(side)))
    assert [int(e["label"]) for e in got] == [i % 7 for i in range(1000)]
    assert all(e["tag"] == b"v1" for e in got) and [int(e["y"]) for e in got] == list(range(1000))
