"""Canonical records whose rows differ in length, assembled with NumPy (no per-record Python step).

A record is built from *pieces* laid end to end; each piece gives every row some bytes:

* ``Const(data)``: the same bytes in every row (tags, feature names);
* ``Varint(values)``: one protobuf varint per row (a length), 1 to 10 bytes;
* ``Block(data)``: ``(rows, w)`` uint8, the same width in every row (float and tensor payloads);
* ``Packed(values, lengths)``: ``(rows, n)`` unsigned 64-bit values as packed varints, each at its own length
  (what protobuf's serializer writes for a packed ``int64_list``);
* ``Ragged(data, starts, lengths)``: row ``i`` is ``data[starts[i]:starts[i] + lengths[i]]``.

Protobuf writes every varint at its minimal length (1 byte per started 7 bits; a negative int64 is its 64-bit two's
complement, 10 bytes), and a length prefix before every nested message; :func:`assemble` does the same, so the
records are the bytes protobuf's own serializer writes. Source: the protobuf encoding guide
(https://protobuf.dev/programming-guides/encoding/, "Base 128 Varints", "Packed Repeated Fields").
"""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np

_SEVEN = [np.uint64(7 * j) for j in range(10)]
_LIMITS = [np.uint64(1 << (7 * k)) for k in range(1, 10)]
_LOOP_BYTES = 48  # mean bytes per row from which a ragged piece is copied row by row (memcpy), not scattered


