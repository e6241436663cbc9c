"""One feature's column as ``codec.encode`` lays it out: checked against its spec (shape, dtype, text), then either
a fixed-layout map entry (the entry's prefix bytes and a ``(rows, n)`` block of its values' bytes, or packed int64
varints of varying lengths) or the pyarrow list columns tfx_bsl's encoder takes (the feature and its ``/shape`` and
``/dtype`` companions) when rows vary.

Reference: the protobuf wire format of ``tf.train.Example`` (example.proto, feature.proto). NumPy and pyarrow only.
"""

from __future__ import annotations

import numpy as np

from tfrecord_etl.transforms.codec import assemble
from tfrecord_etl.transforms.codec.encodings import check_unicode
from tfrecord_etl.transforms.codec.encodings.base import bytes_lists, int_lists
from tfrecord_etl.transforms.codec.spec import VLEN_BYTES, FeatureSpec, normalize_dtype
from tfrecord_etl.transforms.codec.wire import encode_varint, length_delimited_field
from tfrecord_etl.transforms.errors import RecordError, SchemaError

_KIND_TAGS = {"bytes": 1, "float": 2, "int64": 3}  # Feature's oneof field numbers (feature.proto)


def checked_array(spec: FeatureSpec, column, num_rows: int) -> np.ndarray:
    """``column`` as a ``(num_rows, *spec.shape)`` array of ``spec.dtype``, else SchemaError."""
    arr = np.asarray(column)
    want = (num_rows, *spec.shape)
    if arr.shape != want:
        raise SchemaError(f"Feature '{spec.name}': rows of shape {arr.shape[1:]} (batch {arr.shape}), expected {want}")
    if normalize_dtype(arr.dtype, spec.name) != spec.dtype:
        raise SchemaError(f"Feature '{spec.name}': dtype {arr.dtype}, expected {spec.dtype}")
    return arr


def fixed_entry(spec: FeatureSpec, encoding, column, num_rows: int):
    """``(entry prefix bytes, (rows, n) uint8 data)`` of a fixed-layout feature, an :class:`.assemble.Packed` of
    int64 list values whose varints differ in length, else None."""
    if not spec.is_fixed or spec.dtype == VLEN_BYTES or not encoding.fixed_layout(spec):
        return None
    arr = checked_array(spec, column, num_rows)
    if arr.dtype.kind == "U":
        check_unicode(spec.name, arr)
    values = encoding.varint_values(spec, arr)
    if values is not None and values.size:
        low, high = assemble.varint_length(int(values.min())), assemble.varint_length(int(values.max()))
        if low != high:  # protobuf writes each varint at its own length: rows differ in length
            return assemble.Packed(values, assemble.varint_lengths(values))
        data = assemble.varint_block(values, high)
    else:
        data = encoding.fixed_data(spec, arr)
    n = data.shape[1]
    kind = encoding.kind(spec.dtype)
    if kind == "bytes":  # Feature{bytes_list: BytesList{value: [data]}}: one value per row
        inner = encode_varint(1 << 3 | 2) + encode_varint(n)
    else:  # Feature{float_list | int64_list: packed values}; an empty list is an empty message
        inner = encode_varint(1 << 3 | 2) + encode_varint(n) if n else b""
    feature_head = encode_varint(_KIND_TAGS[kind] << 3 | 2) + encode_varint(len(inner) + n) + inner
    name = spec.name.encode("utf-8")
    entry_head = length_delimited_field(1, name) + encode_varint(2 << 3 | 2) + encode_varint(len(feature_head) + n)
    entry_len = len(entry_head) + len(feature_head) + n
    prefix = encode_varint(1 << 3 | 2) + encode_varint(entry_len) + entry_head + feature_head
    return prefix, data


def arrow_columns(spec: FeatureSpec, encoding, column, num_rows: int):
    """Yields (feature name, pyarrow list array) pairs for one spec: its main feature (from its encoding) and
    the ``<name>/shape`` / ``<name>/dtype`` companions when the shape / dtype varies."""
    if spec.is_fixed and spec.dtype != VLEN_BYTES:
        yield spec.name, encoding.fixed_column(spec, checked_array(spec, column, num_rows))
        return
    rows = list(column)
    if len(rows) != num_rows:
        raise SchemaError(f"Feature '{spec.name}': {len(rows)} rows, expected {num_rows}")
    if spec.dtype == VLEN_BYTES:
        yield spec.name, encoding.rows_column(spec, rows)
        if encoding.shape_companion(spec):
            yield f"{spec.name}/shape", int_lists([np.shape(r) for r in rows])
        return
    arrs = [np.asarray(r) for r in rows]
    for i, r in enumerate(arrs):
        check_row(spec, r)
        if r.dtype.kind == "U":
            try:
                check_unicode(spec.name, r.reshape(1, -1))
            except RecordError as e:
                raise RecordError(e.message, hint=e.hint, feature=spec.name, batch_row=i) from None
    yield spec.name, encoding.rows_column(spec, arrs)
    if encoding.shape_companion(spec):
        yield f"{spec.name}/shape", int_lists([r.shape for r in arrs])
    if spec.dtype is None:
        yield f"{spec.name}/dtype", bytes_lists([[normalize_dtype(r.dtype, spec.name).encode()] for r in arrs])


def check_row(spec: FeatureSpec, row: np.ndarray) -> None:
    if (spec.shape is not None and len(row.shape) != len(spec.shape)) or (
        spec.shape is not None and any(d is not None and d != n for d, n in zip(spec.shape, row.shape))
    ):
        raise SchemaError(f"Feature '{spec.name}': row of shape {row.shape}, expected {spec.shape}")
    dt = normalize_dtype(row.dtype, spec.name)
    if spec.dtype is not None and dt != spec.dtype:
        raise SchemaError(f"Feature '{spec.name}': dtype {row.dtype}, expected {spec.dtype}")
