"""End to end: the convert command on DirectRunner, read back with plain TensorFlow, TFXIO and our reader."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

from tests.conftest import convert, fixture_file
from tfrecord_etl.pipelines import common
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import metadata


@pytest.fixture(scope="module")
def tf():
    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def make_h5(path, rows=500):
    comp = np.dtype([("id", "<i8"), ("pos", ">f4", (3,)), ("tag", "S4"), ("flag", "?")])
    table = np.zeros(rows, comp)
    table["id"] = np.arange(rows) * 7
    table["pos"] = np.arange(rows * 3).reshape(rows, 3) / 3
    table["tag"] = [b"t%d" % (i % 100) for i in range(rows)]
    table["flag"] = np.arange(rows) % 3 == 0
    data = {
        "images": np.random.default_rng(1).integers(0, 255, (rows, 8, 8, 3), dtype=np.uint8),
        "meta/labels": np.arange(rows, dtype=">i2") - 250,
        "meta/weights": np.linspace(0, 1, rows, dtype=">f8"),
        "meta/z": (np.arange(rows) * (1 + 2j)).astype("<c8"),
        "meta/big": np.arange(rows, dtype=">u8") * (2**40),
    }
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            f.create_dataset(k, data=v, chunks=(50,) + v.shape[1:], compression="gzip")
        f.create_dataset("table", data=table, chunks=(64,))
        f.create_dataset(
            "names", data=np.array([b"n%d" % i for i in range(rows)], dtype=object), dtype=h5py.string_dtype()
        )
    data.update({f"table/{k}": table[k] for k in comp.names})
    data["names"] = np.array([b"n%d" % i for i in range(rows)], dtype=object)
    return data


def by_row(examples):
    return sorted(examples, key=lambda e: int(np.asarray(e["_source/row"])))


def assert_same(expected: np.ndarray, got) -> None:
    got = np.asarray(got)
    if expected.dtype == object:
        assert got.tolist() == expected.tolist()
        return
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)


@pytest.fixture(scope="module", params=["planned", "beam"])
def converted(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("conv")
    data = make_h5(tmp / "in.h5")
    out = tmp / "out"
    code, _, _ = convert(
        tmp / "in.h5", out, "--provenance", "--num_shards", "3", "--target_range_mb", "0.02", "--writer", request.param
    )
    assert code == 0
    return data, out


def test_output_files_and_metadata(converted):
    _data, out = converted
    names = sorted(os.listdir(out))
    assert names == [
        ".tf-etl-run.json",
        "data-00000-of-00003.tfrecord",
        "data-00001-of-00003.tfrecord",
        "data-00002-of-00003.tfrecord",
        "metadata.json",
        "schema.pbtxt",
    ]  # no lock left behind
    marker = json.loads((out / ".tf-etl-run.json").read_text())
    assert marker["command"] == "convert" and set(marker["files"]) == set(names[1:])
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["num_records"] == 500 and sum(s["records"] for s in meta["shards"]) == 500
    feats = {f["name"]: f for f in meta["features"]}
    assert feats["table/pos"] == {"name": "table/pos", "dtype": "<f4", "shape": [3], "encoding": "list"}
    # --encoding auto (the default): typed lists where exact and not much larger, tensor elsewhere
    assert {n: f["encoding"] for n, f in feats.items()} == {
        "images": "tensor",
        "meta/labels": "list",
        "meta/weights": "tensor",
        "meta/z": "tensor",
        "meta/big": "tensor",
        "table/id": "list",
        "table/pos": "list",
        "table/tag": "list",
        "table/flag": "list",
        "names": "list",
        "_source/file": "list",
        "_source/row": "list",
    }
    assert feats["names"]["dtype"] == "bytes" and feats["names"]["encoding"] == "list"
    assert meta["sources"] == [{"path": str(out.parent / "in.h5"), "rows": 500}]


def test_plain_tensorflow_reads_back_exact_arrays(converted, tf):
    data, out = converted
    spec = reader.tf_feature_spec(str(out))
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    rows = []
    for serialized in tf.data.TFRecordDataset(files).batch(64):
        parsed = tf.io.parse_example(serialized, spec)
        for i in range(int(serialized.shape[0])):
            rows.append(
                {
                    k: (v.values if isinstance(v, tf.SparseTensor) else v)[i].numpy()
                    for k, v in parsed.items()
                    if not isinstance(v, tf.SparseTensor)
                }
            )
    assert len(rows) == 500
    rows = by_row(rows)
    for i in (0, 123, 499):
        # tensor encoding: raw little-endian bytes, decoded with plain numpy from the tf.string
        assert np.frombuffer(rows[i]["images"], np.uint8).reshape(8, 8, 3).tolist() == data["images"][i].tolist()
        assert np.frombuffer(rows[i]["meta/big"], "<u8")[0] == data["meta/big"][i]
        assert np.frombuffer(rows[i]["table/pos"], "<f4").tolist() == data["table/pos"][i].tolist()
        assert rows[i]["names"] == data["names"][i]


def test_to_tf_dataset_restores_dtypes_and_shapes(converted, tf):
    data, out = converted
    examples = by_row([{k: v.numpy() for k, v in e.items()} for e in reader.to_tf_dataset(str(out))])
    assert len(examples) == 500
    first = examples[0]
    assert first["images"].dtype == np.uint8 and first["images"].shape == (8, 8, 3)
    assert first["meta/big"].dtype == np.uint64 and first["meta/z"].dtype == np.complex64
    assert first["table/flag"].dtype == np.bool_
    for name, expected in data.items():
        if expected.dtype.kind == "S":
            assert [e[name] for e in examples] == expected.tolist()
        else:
            assert_same(
                expected,
                np.stack([e[name] for e in examples])
                if expected.dtype != object
                else np.array([e[name] for e in examples], dtype=object),
            )


def test_iter_numpy_restores_exact_arrays(converted):
    data, out = converted
    examples = by_row(list(reader.iter_numpy(str(out))))
    for name, expected in data.items():
        got = [e[name] for e in examples]
        assert_same(expected, np.array(got, dtype=object) if expected.dtype == object else np.stack(got))
        if expected.dtype != object:
            assert got[0].dtype == expected.dtype.newbyteorder("<") or expected.dtype.itemsize == 1


def test_tfxio_reads_with_the_written_schema(converted):
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.public import tfxio

    _, out = converted
    schema = text_format.Parse((out / "schema.pbtxt").read_text(), schema_pb2.Schema())
    source = tfxio.TFExampleRecord(file_pattern=str(out / "*.tfrecord"), schema=schema)
    total, columns = 0, None
    for batch in source.RecordBatches(tfxio.TensorFlowDatasetOptions(batch_size=128, shuffle=False, num_epochs=1)):
        total += batch.num_rows
        columns = set(batch.schema.names)
    assert total == 500
    assert {"images", "names", "table/pos", "_source/row"} <= columns


def test_list_encoding_reads_with_fixed_len_feature(tmp_path, tf):
    arr = np.arange(40 * 2 * 3, dtype=">i2").reshape(40, 2, 3)
    np.save(tmp_path / "a.npy", arr)
    code, _, _ = convert(tmp_path / "a.npy", tmp_path / "out", "--encoding", "list", "--compression", "zlib")
    assert code == 0
    files = [str(p) for p in (tmp_path / "out").glob("*.tfrecord.deflate")]
    ds = (
        tf.data.TFRecordDataset(files, compression_type="ZLIB")
        .batch(40)
        .map(lambda s: tf.io.parse_example(s, {"array": tf.io.FixedLenFeature([2, 3], tf.int64)}))
    )
    got = next(iter(ds))["array"].numpy()
    np.testing.assert_array_equal(np.sort(got, axis=0), arr)  # shard order may differ from row order
    batched = tf.data.experimental.make_batched_features_dataset(
        files,
        8,
        {"array": tf.io.FixedLenFeature([2, 3], tf.int64)},
        reader=lambda f: tf.data.TFRecordDataset(f, compression_type="ZLIB"),
        num_epochs=1,
        shuffle=False,
    )
    assert sum(int(b["array"].shape[0]) for b in batched) == 40


def test_gzip_output_and_arrays_mode_npz_with_varying_shapes(tmp_path):
    members = {"a": np.arange(6, dtype="<i4").reshape(2, 3), "b": np.arange(4, dtype="<i4")}
    np.savez_compressed(tmp_path / "m.npz", **members)
    code, _, _ = convert(tmp_path / "m.npz", tmp_path / "out", "--npz_mode", "arrays", "--compression", "gzip")
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "out").glob("*.gz")) == ["data-00000-of-00001.tfrecord.gz"]
    got = {e["key"].item(): e["array"] for e in reader.iter_numpy(str(tmp_path / "out"))}
    assert set(got) == {b"a", b"b"}
    for k, v in members.items():
        assert got[k.encode()].shape == v.shape
        np.testing.assert_array_equal(got[k.encode()], v)


@pytest.mark.parametrize("source", ["jacksboro", "generated"])
def test_a_feature_whose_dtype_varies_is_refused_by_tf_data_and_read_exactly_by_iter_numpy(tmp_path, tf, source):
    """npz arrays mode over members of several dtypes (matplotlib's jacksboro_fault_dem.npz: int16 elevation,
    float64 scalars; a generated archive of 6 dtypes): ``array`` has no single dtype, so to_tf_dataset and
    decode_tf refuse it naming the feature and iter_numpy, which reads every member exactly; features=[...]
    leaving it out still reads in tf.data."""
    from tfrecord_etl.transforms.errors import SchemaError

    if source == "jacksboro":
        path = fixture_file("matplotlib/mpl-data/sample_data/jacksboro_fault_dem.npz")
    else:
        path = tmp_path / "mixed.npz"
        np.savez(
            path,
            f4=np.linspace(0, 1, 6, dtype="<f4").reshape(2, 3),
            u1=np.arange(5, dtype="u1"),
            be=np.arange(4, dtype=">i8"),
            b=np.array([True, False]),
            c=np.array([1 + 2j], "<c16"),
            s=np.array(7, "<i2"),
        )
    with np.load(path) as npz:
        members = {k: npz[k] for k in npz.files}
    assert len({v.dtype.newbyteorder("<") for v in members.values()}) > 1
    out = tmp_path / "out"
    code, _, err = convert(path, out, "--npz_mode", "arrays")
    assert code == 0, err
    (array,) = [s for s in metadata.load(str(out))["features"] if s.name == "array"]
    assert array.dtype is None
    for call in (
        lambda: reader.to_tf_dataset(str(out)),
        lambda: reader.to_tf_dataset(str(out), batch_size=2),
        lambda: reader.decode_tf(tf, {}, [array]),
    ):
        with pytest.raises(SchemaError, match=r"The dtype of \['array'\] varies between examples") as e:
            call()
        assert "reader.iter_numpy" in str(e.value) and "'array'" in str(e.value)
    got = {e["key"].item().decode(): e["array"] for e in reader.iter_numpy(str(out))}
    assert set(got) == set(members)
    for k, v in members.items():
        assert got[k].dtype == v.dtype.newbyteorder("<") and got[k].shape == v.shape
        assert np.array_equal(got[k], v)
    keys = [e["key"].numpy() for e in reader.to_tf_dataset(str(out), features=["key"])]
    assert sorted(k.decode() for k in keys) == sorted(members)
    from tfrecord_etl.pipelines import inspect as inspect_module  # --tf_read reads the other features

    assert inspect_module.summarize(str(out), tf_read=True)["tf_read_records"] == len(members)
    if source == "generated":  # a sidecar beside it: the merged tf.data reader refuses it too
        from tests.conftest import BEAM_FLAGS, run_command
        from tfrecord_etl.pipelines import augment as augment_main

        np.save(tmp_path / "labels.npy", np.arange(len(members), dtype="<i8"))
        code, _, err = run_command(
            augment_main.main,
            [
                "--input",
                out,
                "--output_dir",
                tmp_path / "side",
                "--mode",
                "sidecar",
                "--join_input",
                tmp_path / "labels.npy",
                "--join_fields",
                "array=label",
                *BEAM_FLAGS,
            ],
        )
        assert code == 0, err
        with pytest.raises(SchemaError, match=r"\['array'\] varies.*reader.iter_numpy_merged"):
            reader.to_tf_dataset_merged(str(out), str(tmp_path / "side"))
        merged = list(reader.iter_numpy_merged(str(out), str(tmp_path / "side")))
        assert [int(e["label"]) for e in merged] == list(range(len(members)))
        assert all(np.array_equal(e["array"], members[e["key"].item().decode()]) for e in merged)


def test_help_lists_custom_flags_with_defaults(capsys):
    from tfrecord_etl.pipelines import convert as convert_module

    with pytest.raises(SystemExit) as exit_info:
        common.run_main(convert_module.main, ["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--input",
        "--output_dir",
        "--datasets",
        "--npz_mode",
        "--npy_mode",
        "--encoding",
        "--compression",
        "--num_shards",
        "--provenance",
        "--overwrite",
        "--config",
    ):
        assert flag in text
    assert "(default: 'auto')" in text


def test_config_file_and_flag_precedence(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(10, dtype="<i8"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"input: {tmp_path / 'a.npy'}\noutput_dir: {tmp_path / 'out'}\ncompression: gzip\n"
        "num_shards: 2\npipeline_options:\n  runner: DirectRunner\n  direct_running_mode: in_memory\n"
    )
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import convert as convert_module

    code, _, _ = run_command(convert_module.main, ["--config", cfg, "--num_shards", "1"])
    assert code == 0
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["compression"] == "gzip" and len(meta["shards"]) == 1  # the flag won over the file


def test_planned_writer_reruns_are_byte_identical(tmp_path):
    make_h5(tmp_path / "in.h5", rows=300)
    outs = []
    for i, flags in enumerate(
        [["--direct_running_mode=in_memory"], ["--direct_running_mode=multi_threading", "--direct_num_workers=2"]]
    ):
        out = tmp_path / f"out{i}"
        code, _, _ = convert(
            tmp_path / "in.h5",
            out,
            "--compression",
            "gzip",
            "--num_shards",
            "4",
            "--target_range_mb",
            "0.01",
            "--runner=DirectRunner",
            *flags,
            beam=False,
        )
        assert code == 0
        outs.append({p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord.gz"))})
    assert len(outs[0]) == 4 and outs[0] == outs[1]
    rows = [int(e["_source/row"]) if "_source/row" in e else None for e in reader.iter_numpy(str(tmp_path / "out0"))]
    ids = [int(e["table/id"]) for e in reader.iter_numpy(str(tmp_path / "out0"))]
    assert ids == list(range(0, 300 * 7, 7))  # shard order is row order with the planned writer
    assert rows[0] is None


def test_planned_shard_retry_leaves_exactly_one_final_file_and_failure_leaves_none(tmp_path):
    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.beam import write as beam_write
    from tfrecord_etl.transforms.beam.encode import EncodeSettings
    from tfrecord_etl.transforms.beam.write import ShardOutput
    from tfrecord_etl.transforms.errors import SourceError
    from tfrecord_etl.transforms.sources import SourceOptions

    make_h5(tmp_path / "in.h5", rows=200)
    plan = planning.plan_inputs(str(tmp_path / "in.h5"), SourceOptions(target_range_bytes=20000))
    specs = planning.choose_encodings(plan.specs, "tensor", {})
    (shard,) = plan.shards(1)
    assert len(shard.ranges) > 2
    out = tmp_path / "out"
    fn = beam_write.WriteShardFn(plan.source, EncodeSettings(specs), ShardOutput(str(out), "data", "gzip"))
    first = list(fn.process(shard))
    data = (out / first[0]["file"]).read_bytes()
    second = list(fn.process(shard))  # a retried attempt of the same work item
    assert first == second and sorted(p.name for p in out.iterdir()) == [first[0]["file"]]
    assert (out / first[0]["file"]).read_bytes() == data

    class Failing(type(plan.source)):
        def read(self, rr):
            if rr.start > 0:
                raise SourceError("disk on fire", file=rr.path)
            return super().read(rr)

    broken = tmp_path / "broken"
    fn = beam_write.WriteShardFn(
        Failing(plan.source.options), EncodeSettings(specs), ShardOutput(str(broken), "data", "none")
    )
    with pytest.raises(SourceError, match="disk on fire"):
        list(fn.process(shard))
    assert list(broken.iterdir()) == []  # the temporary file is gone and nothing looks final


def test_summary_prints_counts_metrics_and_progress(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.arange(300, dtype="<i8").reshape(100, 3))
    code, out, err = convert(tmp_path / "a.npy", tmp_path / "out", "--num_shards", "2", "--progress", capsys=capsys)
    assert code == 0
    assert "wrote 100 examples in 2 shards" in out and "rows dead-lettered: 0" in out
    assert "Beam metrics:" in out and "examples_written" in out and "shards_written" in out
    assert "[tfrecord-etl] shard 1/2 done" in err and "[tfrecord-etl] shard 2/2 done" in err
    assert "INFO" not in err and "WARNING" not in err  # Beam/TF logs stay out of the default output
    # the work span comes from the shard writers' start/end time distributions (Beam metrics)
    import re

    span = re.search(r"^work span: (\d+\.\d{3}) s \(first shard started to last shard written", out, re.M)
    assert span and 0 <= float(span.group(1)) < 60, out


def test_zlib_shards_are_named_deflate_so_beam_auto_detection_reads_them(tmp_path, tf):
    """Before: `.tfrecord.zlib` was unknown to Beam's CompressionTypes.AUTO (and so to TFDV and TFX
    ImportExampleGen); Beam calls the format DEFLATE and detects `.deflate`."""
    import apache_beam as beam
    from apache_beam.io.tfrecordio import ReadFromTFRecord
    from apache_beam.testing.util import assert_that, equal_to

    arr = np.arange(30, dtype="<i8")
    np.save(tmp_path / "a.npy", arr)
    code, _, err = convert(
        tmp_path / "a.npy", tmp_path / "out", "--encoding", "list", "--compression", "zlib", "--num_shards", "2"
    )
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "out").glob("data-*"))
    assert names == ["data-00000-of-00002.tfrecord.deflate", "data-00001-of-00002.tfrecord.deflate"]
    expected = [
        tf.train.Example(
            features=tf.train.Features(
                feature={"array": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v)]))}
            )
        ).SerializeToString()
        for v in arr
    ]
    with beam.Pipeline(
        runner="DirectRunner",
        options=beam.options.pipeline_options.PipelineOptions(["--direct_running_mode=in_memory"]),
    ) as p:  # compression_type defaults to AUTO
        got = p | ReadFromTFRecord(str(tmp_path / "out" / "data-*"))
        assert_that(got, equal_to(expected))
    # shards named `.zlib` (older outputs) are still read as zlib
    (tmp_path / "old").mkdir()
    for name in names:
        (tmp_path / "out" / name).rename(tmp_path / "old" / name.replace(".deflate", ".zlib"))
    old = sorted((tmp_path / "old").glob("*.zlib"))
    assert {reader.file_compression(str(p)) for p in old} == {"zlib"}
    assert sorted(r for p in old for _, _, r in reader.iter_records(str(p))) == sorted(expected)
