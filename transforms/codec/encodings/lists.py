"""The ``list`` encoding: TensorFlow's native lists, so ``tf.io.FixedLenFeature(shape, dtype)`` reads it directly.

bool and integers up to 64 bits -> ``int64_list``; float16/float32 -> ``float_list``; fixed-width bytes/str/void
and variable-length bytes -> ``bytes_list`` (one value per element, str as UTF-8). Lossy casts (float64 ->
float32, uint64 -> int64) are refused unless allowed by feature name; complex numbers have no list form.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tfrecord_etl.transforms.codec.arrow import pa
from tfrecord_etl.transforms.codec.assemble import varint_block, varint_length
from tfrecord_etl.transforms.codec.encodings.base import (
    Encoding,
    as_bytes,
    bytes_lists,
    check_unicode,
    le_bytes,
    list_of,
)
from tfrecord_etl.transforms.codec.spec import VLEN_BYTES, FeatureSpec, to_little_endian
from tfrecord_etl.transforms.errors import RecordError, SchemaError

_LOSSY_LIST_CASTS = {"<u8": "uint64 -> int64", "<f8": "float64 -> float32"}


class ListEncoding(Encoding):
    """Row -> ``Feature{int64_list | float_list | bytes_list}`` of its elements in C order."""

    name = "list"
    native = True
    tfds_encoding = "none"  # a plain tfds.features.Tensor: TFDS parses the list and casts it to the dtype

    def check(self, spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
        super().check(spec, allow_lossy)
        if spec.dtype is None or spec.dtype == VLEN_BYTES:
            return
        dt = np.dtype(spec.dtype)
        if dt.kind == "c":
            raise SchemaError(
                f"Feature '{spec.name}' is {dt}: complex numbers have no list form",
                hint="use the tensor encoding for it",
            )
        lossy = _LOSSY_LIST_CASTS.get(dt.str)
        if lossy and spec.name not in set(allow_lossy):
            raise SchemaError(
                f"Feature '{spec.name}': the list encoding would cast {lossy}, which is lossy",
                hint=f"use the tensor encoding, or allow it with --allow_lossy {spec.name} "
                f"(YAML: allow_lossy: [{spec.name}])",
            )

    def kind(self, dtype: str) -> str:
        if dtype == VLEN_BYTES:
            return "bytes"
        k = np.dtype(dtype).kind
        return "bytes" if k in "SUV" else ("float" if k == "f" else "int64")

    def dense_shape(self, spec: FeatureSpec) -> tuple | None:
        return spec.shape if spec.size is not None else None

    # -- encode ----------------------------------------------------------------------------------------
    def fixed_layout(self, spec: FeatureSpec) -> bool:
        return spec.dtype != VLEN_BYTES and np.dtype(spec.dtype).kind in "fbiuMm"

    def fixed_data(self, spec: FeatureSpec, arr: np.ndarray) -> np.ndarray:
        if np.dtype(spec.dtype).kind in "biuMm":  # only when every varint has one length (see varint_values)
            values = self.varint_values(spec, arr)
            width = varint_length(int(values.max())) if values.size else 1
            return varint_block(values, width)
        return le_bytes(arr.astype("<f4", copy=False))

    def varint_values(self, spec: FeatureSpec, arr: np.ndarray) -> np.ndarray | None:
        """``(rows, n)`` uint64: the 64-bit two's complement of each int64 value of an ``int64_list`` (bool and
        integers sign-extended as protobuf's int64 does, uint64 bit for bit, datetimes as their int64 counts);
        None for float and bytes lists."""
        dt = np.dtype(spec.dtype)
        if dt.kind not in "biuMm":
            return None
        values = arr.reshape(arr.shape[0], -1)
        if dt.kind in "Mm":
            return to_little_endian(values).view("<i8").astype(np.uint64)
        if dt.kind == "u" and dt.itemsize == 8:
            return values.astype(np.uint64)
        return values.astype(np.int64).view(np.uint64)

    def fixed_column(self, spec: FeatureSpec, arr: np.ndarray) -> pa.Array:
        if spec.dtype == VLEN_BYTES:
            return self.rows_column(spec, list(arr))
        return _list_column(spec, arr.reshape(arr.shape[0], -1), spec.size)

    def rows_column(self, spec: FeatureSpec, rows: Sequence) -> pa.Array:
        if spec.dtype == VLEN_BYTES:
            return bytes_lists(
                [[as_bytes(v, spec.name, i) for v in np.asarray(r, dtype=object).ravel()] for i, r in enumerate(rows)]
            )
        flat = [r.reshape(-1) for r in rows]
        lengths = np.array([f.size for f in flat], dtype=np.int64)
        values = np.concatenate(flat) if flat else np.zeros(0, dtype=spec.dtype)
        return _list_column(spec, values, None, lengths)

    # -- decode ----------------------------------------------------------------------------------------
    def decode(self, spec: FeatureSpec, values, shape: tuple, dtype: str) -> np.ndarray:
        count = math.prod(shape)
        if len(values) != count:
            raise RecordError(
                f"Feature '{spec.name}' holds {len(values)} values, expected {count} for shape {shape}",
                feature=spec.name,
            )
        if dtype == VLEN_BYTES:
            out = np.empty(count, dtype=object)
            out[:] = values
            return out.reshape(shape)
        dt = np.dtype(dtype)
        if dt.kind == "S":
            return np.array(values, dtype=dt).reshape(shape)
        if dt.kind == "V":
            return np.array(values, dtype=f"S{dt.itemsize}").view(dt).reshape(shape)
        if dt.kind == "U":
            try:
                return np.array([v.decode("utf-8") for v in values], dtype=dt).reshape(shape)
            except UnicodeDecodeError as e:
                raise RecordError(
                    f"Feature '{spec.name}' holds a value that is not UTF-8: {e}", feature=spec.name
                ) from None
        if dt.kind in "Mm":
            return values.view(dt).reshape(shape)
        out = values.astype(dt)
        if dt.kind != "f" and not np.array_equal(out.astype(values.dtype), values):
            raise RecordError(f"Feature '{spec.name}' holds values out of range for {dtype}", feature=spec.name)
        return out.reshape(shape)

    def decode_native(self, spec: FeatureSpec, kind: str | None, values) -> np.ndarray:
        """A variable-length list of another writer's Example (no ``<name>/shape`` companion; ``kind`` None
        when the feature is absent or has no kind set) -> a 1-D array: ``'<i8'``, ``'<f4'`` or object bytes."""
        want = self.kind(spec.dtype)
        if kind is not None and kind != want:
            raise RecordError(f"Feature '{spec.name}' holds a {kind} list, expected {want}", feature=spec.name)
        if want == "bytes":
            out = np.empty(len(values), dtype=object)
            out[:] = values
            return out
        return np.asarray(values, dtype="<f4" if want == "float" else "<i8")

    def batch_decodable(self, spec: FeatureSpec) -> bool:
        return spec.is_fixed and (spec.dtype == VLEN_BYTES or np.dtype(spec.dtype).kind not in "SUV")

    def batch_values(self, spec: FeatureSpec) -> int:
        return spec.size

    def decode_flat(self, spec: FeatureSpec, values: pa.Array, n: int) -> np.ndarray:
        if spec.dtype == VLEN_BYTES:
            arr = np.empty(n * spec.size, dtype=object)
            arr[:] = values.to_pylist()
            return arr.reshape(n, *spec.shape)
        raw, dt = values.to_numpy(zero_copy_only=False), np.dtype(spec.dtype)
        if dt.kind in "Mm":
            arr = raw.view(dt)
        else:
            arr = raw.astype(dt)
            if dt.kind != "f" and not np.array_equal(arr.astype(raw.dtype), raw):
                raise RecordError(
                    f"Feature '{spec.name}' holds values out of range for {spec.dtype}", feature=spec.name
                )
        return arr.reshape(n, *spec.shape)

    def to_tf(self, tf, spec: FeatureSpec, parsed, shape):
        values = tf.sparse.to_dense(parsed) if isinstance(parsed, tf.SparseTensor) else parsed
        values = tf.reshape(values, shape)
        if spec.dtype == VLEN_BYTES:
            return values
        dt = np.dtype(spec.dtype)
        if dt.kind in "SUVMm":
            return values
        if dt.kind == "u" and dt.itemsize == 8:
            return tf.bitcast(values, tf.uint64)
        return tf.cast(values, getattr(tf, "bool" if dt.kind == "b" else dt.name))

    def stored_dtype(self, spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> str | None:
        if spec.name in set(allow_lossy) and spec.dtype in _LOSSY_LIST_CASTS:
            return {"<f8": "<f4", "<u8": "<i8"}[spec.dtype]  # float_list holds float32, int64_list int64
        return None

    def stored(self, spec: FeatureSpec, arr: np.ndarray, allow_lossy: Iterable[str] = ()) -> np.ndarray:
        if spec.name in allow_lossy and arr.dtype.kind == "f" and arr.dtype.itemsize == 8:
            return arr.astype("<f4").astype("<f8")
        return arr


def _list_column(spec: FeatureSpec, values: np.ndarray, size: int | None, lengths=None) -> pa.Array:
    """A list array of the native list form of ``values`` (rows x size, or flat with ``lengths``)."""
    check_unicode(spec.name, values, lengths)
    if lengths is None:
        lengths = np.full(values.shape[0], size, dtype=np.int64)
    flat = values.reshape(-1)
    dt = np.dtype(spec.dtype)
    if dt.kind in "biu":
        arrow = pa.array(flat.astype("<i8", copy=False))
    elif dt.kind in "Mm":
        arrow = pa.array(to_little_endian(flat).view("<i8"))
    elif dt.kind == "f":
        arrow = pa.array(flat.astype("<f4", copy=False))
    elif dt.kind == "S":
        arrow = pa.array(flat.tolist(), pa.binary())
    elif dt.kind == "V":
        arrow = pa.array(flat.view(f"S{dt.itemsize}").tolist(), pa.binary())
    elif dt.kind == "U":
        arrow = pa.array([s.encode("utf-8") for s in flat.tolist()], pa.binary())
    else:  # pragma: no cover - check refuses the rest
        raise SchemaError(f"Feature '{spec.name}': no list form for {dt}")
    return list_of(arrow, lengths)
