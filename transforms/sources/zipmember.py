"""A zip archive's member read from the middle, as the ``.npz`` source reads one: the archive offset of the member's
data (after its local file header) and a forkable inflater over its deflated bytes, which checks the member's
CRC-32 as ``zipfile`` does.

Reference: PKWARE's APPNOTE.TXT (the .ZIP file format specification: 4.3.7 the local file header, 4.4.5 deflate);
RFC 1951 (raw deflate, ``zlib.decompressobj(-zlib.MAX_WBITS)``).
"""

from __future__ import annotations

import copy
import struct
import zipfile
import zlib

from tfrecord_etl.transforms.errors import SourceError


class Inflater:
    """A forward stream over a deflated zip member's bytes that can be forked (the zlib state is copied).

    Fortran-order members keep one per column: the stream of column ``c`` is forked from column
    ``c - 1``'s, so reading ranges in order decompresses the member at most twice (the fork chain passes
    every column once, then each column's own stream) whatever the number of columns (a fresh
    decompressor per column would skip ``c`` columns each: ``ncols / 2`` passes). A seek backwards
    restarts from the member's start. The stream that reaches the member's end has passed every byte
    and checks the zip CRC-32 (BadZipFile), as zipfile does. Memory: the zlib window (32 KB) and one
    compressed chunk (64 KB) per stream.
    """

    CHUNK = 64 * 1024

    def __init__(self, raw, start: int, compress_size: int, size: int, crc: int):
        self._raw, self._start, self._csize, self._size, self._crc = raw, start, compress_size, size, crc
        self._reset()

    def _reset(self) -> None:
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        self._cpos, self._pos, self._tail, self._running = 0, 0, b"", 0

    def fork(self) -> Inflater:
        new = copy.copy(self)
        new._d = self._d.copy()
        return new

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._tail = b""

    def _produce(self, n: int) -> bytes:
        """Up to ``n`` (> 0) more bytes; b"" at the member's end."""
        while not self._d.eof:
            if not self._tail:
                if self._cpos >= self._csize:
                    break
                self._raw.seek(self._start + self._cpos)
                self._tail = self._raw.read(min(self.CHUNK, self._csize - self._cpos))
                if not self._tail:
                    raise EOFError("the archive ends inside the member's compressed data")
                self._cpos += len(self._tail)
            out = self._d.decompress(self._tail, n)
            self._tail = self._d.unconsumed_tail
            if out:
                self._pos += len(out)
                self._running = zlib.crc32(out, self._running)
                if self._pos >= self._size and self._running != self._crc:  # every byte passed this stream
                    raise zipfile.BadZipFile("Bad CRC-32 of the member's data: the archive is corrupt")
                return out
        return b""

    def read(self, n: int) -> bytes:
        n = max(0, min(n, self._size - self._pos))
        parts = []
        while n > 0:
            out = self._produce(n)
            if not out:
                break
            parts.append(out)
            n -= len(out)
        return b"".join(parts)

    def seek(self, target: int) -> int:
        if target < self._pos:
            self._reset()
        while self._pos < min(target, self._size):
            if not self._produce(min(target - self._pos, 2**20)):
                break
        return self._pos


def member_data_start(stream, info: zipfile.ZipInfo, path: str) -> int:
    """Archive offset of a member's (stored or compressed) data: after its local header (30 bytes, name, extra)."""
    stream.seek(info.header_offset)
    local = stream.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise SourceError(
            "Bad local header of a member",
            file=path,
            member=info.filename[:-4],
            offset=info.header_offset,
            hint="the archive is corrupt",
        )
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len
