"""TFRecord framing against TensorFlow's own writer and reader; errors name file, record and offset."""

from __future__ import annotations

import io

import pytest

from tfrecord_etl.pipelines import common
from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import tfrecord

RECORDS = [b"", b"a", b"hello world" * 100, bytes(range(256)) * 40]


@pytest.fixture(scope="module")
def tf():
    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def test_frames_are_byte_identical_to_tensorflow_writer(tf, tmp_path):
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in RECORDS:
            w.write(r)
    assert open(path, "rb").read() == tfrecord.frame_records(RECORDS)


@pytest.mark.parametrize("compression,tf_name", [("none", ""), ("gzip", "GZIP"), ("zlib", "ZLIB")])
def test_tensorflow_reads_our_shards_and_we_read_tensorflows(tf, tmp_path, compression, tf_name):
    ours = tmp_path / f"ours{tfrecord.SUFFIXES[compression]}"
    with open(ours, "wb") as f:
        w = tfrecord.ShardWriter(f, compression)
        w.write_batch(RECORDS[:2])
        w.write_batch(RECORDS[2:])
        w.close()
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours), compression_type=tf_name)] == RECORDS
    theirs = str(tmp_path / "theirs")
    with tf.io.TFRecordWriter(theirs, options=tf_name or None) as w:
        for r in RECORDS:
            w.write(r)
    with open(theirs, "rb") as raw:
        assert tfrecord.detect_compression(raw.read(12)) == compression
        raw.seek(0)
        got = [rec for _, _, rec in tfrecord.iter_records(tfrecord.open_decompressed(raw, compression), theirs)]
    assert got == RECORDS


def test_truncated_record_names_file_record_and_offset():
    data = tfrecord.frame_records(RECORDS)[:-5]
    with pytest.raises(RecordError, match="Truncated record") as err:
        list(tfrecord.iter_records(io.BytesIO(data), "x.tfrecord"))
    assert err.value.context == {"file": "x.tfrecord", "record": 3, "offset": 16 + 16 + 1 + 16 + 1100}


def test_flipped_byte_is_a_crc_mismatch():
    data = bytearray(tfrecord.frame_records(RECORDS))
    data[16 + 12 + 0] ^= 0x01  # first data byte of record 1 ("a")
    with pytest.raises(RecordError, match="Data CRC mismatch") as err:
        list(tfrecord.iter_records(io.BytesIO(bytes(data)), "x"))
    assert err.value.context["record"] == 1 and err.value.context["offset"] == 16


def test_gzip_read_as_uncompressed_fails_with_a_compression_hint(tmp_path):
    buf = io.BytesIO()
    w = tfrecord.ShardWriter(buf, "gzip")
    w.write_batch(RECORDS)
    w.close()
    with pytest.raises(RecordError, match="compression"):
        list(tfrecord.iter_records(io.BytesIO(buf.getvalue()), "x.gz"))


def test_vectorized_block_framing_equals_per_record_framing():
    import numpy as np

    block = np.random.default_rng(3).integers(0, 256, (50, 37), dtype=np.uint8)
    assert tfrecord.frame_block(block).tobytes() == tfrecord.frame_records([r.tobytes() for r in block])
    assert tfrecord.frame_block(np.zeros((3, 0), np.uint8)).tobytes() == tfrecord.frame_records([b""] * 3)


@pytest.mark.parametrize("first_id,order", [(20_000, "sorted"), (-5, "sorted"), (-5, "shuffled")])
def test_encoded_batches_are_framed_in_place_exactly_as_their_records(tf, first_id, order):
    """The fixed-layout fast path (rows assembled straight into the framed buffer; ids whose varints are all 3
    bytes), runs of it (sorted ids from -5: varints of 10, then 2, then 3 bytes) and the padded path (the same ids
    shuffled: rows of different lengths framed in their padded block) write the same bytes as framing each record,
    and TensorFlow parses them back to the original arrays."""
    import numpy as np

    from tfrecord_etl.transforms import codec

    rng = np.random.default_rng(5)
    columns = {
        "image": rng.integers(0, 256, (40, 4, 4, 3), dtype=np.uint8),
        "emb": rng.standard_normal((40, 8)).astype("<f4"),
        "id": first_id + np.arange(40, dtype="<i8") * 1000,
    }
    if order == "shuffled":
        columns["id"] = rng.permutation(columns["id"])
    specs = [
        codec.FeatureSpec("image", "|u1", (4, 4, 3), "tensor"),
        codec.FeatureSpec("emb", "<f4", (8,), "list"),
        codec.FeatureSpec("id", "<i8", (), "list"),
    ]
    batch = codec.encode_columns(columns, specs, 40)
    kind = "fixed" if batch.width else "runs" if batch.parts is not None else "padded" if batch.padded else None
    assert batch.tails is None and kind == {"sorted": "fixed" if first_id > 0 else "runs"}.get(order, "padded")
    expected = tfrecord.frame_records(batch.records())
    buf = io.BytesIO()
    writer = tfrecord.ShardWriter(buf, index=True)
    writer.write_encoded(batch)
    writer.close()
    assert buf.getvalue() == expected and writer.records == 40
    assert writer.index_text() == tfrecord.index_text([len(r) for r in batch.records()])
    if first_id > 0:
        assert tfrecord.frame_encoded(batch).tobytes() == buf.getvalue()
    records = [r for _, _, r in tfrecord.iter_records(io.BytesIO(buf.getvalue()))]
    parsed = tf.io.parse_example(
        records,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "emb": tf.io.FixedLenFeature([8], tf.float32),
            "id": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    images = np.stack([np.frombuffer(x, np.uint8).reshape(4, 4, 3) for x in parsed["image"].numpy()])
    np.testing.assert_array_equal(images, columns["image"])
    np.testing.assert_array_equal(parsed["emb"].numpy(), columns["emb"])
    np.testing.assert_array_equal(parsed["id"].numpy(), columns["id"])
