"""schema.pbtxt's typed additions: bool_domain for bools carried as int64, and the encoding, dtype and shape of
every feature (carried as opaque bytes or as lists) in the feature's annotation; read with tensorflow_metadata and by
TFXIO, and ignored by specs_from_schema (so schemas of earlier versions and ours read alike)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from tests.conftest import convert
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.output import schemafile

ROWS = 40


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("typed")
    rng = np.random.default_rng(5)
    data = {
        "flag": np.arange(ROWS) % 3 == 0,
        "mask": rng.integers(0, 2, (ROWS, 4, 5)).astype(bool),
        "w": np.arange(ROWS, dtype=np.float64) / 7,
        "image": rng.integers(0, 255, (ROWS, 4, 4, 3), np.uint8),
        "x": np.arange(ROWS, dtype=np.float32),
        "code": np.array([b"c%02d" % i for i in range(ROWS)], "S3"),
    }
    np.savez(tmp / "in.npz", **data)
    out = tmp / "out"
    assert convert(tmp / "in.npz", out, "--feature_encodings", "mask=packbits,image=zlib")[0] == 0
    schema = text_format.Parse((out / "schema.pbtxt").read_text(), schema_pb2.Schema())
    return data, out, schema, {f.name: f for f in schema.feature}


def tags(feature) -> dict:
    return dict(t.split(":", 1) for t in feature.annotation.tag)


def test_bools_carried_as_int64_have_a_bool_domain(typed):
    _, out, _, features = typed
    meta = {f["name"]: f for f in json.loads((out / "metadata.json").read_text())["features"]}
    assert meta["flag"]["encoding"] == "list" and meta["flag"]["dtype"] == "|b1"
    assert features["flag"].type == schema_pb2.INT and features["flag"].HasField("bool_domain")
    assert [n for n, f in features.items() if f.HasField("bool_domain")] == ["flag"]  # not the packbits mask


def test_opaque_byte_features_carry_dtype_and_shape_in_their_annotation(typed):
    _, out, _, features = typed
    meta = {f["name"]: f for f in json.loads((out / "metadata.json").read_text())["features"]}
    opaque = sorted(n for n, f in meta.items() if f["encoding"] in ("tensor", "zlib", "packbits"))
    assert opaque == ["image", "mask", "w"]
    for name in opaque:
        assert tags(features[name]) == {
            "tfrecord_etl.encoding": meta[name]["encoding"],
            "tfrecord_etl.dtype": meta[name]["dtype"],
            "tfrecord_etl.shape": json.dumps(meta[name]["shape"]),
        }
        assert features[name].type == schema_pb2.BYTES and len(features[name].annotation.comment) == 1
    assert tags(features["w"]) == {
        "tfrecord_etl.encoding": "tensor",
        "tfrecord_etl.dtype": "<f8",
        "tfrecord_etl.shape": "[]",
    }


def test_list_features_carry_their_dtype_and_shape_in_their_annotation_too(typed):
    """A FLOAT, INT or BYTES list feature says its dtype too (float16 and float32 are both FLOAT), so schema.pbtxt
    pins every field of metadata.json's features."""
    _, _, _, features = typed
    assert tags(features["x"]) == {
        "tfrecord_etl.encoding": "list",
        "tfrecord_etl.dtype": "<f4",
        "tfrecord_etl.shape": "[]",
    }
    assert (
        tags(features["code"])["tfrecord_etl.dtype"] == "|S3" and tags(features["flag"])["tfrecord_etl.dtype"] == "|b1"
    )
    assert features["x"].type == schema_pb2.FLOAT and len(features["x"].annotation.comment) == 1


def test_tfxio_reads_the_typed_schema_and_the_annotation_decodes_the_bytes(typed):
    """TFXIO (tfx-bsl) with our schema: bools arrive as int64 0/1, a tensor feature as its bytes, which the
    annotation's dtype and shape turn back into the exact array."""
    from tfx_bsl.public import tfxio

    data, out, schema, features = typed
    shards = [str(out / s["file"]) for s in json.loads((out / "metadata.json").read_text())["shards"]]
    ds = tfxio.TFExampleRecord(shards, schema=schema).TensorFlowDataset(
        tfxio.TensorFlowDatasetOptions(batch_size=ROWS, shuffle=False, num_epochs=1)
    )
    batch = next(ds.as_numpy_iterator())
    assert batch["flag"].dtype == np.int64
    np.testing.assert_array_equal(batch["flag"].ravel(), data["flag"].astype(np.int64))
    w = tags(features["w"])
    got = np.stack(
        [
            np.frombuffer(b, w["tfrecord_etl.dtype"]).reshape(json.loads(w["tfrecord_etl.shape"]))
            for b in batch["w"].ravel()
        ]
    )
    np.testing.assert_array_equal(got, data["w"])


def test_specs_from_schema_reads_our_schema_as_before(typed):
    """The additions are invisible to specs_from_schema: the same specs as from the schema without them."""
    _, _, schema, _ = typed
    plain = schema_pb2.Schema()
    plain.CopyFrom(schema)
    for f in plain.feature:
        f.ClearField("annotation")
        f.ClearField("bool_domain")
    assert plain != schema
    assert schemafile.specs_from_schema(text_format.MessageToString(schema)) == schemafile.specs_from_schema(
        text_format.MessageToString(plain)
    )


def test_schema_text_without_the_list_annotations_is_the_earlier_versions():
    """``native_tags=False``: the text earlier versions wrote (the fingerprint a collection's older spans have)."""
    specs = [
        FeatureSpec("x", "<f4", (3,), "list"),
        FeatureSpec("n", "<i2", (), "list"),
        FeatureSpec("s", "bytes", (), "list"),
        FeatureSpec("v", "<i8", (None,), "varlen"),
    ]
    tagged = text_format.Parse(schemafile.schema_text(specs), schema_pb2.Schema())
    assert [tags(f)["tfrecord_etl.dtype"] for f in tagged.feature] == ["<f4", "<i2", "bytes", "<i8"]
    assert schemafile.schema_text(specs, native_tags=False) == (
        'feature {\n  name: "x"\n  type: FLOAT\n  presence {\n    min_fraction: 1.0\n    min_count: 1\n  }\n'
        "  shape {\n    dim {\n      size: 3\n    }\n  }\n}\n"
        'feature {\n  name: "n"\n  type: INT\n  presence {\n    min_fraction: 1.0\n    min_count: 1\n  }\n'
        "  shape {\n  }\n}\n"
        'feature {\n  name: "s"\n  type: BYTES\n  presence {\n    min_fraction: 1.0\n    min_count: 1\n  }\n'
        "  shape {\n  }\n}\n"
        'feature {\n  name: "v"\n  value_count {\n    min: 0\n  }\n  type: INT\n  presence {\n'
        "    min_fraction: 0.0\n    min_count: 0\n  }\n}\n"
    )
