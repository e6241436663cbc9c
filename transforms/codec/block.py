"""Decoding a block of serialized Examples at once with NumPy: the fast path of the NumPy readers.

Our records have a known layout: the writer lays every row of a batch out with the same protobuf headers (tags,
lengths, feature names; :class:`codec.encode.FixedLayout`), so among records of one length only the values differ.
:class:`BlockDecoder` walks the first record of a block once, noting the *structural* bytes the walk reads (every
tag, length and name) and where each feature's values lie; every record of the block whose structural bytes equal
the first one's (one NumPy comparison per byte range over the whole block) would walk identically, so its values
sit at the same offsets and are gathered for all such records at once (``np.frombuffer`` of the block, a strided
slice per feature, a ``view`` to the dtype). Records that differ (another writer's layout, varint lengths that vary,
concatenated Examples, a feature missing) are decoded one by one by :func:`codec.decode_example_lenient`, so the
result always equals stacking that decoder's arrays, value for value, dtype for dtype.

Vectorized per feature: ``tensor`` (raw little-endian bytes of a fixed dtype and shape), ``packbits``, and ``list``
features of numbers (``float_list``: float32 views; ``int64_list``: packed varints of one width per record, decoded
as columns of bytes). Every other feature of a record that matches the layout (strings of a ``list``, ``zlib``,
shapes or dtypes that vary, ``varlen``) is decoded per record from the same offsets with the per-record decoder's
own functions. No Beam, TensorFlow or pyarrow import: NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np

from tfrecord_etl.transforms.codec.encodings import encoding_of
from tfrecord_etl.transforms.codec.encodings.lists import ListEncoding
from tfrecord_etl.transforms.codec.encodings.packbits import PackbitsEncoding, packed_shape
from tfrecord_etl.transforms.codec.encodings.tensor import TensorEncoding
from tfrecord_etl.transforms.codec.foreign import decode_example_lenient
from tfrecord_etl.transforms.codec.spec import MAX_FEATURES, VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.codec.wire import decode_feature, decode_spec
from tfrecord_etl.transforms.errors import RecordError

_KIND_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}  # Feature's oneof fields, LEN wire type
MIN_BLOCK = 4  # fewer records than this are decoded one by one (the layout walk would cost more than it saves)


def ragged(spec: FeatureSpec) -> bool:
    """True when rows of ``spec`` cannot be stacked into one array (shape or dtype varies between examples): a
    batch then holds them in a 1-D object array, one array per row."""
    return not spec.is_fixed


def _varint_at(buf: bytes, pos: int, end: int) -> tuple[int, int] | None:
    result = shift = 0
    while pos < end and shift < 64:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    return None


def _vector_kind(spec: FeatureSpec) -> str | None:
    """How a fixed-layout feature's values are gathered for a whole block, or None (decoded per record)."""
    if not spec.is_fixed or spec.dtype == VLEN_BYTES:
        return None
    encoding = encoding_of(spec)
    cls = type(encoding)
    if cls is TensorEncoding:
        return "tensor"
    if cls is PackbitsEncoding:
        return "packbits"
    if cls is ListEncoding:
        kind = encoding.kind(spec.dtype)
        return {"float": "float", "int64": "int64"}.get(kind)
    return None  # zlib (rows of different lengths), varlen, encodings added later: per record


