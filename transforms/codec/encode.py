"""Encoding a batch of rows into serialized Examples: the fixed-layout block and the tfx_bsl path."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tfrecord_etl.transforms.codec import assemble
from tfrecord_etl.transforms.codec.arrow import pa
from tfrecord_etl.transforms.codec.columns import arrow_columns, fixed_entry
from tfrecord_etl.transforms.codec.encodings import encoding_of
from tfrecord_etl.transforms.codec.spec import MAX_RECORD_BYTES, FeatureSpec
from tfrecord_etl.transforms.codec.wire import encode_varint, length_delimited_field
from tfrecord_etl.transforms.errors import RecordError, SchemaError

FRAME_LEAD, FRAME_TRAIL = 12, 4  # a TFRecord frame's bytes before a record (length, its CRC) and after (data CRC)


@dataclasses.dataclass
class FixedLayout:
    """The fixed-layout part of a batch, not yet assembled: every row is ``head`` followed, for each
    entry ``(prefix, data)``, by the constant ``prefix`` bytes and the row's ``data`` bytes.

    Attributes:
      head: the Example's ``features`` field tag and length (the same for every row).
      entries: ``(prefix bytes, (rows, n) uint8 data)`` per fixed-layout feature, in map order.
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
        out[:, : len(self.head)] = np.frombuffer(self.head, np.uint8)
        pos = len(self.head)
        for prefix, data in self.entries:
            out[:, pos : pos + len(prefix)] = np.frombuffer(prefix, np.uint8)
            pos += len(prefix)
            out[:, pos : pos + data.shape[1]] = data
            pos += data.shape[1]


@dataclasses.dataclass
class EncodedBatch:
    """A batch of serialized Examples, kept in a form that frames without a per-record Python step.

    Attributes:
      layout: the fixed-layout features (fixed-shape ``tensor`` features and fixed-shape numeric lists),
        entries in map order (:func:`map_order`), so every row has the same layout and only the data bytes
        differ. It is
        assembled only when asked: :attr:`block` makes a ``(rows, width)`` array, and
        ``tfrecord.frame_encoded`` fills the data columns of the framed buffer directly (one copy).
      tails: None, or per row more bytes appended to the block row (concatenated Examples are one
        Example, protobuf's merge); the codec itself no longer makes them.
      parts: None, or consecutive runs of rows, each a batch of its own (rows whose integers have one varint
        length per run: sorted ids, timestamps); :attr:`layout` then has no entries.
      padded: None, or ``(block, lengths)`` when rows differ in length (int64 varints of several lengths,
        byte lists, varying shapes): row ``i``'s record is ``block[i, FRAME_LEAD:FRAME_LEAD + lengths[i]]``,
        with room for the TFRecord frame's header before it and its CRC after it (``tfrecord`` frames the
        block in place); :attr:`layout` then has no entries.
    """

    layout: FixedLayout
    tails: list[bytes] | None = None
    padded: tuple[np.ndarray, np.ndarray] | None = None
    parts: list[EncodedBatch] | None = None

    @classmethod
    def joined(cls, parts: list[EncodedBatch]) -> EncodedBatch:
        """The batch of ``parts``' rows, in order (runs of rows of one layout each, see :func:`encode_columns`)."""
        return cls(FixedLayout(b"", [], sum(p.num_rows for p in parts)), parts=parts)

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

    def lengths(self) -> np.ndarray:
        """int64 ``(rows,)``: the bytes of each serialized Example."""
        if self.parts is not None:
            return np.concatenate([p.lengths() for p in self.parts]) if self.parts else np.zeros(0, np.int64)
        if self.padded is not None:
            return self.padded[1]
        out = np.full(self.num_rows, self.width, np.int64)
        return out if self.tails is None else out + np.fromiter(map(len, self.tails), np.int64, self.num_rows)

    def records(self) -> list[bytes]:
        """The serialized Examples, one bytes object per row."""
        if self.parts is not None:
            return [r for p in self.parts for r in p.records()]
        if self.padded is not None:
            block, lengths = self.padded
            return [row[FRAME_LEAD : FRAME_LEAD + n].tobytes() for row, n in zip(block, lengths.tolist())]
        rows = [r.tobytes() for r in self.block] if self.width else [b""] * self.num_rows
        return rows if self.tails is None else [a + b for a, b in zip(rows, self.tails)]

    def record_views(self) -> tuple[EncodedBatch, list]:
        """The serialized Examples as buffers, without a copy per record where the batch allows it: ``(batch,
        views)``, ``views[i]`` row ``i``'s record (a C-contiguous uint8 row of an assembled block, or bytes) and
        ``batch`` the same rows in a form whose records are those views (a fixed-layout batch is assembled once
        into a block, which :meth:`take` then slices instead of assembling again). For hashing records
        (``splits.SplitPlan.assign_records``) before writing them."""
        if self.parts is not None:
            pairs = [p.record_views() for p in self.parts]
            return EncodedBatch.joined([b for b, _ in pairs]), [v for _, views in pairs for v in views]
        if self.padded is not None:
            block, lengths = self.padded
            return self, [row[FRAME_LEAD : FRAME_LEAD + n] for row, n in zip(block, lengths.tolist())]
        if self.tails is None and self.width:
            block = self.block
            return EncodedBatch(FixedLayout(b"", [(b"", block)], self.num_rows)), list(block)
        records = self.records()
        return EncodedBatch(FixedLayout(b"", [], self.num_rows), tails=records), records

    def take(self, rows: np.ndarray) -> EncodedBatch:
        """The batch of rows ``rows`` (int64 positions, ascending), in that order; the data is copied."""
        rows = np.asarray(rows, np.int64)
        if self.parts is not None:
            out, start = [], 0
            for part in self.parts:
                mine = rows[(rows >= start) & (rows < start + part.num_rows)] - start
                if mine.size:
                    out.append(part.take(mine))
                start += part.num_rows
            return EncodedBatch.joined(out)
        if self.padded is not None:
            block, lengths = self.padded
            return EncodedBatch(FixedLayout(b"", [], len(rows)), padded=(block[rows], lengths[rows]))
        layout = FixedLayout(self.layout.head, [(p, d[rows]) for p, d in self.layout.entries], len(rows))
        tails = None if self.tails is None else [self.tails[i] for i in rows.tolist()]
        return EncodedBatch(layout, tails)


