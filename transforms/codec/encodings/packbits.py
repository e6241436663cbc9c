"""The ``packbits`` encoding: boolean masks at 1 bit per element. A row is stored as
``np.packbits(row, axis=-1)`` (big bit order, the last axis padded with zero bits to whole bytes) in one
``bytes_list`` value; the original shape is in the metadata. For bool features, and for uint8 features of 0/1
values when asked (any other value is refused, so the round trip stays exact)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tfrecord_etl.transforms.codec.arrow import pa
from tfrecord_etl.transforms.codec.encodings.base import Encoding, bytes_lists, one_bytes_value, one_value_per_row
from tfrecord_etl.transforms.codec.spec import FeatureSpec
from tfrecord_etl.transforms.errors import RecordError, SchemaError

DTYPES = ("|b1", "|u1")


def packed_shape(shape: tuple) -> tuple:
    """The shape of ``np.packbits(row, axis=-1)`` for a row of ``shape`` (a 0-d row packs as one element)."""
    shape = tuple(shape) or (1,)
    return (*shape[:-1], (shape[-1] + 7) // 8)


class PackbitsEncoding(Encoding):
    """Row -> ``Feature{bytes_list: [np.packbits(row, axis=-1).tobytes()]}``."""

    name = "packbits"

    def check(self, spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
        super().check(spec, allow_lossy)
        if spec.dtype not in DTYPES:
            raise SchemaError(
                f"Feature '{spec.name}' is {spec.dtype}: the packbits encoding stores booleans "
                "(bool, or uint8 holding only 0 and 1)",
                hint="use the tensor encoding for it",
            )
        if spec.shape is None:
            raise SchemaError(
                f"Feature '{spec.name}': the packbits encoding needs a known rank",
                hint="use the tensor encoding for it",
            )

    def fixed_layout(self, spec: FeatureSpec) -> bool:
        return True

    def _pack(self, spec: FeatureSpec, arr: np.ndarray, first_row: int = 0) -> np.ndarray:
        """``(rows, *shape)`` -> ``(rows, packed bytes)`` uint8."""
        rows = arr.shape[0]
        if arr.dtype.kind == "u":
            bad = np.flatnonzero(arr.reshape(rows, -1).max(axis=1, initial=0) > 1)
            if bad.size:
                raise RecordError(
                    f"Feature '{spec.name}' holds a value other than 0 and 1, which packbits cannot store",
                    feature=spec.name,
                    batch_row=first_row + int(bad[0]),
                    hint="use the tensor encoding for it, or store a bool mask",
                )
        bits = arr.reshape(rows, *(arr.shape[1:] or (1,)))
        return np.packbits(bits, axis=-1).reshape(rows, -1)

    def fixed_data(self, spec: FeatureSpec, arr: np.ndarray) -> np.ndarray:
        return self._pack(spec, arr)

    def fixed_column(self, spec: FeatureSpec, arr: np.ndarray) -> pa.Array:
        return one_value_per_row(self._pack(spec, arr))

    def rows_column(self, spec: FeatureSpec, rows: Sequence[np.ndarray]) -> pa.Array:
        return bytes_lists([[self._pack(spec, r[None], i).tobytes()] for i, r in enumerate(rows)])

    def _unpack(self, packed: np.ndarray, shape: tuple, dtype: str) -> np.ndarray:
        """``(..., *packed_shape(shape))`` uint8 -> ``(..., *shape)`` of ``dtype``."""
        last = shape[-1] if shape else 1
        bits = np.unpackbits(packed, axis=-1, count=last)
        lead = packed.shape[: packed.ndim - len(packed_shape(shape))]
        return bits.reshape(tuple(lead) + tuple(shape)).astype(dtype, copy=False)

    def decode(self, spec: FeatureSpec, values, shape: tuple, dtype: str) -> np.ndarray:
        ps = packed_shape(shape)
        raw = one_bytes_value(spec, values, math.prod(ps), shape, dtype)
        return self._unpack(np.frombuffer(raw, np.uint8).reshape(ps), shape, dtype)

    def decode_flat(self, spec: FeatureSpec, values: pa.Array, n: int) -> np.ndarray:
        import pyarrow.compute as pc

        ps = packed_shape(spec.shape)
        nbytes = math.prod(ps)
        if n and not (pc.binary_length(values).to_numpy() == nbytes).all():
            raise RecordError(
                f"Feature '{spec.name}' holds a value of the wrong size, expected {nbytes} bytes "
                f"for packed {spec.dtype} {spec.shape}",
                feature=spec.name,
            )
        packed = np.frombuffer(b"".join(values.to_pylist()), np.uint8).reshape(n, *ps)
        return self._unpack(packed, spec.shape, spec.dtype)

    def to_tf(self, tf, spec: FeatureSpec, parsed, shape):
        packed = tf.io.decode_raw(parsed, tf.uint8)
        if not spec.shape:  # a 0-d row: one byte, its top bit
            bits = tf.bitwise.right_shift(tf.reshape(packed, []), 7)
        else:
            last = shape[-1]
            nb = (last + 7) // 8
            packed = tf.reshape(packed, tf.concat([shape[:-1], [nb]], 0))
            masks = tf.constant([128, 64, 32, 16, 8, 4, 2, 1], tf.uint8)
            bits = tf.cast(tf.bitwise.bitwise_and(tf.expand_dims(packed, -1), masks) > 0, tf.uint8)
            bits = tf.reshape(bits, tf.concat([shape[:-1], [nb * 8]], 0))[..., :last]
            bits = tf.reshape(bits, shape)
        return tf.cast(bits, tf.bool) if spec.dtype == "|b1" else tf.cast(bits, tf.uint8)

    def to_tf_batch(self, tf, spec: FeatureSpec, parsed):
        if spec.shape:
            return super().to_tf_batch(tf, spec, parsed)
        packed = tf.io.decode_raw(parsed, tf.uint8)  # [batch, 1]: each 0-d row is one byte, its top bit
        bits = tf.bitwise.right_shift(tf.reshape(packed, tf.shape(parsed)), 7)
        return tf.cast(bits, tf.bool) if spec.dtype == "|b1" else tf.cast(bits, tf.uint8)
