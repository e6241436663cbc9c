"""The settings objects the Beam transforms take (``EncodeSettings``, ``ShardOutput``): what they refuse at
construction, and that a DoFn holding them goes through Beam's pickler to a worker and writes the same bytes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from apache_beam.internal import pickler

from tfrecord_etl.transforms import planning
from tfrecord_etl.transforms.beam.encode import EncodeSettings
from tfrecord_etl.transforms.beam.write import ShardOutput, WriteShardFn
from tfrecord_etl.transforms.sources import SourceOptions


@pytest.fixture
def inputs(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(600, dtype="<i4").reshape(200, 3))
    plan = planning.plan_inputs(str(tmp_path / "a.npy"), SourceOptions(target_range_bytes=800))
    return plan, planning.choose_encodings(plan.specs, "tensor", {})


def test_encode_settings_refuse_what_would_fail_on_a_worker(inputs):
    _, specs = inputs
    settings = EncodeSettings(list(specs), ["array"])
    assert settings.specs == tuple(specs) and settings.allow_lossy == ("array",)  # lists become tuples
    with pytest.raises(TypeError, match="allow_lossy is a sequence of feature names, not the string 'array'"):
        EncodeSettings(specs, "array")
    with pytest.raises(TypeError, match="specs must be FeatureSpecs; got str: 'array'"):
        EncodeSettings(["array"])


def test_shard_output_refuses_an_unknown_compression(tmp_path):
    with pytest.raises(ValueError, match="Unknown shard compression 'gz'; choose one of none, gzip, zlib"):
        ShardOutput(str(tmp_path), "data", "gz")
    assert ShardOutput(str(tmp_path), "data", "zlib").path("x") == str(tmp_path / "x")


def test_write_shard_fn_refuses_dead_letters_without_a_directory(inputs, tmp_path):
    plan, specs = inputs
    with pytest.raises(ValueError, match=r"dead_letters \(True\) and ShardOutput.dead_letter_dir \(None\) disagree"):
        WriteShardFn(plan.source, EncodeSettings(specs, dead_letters=True), ShardOutput(str(tmp_path), "data", "none"))
    with pytest.raises(ValueError, match="disagree"):
        WriteShardFn(
            plan.source, EncodeSettings(specs), ShardOutput(str(tmp_path), "data", "none", dead_letter_dir="d")
        )


def test_settings_and_the_shard_writer_pickle_and_write_the_same_bytes(inputs, tmp_path):
    plan, specs = inputs
    encode = EncodeSettings(specs, provenance=True)
    out = ShardOutput(str(tmp_path / "a"), "data", "gzip", index=True)
    assert pickle.loads(pickle.dumps(encode)) == encode and pickle.loads(pickle.dumps(out)) == out
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (shard,) = plan.shards(1)
    here = list(WriteShardFn(plan.source, encode, out).process(shard))
    shipped = pickler.loads(
        pickler.dumps(WriteShardFn(plan.source, encode, ShardOutput(str(tmp_path / "b"), "data", "gzip", index=True)))
    )
    there = list(shipped.process(shard))
    assert here == there and here[0]["records"] == 200 and here[0]["index"]
    for name in (here[0]["file"], here[0]["index"]):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