class Layout:
    """Where the values of each feature lie in records of one length, and the structural byte ranges (tags, lengths,
    names) that a record must share with the reference for those offsets to hold.

    Attributes:
      length: the records' length in bytes.
      ref: the reference record (uint8).
      ranges: ``[(start, stop)]`` structural byte ranges.
      vector: ``{name: (start, nbytes, varint width or 0)}`` of the features gathered for the whole block.
      spans: ``{name: (start, stop)}`` of every ``Feature`` message (as ``wire.split_features``), for the features
        decoded per record.
    """

    def __init__(self, length, ref, ranges, vector, spans):
        self.length, self.ref, self.ranges, self.vector, self.spans = length, ref, ranges, vector, spans
        self._one = None  # matches_one's checks, prepared on first use
        # the bytes every matching row must hold: structural bytes whole, and the continuation bit of each varint
        # byte (set but on each value's last byte); gathered in one fancy index and compared 8 bytes at a time
        idx = [i for a, b in ranges for i in range(a, b)]
        mask = [0xFF] * len(idx)
        want = [int(ref[i]) for i in idx]
        for start, nbytes, width in vector.values():
            if width:
                for i in range(start, start + nbytes):
                    idx.append(i)
                    mask.append(0x80)
                    want.append(0 if (i - start) % width == width - 1 else 0x80)
        pad = -len(idx) % 8
        idx += [idx[-1] if idx else 0] * pad
        mask += [0] * pad
        want += [0] * pad
        self._idx = np.array(idx, np.intp)
        self._mask = np.array(mask, np.uint8) if any(m != 0xFF for m in mask) else None
        self._want = np.array(want, np.uint8).view("<u8")
        # the columns as runs of consecutive bytes: (first column in the gathered copy, start, stop in the record);
        # the padding columns are left zero (their mask is 0)
        self._copies: list[tuple[int, int, int]] = []
        for col, i in enumerate(idx[: len(idx) - pad]):
            last = self._copies[-1] if self._copies else None
            if last is not None and last[2] == i and col == last[0] + last[2] - last[1]:
                self._copies[-1] = (last[0], last[1], i + 1)
            else:
                self._copies.append((col, i, i + 1))

    def matches(self, block: np.ndarray) -> np.ndarray:
        """bool ``(rows,)``: the rows of ``block`` (``(rows, length)`` uint8) whose structural bytes are the
        reference's (varint columns checked too: every byte but each value's last has its high bit set)."""
        rows = block.shape[0]
        if not len(self._idx):
            return np.ones(rows, bool)
        # one strided slice copy per run of columns (a fancy index block[:, idx] costs several times more; take
        # would copy the whole block first)
        got = np.zeros((rows, len(self._idx)), np.uint8)
        for col, a, b in self._copies:
            got[:, col : col + b - a] = block[:, a:b]
        if self._mask is not None:
            got &= self._mask
        words = got.view("<u8")
        ok = words[:, 0] == self._want[0]
        for j in range(1, words.shape[1]):
            ok &= words[:, j] == self._want[j]
        return ok

    def matches_one(self, record: bytes) -> bool:
        """:meth:`matches` for one record (bytes), in pure Python: a few slice comparisons (their reference bytes
        and the varint bytes' continuation bits prepared on first use)."""
        if len(record) != self.length:
            return False
        checks = self._one
        if checks is None:
            ref = self._ref_bytes
            checks = self._one = (
                tuple((a, b, ref[a:b]) for a, b in self.ranges),
                tuple(
                    (start + i, i % width != width - 1)
                    for start, nbytes, width in self.vector.values()
                    if width and nbytes
                    for i in range(nbytes)
                ),
            )
        for a, b, want in checks[0]:
            if record[a:b] != want:
                return False
        for i, high in checks[1]:  # noqa: SIM110 - a plain loop: this runs for every record
            if (record[i] >= 0x80) != high:
                return False
        return True

    @property
    def _ref_bytes(self) -> bytes:
        cached = getattr(self, "_bytes", None)
        if cached is None:
            cached = self._bytes = self.ref.tobytes()
        return cached


def layout_of(record: bytes, specs: Sequence[FeatureSpec], max_features: int | None = None) -> Layout | None:
    """The :class:`Layout` of ``record`` for ``specs``, or None when the record is not framed as a plain
    ``Example{Features{entry{key, value}...}...}`` (then every record of its kind is decoded one by one)."""
    limit = MAX_FEATURES if max_features is None else max_features
    n = len(record)
    struct: list[tuple[int, int]] = []
    spans: dict[str, tuple[int, int]] = {}
    pos, count = 0, 0

    def header(pos, end, tag):
        """(payload start, payload end) of a LEN field with ``tag`` at ``pos``, its header noted as structural."""
        if pos >= end or record[pos] != tag:
            return None
        got = _varint_at(record, pos + 1, end)
        if got is None or got[1] + got[0] > end:
            return None
        struct.append((pos, got[1]))
        return got[1], got[1] + got[0]

    while pos < n:
        features = header(pos, n, 0x0A)
        if features is None:
            return None
        pos, end = features
        while pos < end:
            entry = header(pos, end, 0x0A)
            if entry is None:
                return None
            key = header(entry[0], entry[1], 0x0A)
            if key is None:
                return None
            struct.append(key)
            value = header(key[1], entry[1], 0x12)
            if value is None or value[1] != entry[1]:
                return None
            try:
                name = record[key[0] : key[1]].decode("utf-8")
            except UnicodeDecodeError:
                return None
            spans[name] = value
            count += 1
            if count > limit:
                return None
            pos = entry[1]
    vector = {}
    for spec in specs:
        how = _vector_kind(spec)
        if how is None or spec.name not in spans or f"{spec.name}/shape" in spans or f"{spec.name}/dtype" in spans:
            continue
        mark = len(struct)
        got = _vector_values(record, spans[spec.name], spec, how, header)
        if got is None:
            del struct[mark:]  # decoded per record: that decoder raises the exact error, if any
            continue
        vector[spec.name] = got
    ranges = _merged(struct)
    return Layout(n, np.frombuffer(record, np.uint8).copy(), ranges, vector, spans)