def encode_batch(
    columns: Mapping[str, Any], specs: Sequence[FeatureSpec], num_rows: int, allow_lossy: Iterable[str] = ()
) -> list[bytes]:
    """Encodes ``num_rows`` rows as serialized Examples; see :func:`encode_columns`."""
    return encode_columns(columns, specs, num_rows, allow_lossy).records()


def encode_columns(
    columns: Mapping[str, Any], specs: Sequence[FeatureSpec], num_rows: int, allow_lossy: Iterable[str] = ()
) -> EncodedBatch:
    """Encodes ``num_rows`` rows as serialized Examples, vectorized over the batch.

    Every record is the bytes of protobuf's own serializer, ``tf.train.Example.SerializeToString(
    deterministic=True)`` of the same values: minimal varints (each int64 at its own length), packed lists, and
    the feature map's entries in the order of :func:`map_order`. (Without ``deterministic=True`` protobuf
    writes the entries in hash-table order, which changes from process to process; the entries' bytes and the
    record's length are the same.)

    When every row's bytes count is the same (fixed-shape features whose int64 varints all have one length in
    the batch), the batch is a :class:`FixedLayout`: the protobuf headers are the same for every row, so only
    the data columns differ; it is assembled with NumPy straight into the framed buffer by
    ``tfrecord.frame_encoded``, or into a block on demand. Otherwise the records are laid out row by row with
    NumPy (:mod:`.assemble`) and returned as ``tails``; features whose shape or dtype varies go through
    tfx_bsl's C++ ``RecordBatchToExamplesEncoder`` first, one feature per call.

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

    entries = _entries(columns, specs, num_rows, allow_lossy)
    runs = _uniform_runs(entries, num_rows)
    if runs is not None:  # a few runs of rows, each of one layout: the fixed-layout writer per run
        return EncodedBatch.joined(
            [encode_columns({s.name: columns[s.name][a:b] for s in specs}, specs, b - a, allow_lossy) for a, b in runs]
        )
    if not all(isinstance(e, tuple) for _, e in entries):
        return _row_by_row(entries, num_rows)
    layout = _fixed_layout([e for _, e in entries], num_rows)
    if layout.width > MAX_RECORD_BYTES:
        raise RecordError("An Example is over protobuf's 2 GB limit", hint="split the array into smaller rows")
    return EncodedBatch(layout, None, None)


def _entries(columns: Mapping[str, Any], specs: Sequence[FeatureSpec], num_rows: int, allow_lossy) -> list:
    """``[(name, entry)]`` in map order (:func:`map_order`): a fixed-layout ``(prefix, data)``, packed int64
    varints (:class:`.assemble.Packed`), or the per-row bytes of one-feature Examples from tfx_bsl's C++ encoder."""
    from tfx_bsl.coders import example_coder  # C++; no TensorFlow import

    entries = []
    for spec in specs:
        if spec.name not in columns:
            raise SchemaError(f"Missing column for feature '{spec.name}'")
        encoding = encoding_of(spec)
        encoding.check(spec, allow_lossy)
        entry = fixed_entry(spec, encoding, columns[spec.name], num_rows)
        if entry is not None:
            entries.append((spec.name, entry))
            continue
        for name, arr in arrow_columns(spec, encoding, columns[spec.name], num_rows):
            part = example_coder.RecordBatchToExamplesEncoder().encode(pa.RecordBatch.from_arrays([arr], [name]))
            entries.append((name, part))
    entries.sort(key=lambda e: map_order(e[0]))
    return entries


