"""The example codec: columns of NumPy rows <-> serialized ``tf.train.Example`` records.

Pure functions over numpy, pyarrow and tfx_bsl's C++ encoder; no Beam and no TensorFlow import.

Encodings (chosen per feature; the default is ``tensor``):

* ``tensor``: one ``bytes_list`` value holding the row's raw bytes, C order, little-endian. Dtype and
  shape are recorded in the metadata, so it is exact for every supported dtype. When the shape (or the
  dtype) varies between examples, the features ``<name>/shape`` (int64_list) and ``<name>/dtype``
  (bytes_list, a NumPy dtype string) travel with each example.
* ``list``: TensorFlow's native lists, so ``tf.io.FixedLenFeature(shape, dtype)`` reads it directly:
  bool and integers up to 64 bits -> ``int64_list``; float16/float32 -> ``float_list``; fixed-width
  bytes/str/void and variable-length bytes -> ``bytes_list`` (one value per element, str as UTF-8).
  Lossy casts (float64 -> float32, uint64 -> int64) are refused unless allowed by feature name;
  complex numbers have no list form.

Wire format: ``Example{1: Features{1: repeated MapEntry{1: key, 2: Feature}}}``, where
``Feature`` is a oneof of ``BytesList`` (1), ``FloatList`` (2) and ``Int64List`` (3), each with one
repeated field 1 (tensorflow/core/example/feature.proto). Concatenated Examples are one valid Example
(protobuf merge), the basis of the byte-level field append.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from transforms.errors import RecordError, SchemaError

ENCODINGS = ("tensor", "list")
VLEN_BYTES = "bytes"  # dtype marker of variable-length byte strings (h5py vlen strings, file keys)
MAX_RECORD_BYTES = 2**31 - 1  # protobuf's hard limit on one message
MAX_FEATURES = 10_000  # default limit on the features of one Example, and on the distinct names inferred (--max_features)

_FLOAT_KINDS = {"<f2", "<f4"}
_LOSSY_LIST_CASTS = {"<u8": "uint64 -> int64", "<f8": "float64 -> float32"}


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One feature of an Example.

    Attributes:
      name: feature key in the Example.
      dtype: NumPy dtype string in little-endian form (``'<f8'``, ``'|u1'``, ``'|S6'``, ``'<U4'``,
        ``'<M8[D]'``), ``'bytes'`` for variable-length byte strings, or None when it varies per example
        (tensor encoding only).
      shape: per-example shape; None for a dimension that varies between examples, or None for the
        whole shape when even the rank varies (the ``np.savez(**arrays)`` case).
      encoding: ``'tensor'`` or ``'list'`` (see the module docstring).
    """

    name: str
    dtype: str | None
    shape: tuple[int | None, ...] | None
    encoding: str = "tensor"

    @property
    def is_fixed(self) -> bool:
        """True when dtype and every dimension are known, so no per-example shape/dtype features exist."""
        return self.dtype is not None and self.shape is not None and all(d is not None for d in self.shape)

    @property
    def size(self) -> int | None:
        """Number of elements per example, or None when the shape varies."""
        return math.prod(self.shape) if self.shape is not None and None not in self.shape else None

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": None if self.shape is None else list(self.shape), "encoding": self.encoding}

    @classmethod
    def from_json(cls, obj: Mapping) -> "FeatureSpec":
        try:
            spec = cls(str(obj["name"]), obj["dtype"],
                       None if obj["shape"] is None else tuple(obj["shape"]), str(obj.get("encoding", "tensor")))
        except (KeyError, TypeError) as e:
            raise SchemaError(f"Malformed feature entry {obj!r}: {e}") from None
        check_spec(spec, allow_lossy=(spec.name,))  # a lossy list cast on record was allowed when written
        return spec


