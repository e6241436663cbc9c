"""Read an output directory of tfrecord-etl back: as NumPy (no TensorFlow import) or as tf.data.

    from transforms import reader
    for example in reader.iter_numpy("out/"):            # dicts of numpy arrays, in shard order
        ...
    ds = reader.to_tf_dataset("out/", batch_size=256)    # dicts of tensors, original dtypes and shapes
    spec = reader.feature_spec("out/")                   # for tf.io.parse_example

Every function refuses an output directory without ``metadata.json`` (IncompleteOutputError).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from transforms import fileio, metadata, tfrecord
from transforms.codec import VLEN_BYTES, FeatureSpec, decode_example
from transforms.errors import RecordError, SchemaError

_TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}


def iter_records(path: str, compression: str | None = None) -> Iterator[tuple[int, int, bytes]]:
    """``(record index, byte offset, serialized record)`` of one TFRecord file, streamed, CRCs checked.

    ``compression``: ``none``, ``gzip`` or ``zlib``; None guesses from the suffix, then the first bytes.
    """
    with fileio.open_read(path) as raw:
        if compression is None:
            compression = tfrecord.compression_from_path(path)
            if compression == "none":
                compression = tfrecord.detect_compression(raw.read(12))
                raw.seek(0)
        yield from tfrecord.iter_records(tfrecord.open_decompressed(raw, compression), path)


def _select(specs: Sequence[FeatureSpec], features: Sequence[str] | None) -> list[FeatureSpec]:
    if features is None:
        return list(specs)
    by_name = {s.name: s for s in specs}
    missing = [f for f in features if f not in by_name]
    if missing:
        raise SchemaError(f"No such features {missing}", hint=f"features are {sorted(by_name)}")
    return [by_name[f] for f in features]


def iter_numpy(output_dir: str, features: Sequence[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Yields one ``{name: np.ndarray}`` per example, in shard order, without importing TensorFlow.

    Arrays have the recorded dtype (little-endian) and shape; ``bytes`` features are object arrays.

    Raises:
      IncompleteOutputError: no metadata.json. RecordError: a corrupt record (file, index, offset), or a
      shard whose record count differs from the metadata.
    """
    meta = metadata.load(output_dir)
    specs = _select(meta["features"], features)
    for shard, path in zip(meta["shards"], metadata.shard_paths(output_dir, meta)):
        count = 0
        for index, offset, record in iter_records(path, meta["compression"]):
            try:
                yield decode_example(record, specs)
            except RecordError as e:
                raise RecordError(f"Cannot decode example: {e}", file=path, record=index, offset=offset) from None
            count += 1
        if count != shard["records"]:
            raise RecordError(f"Shard holds {count} records, metadata says {shard['records']}", file=path)


def _tf_kind(tf, spec: FeatureSpec):
    if spec.dtype == VLEN_BYTES or spec.dtype is None or np.dtype(spec.dtype).kind in "SUV":
        return tf.string
    return tf.float32 if np.dtype(spec.dtype).kind == "f" else tf.int64


def feature_spec(output_dir: str, features: Sequence[str] | None = None) -> dict:
    """The ``tf.io.parse_example`` spec of the output's Example features (encoded form).

    ``tensor`` features parse as ``FixedLenFeature([], tf.string)``; fixed ``list`` features as
    ``FixedLenFeature(shape, tf.int64 | tf.float32 | tf.string)``; variable-length ones as
    ``VarLenFeature``, with their ``<name>/shape`` (and ``<name>/dtype``) companions.
    Use :func:`to_tf_dataset` to get the original dtypes and shapes.
    """
    import tensorflow as tf
    meta = metadata.load(output_dir)
    return _parse_spec(tf, _select(meta["features"], features))


def _parse_spec(tf, specs):
    out = {}
    for spec in specs:
        for name, kind, shape in metadata.example_features(spec):
            dtype = {"bytes": tf.string, "int64": tf.int64, "float": tf.float32}[kind]
            out[name] = tf.io.FixedLenFeature(shape, dtype) if shape is not None else tf.io.VarLenFeature(dtype)
    return out