def _row_by_row(entries: list, num_rows: int) -> EncodedBatch:
    """The records of ``entries`` laid out row by row with NumPy (:mod:`.assemble`): one padded block with the
    frames' room, or (rows of very different lengths) the records' bytes."""
    pieces = _record_pieces(entries, num_rows)
    layout, padded, tails = _fixed_layout([], num_rows), None, None
    block_bytes, held = assemble.padded_bytes(pieces, num_rows)
    if block_bytes <= 2 * held + (16 << 20):
        padded = assemble.assemble(pieces, num_rows, FRAME_LEAD, FRAME_TRAIL)
        largest = int(padded[1].max()) if num_rows else 0
    else:  # rows of very different lengths (a few long strings): padding them all would waste memory
        tails = _unpadded(pieces, num_rows)
        largest = max(map(len, tails), default=0)
    if largest > MAX_RECORD_BYTES:
        raise RecordError("An Example is over protobuf's 2 GB limit", hint="split the array into smaller rows")
    return EncodedBatch(layout, tails, padded)


def _unpadded(pieces: list, num_rows: int) -> list[bytes]:
    """The records of ``pieces`` as bytes, assembled in runs of rows whose padded block stays small."""
    out, a = [], 0
    lengths = sum((assemble.piece_lengths(p, num_rows) for p in pieces), np.zeros(num_rows, np.int64)).tolist()
    while a < num_rows:
        b, longest, held = a, 0, 0
        while b < num_rows and max(longest, lengths[b]) * (b - a + 1) <= max(2 * (held + lengths[b]), 16 << 20):
            longest, held = max(longest, lengths[b]), held + lengths[b]
            b += 1
        b = max(b, a + 1)
        block, n = assemble.assemble([assemble.row_slice(p, a, b) for p in pieces], b - a)
        out += [row[:k].tobytes() for row, k in zip(block, n.tolist())]
        a = b
    return out


MAX_RUNS = 16  # runs of rows of one layout from which a batch is laid out row by row instead (see _uniform_runs)


