"""Encoding a batch of rows into serialized Examples: the fixed-layout block and the tfx_bsl path."""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from transforms.errors import RecordError, SchemaError
from transforms.codec.spec import (check_spec, FeatureSpec, MAX_RECORD_BYTES, normalize_dtype, to_little_endian,
                                   VLEN_BYTES)
from transforms.codec.wire import _encode_varint, _len_field


@dataclasses.dataclass
class FixedLayout:
    """The fixed-layout part of a batch, not yet assembled: every row is ``head`` followed, for each
    entry ``(prefix, data)``, by the constant ``prefix`` bytes and the row's ``data`` bytes.

    Attributes:
      head: the Example's ``features`` field tag and length (the same for every row).
      entries: ``(prefix bytes, (rows, n) uint8 data)`` per fixed-layout feature, sorted by name.
      num_rows: rows in the batch.
    """

    head: bytes
    entries: list[tuple[bytes, np.ndarray]]
    num_rows: int

    @property
    def width(self) -> int:
        """Bytes of one assembled row (one serialized Example)."""
        return (len(self.head) + sum(len(p) + d.shape[1] for p, d in self.entries)) if self.entries else 0

    def fill(self, out: np.ndarray) -> None:
        """Writes the assembled rows into ``out``, a ``(rows, width)`` uint8 array or view (its rows may be
        strided, e.g. the data columns of a framed buffer, so no intermediate block is made)."""
        if not self.entries:
            return
        out[:, :len(self.head)] = np.frombuffer(self.head, np.uint8)
        pos = len(self.head)
        for prefix, data in self.entries:
            out[:, pos:pos + len(prefix)] = np.frombuffer(prefix, np.uint8)
            pos += len(prefix)
            out[:, pos:pos + data.shape[1]] = data
            pos += data.shape[1]


@dataclasses.dataclass
class EncodedBatch:
    """A batch of serialized Examples, kept in a form that frames without a per-record Python step.

    Attributes:
      layout: the fixed-layout features (fixed-shape ``tensor`` features and fixed-shape numeric lists),
        entries sorted by name, so every row has the same layout and only the data bytes differ. It is
        assembled only when asked: :attr:`block` makes a ``(rows, width)`` array, and
        ``tfrecord.frame_encoded`` fills the data columns of the framed buffer directly (one copy).
      tails: None, or per row the bytes of one more Example per variable-layout feature (int64 lists,
        byte lists, varying shapes), appended to the block row: concatenated Examples are one Example
        (protobuf merge), and each tail holds exactly one feature, so the bytes are deterministic.
    """

    layout: FixedLayout
    tails: list[bytes] | None = None

    @property
    def num_rows(self) -> int:
        return self.layout.num_rows

    @property
    def width(self) -> int:
        """Bytes of the fixed-layout part of every record (0 when there is none)."""
        return self.layout.width

    @property
    def block(self) -> np.ndarray:
        """``(rows, width)`` uint8; row i is one complete Example of every fixed-layout feature."""
        out = np.empty((self.num_rows, self.width), np.uint8)
        self.layout.fill(out)
        return out

    def records(self) -> list[bytes]:
        """The serialized Examples, one bytes object per row."""
        rows = [r.tobytes() for r in self.block] if self.width else [b""] * self.num_rows
        return rows if self.tails is None else [a + b for a, b in zip(rows, self.tails)]


def encode_batch(columns: Mapping[str, object], specs: Sequence[FeatureSpec], num_rows: int,
                 allow_lossy: Iterable[str] = ()) -> list[bytes]:
    """Encodes ``num_rows`` rows as serialized Examples; see :func:`encode_columns`."""
    return encode_columns(columns, specs, num_rows, allow_lossy).records()


