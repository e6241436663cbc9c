"""The CRC32C of framed fixed-width records, combined from the record CRCs the framing already computed, so the
shard checksum of ``metadata.json`` costs no second pass over the data.

CRC32C is linear over GF(2): ``crc(A + B) = crc(A) * x^(8 len(B)) mod P  xor  crc(B)`` (zlib's ``crc32_combine``,
``zlib/crc32.c``: ``multmodp`` and ``x2nmodp``, here with CRC32C's reflected polynomial ``0x82F63B78``). A TFRecord
frame of ``w`` data bytes is ``header (12) + data + masked data CRC (4)``; with the header fixed by ``w``, the CRC of
the frame is ``K(w) xor shift4(d xor m)``, ``d`` the data's CRC and ``m`` its masked CRC (the 4 trailer bytes), and
the CRC of ``n`` frames is the xor of each frame's CRC shifted by the frames after it. :class:`FrameCrcs` keeps,
per width, ``shift(j frames + 4 bytes)`` of each of the 32 bits (one row per frame position), so a batch's CRC is one
NumPy select-and-xor over ``rows x 32`` bits: about 50 ns a record, against about 0.13 s per GB for
``google_crc32c.extend`` over a framed buffer that has left the CPU caches (docs/performance.md). Narrow records
(under :data:`MIN_WIDTH` bytes: many records per MB) are as cheap to checksum with ``extend``, and :func:`frames_crc32c`
returns None for them.
"""

from __future__ import annotations

import struct
import threading

import google_crc32c
import numpy as np

_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected
MIN_WIDTH = 1024  # data bytes per record from which combining is several times cheaper than extend (measured)
MAX_ROWS = 1 << 16  # frame positions kept per width (32 x 4 bytes each: 8 MiB at most)


def multmodp(a: int, b: int) -> int:
    """``a * b mod P`` of two reflected 32-bit polynomials (zlib's ``multmodp``)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) mod P
for _ in range(63):
    _X2N.append(multmodp(_X2N[-1], _X2N[-1]))
_SHIFTS: dict[int, int] = {}  # bytes -> x^(8 bytes) mod P, as asked


def x8n(nbytes: int) -> int:
    """``x^(8 nbytes) mod P``: what multiplies a CRC to append ``nbytes`` bytes after it (zlib's ``x2nmodp``)."""
    p = _SHIFTS.get(nbytes)
    if p is None:
        p, n, k = 1 << 31, nbytes, 3
        while n:
            if n & 1:
                p = multmodp(_X2N[k], p)
            n >>= 1
            k += 1
        if len(_SHIFTS) < 4096:
            _SHIFTS[nbytes] = p
    return p


def combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32C of ``A + B`` from ``crc1`` = CRC32C(A), ``crc2`` = CRC32C(B) and ``len2`` = len(B) in bytes."""
    return multmodp(x8n(len2), crc1) ^ crc2


def _map_of(value: int) -> np.ndarray:
    """The 4 x 256 byte tables of "multiply by ``value`` mod P", a linear map on 32-bit CRCs."""
    basis = np.array([multmodp(value, 1 << b) for b in range(32)], np.uint32)
    byte = np.arange(256)
    tables = np.zeros((4, 256), np.uint32)
    for j in range(4):
        for i in range(8):
            tables[j] ^= np.where((byte >> i) & 1, basis[8 * j + i], 0).astype(np.uint32)
    return tables


def _apply(tables: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The map of :func:`_map_of` applied to each of ``values`` (uint32, any shape)."""
    v = np.asarray(values, np.uint32)
    return tables[0][v & 255] ^ tables[1][(v >> 8) & 255] ^ tables[2][(v >> 16) & 255] ^ tables[3][v >> 24]


class FrameCrcs:
    """For one record width ``w`` (frames of ``L = w + 16`` bytes): ``rows[j, b]`` = bit ``b`` shifted by ``j``
    frames and 4 bytes, and ``constant[n]`` = the CRC of ``n`` frames whose records' ``d xor m`` are all 0 (the
    headers' and trailers' fixed part). Both grow by doubling: position ``m + j`` is position ``j`` shifted by ``m``
    frames."""

    def __init__(self, width: int):
        self.frame = width + 16
        length = struct.pack("<Q", width)
        crc = google_crc32c.value(length)
        header = length + struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
        k = multmodp(x8n(width + 4), google_crc32c.value(header)) ^ google_crc32c.value(b"\0" * 4)
        self.rows = _apply(_map_of(x8n(4)), 1 << np.arange(32, dtype=np.uint32))[None, :]
        self.constant = np.array([0, k], np.uint32)

    def grow(self, n: int) -> None:
        """Keeps at least ``n`` frame positions."""
        while len(self.rows) < n:
            m = len(self.rows)
            tables = _map_of(x8n(m * self.frame))
            self.rows = np.concatenate([self.rows, _apply(tables, self.rows)])
            self.constant = np.concatenate([self.constant, self.constant[m] ^ _apply(tables, self.constant[1 : m + 1])])


_TABLES: dict[int, FrameCrcs] = {}
_LOCK = threading.Lock()


def frames_crc32c(width: int, data_crcs: np.ndarray, masked: np.ndarray) -> int | None:
    """The CRC32C of ``n`` framed records of ``width`` data bytes each (``tfrecord.frame_fixed``'s output), from
    their data CRCs and masked data CRCs (``n`` unsigned ints each): what ``google_crc32c.value`` of the framed bytes
    gives, without reading them. None when ``width`` is under :data:`MIN_WIDTH` or ``n`` over :data:`MAX_ROWS`
    (``extend`` over the bytes is then as cheap or cheaper)."""
    n = len(data_crcs)
    if width < MIN_WIDTH or n > MAX_ROWS:
        return None
    if n == 0:
        return 0
    with _LOCK:
        table = _TABLES.get(width)
        if table is None:
            table = _TABLES[width] = FrameCrcs(width)
        table.grow(n)
        rows, constant = table.rows, table.constant  # grow replaces them: these stay whole
    h = (np.asarray(data_crcs, np.uint64) ^ np.asarray(masked, np.uint64)).astype(np.uint32)[::-1]
    bits = (h[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    return int(np.bitwise_xor.reduce((rows[:n] * bits).ravel()) ^ constant[n])