def _uniform_runs(entries, num_rows: int) -> list[tuple[int, int]] | None:
    """``[(start, stop), ...]``: at most :data:`MAX_RUNS` runs of consecutive rows covering the batch, in each of
    which every packed int64 feature's varints have one length (ids in order: 1, 2, then 3 bytes), so each run
    is a fixed layout; None when the batch has other variable parts, or too many runs."""
    if num_rows < 2 or not all(isinstance(e, (tuple, assemble.Packed)) for _, e in entries):
        return None
    keys = []
    for _, entry in entries:
        if isinstance(entry, assemble.Packed):
            low, high = entry.lengths.min(axis=1), entry.lengths.max(axis=1)
            if (low != high).any():
                return None
            keys.append(low)
    if not keys:
        return None
    change = np.zeros(num_rows - 1, bool)
    for k in keys:
        change |= k[1:] != k[:-1]
    cuts = (np.flatnonzero(change) + 1).tolist()
    if len(cuts) >= MAX_RUNS:
        return None
    return list(zip([0] + cuts, cuts + [num_rows]))


def map_order(name: str) -> bytes:
    """The sort key of the feature map's entries in a record: the order of protobuf's deterministic serialization
    (``SerializeToString(deterministic=True)`` with the upb backend, protobuf's default for Python since 4.21):
    ascending by UTF-8 bytes, and a name before any name it is a prefix of comes *after* it (``"x/shape"`` before
    ``"x"``), as upb's map sorter orders string keys (``upb/message/internal/map_sorter``: a descending byte
    compare, emitted backwards). UTF-8 never holds the byte 0xFF, so it serves as the end marker."""
    return name.encode("utf-8") + b"\xff"


def _record_pieces(entries, num_rows: int) -> list:
    """The :mod:`.assemble` pieces of whole records from ``entries`` (see :func:`encode_columns`)."""
    pieces, total = [], np.zeros(num_rows, np.int64)
    for name, entry in entries:
        if isinstance(entry, tuple):  # (prefix, data): the same bytes count in every row
            prefix, data = entry
            pieces += [assemble.Const(prefix), assemble.Block(data)]
            total += len(prefix) + data.shape[1]
        elif isinstance(entry, assemble.Packed):
            field, n = _packed_entry(name, entry, num_rows)
            pieces += field
            total += n
        else:  # one-feature Examples (tfx_bsl): their Features' map entry field, after the Example's own header
            lengths = np.fromiter(map(len, entry), np.int64, num_rows)
            head = _header_lengths(lengths)
            starts = np.cumsum(lengths) - lengths + head
            data = np.frombuffer(b"".join(entry), np.uint8)
            pieces.append(assemble.Ragged(data, starts, lengths - head))
            total += lengths - head
    return [assemble.Const(b"\x0a"), assemble.Varint(total.astype(np.uint64))] + pieces


def _packed_entry(name: str, packed, num_rows: int) -> tuple[list, np.ndarray]:
    """The pieces of ``Features.feature`` map entry ``name`` -> ``Feature{int64_list{packed}}`` and its bytes per
    row: ``0A len {0A len name, 12 len {1A len {0A len varints}}}``."""
    piece: list = [packed]
    n = packed.lengths.sum(axis=1, dtype=np.int64)
    for tag in (0x0A, 0x1A, 0x12):  # Int64List.value, Feature.int64_list, MapEntry.value
        piece, n = assemble.len_field(tag, piece, n)
    key = length_delimited_field(1, name.encode("utf-8"))
    return assemble.len_field(0x0A, [assemble.Const(key)] + piece, n + len(key))


def _header_lengths(lengths: np.ndarray) -> np.ndarray:
    """Bytes of the ``0A`` tag and length varint that start Examples of ``lengths`` bytes (0 for empty ones)."""
    head = np.zeros(lengths.shape, np.int64)
    for h in range(5, 0, -1):
        inner = np.maximum(lengths - 1 - h, 0).astype(np.uint64)
        head[(lengths > 0) & (assemble.varint_lengths(inner) == h)] = 1 + h
    return head


def _fixed_layout(entries, num_rows: int) -> FixedLayout:
    """One Example per row from fixed-layout entries, not yet assembled."""
    features_len = sum(len(p) + d.shape[1] for p, d in entries)
    head = encode_varint(1 << 3 | 2) + encode_varint(features_len) if entries else b""
    return FixedLayout(head, list(entries), num_rows)
