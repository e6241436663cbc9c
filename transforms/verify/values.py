"""What verify expects of a source row, and the exact comparison of one decoded value with it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec


def expected_value(spec: FeatureSpec, value, allow_lossy: Sequence[str] = ()) -> np.ndarray:
    """What :func:`codec.decode_example` returns for one source row ``value`` of ``spec``.

    Little-endian, C order; ``'bytes'`` features are object arrays of bytes (str as UTF-8); an allowed
    lossy list cast (float64 -> float32) is applied and cast back.
    """
    if spec.dtype == VLEN_BYTES:
        arr = np.asarray(value, dtype=object)
        out = np.empty(arr.size, dtype=object)
        out[:] = [codec.as_bytes(v) for v in arr.reshape(-1).tolist()]
        return out.reshape(arr.shape)
    arr = np.asarray(value)
    arr = codec.to_little_endian(arr).reshape(arr.shape)  # keeps 0-d rows 0-d
    return codec.encoding_of(spec).stored(spec, arr, allow_lossy)


def _row_bytes(arr: np.ndarray) -> np.ndarray:
    """``(elements, itemsize)`` uint8 view of an array's little-endian bytes."""
    arr = np.ascontiguousarray(arr)
    return np.frombuffer(arr.tobytes(), np.uint8).reshape(arr.size, arr.dtype.itemsize)


def compare_value(spec: FeatureSpec, expected: np.ndarray, got) -> str | None:
    """None when ``got`` (decoded from a record) equals ``expected`` (from the source) exactly, else what differs.

    Exact means same shape, dtype and bytes; the tolerances are NaN against NaN in floats (a list
    encoding's float32 round trip may change a NaN's payload bits) and bools compared as truth values.
    """
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"shape {got.shape} in the output, {expected.shape} in the source"
    if expected.dtype == object or got.dtype == object:
        for i, (a, b) in enumerate(zip(expected.reshape(-1).tolist(), got.reshape(-1).tolist())):
            if a != b:
                return f"differs at index {_index(i, expected.shape)}: {b!r} in the output, {a!r} in the source"
        return None
    if got.dtype.str != expected.dtype.str:
        return f"dtype {got.dtype.str} in the output, {expected.dtype.str} in the source"
    if got.tobytes() == expected.tobytes():
        return None
    diff = np.any(_row_bytes(got) != _row_bytes(expected), axis=1)
    if got.dtype.kind == "b":  # a bool's byte may be any non-zero value; list encodings write 1
        diff = (got != expected).reshape(-1)
    if got.dtype.kind in "fc":
        diff &= ~(np.isnan(got) & np.isnan(expected)).reshape(-1)
    bad = np.flatnonzero(diff)
    if not bad.size:
        return None
    i = int(bad[0])
    return (
        f"differs at index {_index(i, expected.shape)}: {got.reshape(-1)[i]} in the output, "
        f"{expected.reshape(-1)[i]} in the source ({bad.size} of {expected.size} elements differ)"
    )


def _index(flat: int, shape: tuple) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def digest(values: Sequence[np.ndarray]) -> bytes:
    """A 16-byte digest of a row's arrays: dtype, shape and bytes (length-prefixed elements for objects)."""
    h = hashlib.blake2b(digest_size=16)
    for v in values:
        v = np.asarray(v)
        h.update(f"{v.dtype.str}{v.shape}|".encode())
        if v.dtype == object:
            for x in v.reshape(-1).tolist():
                h.update(len(x).to_bytes(8, "little"))
                h.update(x)
        else:
            h.update(np.ascontiguousarray(v).tobytes())
    return h.digest()


def row_of(column, i: int):
    """Row ``i`` of a column; ``[i, ...]`` keeps a 0-d row an array with its bytes (a scalar would not:
    NumPy normalizes a bool's byte)."""
    return column[i, ...] if isinstance(column, np.ndarray) else column[i]