def varint_length(value: int) -> int:
    """Bytes of the minimal varint of a non-negative int below 2**64 (1 to 10)."""
    return max(1, (int(value).bit_length() + 6) // 7)


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """uint8 array of the same shape: the minimal varint length of each of ``values`` (uint64), 1 to 10."""
    values = np.asarray(values, np.uint64)
    out = np.ones(values.shape, np.uint8)
    if values.size:
        top = varint_length(int(values.max()))
        for limit in _LIMITS[: top - 1]:
            out += values >= limit
    return out


def varint_block(values: np.ndarray, width: int) -> np.ndarray:
    """``(rows, n)`` uint64 values whose varints are all ``width`` bytes -> ``(rows, n * width)`` uint8 packed
    varints (the canonical bytes when every value's minimal length is ``width``)."""
    rows = values.shape[0]
    out = np.empty(values.shape + (width,), np.uint8)
    for j in range(width):
        byte = ((values >> _SEVEN[j]) & np.uint64(0x7F)).astype(np.uint8)
        out[..., j] = byte | 0x80 if j < width - 1 else byte
    return out.reshape(rows, -1)


@dataclasses.dataclass
class Const:
    data: bytes


@dataclasses.dataclass
class Varint:
    values: np.ndarray  # (rows,) uint64


@dataclasses.dataclass
class Block:
    data: np.ndarray  # (rows, w) uint8


@dataclasses.dataclass
class Packed:
    values: np.ndarray  # (rows, n) uint64
    lengths: np.ndarray  # (rows, n) uint8, from varint_lengths


@dataclasses.dataclass
class Ragged:
    data: np.ndarray  # flat uint8
    starts: np.ndarray  # (rows,) int64
    lengths: np.ndarray  # (rows,) int64


def piece_lengths(piece, rows: int) -> np.ndarray:
    """int64 ``(rows,)``: the bytes ``piece`` gives each row."""
    if isinstance(piece, Const):
        return np.full(rows, len(piece.data), np.int64)
    if isinstance(piece, Varint):
        return varint_lengths(piece.values).astype(np.int64)
    if isinstance(piece, Block):
        return np.full(rows, piece.data.shape[1], np.int64)
    if isinstance(piece, Packed):
        return piece.lengths.sum(axis=1, dtype=np.int64)
    return np.asarray(piece.lengths, np.int64)


def len_field(tag: int, pieces: list, inner: np.ndarray) -> tuple[list, np.ndarray]:
    """The pieces of a LEN field (the ``tag`` byte, the varint of ``inner``, then ``pieces``, which give each row
    ``inner`` bytes (int64)) and the field's bytes per row."""
    head = [Const(bytes([tag])), Varint(inner.astype(np.uint64))]
    return head + pieces, inner + 1 + varint_lengths(inner.astype(np.uint64))


def padded_bytes(pieces: list, rows: int) -> tuple[int, int]:
    """``(rows x longest, sum of lengths)``: the bytes :func:`assemble` would allocate and the bytes it holds."""
    total = sum((piece_lengths(p, rows) for p in pieces), np.zeros(rows, np.int64))
    return (int(total.max()) * rows if rows else 0), int(total.sum())


def row_slice(piece, a: int, b: int):
    """``piece`` for rows ``a:b`` only."""
    if isinstance(piece, Varint):
        return Varint(piece.values[a:b])
    if isinstance(piece, Block):
        return Block(piece.data[a:b])
    if isinstance(piece, Packed):
        return Packed(piece.values[a:b], piece.lengths[a:b])
    if isinstance(piece, Ragged):
        return Ragged(piece.data, piece.starts[a:b], piece.lengths[a:b])
    return piece


def assemble(pieces: list, rows: int, lead: int = 0, trail: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Lays ``pieces`` end to end in each of ``rows`` rows.

    Returns ``(block, lengths)``: ``block`` is ``(rows, lead + max(lengths) + trail)`` uint8 whose row ``i`` holds
    its record at ``block[i, lead:lead + lengths[i]]`` (``lead`` and ``trail`` bytes of room around the longest,
    e.g. for TFRecord framing; the other bytes are unset), ``lengths`` int64. Rows are padded to the longest
    so that a fixed-width piece is copied a slice per distinct column offset, not a byte at a time.
    """
    lengths = [piece_lengths(p, rows) for p in pieces]
    total = cast(np.ndarray, sum(lengths)) if lengths else np.zeros(rows, np.int64)
    width = lead + (int(total.max()) if rows else 0) + trail
    block = np.empty((rows, width), np.uint8)
    col = np.full(rows, lead, np.int64)
    for piece, n in zip(pieces, lengths):
        _write(block, col, piece, n)
        col += n
    return block, total


def _write(block: np.ndarray, col: np.ndarray, piece, n: np.ndarray) -> None:
    if isinstance(piece, Const):
        if piece.data:
            _write_columns(block, col, np.frombuffer(piece.data, np.uint8)[None, :])
        return
    if isinstance(piece, Block):
        _write_columns(block, col, piece.data)
        return
    flat = block.reshape(-1)
    pos = np.arange(len(col), dtype=np.int64) * block.shape[1] + col
    if isinstance(piece, Varint):
        _write_varints(flat, pos, piece.values, n)
    elif isinstance(piece, Packed):
        starts = pos[:, None] + (np.cumsum(piece.lengths, axis=1, dtype=np.int64) - piece.lengths)
        _write_varints(flat, starts.reshape(-1), piece.values.reshape(-1), piece.lengths.reshape(-1))
    else:
        _write_ragged(flat, pos, piece.data, np.asarray(piece.starts, np.int64), n)


def _write_varints(out: np.ndarray, pos: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
    """Writes each of ``values`` (uint64) as a varint of its ``lengths`` bytes at ``pos`` of flat ``out``."""
    if not values.size:
        return
    top = int(lengths.max())
    for j in range(top):
        if j:
            keep = np.flatnonzero(lengths > j)
            values, lengths, pos = values[keep], lengths[keep], pos[keep]
        byte = ((values >> _SEVEN[j]) & np.uint64(0x7F)).astype(np.uint8)
        if j < top - 1:
            byte |= (lengths > j + 1).astype(np.uint8) << 7
        out[pos + j] = byte


def _write_columns(block: np.ndarray, col: np.ndarray, data: np.ndarray) -> None:
    """Writes ``data`` (``(rows, w)``, or ``(1, w)``: the same bytes in every row) at column ``col[i]`` of each row
    ``i``: a slice copy per distinct column (few: they differ by the lengths of the varints before)."""
    w = data.shape[1]
    if not w or not len(col):
        return
    lo, hi = int(col.min()), int(col.max())
    if lo == hi:
        block[:, lo : lo + w] = data
        return
    for c in np.flatnonzero(np.bincount(col - lo)).tolist():
        rows_c = np.flatnonzero(col == lo + c)
        block[rows_c, lo + c : lo + c + w] = data if data.shape[0] == 1 else data[rows_c]


def _write_ragged(flat: np.ndarray, pos: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    total = int(lengths.sum())
    if not total:
        return
    if total < _LOOP_BYTES * len(lengths):
        before = np.cumsum(lengths) - lengths
        step = np.arange(total, dtype=np.int64)
        flat[np.repeat(pos - before, lengths) + step] = data[np.repeat(starts - before, lengths) + step]
        return
    for p, s, k in zip(pos.tolist(), starts.tolist(), lengths.tolist()):
        flat[p : p + k] = data[s : s + k]