def check_spec(spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
    """Raises SchemaError when ``spec`` cannot be encoded as asked."""
    if spec.encoding not in ENCODINGS:
        raise SchemaError(f"Unknown encoding {spec.encoding!r} for feature '{spec.name}'",
                          hint=f"use one of {ENCODINGS}")
    if spec.dtype is None and spec.encoding != "tensor":
        raise SchemaError(f"Feature '{spec.name}' has a dtype that varies between examples; only the "
                          "'tensor' encoding can carry it", hint="set its encoding to tensor")
    if spec.dtype is not None and spec.dtype != VLEN_BYTES:
        dt = np.dtype(spec.dtype)
        if spec.encoding == "list":
            if dt.kind == "c":
                raise SchemaError(f"Feature '{spec.name}' is {dt}: complex numbers have no list form",
                                  hint="use the tensor encoding for it")
            lossy = _LOSSY_LIST_CASTS.get(dt.str)
            if lossy and spec.name not in set(allow_lossy):
                raise SchemaError(f"Feature '{spec.name}': the list encoding would cast {lossy}, which is lossy",
                                  hint=f"use the tensor encoding, or allow it with allow_lossy: [{spec.name}]")
    if spec.dtype == VLEN_BYTES and spec.encoding != "list":
        raise SchemaError(f"Feature '{spec.name}' holds variable-length strings: only the list encoding "
                          "can carry them", hint="set its encoding to list")


def normalize_dtype(dt: np.dtype, where: str = "") -> str:
    """The little-endian dtype string of a supported non-structured dtype.

    Raises:
      SchemaError: object, float128, structured (flatten it first) and other unsupported dtypes.
    """
    dt = np.dtype(dt)
    at = f" ({where})" if where else ""
    if dt.fields is not None:
        raise SchemaError(f"Structured dtype {dt} must be flattened into fields first{at}")
    if dt.subdtype is not None:
        raise SchemaError(f"Subarray dtype {dt} must be expanded first{at}")
    kind, size = dt.kind, dt.itemsize
    ok = (kind in "biu" and size in (1, 2, 4, 8)) or (kind == "f" and size in (2, 4, 8)) \
        or (kind == "c" and size in (8, 16)) or (kind in "SUV" and size > 0) or kind in "Mm"
    if not ok:
        what = {"O": "object (Python objects; refused: input is never unpickled)",
                "f": f"float{size * 8} (no portable form)"}.get(kind, str(dt))
        raise SchemaError(f"Unsupported dtype {what}{at}",
                          hint="convert the array to a supported dtype (bool, ints, floats up to 64 bits, "
                               "complex64/128, fixed-width bytes/str) before converting")
    return dt.newbyteorder("<").str if size > 1 or kind in "Mm" else dt.str


def flatten_fields(name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Splits a structured array of shape ``(rows, *s)`` into one ``(name/field, array)`` per leaf field.

    Nested compounds recurse (``name/outer/inner``); subarray fields add their dimensions to the end,
    as NumPy does: a field ``('<f4', (3,))`` becomes an array of shape ``(rows, *s, 3)``.
    """
    if array.dtype.fields is None:
        return [(name, array)]
    out = []
    for field in array.dtype.names:
        out.extend(flatten_fields(f"{name}/{field}", array[field]))
    return out


def to_little_endian(array: np.ndarray) -> np.ndarray:
    """A C-contiguous little-endian array with the same values (no copy when it already is one)."""
    dt = array.dtype
    if dt.byteorder == ">" or (dt.byteorder == "=" and not _NATIVE_LE):
        array = array.astype(dt.newbyteorder("<"))
    return np.ascontiguousarray(array)


_NATIVE_LE = np.little_endian


# ----------------------------------------------------------------------------------------------
# Encoding a batch of rows
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Decoding: a small protobuf wire-format reader for Example (no TensorFlow)
# ----------------------------------------------------------------------------------------------

def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise RecordError("Truncated varint in serialized Example", offset=pos)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise RecordError("Varint longer than 10 bytes in serialized Example", offset=pos)


def _fields(buf: bytes, pos: int, end: int):
    """Yields (field number, wire type, value) over a message; LEN values are (start, stop) slices."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 1:
            value, pos = (pos, pos + 8), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            value, pos = (pos, pos + n), pos + n
        elif wire == 5:
            value, pos = (pos, pos + 4), pos + 4
        else:
            raise RecordError(f"Unsupported protobuf wire type {wire}: not a tf.train.Example", offset=pos)
        if pos > end or field == 0:
            raise RecordError("Field runs past the end of the message: not a tf.train.Example", offset=pos)
        yield field, wire, value


def split_features(record: bytes, max_features: int | None = None) -> dict[str, tuple[int, int]]:
    """Maps each feature name of a serialized Example to the (start, stop) byte slice of its Feature.

    Later entries win, as in protobuf's map merge (so concatenated Examples behave like TensorFlow's
    parser, which keeps the last value of a repeated key).

    Raises:
      RecordError: the bytes are not a tf.train.Example (with the byte offset), or it holds more than
        ``max_features`` (default :data:`MAX_FEATURES`) feature entries.
    """
    out: dict[str, tuple[int, int]] = {}
    for _, entry in split_feature_entries(record, max_features):
        key, value = None, (0, 0)
        for field, wire, val in _fields(record, entry[0], entry[1]):
            if field == 1 and wire == 2:
                try:
                    key = bytes(record[val[0]:val[1]]).decode("utf-8")
                except UnicodeDecodeError:
                    raise RecordError("Feature name is not UTF-8: not a tf.train.Example", offset=val[0]) from None
            elif field == 2 and wire == 2:
                value = val
        if key is None:
            raise RecordError("Feature map entry without a name: not a tf.train.Example", offset=entry[0])
        out[key] = value
    return out


def split_feature_entries(record: bytes, max_features: int | None = None) -> list[tuple[str | None, tuple[int, int]]]:
    """The (name placeholder, byte slice) of every ``Features.feature`` map entry, in order.

    Checks the Example's and the Features' framing (field numbers, wire types, lengths), not the values.

    Raises:
      RecordError: not a tf.train.Example, or more than ``max_features`` (default :data:`MAX_FEATURES`)
        entries, counted while parsing (the error comes before the rest of the record is walked).
    """
    limit = MAX_FEATURES if max_features is None else max_features
    entries = []
    for field, wire, val in _fields(record, 0, len(record)):
        if field != 1 or wire != 2:
            raise RecordError(f"Unexpected field {field} (wire type {wire}) in a tf.train.Example", offset=0)
        for f2, w2, v2 in _fields(record, val[0], val[1]):
            if f2 != 1 or w2 != 2:
                raise RecordError(f"Unexpected field {f2} in tf.train.Features", offset=val[0])
            entries.append((None, v2))
            if len(entries) > limit:
                raise too_many_features(limit, offset=v2[0])
    return entries


def too_many_features(limit: int, **context) -> RecordError:
    """The RecordError of an Example (or a collection) with more than ``limit`` features."""
    return RecordError(f"More than {limit} features (the feature limit, --max_features {limit})",
                       hint="raise --max_features if the data is trusted", **context)


def check_example_frame(record: bytes, max_features: int | None = None) -> int:
    """Checks that ``record`` is framed as a tf.train.Example (see :func:`split_feature_entries`) and
    returns its number of feature entries; cheap (no value is decoded: about 1 us per feature). Raises
    RecordError (from split_feature_entries, which any irregularity falls back to)."""
    limit = MAX_FEATURES if max_features is None else max_features
    n, pos, count = len(record), 0, 0
    while pos < n:
        if record[pos] != 0x0A:  # Example.features: field 1, LEN (other tags: the exact walk below decides)
            return len(split_feature_entries(record, max_features))
        b = record[pos + 1] if pos + 1 < n else 0x80
        if b < 0x80:
            length, pos = b, pos + 2
        else:
            length, pos = _varint(record, pos + 1, n)
        end = pos + length
        if end > n:
            return len(split_feature_entries(record, max_features))
        while pos < end:  # Features.feature entries: field 1, LEN
            if record[pos] != 0x0A:
                return len(split_feature_entries(record, max_features))
            b = record[pos + 1] if pos + 1 < end else 0x80
            if b < 0x80:
                pos += 2 + b
            else:
                length, pos = _varint(record, pos + 1, end)
                pos += length
            count += 1
            if count > limit:
                return len(split_feature_entries(record, max_features))
        if pos != end:
            return len(split_feature_entries(record, max_features))
    return count


def entry_name(record: bytes, entry: tuple[int, int]) -> str:
    """The feature name of one map entry slice (see split_feature_entries)."""
    for field, wire, val in _fields(record, entry[0], entry[1]):
        if field == 1 and wire == 2:
            return bytes(record[val[0]:val[1]]).decode("utf-8", errors="replace")
    raise RecordError("Feature map entry without a name", offset=entry[0])


def drop_features(record: bytes, names: Iterable[str]) -> bytes:
    """The Example without the features in ``names``: other entries are copied byte for byte, not decoded."""
    names = set(names)
    kept = [record[s:e] for _, (s, e) in split_feature_entries(record) if entry_name(record, (s, e)) not in names]
    features = b"".join(_len_field(1, bytes(e)) for e in kept)
    return _len_field(1, features) if kept else b""


def _len_field(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_feature(record: bytes, span: tuple[int, int]):
    """Decodes one Feature slice to ``(kind, values)``.

    ``kind`` is ``'bytes'`` (values: list of bytes), ``'float'`` (float32 array), ``'int64'`` (int64
    array), or None for a Feature with no kind set (values: empty list).
    """
    kind, values = None, []
    for field, wire, val in _fields(record, span[0], span[1]):
        if wire != 2 or field not in (1, 2, 3):
            raise RecordError(f"Unexpected field {field} in tf.train.Feature", offset=span[0])
        kind = {1: "bytes", 2: "float", 3: "int64"}[field]
        values = _decode_list(record, kind, val)
    return kind, values


def _decode_list(buf: bytes, kind: str, span: tuple[int, int]):
    if kind == "bytes":
        return [bytes(buf[v[0]:v[1]]) for f, w, v in _fields(buf, span[0], span[1]) if f == 1 and w == 2]
    parts = []
    for f, w, v in _fields(buf, span[0], span[1]):
        if f != 1:
            continue
        if kind == "float":
            if w not in (2, 5) or (v[1] - v[0]) % 4:
                raise RecordError("FloatList value with wire type %d or a length not a multiple of 4" % w,
                                  offset=span[0])
            parts.append(np.frombuffer(bytes(buf[v[0]:v[1]]), dtype="<f4"))
        elif w == 2:
            parts.append(_decode_varints(bytes(buf[v[0]:v[1]]), v[0]))
        elif w == 0:
            parts.append(np.array([v & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64).view(np.int64))  # 64 bits, as protobuf
        else:
            raise RecordError("Int64List value with wire type %d" % w, offset=span[0])
    if kind == "float":
        return np.concatenate(parts) if parts else np.zeros(0, "<f4")
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _decode_varints(data: bytes, offset: int = 0) -> np.ndarray:
    """Vectorized decode of packed varints to int64 (two's complement, as protobuf int64)."""
    b = np.frombuffer(data, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64)
    if b[-1] >= 0x80:
        raise RecordError("Truncated packed varint list", offset=offset + len(data))
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if np.any(ends - starts >= 10):
        raise RecordError("Varint longer than 10 bytes", offset=offset)
    pos = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
    parts = (b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)


def parse_example(record: bytes, max_features: int | None = None) -> dict[str, tuple[str | None, object]]:
    """Decodes a whole serialized Example to ``{name: (kind, values)}`` (see decode_feature).

    Raises RecordError: not an Example, or more than ``max_features`` features (see split_features)."""
    return {name: decode_feature(record, span) for name, span in split_features(record, max_features).items()}


def decode_example(record: bytes, specs: Sequence[FeatureSpec], max_features: int | None = None
                   ) -> dict[str, np.ndarray]:
    """Decodes the features in ``specs`` to NumPy arrays with their recorded dtype and shape.

    Little-endian arrays come back for every dtype (values equal to the source's, whatever its byte
    order); ``'bytes'`` features come back as object arrays of bytes. Features not in ``specs`` are
    not decoded.

    Raises:
      RecordError: a feature is missing, has the wrong kind, or its size does not match the shape; more
        than ``max_features`` (default :data:`MAX_FEATURES`) features in the record.
    """
    spans = split_features(record, max_features)
    return {spec.name: _decode_spec(record, spans, spec) for spec in specs}


def _get(record, spans, name, kind):
    if name not in spans:
        raise RecordError(f"Feature '{name}' is missing from the Example", feature=name)
    got, values = decode_feature(record, spans[name])
    if got != kind:
        raise RecordError(f"Feature '{name}' holds a {got} list, expected {kind}", feature=name)
    return values


def _decode_spec(record: bytes, spans, spec: FeatureSpec) -> np.ndarray:
    shape = spec.shape
    if not spec.is_fixed:
        shape = tuple(int(v) for v in _get(record, spans, f"{spec.name}/shape", "int64"))
        if any(d < 0 for d in shape) or spec.shape is not None and (
                len(shape) != len(spec.shape) or any(d is not None and d != n for d, n in zip(spec.shape, shape))):
            raise RecordError(f"Feature '{spec.name}/shape' holds {list(shape)}, which is not a shape of "
                              f"{spec.shape}", feature=spec.name)
    dtype = spec.dtype
    if dtype is None:
        values = _get(record, spans, f"{spec.name}/dtype", "bytes")
        dtype = values[0].decode("ascii", errors="replace") if len(values) == 1 else ""
        try:
            normalize_dtype(np.dtype(dtype), spec.name)
        except (TypeError, ValueError, OverflowError):
            raise RecordError(f"Feature '{spec.name}/dtype' holds {values!r}, not one NumPy dtype",
                              feature=spec.name) from None
    count = math.prod(shape)
    if spec.encoding == "tensor":
        raws = _get(record, spans, spec.name, "bytes")
        raw = raws[0] if len(raws) == 1 else None
        dt = np.dtype(dtype)
        if raw is None or len(raw) != count * dt.itemsize:
            got = f"{len(raw)} bytes" if raw is not None else f"{len(raws)} values (0 bytes)"
            raise RecordError(f"Feature '{spec.name}' holds {got}, expected "
                              f"{count * dt.itemsize} for {dtype} {shape}", feature=spec.name)
        return np.frombuffer(raw, dtype=dt).reshape(shape)
    kind = "bytes" if dtype == VLEN_BYTES or np.dtype(dtype).kind in "SUV" else \
        ("float" if np.dtype(dtype).kind == "f" else "int64")
    values = _get(record, spans, spec.name, kind)
    if len(values) != count:
        raise RecordError(f"Feature '{spec.name}' holds {len(values)} values, expected {count} for shape {shape}",
                          feature=spec.name)
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
            raise RecordError(f"Feature '{spec.name}' holds a value that is not UTF-8: {e}", feature=spec.name) from None
    if dt.kind in "Mm":
        return values.view(dt).reshape(shape)
    out = values.astype(dt)
    if dt.kind != "f" and not np.array_equal(out.astype(values.dtype), values):
        raise RecordError(f"Feature '{spec.name}' holds values out of range for {dtype}", feature=spec.name)
    return out.reshape(shape)



# ----------------------------------------------------------------------------------------------
# Examples written by anyone else (no metadata): inferred features, lenient decoding, key patterns
# ----------------------------------------------------------------------------------------------

_KIND_DTYPES = {"int64": "<i8", "float": "<f4", "bytes": VLEN_BYTES}


def infer_feature_specs(records: Iterable[bytes], max_features: int | None = None) -> tuple[FeatureSpec, ...]:
    """Infers the features of serialized Examples that came without metadata (TFX, TFDS, tf.io writers).

    Each feature becomes a ``list`` spec of its native kind: ``int64_list`` -> ``'<i8'``, ``float_list``
    -> ``'<f4'``, ``bytes_list`` -> ``'bytes'``; shape ``(n,)`` when every sampled record holds exactly
    ``n`` values of it, else ``(None,)`` (a record without the feature, or with a Feature whose kind is
    not set, as some TFX Examples carry, counts as 0 values). A feature whose kind is never set is a
    ``'bytes'`` ``(None,)`` feature. Order: first seen. Time and memory are linear in the entries read.

    Args:
      records: serialized ``tf.train.Example`` byte strings (a sample, e.g. a shard's first 1000).
      max_features: limit on the features of one record and on the distinct names of all records
        (default :data:`MAX_FEATURES`).

    Raises:
      SchemaError: a feature holds different kinds in different records.
      RecordError: a record is not a tf.train.Example (with the record index and byte offset), or more
        than ``max_features`` features (in one record, or distinct names in all).
    """
    limit = MAX_FEATURES if max_features is None else max_features
    kinds: dict[str, set] = {}
    lengths: dict[str, set] = {}
    present: dict[str, int] = {}
    total = 0
    for i, record in enumerate(records):
        try:
            parsed = parse_example(record, limit)
        except RecordError as e:
            raise RecordError(f"Cannot infer the features: {e.message}", hint=e.hint, record=i,
                              payload_offset=e.context.get("offset")) from None
        for name, (kind, values) in parsed.items():
            if name not in kinds:
                if len(kinds) >= limit:
                    raise too_many_features(limit, record=i)
                kinds[name], lengths[name], present[name] = set(), set(), 0
                if total:
                    lengths[name].add(0)  # absent from the earlier records
            if kind is not None:
                kinds[name].add(kind)
            lengths[name].add(len(values))
            present[name] += 1
        total += 1
    specs = []
    for name, found in kinds.items():
        if len(found) > 1:
            raise SchemaError(f"Feature '{name}' holds {' and '.join(sorted(found))} lists in different records",
                              feature=name, hint="one feature must have one kind in every record")
        dtype = _KIND_DTYPES[next(iter(found))] if found else VLEN_BYTES
        counts = lengths[name] | ({0} if present[name] < total else set())
        shape = (counts.pop(),) if len(counts) == 1 and found else (None,)
        specs.append(FeatureSpec(name, dtype, shape, "list"))
    return tuple(specs)


def decode_example_lenient(record: bytes, specs: Sequence[FeatureSpec], max_features: int | None = None
                           ) -> dict[str, np.ndarray]:
    """Like :func:`decode_example`, but also decodes variable-length native lists of foreign Examples.

    A ``list`` spec of shape ``(None,)`` whose ``<name>/shape`` companion is absent (an Example written
    by anyone else, whose features were inferred by :func:`infer_feature_specs`) decodes to a 1-D array
    of its values (``'<i8'``, ``'<f4'``, or an object array of bytes); a missing feature or a Feature
    with no kind set decodes to an empty array. Every other spec decodes exactly as decode_example.

    Raises:
      RecordError: a feature is missing, has the wrong kind, or its size does not match the shape; more
        than ``max_features`` (default :data:`MAX_FEATURES`) features in the record.
    """
    spans = split_features(record, max_features)
    out = {}
    for spec in specs:
        if spec.encoding == "list" and spec.shape == (None,) and f"{spec.name}/shape" not in spans:
            out[spec.name] = _native_values(record, spans, spec)
        else:
            out[spec.name] = _decode_spec(record, spans, spec)
    return out


def _native_values(record: bytes, spans, spec: FeatureSpec) -> np.ndarray:
    kind, values = decode_feature(record, spans[spec.name]) if spec.name in spans else (None, [])
    want = "bytes" if spec.dtype == VLEN_BYTES or np.dtype(spec.dtype).kind in "SUV" else \
        ("float" if np.dtype(spec.dtype).kind == "f" else "int64")
    if kind is not None and kind != want:
        raise RecordError(f"Feature '{spec.name}' holds a {kind} list, expected {want}", feature=spec.name)
    if want == "bytes":
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.asarray(values, dtype="<f4" if want == "float" else "<i8")


def feature_key_pattern(name: str) -> bytes:
    """The bytes every serialized Example holding feature ``name`` contains: its map entry's key field.

    A cheap ``pattern in record`` test rules a feature out without parsing (a hit may be a false
    positive inside a value; confirm with :func:`split_features`).
    """
    key = name.encode("utf-8")
    return _encode_varint(1 << 3 | 2) + _encode_varint(len(key)) + key


def batch_decodable(spec: FeatureSpec) -> bool:
    """True when :func:`decode_batch` can decode ``spec``: a fixed shape, and not a ``list`` of fixed-width
    bytes/str/void (those decode per record with decode_example)."""
    if not spec.is_fixed:
        return False
    return spec.encoding == "tensor" or spec.dtype == VLEN_BYTES or np.dtype(spec.dtype).kind not in "SUV"


def decode_batch(records: Sequence[bytes], specs: Sequence[FeatureSpec]) -> dict[str, np.ndarray]:
    """Decodes the features in ``specs`` of a batch of serialized Examples in one C++ call.

    The result equals stacking :func:`decode_example` over the records: ``{name: (len(records),
    *spec.shape)}`` arrays of the recorded dtype (object arrays of bytes for ``bytes`` features). Only
    the features in ``specs`` are decoded (tfx_bsl's ``ExamplesToRecordBatchDecoder`` with a schema
    of just those). Every spec must be :func:`batch_decodable`.

    Raises:
      RecordError: a feature missing from a record, of the wrong kind, or of the wrong size (the record
        is not named: decode record by record to find it).
    """
    import pyarrow.compute as pc
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders import example_coder

    n = len(records)
    schema, kinds = schema_pb2.Schema(), {}
    types = {"bytes": schema_pb2.BYTES, "int64": schema_pb2.INT, "float": schema_pb2.FLOAT}
    for spec in specs:
        if not batch_decodable(spec):
            raise SchemaError(f"Feature '{spec.name}' ({spec.dtype} {spec.shape} {spec.encoding}) cannot be "
                              "decoded as a batch", feature=spec.name, hint="decode it with decode_example")
        if spec.encoding == "tensor" or spec.dtype == VLEN_BYTES:
            kinds[spec.name] = "bytes"
        else:
            kinds[spec.name] = "float" if np.dtype(spec.dtype).kind == "f" else "int64"
        schema.feature.add(name=spec.name, type=types[kinds[spec.name]])
    try:
        batch = example_coder.ExamplesToRecordBatchDecoder(schema.SerializeToString()).DecodeBatch(list(records))
    except Exception as e:  # tfx_bsl raises RuntimeError/ValueError for a wrong kind or bad bytes
        raise RecordError(f"Cannot decode the batch: {e}") from None
    out = {}
    for spec in specs:
        if spec.name not in batch.schema.names:
            raise RecordError(f"Feature '{spec.name}' is missing from every Example", feature=spec.name)
        col = batch.column(spec.name)
        if col.null_count:
            raise RecordError(f"Feature '{spec.name}' is missing from an Example", feature=spec.name)
        lengths = np.diff(col.offsets.to_numpy())
        values = col.flatten()
        want = 1 if spec.encoding == "tensor" else spec.size
        if n and not (lengths == want).all():
            raise RecordError(f"Feature '{spec.name}' holds {sorted(set(lengths.tolist()))} values in some "
                              f"Examples, expected {want}", feature=spec.name)
        if spec.encoding == "tensor":
            dt = np.dtype(spec.dtype)
            nbytes = spec.size * dt.itemsize
            if n and not (pc.binary_length(values).to_numpy() == nbytes).all():
                raise RecordError(f"Feature '{spec.name}' holds a value of the wrong size, expected {nbytes} bytes "
                                  f"for {spec.dtype} {spec.shape}", feature=spec.name)
            out[spec.name] = np.frombuffer(b"".join(values.to_pylist()), dtype=dt).reshape(n, *spec.shape)
        elif spec.dtype == VLEN_BYTES:
            arr = np.empty(n * want, dtype=object)
            arr[:] = values.to_pylist()
            out[spec.name] = arr.reshape(n, *spec.shape)
        else:
            raw, dt = values.to_numpy(zero_copy_only=False), np.dtype(spec.dtype)
            if dt.kind in "Mm":
                arr = raw.view(dt)
            else:
                arr = raw.astype(dt)
                if dt.kind != "f" and not np.array_equal(arr.astype(raw.dtype), raw):
                    raise RecordError(f"Feature '{spec.name}' holds values out of range for {spec.dtype}",
                                      feature=spec.name)
            out[spec.name] = arr.reshape(n, *spec.shape)
    return out