def _vector_values(record, span, spec: FeatureSpec, how: str, header):
    """``(start, nbytes, varint width)`` of a vector feature's values in its ``Feature`` message ``span``, its
    headers noted as structural; None when the message is not the one value list the feature's rows hold."""
    start, stop = span
    kind = "bytes" if how in ("tensor", "packbits") else how
    inner = header(start, stop, _KIND_TAG[kind])
    if inner is None or inner[1] != stop:
        return None
    size = spec.size
    if inner[0] == inner[1]:  # an empty list: the writer's form of zero values
        return (inner[0], 0, 0) if kind != "bytes" and size == 0 else None
    values = header(inner[0], inner[1], 0x0A)
    if values is None or values[1] != inner[1]:
        return None
    nbytes = values[1] - values[0]
    if how == "tensor":
        ok = nbytes == size * np.dtype(spec.dtype).itemsize
    elif how == "packbits":
        ok = nbytes == math.prod(packed_shape(spec.shape))
    elif how == "float":
        ok = nbytes == 4 * size
    else:
        ok = size > 0 and nbytes % size == 0 and 1 <= nbytes // size <= 10
    if not ok:
        return None
    return values[0], nbytes, (nbytes // size if how == "int64" else 0)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _gather(block: np.ndarray, start: int, nbytes: int) -> np.ndarray:
    """``(rows, nbytes)`` uint8, C-contiguous, a copy (never a view of the block's buffer)."""
    return np.array(block[:, start : start + nbytes], order="C", copy=True)


def _varints(cols: np.ndarray, width: int) -> np.ndarray:
    """``(rows, n*width)`` uint8 of varints of ``width`` bytes each -> ``(rows, n)`` int64 (two's complement)."""
    rows = cols.shape[0]
    cols = cols.reshape(rows, -1, width)
    out = (cols[:, :, 0] & 0x7F).astype(np.uint64)
    for j in range(1, width):
        out |= (cols[:, :, j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return out.view(np.int64)


class BlockDecoder:
    """Decodes blocks of serialized Examples to ``{name: array of rows}``, equal to stacking
    :func:`codec.decode_example_lenient` over the records (see the module).

    Args:
      specs: the features to decode.
      max_features: limit on one record's feature count (default :data:`MAX_FEATURES`).

    Output arrays: ``(rows, *spec.shape)`` of ``spec.dtype`` for fixed features (object arrays for ``bytes``);
    1-D object arrays of one array per row for features whose shape or dtype varies (:func:`ragged`).
    """

    def __init__(self, specs: Sequence[FeatureSpec], max_features: int | None = None):
        self.specs = list(specs)
        self.max_features = max_features
        self._layouts: dict[int, Layout | None] = {}
        self._encodings = {s.name: encoding_of(s) for s in self.specs}
        # per feature: (how its values are gathered, its dtype), looked up once
        self._how = {
            s.name: (_vector_kind(s), None if s.dtype in (None, VLEN_BYTES) else np.dtype(s.dtype)) for s in self.specs
        }

    # -- one record ------------------------------------------------------------------------------------
    def decode_one(self, record: bytes) -> dict[str, np.ndarray]:
        """One record, as :func:`codec.decode_example_lenient` decodes it; faster when it shares the layout of a
        record of its length seen before. Raises RecordError as that function does."""
        if len(record) not in self._layouts:
            self._layouts[len(record)] = layout_of(record, self.specs, self.max_features)
        layout = self._layouts[len(record)]
        if layout is None or not layout.matches_one(record):
            return decode_example_lenient(record, self.specs, self.max_features)
        out = {}
        for spec in self.specs:
            where = layout.vector.get(spec.name)
            if where is None:
                out[spec.name] = self._per_record(record, layout.spans, spec)
                continue
            value = self._vector_one(spec, record, where)
            if value is None:  # out of range for the dtype: the per-record decoder says so
                return decode_example_lenient(record, self.specs, self.max_features)
            out[spec.name] = value
        return out

    def _vector_one(self, spec: FeatureSpec, record: bytes, where) -> np.ndarray | None:
        """:meth:`_vector` for one record, with as few NumPy calls as it takes (one record is all Python overhead)."""
        start, nbytes, width = where
        how, dt = self._how[spec.name]
        if how == "tensor":
            if not nbytes:
                return np.zeros(spec.shape, dt)
            return np.frombuffer(record, dt, spec.size, start).reshape(spec.shape)
        if how == "packbits":
            packed = np.frombuffer(record, np.uint8, nbytes, start).reshape(packed_shape(spec.shape))
            return cast(PackbitsEncoding, self._encodings[spec.name])._unpack(packed, spec.shape, spec.dtype)
        if how == "float":
            values = np.frombuffer(record, "<f4", spec.size, start)
            return values.astype(dt).reshape(spec.shape)
        if nbytes <= 64:
            ints, shift, value = [], 0, 0
            for b in record[start : start + nbytes]:
                value |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    ints.append(value & 0xFFFFFFFFFFFFFFFF)
                    shift = value = 0
            values = np.array(ints, np.uint64).view(np.int64)
        else:
            values = _varints(np.frombuffer(record, np.uint8, nbytes, start)[None], width)[0]
        if dt.kind in "Mm":
            return values.view(dt).reshape(spec.shape)
        if dt == values.dtype:
            return values.reshape(spec.shape)
        out = values.astype(dt)
        if dt.kind != "f" and not np.array_equal(out.astype(values.dtype), values):
            return None
        return out.reshape(spec.shape)

    # -- a block ---------------------------------------------------------------------------------------
    def decode(self, block: np.ndarray, records: Sequence[bytes] | None = None) -> dict[str, np.ndarray]:
        """Decodes ``block``, a ``(rows, length)`` uint8 array (a view: rows may be strided) of records of one
        length. ``records``: the same records as bytes when the caller has them (else rows are copied out when
        a record is decoded one by one).

        Raises:
          RecordError: from the per-record decoder, with ``context['record']`` the row within the block.
        """
        rows, length = block.shape
        layout = None
        if rows >= MIN_BLOCK or length in self._layouts:
            cached = self._layouts.get(length)
            if cached is None or not cached.matches(block[:1]).all():
                self._layouts[length] = layout_of(block[0].tobytes(), self.specs, self.max_features)
            layout = self._layouts[length]
        ok = layout.matches(block) if layout is not None else np.zeros(rows, bool)
        good = np.flatnonzero(ok)
        sub = block if len(good) == rows else block[good]
        vec: dict[str, np.ndarray] = {}
        pending = [s for s in self.specs if layout is not None and s.name in layout.vector]
        while pending and len(good):
            spec = pending[0]
            value = self._vector(spec, sub, layout.vector[spec.name])
            if value is None:  # some rows hold integers out of range for the dtype: those go one by one
                bad = self._out_of_range(spec, sub, layout.vector[spec.name])
                ok[good[bad]] = False
                good, sub = good[~bad], sub[~bad]
                vec, pending = {}, [s for s in self.specs if s.name in layout.vector]
                continue
            vec[spec.name] = value
            pending.pop(0)
        return self._finish(block, records, layout, ok, good, vec)

    def _finish(self, block, records, layout, ok, good, vec):
        """Every feature: vector features of the ``good`` rows from ``vec``, per-record features of the ``good`` rows
        from the layout's spans, and whole records of the other rows, merged in row order."""
        rows = block.shape[0]
        per_spec = [s for s in self.specs if s.name not in vec]
        bad_list = np.flatnonzero(~ok).tolist() if len(good) < rows else []
        if not per_spec and not bad_list:
            return vec
        good_list = good.tolist()
        per_row: dict[str, list] = {s.name: [] for s in per_spec}
        if per_spec and good_list:
            for i in good_list:
                record = records[i] if records is not None else block[i].tobytes()
                for spec in per_spec:
                    try:
                        per_row[spec.name].append(self._per_record(record, layout.spans, spec))
                    except RecordError as e:
                        raise e.with_context(record=i) from None
        whole = []
        for i in bad_list:
            record = records[i] if records is not None else block[i].tobytes()
            try:
                whole.append(decode_example_lenient(record, self.specs, self.max_features))
            except RecordError as e:
                raise e.with_context(record=i) from None
        out = {}
        for spec in self.specs:
            name = spec.name
            part = (vec[name] if name in vec else stack(spec, per_row[name])) if good_list else None
            if not bad_list:
                out[name] = part
                continue
            rest = stack(spec, [w[name] for w in whole])
            if part is None:
                out[name] = rest
                continue
            merged = np.empty((rows, *part.shape[1:]), dtype=_common(part, rest))
            merged[good] = part
            merged[np.asarray(bad_list)] = rest
            out[name] = merged
        return out

    def _per_record(self, record: bytes, spans, spec: FeatureSpec) -> np.ndarray:
        """One feature of one record, exactly as :func:`codec.decode_example_lenient` decodes it."""
        encoding = self._encodings[spec.name]
        if encoding.native and not encoding.optional and spec.shape == (None,) and f"{spec.name}/shape" not in spans:
            kind, values = decode_feature(record, spans[spec.name]) if spec.name in spans else (None, [])
            return encoding.decode_native(spec, kind, values)
        return decode_spec(record, spans, spec)

    def _vector(self, spec: FeatureSpec, block: np.ndarray, where) -> np.ndarray | None:
        """The values of a vector feature for every row of ``block`` (rows sharing the layout); None when some row
        holds an integer out of range for the dtype (the caller decodes those rows one by one). One-byte ``tensor``
        values are a view of ``block``'s buffer (rows strided by the frame; the buffer must not be reused), every other
        feature a new C-contiguous array."""
        start, nbytes, width = where
        rows = block.shape[0]
        how, dt = self._how[spec.name]
        if how == "tensor":
            if not nbytes:
                return np.zeros((rows, *spec.shape), dt)
            if dt.itemsize == 1:  # bytes-wide values (images): a view of the block's buffer, no copy (rows strided)
                return block[:, start : start + nbytes].view(dt).reshape(rows, *spec.shape)
            return _gather(block, start, nbytes).view(dt).reshape(rows, *spec.shape)
        if how == "packbits":
            packed = _gather(block, start, nbytes).reshape(rows, *packed_shape(spec.shape))
            return cast(PackbitsEncoding, self._encodings[spec.name])._unpack(packed, spec.shape, spec.dtype)
        if how == "float":
            values = _gather(block, start, nbytes).view("<f4") if nbytes else np.zeros((rows, 0), "<f4")
            return (values if dt == values.dtype else values.astype(dt)).reshape(rows, *spec.shape)
        values = _varints(_gather(block, start, nbytes), width) if nbytes else np.zeros((rows, 0), np.int64)
        if dt.kind in "Mm":
            return values.view(dt).reshape(rows, *spec.shape)
        if dt == values.dtype:
            return values.reshape(rows, *spec.shape)
        out = values.astype(dt)
        if dt.kind != "f" and not np.array_equal(out.astype(values.dtype), values):
            return None
        return out.reshape(rows, *spec.shape)

    def _out_of_range(self, spec, block, where) -> np.ndarray:
        """bool ``(rows,)``: rows of ``block`` whose integer values do not fit the dtype."""
        start, nbytes, width = where
        values = _varints(_gather(block, start, nbytes), width)
        return (values.astype(spec.dtype).astype(values.dtype) != values).any(axis=1)


def _common(a: np.ndarray, b: np.ndarray) -> np.dtype:
    return a.dtype if a.dtype == b.dtype else np.result_type(a, b)


def stack(spec: FeatureSpec, rows: list) -> np.ndarray:
    """Per-record arrays of ``spec`` -> one array of rows: ``(n, *shape)`` of ``spec.dtype`` for a fixed feature,
    else a 1-D object array holding each row's array (:func:`ragged`)."""
    if ragged(spec):
        out = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            out[i] = row
        return out
    if not rows:
        return np.zeros((0, *spec.shape), dtype=object if spec.dtype == VLEN_BYTES else np.dtype(spec.dtype))
    return np.stack(rows)