def encode_columns(columns: Mapping[str, object], specs: Sequence[FeatureSpec], num_rows: int,
                   allow_lossy: Iterable[str] = ()) -> EncodedBatch:
    """Encodes ``num_rows`` rows as serialized Examples, vectorized over the batch.

    Fixed-layout features become a :class:`FixedLayout` (the protobuf headers are the same for every
    row, so only the data columns differ; it is assembled with NumPy straight into the framed buffer
    by ``tfrecord.frame_encoded``, or into a block on demand); the others go through tfx_bsl's C++
    ``RecordBatchToExamplesEncoder``, one feature per call so that no map order can vary (protobuf
    serializes maps in an unspecified order, which would make reruns differ).

    Args:
      columns: feature name -> ``np.ndarray`` of shape ``(num_rows, *spec.shape)`` for fixed specs, or
        a sequence of ``num_rows`` per-row arrays (or bytes, for ``'bytes'`` specs) otherwise.
      specs: the features, in any order; every one must be in ``columns``.
      num_rows: rows in the batch.
      allow_lossy: feature names whose lossy list cast is allowed.

    Raises:
      SchemaError: a column's dtype or shape does not match its spec, or a refused lossy cast.
      RecordError: one record is over protobuf's 2 GB limit; a str value with no UTF-8 form (a lone
        surrogate, or a ``'U'`` code point above U+10FFFF), naming the feature and ``batch_row``.
    """
    from tfx_bsl.coders import example_coder  # C++; no TensorFlow import

    fixed, tails = [], None
    for spec in sorted(specs, key=lambda s: s.name):
        if spec.name not in columns:
            raise SchemaError(f"Missing column for feature '{spec.name}'")
        check_spec(spec, allow_lossy)
        entry = _fixed_entry(spec, columns[spec.name], num_rows)
        if entry is not None:
            fixed.append(entry)
            continue
        for name, arr in _encode_column(spec, columns[spec.name], num_rows):
            part = example_coder.RecordBatchToExamplesEncoder().encode(pa.RecordBatch.from_arrays([arr], [name]))
            tails = part if tails is None else [a + b for a, b in zip(tails, part)]
    layout = _fixed_layout(fixed, num_rows)
    width = layout.width
    if width > MAX_RECORD_BYTES or any(len(t) + width > MAX_RECORD_BYTES for t in tails or ()):
        raise RecordError("An Example is over protobuf's 2 GB limit", hint="split the array into smaller rows")
    return EncodedBatch(layout, tails)


def _fixed_entry(spec: FeatureSpec, column, num_rows: int):
    """``(entry prefix bytes, (rows, n) uint8 data)`` of a fixed-layout feature, else None."""
    if not spec.is_fixed or spec.dtype == VLEN_BYTES:
        return None
    dt = np.dtype(spec.dtype)
    if spec.encoding == "list" and dt.kind not in "fbiuMm":
        return None
    arr = np.asarray(column)
    want = (num_rows, *spec.shape)
    if arr.shape != want:
        raise SchemaError(f"Feature '{spec.name}': rows of shape {arr.shape[1:]} (batch {arr.shape}), expected {want}")
    if normalize_dtype(arr.dtype, spec.name) != spec.dtype:
        raise SchemaError(f"Feature '{spec.name}': dtype {arr.dtype}, expected {spec.dtype}")
    if dt.kind == "U":
        check_unicode(spec.name, arr)
    if spec.encoding == "list" and dt.kind in "biuMm":
        data = _fixed_width_varints(arr.reshape(num_rows, -1), dt)
    else:
        if spec.encoding == "list":
            arr = arr.astype("<f4", copy=False)
        data = to_little_endian(arr).reshape(num_rows, -1).view(np.uint8).reshape(num_rows, -1) if arr.size \
            else np.zeros((num_rows, 0), np.uint8)
    n = data.shape[1]
    if spec.encoding == "tensor":  # Feature{bytes_list: BytesList{value: [data]}}
        inner = _encode_varint(1 << 3 | 2) + _encode_varint(n)
        feature_head = _encode_varint(1 << 3 | 2) + _encode_varint(len(inner) + n) + inner
    else:  # Feature{float_list | int64_list: packed values}; an empty list is an empty message
        tag = 2 if dt.kind == "f" else 3
        inner = _encode_varint(1 << 3 | 2) + _encode_varint(n) if n else b""
        feature_head = _encode_varint(tag << 3 | 2) + _encode_varint(len(inner) + n) + inner
    name = spec.name.encode("utf-8")
    entry_head = _len_field(1, name) + _encode_varint(2 << 3 | 2) + _encode_varint(len(feature_head) + n)
    entry_len = len(entry_head) + len(feature_head) + n
    prefix = _encode_varint(1 << 3 | 2) + _encode_varint(entry_len) + entry_head + feature_head
    return prefix, data