_TF_RAW = {"b": "bool", "f2": "float16", "f4": "float32", "f8": "float64", "c8": "complex64",
           "c16": "complex128", "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64", "u1": "uint8",
           "u2": "uint16", "u4": "int32", "u8": "int64"}


def _tensor_to_tf(tf, spec: FeatureSpec, raw, shape):
    dt = np.dtype(spec.dtype)
    if dt.kind in "SV":
        n = dt.itemsize
        count = tf.reduce_prod(shape)
        parts = tf.strings.substr(raw, tf.range(count) * n, tf.fill([count], n))
        if dt.kind == "S":
            parts = tf.strings.regex_replace(parts, "\x00+$", "")
        return tf.reshape(parts, shape)
    if dt.kind == "U":
        codes = tf.reshape(tf.io.decode_raw(raw, tf.int32, little_endian=True), [-1, dt.itemsize // 4])
        text = tf.strings.unicode_encode(tf.RaggedTensor.from_tensor(codes, padding=0), "UTF-8")
        return tf.reshape(text, shape)
    key = "b" if dt.kind == "b" else ("i8" if dt.kind in "Mm" else f"{dt.kind}{dt.itemsize}")
    values = tf.io.decode_raw(raw, getattr(tf, _TF_RAW[key]), little_endian=True)
    if dt.kind == "u" and dt.itemsize >= 4:
        values = tf.bitcast(values, tf.uint32 if dt.itemsize == 4 else tf.uint64)
    return tf.reshape(values, shape)


def _list_to_tf(tf, spec: FeatureSpec, values, shape):
    if isinstance(values, tf.SparseTensor):
        values = tf.sparse.to_dense(values)
    values = tf.reshape(values, shape)
    if spec.dtype == VLEN_BYTES:
        return values
    dt = np.dtype(spec.dtype)
    if dt.kind in "SUVMm":
        return values
    if dt.kind == "u" and dt.itemsize == 8:
        return tf.bitcast(values, tf.uint64)
    return tf.cast(values, getattr(tf, "bool" if dt.kind == "b" else dt.name))


def decode_tf(tf, parsed: dict, specs: Sequence[FeatureSpec]) -> dict:
    """Parsed (encoded) features of one example -> tensors with the original dtypes and shapes.

    Features whose dtype varies (``dtype`` None) stay raw: ``name`` bytes, ``name/shape``, ``name/dtype``.
    """
    out = {}
    for spec in specs:
        if spec.dtype is None:
            out[spec.name] = parsed[spec.name]
            out[f"{spec.name}/dtype"] = parsed[f"{spec.name}/dtype"]
            out[f"{spec.name}/shape"] = tf.sparse.to_dense(parsed[f"{spec.name}/shape"])
            continue
        if spec.is_fixed:
            shape = tf.constant(list(spec.shape), tf.int32)
        else:
            shape = tf.cast(tf.sparse.to_dense(parsed[f"{spec.name}/shape"]), tf.int32)
        if spec.encoding == "tensor":
            out[spec.name] = _tensor_to_tf(tf, spec, parsed[spec.name], shape)
        else:
            out[spec.name] = _list_to_tf(tf, spec, parsed[spec.name], shape)
    return out


def to_tf_dataset(output_dir: str, batch_size: int | None = None, features: Sequence[str] | None = None):
    """A ``tf.data.Dataset`` of ``{name: tensor}`` with the original dtypes and shapes, in shard order.

    ``S``/``U``/``V`` features become ``tf.string`` (str as UTF-8), datetimes ``tf.int64``.
    ``batch_size`` batches examples (shapes must then agree within a batch).
    """
    import tensorflow as tf
    meta = metadata.load(output_dir)
    specs = _select(meta["features"], features)
    parse_spec = _parse_spec(tf, specs)
    ds = tf.data.TFRecordDataset(metadata.shard_paths(output_dir, meta),
                                 compression_type=_TF_COMPRESSION[meta["compression"]])
    ds = ds.map(lambda r: decode_tf(tf, tf.io.parse_single_example(r, parse_spec), specs),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch_size) if batch_size else ds
