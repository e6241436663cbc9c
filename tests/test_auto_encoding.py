"""--encoding auto (the default): typed native lists wherever exact and not much larger than the raw bytes, tensor
elsewhere; TFX's typed feature spec and TFXIO then see numbers and strings; augment's new features follow the
collection's style."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import convert
from tests.test_augment import run_augment, tf  # noqa: F401 - the shared command helper and TF fixture
from tests.test_foreign import TAXI_RECORDS, taxi_pattern
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.codec.encodings import auto_encoding
from tfrecord_etl.transforms.output import metadata

ROWS = 64
# name: (values, the encoding the rule gives, the tf.io.FixedLenFeature dtype TFX sees (None: opaque bytes))
COLUMNS = {
    "label": (np.arange(ROWS, dtype=">i8") - 10, "list", "int64"),
    "class_id": (np.arange(ROWS, dtype="<i2") * -3, "list", "int64"),  # small: 1 value
    "emb": (np.linspace(-1, 1, ROWS * 8, dtype="<f4").reshape(ROWS, 8), "list", "float"),
    "half": (np.linspace(-1, 1, ROWS * 4, dtype="<f2").reshape(ROWS, 4), "list", "float"),
    "flags": (np.arange(ROWS * 40).reshape(ROWS, 40) % 3 == 0, "list", "int64"),
    "counts": (np.arange(ROWS * 20, dtype="<u4").reshape(ROWS, 20) * 70000, "list", "int64"),
    "when": (np.arange(ROWS).astype("M8[s]"), "list", "int64"),
    "tag": (np.array([b"t%d" % i for i in range(ROWS)], dtype="S4"), "list", "string"),
    "image": (np.arange(ROWS * 8 * 8 * 3, dtype=np.uint64).astype(np.uint8).reshape(ROWS, 8, 8, 3), "tensor", None),
    "patch": (np.arange(ROWS * 17, dtype="<i4").reshape(ROWS, 17) - 500, "tensor", None),  # 17 > 16 values
    "weight": (np.linspace(0, 1, ROWS, dtype=">f8"), "tensor", None),
    "big": (np.arange(ROWS, dtype="<u8") * 2**60, "tensor", None),
    "z": (np.arange(ROWS) * (1 + 2j), "tensor", None),
}


@pytest.fixture(scope="module")
def auto_output(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auto")
    np.savez(tmp / "in.npz", **{n: v for n, (v, _, _) in COLUMNS.items()})
    code, _, _ = convert(tmp / "in.npz", tmp / "out", "--num_shards", "2")
    assert code == 0
    return tmp / "out"


def test_the_rule_picks_lists_where_exact_and_not_much_larger(auto_output):
    meta = metadata.load(str(auto_output))
    assert {s.name: s.encoding for s in meta["features"]} == {n: enc for n, (_, enc, _) in COLUMNS.items()}
    assert auto_encoding(FeatureSpec("x", "<u1", (16,), "tensor")) == "list"
    assert auto_encoding(FeatureSpec("x", "<u1", (None,), "tensor")) == "tensor"  # size unknown: images too
    assert auto_encoding(FeatureSpec("x", "<f4", (None, 3), "tensor")) == "list"
    assert auto_encoding(FeatureSpec("x", "<U5", (), "tensor")) == "list"
    assert auto_encoding(FeatureSpec("x", "|V4", (), "tensor")) == "tensor"
    assert auto_encoding(FeatureSpec("x", None, None, "tensor")) == "tensor"


def test_values_are_exact_through_both_readers(auto_output, tf):
    got = list(reader.iter_numpy(str(auto_output)))
    assert len(got) == ROWS
    for name, (values, _, _) in COLUMNS.items():
        stacked = np.stack([g[name] for g in got])
        assert stacked.dtype == values.dtype.newbyteorder("<") or values.dtype.itemsize == 1
        np.testing.assert_array_equal(stacked, values)
    batch = next(iter(reader.to_tf_dataset(str(auto_output), batch_size=ROWS)))
    for name in ("label", "class_id", "emb", "half", "flags", "counts", "image", "patch", "weight"):
        np.testing.assert_array_equal(batch[name].numpy(), COLUMNS[name][0])


def test_tfx_sees_typed_features(auto_output, tf):
    """TFXIO (what TFX Transform, TFDV and Trainer read through) with the written schema: int64/float tensors where
    the rule chose lists, opaque strings only for the tensor ones; the Arrow batches TFDV computes statistics on
    are typed the same way."""
    import pyarrow as pa
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.public import tfxio

    schema = text_format.Parse((auto_output / "schema.pbtxt").read_text(), schema_pb2.Schema())
    source = tfxio.TFExampleRecord(file_pattern=str(auto_output / "*.tfrecord"), schema=schema)
    specs = source.TensorAdapter().OriginalTypeSpecs()
    kinds = {tf.int64: "int64", tf.float32: "float", tf.string: "string"}
    for name, (_, _, kind) in COLUMNS.items():
        assert kinds[specs[name].dtype] == (kind or "string"), name
    batch = next(
        iter(source.RecordBatches(tfxio.TensorFlowDatasetOptions(batch_size=ROWS, shuffle=False, num_epochs=1)))
    )
    arrow = {"int64": pa.int64(), "float": pa.float32(), "string": pa.large_binary(), None: pa.large_binary()}
    for name, (_, _, kind) in COLUMNS.items():
        value_type = batch.column(batch.schema.get_field_index(name)).type.value_type
        assert value_type in (arrow[kind], pa.binary()), (name, value_type)


def test_augment_new_features_follow_the_collection_style(auto_output, tmp_path):
    """A collection of lists (TFX ExampleGen's taxi data) gets typed lists; an output of --encoding tensor gets
    tensor features, as before; an explicit --encoding wins."""
    code, _, _ = run_augment(
        taxi_pattern(),
        tmp_path / "taxi",
        "--constants",
        "year=2026,w=0.5:float64,v=0.5",
        "--fn",
        "tests.augment_fns:count_values",
        "--fn_inputs",
        "trip_seconds",
    )
    assert code == 0
    meta = metadata.load(str(tmp_path / "taxi"))
    assert meta["num_records"] == TAXI_RECORDS
    new = {s.name: s.encoding for s in meta["features"] if s.name in ("year", "w", "v", "n_trip_seconds")}
    assert new == {"year": "list", "w": "tensor", "v": "list", "n_trip_seconds": "list"}  # float64: tensor (exact)
    src = tmp_path / "in.npz"
    np.savez(src, x=np.arange(10, dtype="<i8"))
    assert convert(src, tmp_path / "tensor", "--encoding", "tensor")[0] == 0
    assert run_augment(tmp_path / "tensor", tmp_path / "t2", "--constants", "year=2026")[0] == 0
    assert {s.name: s.encoding for s in metadata.load(str(tmp_path / "t2"))["features"]} == {
        "x": "tensor",
        "year": "tensor",
    }
    assert run_augment(tmp_path / "tensor", tmp_path / "t3", "--constants", "year=2026", "--encoding", "list")[0] == 0
    assert {s.name: s.encoding for s in metadata.load(str(tmp_path / "t3"))["features"]}["year"] == "list"
    assert [int(e["year"]) for e in reader.iter_numpy(str(tmp_path / "t3"))] == [2026] * 10