def _fixed_width_varints(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Packed int64 varints of ``(rows, n)`` values, every value padded to the batch's widest varint.

    Protobuf parsers accept such non-minimal varints (continuation bytes carrying zero bits; see the
    protobuf encoding guide), which keeps every row the same length, so int64 lists join the
    fixed-layout block. Returns ``(rows, n * width)`` uint8.
    """
    if dt.kind in "Mm":
        v = to_little_endian(values).view("<i8").astype(np.uint64)
    else:
        v = values.astype(np.int64).view(np.uint64) if dt.kind != "u" or dt.itemsize < 8 else \
            values.astype(np.uint64)
    width = max(1, (int(v.max()).bit_length() + 6) // 7) if v.size else 1
    out = np.empty(v.shape + (width,), np.uint8)
    for j in range(width):
        out[..., j] = ((v >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8) | (0x80 if j < width - 1 else 0)
    return out.reshape(values.shape[0], -1)


def _fixed_layout(entries, num_rows: int) -> FixedLayout:
    """One Example per row from fixed-layout entries, not yet assembled."""
    features_len = sum(len(p) + d.shape[1] for p, d in entries)
    head = _encode_varint(1 << 3 | 2) + _encode_varint(features_len) if entries else b""
    return FixedLayout(head, list(entries), num_rows)


def _encode_column(spec: FeatureSpec, column, num_rows: int):
    """Yields (feature name, pyarrow list array) pairs for one spec."""
    if spec.is_fixed and spec.dtype != VLEN_BYTES:
        arr = np.asarray(column)
        want = (num_rows, *spec.shape)
        if arr.shape != want:
            raise SchemaError(f"Feature '{spec.name}': rows of shape {arr.shape[1:]} (batch {arr.shape}), "
                              f"expected {want}")
        if normalize_dtype(arr.dtype, spec.name) != spec.dtype:
            raise SchemaError(f"Feature '{spec.name}': dtype {arr.dtype}, expected {spec.dtype}")
        if spec.encoding == "tensor":
            yield spec.name, _fixed_tensor_column(arr, num_rows)
        else:
            yield spec.name, _list_column(spec, arr.reshape(num_rows, -1), spec.size)
        return
    rows = list(column)
    if len(rows) != num_rows:
        raise SchemaError(f"Feature '{spec.name}': {len(rows)} rows, expected {num_rows}")
    if spec.dtype == VLEN_BYTES:
        yield spec.name, _bytes_lists([[_as_bytes(v, spec.name, i) for v in np.asarray(r, dtype=object).ravel()]
                                       for i, r in enumerate(rows)])
        if not spec.is_fixed:
            yield f"{spec.name}/shape", _int_lists([np.shape(r) for r in rows])
        return
    arrs = [np.asarray(r) for r in rows]
    for i, r in enumerate(arrs):
        _check_row(spec, r)
        if r.dtype.kind == "U":
            try:
                check_unicode(spec.name, r.reshape(1, -1))
            except RecordError as e:
                raise RecordError(e.message, hint=e.hint, feature=spec.name, batch_row=i) from None
    if spec.encoding == "tensor":
        yield spec.name, _bytes_lists([[to_little_endian(r).tobytes()] for r in arrs])
    else:
        flat = [r.reshape(-1) for r in arrs]
        lengths = np.array([f.size for f in flat], dtype=np.int64)
        values = np.concatenate(flat) if flat else np.zeros(0, dtype=spec.dtype)
        yield spec.name, _list_column(spec, values, None, lengths)
    yield f"{spec.name}/shape", _int_lists([r.shape for r in arrs])
    if spec.dtype is None:
        yield f"{spec.name}/dtype", _bytes_lists([[normalize_dtype(r.dtype, spec.name).encode()] for r in arrs])


def _check_row(spec: FeatureSpec, row: np.ndarray) -> None:
    if spec.shape is not None and len(row.shape) != len(spec.shape) or spec.shape is not None and any(d is not None and d != n for d, n in zip(spec.shape, row.shape)):
        raise SchemaError(f"Feature '{spec.name}': row of shape {row.shape}, expected {spec.shape}")
    dt = normalize_dtype(row.dtype, spec.name)
    if spec.dtype is not None and dt != spec.dtype:
        raise SchemaError(f"Feature '{spec.name}': dtype {row.dtype}, expected {spec.dtype}")


def _as_bytes(v, name: str | None = None, row: int | None = None) -> bytes:
    """``v`` as bytes (str as UTF-8). Raises RecordError for a str with no UTF-8 form (a lone surrogate)."""
    if isinstance(v, str):
        try:
            return v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _not_unicode(name, row, ord(v[e.start])) from None
    return bytes(v)


def _not_unicode(name: str | None, row: int | None, code: int) -> RecordError:
    """The error of a str value with no UTF-8 form; ``row`` is the row's index in its batch (the caller
    adds the batch's file and row range)."""
    what = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "above U+10FFFF"
    return RecordError(f"Feature '{name}' holds code point U+{code:04X} ({what}), which is not valid Unicode and has "
                       "no UTF-8 form", feature=name, batch_row=row,
                       hint="clean the strings, or store them as bytes (an 'S' dtype)")


def check_unicode(name: str, values: np.ndarray, lengths: np.ndarray | None = None) -> None:
    """Raises RecordError (naming the feature and the batch row) when a ``'U'`` array holds a code point
    that is a lone surrogate or above U+10FFFF (NumPy stores any 32-bit value; UTF-8 cannot).

    ``values``: ``(rows, ...)`` array, or a flat array of all rows' elements with per-row ``lengths``.
    """
    if values.dtype.kind != "U" or values.size == 0:
        return
    codes = to_little_endian(values).view("<u4").reshape(-1)
    bad = np.flatnonzero((codes > 0x10FFFF) | ((codes >= 0xD800) & (codes <= 0xDFFF)))
    if not bad.size:
        return
    chars = values.dtype.itemsize // 4
    element = int(bad[0]) // chars
    if lengths is None:
        row = element // max(1, values.size // max(1, values.shape[0])) if values.ndim > 1 else element
    else:
        row = int(np.searchsorted(np.cumsum(lengths), element, side="right"))
    raise _not_unicode(name, row, int(codes[bad[0]]))


def _offsets(lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] < 2**31:
        return pa.array(offsets.astype(np.int32))
    return pa.array(offsets)


def _list_of(values: pa.Array, lengths: np.ndarray) -> pa.Array:
    offsets = _offsets(lengths)
    cls = pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray
    return cls.from_arrays(offsets, values)


def _fixed_tensor_column(arr: np.ndarray, num_rows: int) -> pa.Array:
    """One bytes value per row holding the row's little-endian bytes; zero-copy into Arrow."""
    le = to_little_endian(arr)
    row_bytes = le.itemsize * (math.prod(le.shape[1:]) if le.ndim > 1 else 1)
    data = pa.py_buffer(le.reshape(-1).view(np.uint8)) if le.size else pa.py_buffer(b"")
    offsets = np.arange(num_rows + 1, dtype=np.int64) * row_bytes
    if offsets[-1] < 2**31:
        binary = pa.Array.from_buffers(pa.binary(), num_rows, [None, pa.py_buffer(offsets.astype(np.int32)), data])
    else:
        binary = pa.Array.from_buffers(pa.large_binary(), num_rows, [None, pa.py_buffer(offsets), data])
    return _list_of(binary, np.ones(num_rows, dtype=np.int64))


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
    else:  # pragma: no cover - check_spec refuses the rest
        raise SchemaError(f"Feature '{spec.name}': no list form for {dt}")
    return _list_of(arrow, lengths)


def _bytes_lists(rows: list[list[bytes]]) -> pa.Array:
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return _list_of(pa.array([v for r in rows for v in r], pa.binary()), lengths)


def _int_lists(rows: list[Sequence[int]]) -> pa.Array:
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return _list_of(pa.array([int(v) for r in rows for v in r], pa.int64()), lengths)


