"""The layout of a serialized Example as the block decoder sees it (``codec.block``): the *structural* bytes a walk of
the record reads (every tag, length and feature name) and where each feature's values lie. Records of one length
whose structural bytes equal a first record's hold their values at the same offsets: :meth:`Layout.matches` finds
them with one NumPy comparison per byte range over a whole block.

Reference: the protobuf wire format (tags, LEN fields, varints) of ``tf.train.Example`` (example.proto,
feature.proto). NumPy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms.codec.encodings import encoding_of
from tfrecord_etl.transforms.codec.encodings.lists import ListEncoding
from tfrecord_etl.transforms.codec.encodings.packbits import PackbitsEncoding, packed_shape
from tfrecord_etl.transforms.codec.encodings.tensor import TensorEncoding
from tfrecord_etl.transforms.codec.spec import MAX_FEATURES, VLEN_BYTES, FeatureSpec

_KIND_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}  # Feature's oneof fields, LEN wire type


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


def vector_kind(spec: FeatureSpec) -> str | None:
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
        how = vector_kind(spec)
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
