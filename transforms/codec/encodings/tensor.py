"""The ``tensor`` encoding (the default): one ``bytes_list`` value holding the row's raw bytes, C order,
little-endian. Dtype and shape are recorded in the metadata, so it is exact for every supported dtype, and it is
the only encoding that carries a dtype varying between examples (``<name>/dtype`` companion)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tfrecord_etl.transforms.codec.arrow import pa
from tfrecord_etl.transforms.codec.encodings.base import (
    Encoding,
    bytes_lists,
    check_vlen,
    le_bytes,
    one_bytes_value,
    one_value_per_row,
)
from tfrecord_etl.transforms.codec.spec import FeatureSpec, to_little_endian
from tfrecord_etl.transforms.errors import RecordError

# tf.io.decode_raw's out_type per NumPy kind+itemsize (uint32/uint64 are decoded as int32/int64 and bitcast)
_TF_RAW = {
    "b": "bool",
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
    "c8": "complex64",
    "c16": "complex128",
    "i1": "int8",
    "i2": "int16",
    "i4": "int32",
    "i8": "int64",
    "u1": "uint8",
    "u2": "uint16",
    "u4": "int32",
    "u8": "int64",
}


class TensorEncoding(Encoding):
    """Row -> ``Feature{bytes_list: [row.astype(little-endian).tobytes()]}``; TFDS's ``Encoding.BYTES``."""

    name = "tensor"
    tfds_encoding = "bytes"  # tfds.features.Encoding.BYTES: raw little-endian bytes, tf.io.decode_raw
    varying_dtype = True

    def check(self, spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
        super().check(spec, allow_lossy)
        check_vlen(spec, self)

    def fixed_layout(self, spec: FeatureSpec) -> bool:
        return True

    def fixed_data(self, spec: FeatureSpec, arr: np.ndarray) -> np.ndarray:
        return le_bytes(arr)

    def fixed_column(self, spec: FeatureSpec, arr: np.ndarray) -> pa.Array:
        return one_value_per_row(le_bytes(arr))

    def rows_column(self, spec: FeatureSpec, rows: Sequence[np.ndarray]) -> pa.Array:
        return bytes_lists([[to_little_endian(r).tobytes()] for r in rows])

    def payload(self, spec: FeatureSpec, raw: bytes, count: int, dt: np.dtype, shape: tuple) -> bytes:
        """The row's little-endian bytes from the stored value (here: the value itself)."""
        return raw

    def payload_bytes(self, count: int, dt: np.dtype) -> int | None:
        """The stored value's length in bytes for ``count`` elements of ``dt`` (None: not known up front)."""
        return count * dt.itemsize

    def decode(self, spec: FeatureSpec, values, shape: tuple, dtype: str) -> np.ndarray:
        dt = np.dtype(dtype)
        count = math.prod(shape)
        raw = one_bytes_value(spec, values, self.payload_bytes(count, dt), shape, dtype)
        return np.frombuffer(self.payload(spec, raw, count, dt, shape), dtype=dt).reshape(shape)

    def decode_flat(self, spec: FeatureSpec, values: pa.Array, n: int) -> np.ndarray:
        import pyarrow.compute as pc

        dt = np.dtype(spec.dtype)
        nbytes = self.payload_bytes(spec.size, dt)
        if n and nbytes is not None and not (pc.binary_length(values).to_numpy() == nbytes).all():
            raise RecordError(
                f"Feature '{spec.name}' holds a value of the wrong size, expected {nbytes} bytes "
                f"for {spec.dtype} {spec.shape}",
                feature=spec.name,
            )
        raws = [self.payload(spec, v, spec.size, dt, spec.shape) for v in values.to_pylist()]
        return np.frombuffer(b"".join(raws), dtype=dt).reshape(n, *spec.shape)

    def tf_payload(self, tf, spec: FeatureSpec, raw):
        """The row's little-endian bytes inside tf.data, from the parsed string tensor."""
        return raw

    def to_tf(self, tf, spec: FeatureSpec, parsed, shape):
        raw = self.tf_payload(tf, spec, parsed)
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

    def to_tf_batch(self, tf, spec: FeatureSpec, parsed):
        dt = np.dtype(spec.dtype)
        if dt.kind not in "SV":
            return super().to_tf_batch(tf, spec, parsed)
        raw = self.tf_payload(tf, spec, parsed)  # [batch] strings: each row's elements, itemsize bytes each
        n, count = dt.itemsize, math.prod(spec.shape)
        parts = tf.strings.substr(tf.expand_dims(raw, -1), tf.range(count) * n, tf.fill([count], n))  # [batch, count]
        if dt.kind == "S":
            parts = tf.strings.regex_replace(parts, "\x00+$", "")
        # every row's value holds exactly count elements (substr would silently cut a longer one)
        check = tf.debugging.assert_equal(
            tf.strings.length(raw), count * n, message=f"Feature '{spec.name}' holds a value of the wrong size"
        )
        with tf.control_dependencies([check]):
            return tf.reshape(parts, tf.concat([tf.shape(raw)[:1], list(spec.shape)], 0))
