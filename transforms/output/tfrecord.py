"""TFRecord framing, read and written a batch at a time; pure Python over file objects (no Beam, no TF).

A TFRecord file is a sequence of frames (tensorflow/core/lib/io/record_writer.cc)::

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

with ``masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32)``. A whole file may be wrapped
in a GZIP or ZLIB stream. CRCs come from google-crc32c's C implementation; Beam's pure-Python crcmod
fallback is far too slow (apache/beam#33407), so :func:`require_fast_crc32c` refuses to start without it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

from tfrecord_etl.transforms import checksum, compression as backends
from tfrecord_etl.transforms.errors import RecordError, SourceError
from tfrecord_etl.transforms.output import framing
from tfrecord_etl.transforms.output.framing import (  # noqa: F401 - framing's names, used here and by others
    foreign_format,
    frame_block,
    frame_encoded,
    frame_fixed,
    frame_padded,
    frame_records,
    index_name,
    index_text,
    masked_crc,
    parse_index,
    require_fast_crc32c,
    scan_frames,
    unframe,
)

COMPRESSIONS = ("none", "gzip", "zlib")
# Shard suffixes written. zlib shards end in .deflate, the name Apache Beam gives the same format
# (CompressionTypes.DEFLATE) and detects with CompressionTypes.AUTO, so ReadFromTFRecord, TFDV and TFX ImportExampleGen
# read them as they are; .zlib and .zz (older outputs) are still read as zlib.
SUFFIXES = {"none": "", "gzip": ".gz", "zlib": ".deflate"}
ZLIB_SUFFIXES = (".deflate", ".zlib", ".zz")


def compression_from_path(path: str) -> str:
    """``'gzip'`` for ``*.gz``, ``'zlib'`` for ``*.deflate``/``*.zlib``/``*.zz``, else ``'none'``."""
    if path.endswith(".gz"):
        return "gzip"
    if path.endswith(ZLIB_SUFFIXES):
        return "zlib"
    return "none"


def detect_compression(head: bytes) -> str:
    """Guesses the compression from a file's first bytes: a valid frame header wins over magic bytes."""
    if len(head) >= 12:
        _length, crc = framing.HEADER.unpack_from(head)
        if masked_crc(head[:8]) == crc:
            return "none"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return "none"


def open_decompressed(raw: BinaryIO | ChecksumReader, compression: str, backend: str | None = None) -> BinaryIO:
    """Wraps a binary stream for reading with ``compression`` (``none``, ``gzip`` or ``zlib``), decompressed
    through the compression backend ``backend`` (a name; None: ``compression.get()``'s choice, ISA-L when
    installed). Any backend reads the streams of any other."""
    if compression == "gzip":
        return backends.get(backend).open_gzip(raw)
    if compression == "zlib":
        return backends.get(backend).open_zlib(raw)
    return raw


def crc32c_hex(crc: int) -> str:
    """A CRC32C as metadata.json records it: 8 lower-case hex digits, most significant first (as
    ``google_crc32c.Checksum.hexdigest`` and GCS's ``crc32c`` in hex)."""
    return f"{crc:08x}"


def _readonly_bytes(data):
    """``data`` as google-crc32c takes it (its C functions refuse memoryviews): bytes as they are, any other
    buffer as a uint8 NumPy view of the same memory (no copy)."""
    return data if type(data) is bytes else np.frombuffer(data, np.uint8)


class ChecksumWriter:
    """A write-only stream that passes every write to ``raw`` and extends the CRC32C (``crc``, an int) and the
    count (``bytes``) of the bytes written with it: the checksum of a file as written, computed while it is written
    (``google_crc32c.extend``), never by reading it again. A write may bring the CRC32C of its bytes
    (``crc``: fixed-width frames, from their record CRCs, ``checksum.frames_crc32c``); it is then combined in
    (``checksum.combine``) instead of the bytes being read once more."""

    def __init__(self, raw: BinaryIO):
        self._raw, self.crc, self.bytes = raw, 0, 0

    def write(self, data, crc: int | None = None) -> int:
        view = _readonly_bytes(data)
        self._raw.write(data)
        if crc is None:
            self.crc = google_crc32c.extend(self.crc, view)
        else:
            self.crc = checksum.combine(self.crc, crc, len(view))
        self.bytes += len(view)
        return len(view)

    def flush(self) -> None:
        self._raw.flush()


class ChecksumReader:
    """A read-only stream over ``raw`` that counts (``bytes``) the bytes read through it and extends their CRC32C
    (``crc``, an int; :attr:`crc32c` as 8 hex digits) with them: the checksum of the stored bytes (compressed as
    stored) folded into the pass that reads a file."""

    def __init__(self, raw: BinaryIO):
        self._raw, self.crc, self.bytes = raw, 0, 0
        self.mode, self.name = "rb", getattr(raw, "name", "")

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read() if n is None or n < 0 else self._raw.read(n)
        if data:
            self.crc = google_crc32c.extend(self.crc, _readonly_bytes(data))
            self.bytes += len(data)
        return data

    def readinto(self, b) -> int:
        """Reads into the buffer ``b`` (what ISA-L's and zlib-ng's gzip readers call); returns the count."""
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def drain(self) -> None:
        """Reads (and counts) the rest of the stream: the bytes after the last frame (a gzip trailer) count too."""
        while self.read(READ_CHUNK):
            pass

    @property
    def crc32c(self) -> str:
        return crc32c_hex(self.crc)


class ShardWriter:
    """Writes framed records to a binary stream, compressed as asked; counts records and bytes.

    ``write_batch`` frames and writes a whole batch in one call. ``close`` flushes the compressor
    but does not close the underlying stream. With ``index``, the data length of every record is kept
    (8 bytes per record) for :meth:`index_text`. The bytes written to the stream (compressed ones for gzip and
    zlib) are counted (:attr:`bytes_out`) and checksummed (:attr:`crc32c`) as they are written, through a
    :class:`ChecksumWriter`: the shard's size and CRC32C in metadata.json without a second pass over the file.
    """

    def __init__(
        self,
        raw: BinaryIO,
        compression: str = "none",
        index: bool = False,
        level: int | None = None,
        backend: str | None = None,
    ):
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
        raw = self._out = ChecksumWriter(raw)
        self._raw, self._compression = raw, compression
        self._lengths: list[np.ndarray] | None = [] if index else None
        # gzip/zlib through the backend (compression.StreamCompressor): the gzip header has no file name and
        # mtime 0, so the same records, level and backend give byte-identical files.
        self._z = (
            backends.StreamCompressor(raw, compression, backends.get(backend), level) if compression != "none" else None
        )
        self.records = 0
        self.bytes_in = 0

    def write_batch(self, records: list[bytes]) -> None:
        """Frames and writes ``records``."""
        if self._lengths is not None:
            self._lengths.append(np.fromiter(map(len, records), np.int64, len(records)))
        self._write(frame_records(records), len(records))

    def write_encoded(self, batch) -> None:
        """Frames and writes a ``codec.EncodedBatch``; fixed-layout batches are framed without a
        per-record Python object."""
        if batch.parts is not None:
            for part in batch.parts:
                self.write_encoded(part)
            return
        if batch.tails is None and batch.padded is None:
            if self._lengths is not None:
                self._lengths.append(np.full(batch.num_rows, batch.width, np.int64))
            framed, crcs, masked = framing.framed(batch.num_rows, batch.width, batch.layout.fill)
            crc = checksum.frames_crc32c(batch.width, crcs, masked) if self._compression == "none" else None
            self._write(memoryview(framed).cast("B"), batch.num_rows, crc)
        elif batch.padded is not None:
            if self._lengths is not None:
                self._lengths.append(batch.padded[1].copy())
            self._write(memoryview(frame_padded(*batch.padded)), batch.num_rows)
        else:
            self.write_batch(batch.records())

    def index_text(self) -> bytes:
        """The ``tfrecord2idx`` index of the records written so far (see :func:`index_text`); offsets count
        bytes of the uncompressed stream. Raises ValueError when the writer was made without ``index``."""
        if self._lengths is None:
            raise ValueError("ShardWriter(index=False) keeps no record lengths")
        return index_text(np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64))

    def _write(self, data, count: int, crc: int | None = None) -> None:
        self.records += count
        self.bytes_in += len(data)
        if self._z is not None:
            self._z.write(data)
        else:
            self._raw.write(data, crc)

    def close(self) -> None:
        if self._z is not None:
            self._z.finish()

    @property
    def bytes_out(self) -> int:
        """Bytes written to the stream so far (the file's size once :meth:`close` ran)."""
        return self._out.bytes

    @property
    def crc32c(self) -> str:
        """CRC32C of the bytes written to the stream so far (8 hex digits; the whole file's once closed)."""
        return crc32c_hex(self._out.crc)


READ_ERRORS = (OSError, EOFError, MemoryError, OverflowError, *backends.all_errors())
READ_CHUNK = 1 << 22  # bytes read at a time by iter_records (4 MiB)
MAX_RECORD_MB = 1024.0  # default limit on one record's length header (--max_record_mb); protobuf's own is 2 GB


def record_limit(max_record_mb: float | None = None) -> int:
    """The record size limit in bytes of ``max_record_mb`` (MiB; None: :data:`MAX_RECORD_MB`)."""
    return int((MAX_RECORD_MB if max_record_mb is None else max_record_mb) * 2**20)


def check_regular(path: str) -> None:
    """Raises SourceError when local ``path`` exists and is not a regular file (a FIFO, device, socket or
    directory): such a file is never opened, as reading it may block forever or never end. Remote paths
    (``gs://``, ``s3://``, any ``scheme://``) pass."""
    if "://" in path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # a missing file is reported by whoever opens it
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a character device"
            if stat.S_ISCHR(mode)
            else "a block device"
            if stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a directory"
            if stat.S_ISDIR(mode)
            else "not a regular file"
        )
        raise SourceError(
            f"Not a regular file ({kind}): not read", file=path, hint="TFRecord inputs must be regular files"
        )


def check_record_size(size: int, limit: int, **context) -> None:
    """Raises RecordError when a record of ``size`` bytes is over ``limit`` bytes (``context``: file, record...)."""
    if size > limit:
        raise RecordError(
            f"Record of {size} bytes ({size / 2**20:.1f} MB) is over the record size limit of "
            f"{limit} bytes (--max_record_mb {limit / 2**20:g})",
            hint="raise --max_record_mb if the file is trusted (protobuf's own limit is 2 GB)",
            **context,
        )


COMPRESSION_HINT = "check the compression (gzip/zlib/none) of this file"
CUT_HINT = "the file was cut short; rewrite it"


def read_error(message: str, path: str, index: int, offset: int, hint: str | None = None) -> RecordError:
    """The RecordError of :func:`iter_records` for the record ``index`` at byte ``offset`` of ``path``."""
    return RecordError(message, file=path, record=index, offset=offset, hint=hint)


def _cut_short(message: str, path: str, index: int, offset: int) -> RecordError:
    """The RecordError of :func:`iter_records` for a stream that ends inside a frame."""
    return RecordError(message, file=path, record=index, offset=offset, hint=CUT_HINT)


def _length_crc_error(head, path: str, index: int, offset: int) -> RecordError:
    """The error for a frame header whose length CRC fails: at offset 0 of a file that starts like another
    format (:func:`foreign_format`), that it is not a TFRecord file; else corrupt data or a wrong compression."""
    known = foreign_format(bytes(head)) if offset == 0 else None
    if known:
        return RecordError(
            f"Not a TFRecord file: it starts like {known}",
            file=path,
            hint="convert arrays with tfrecord-etl convert --input FILE; inspect and verify read TFRecord outputs",
        )
    return read_error("Length CRC mismatch: corrupt data or wrong compression", path, index, offset, COMPRESSION_HINT)


def _fill(stream: BinaryIO, buf: bytes, pos: int, need: int, chunk: int, eof: bool) -> tuple[bytes, int, bool]:
    """``(buffer, 0, eof)``: ``buf[pos:]`` followed by reads of ``stream`` (``chunk`` bytes or more at a time) until
    it holds at least ``need`` bytes, or all that is left of the stream (then ``eof`` is True)."""
    parts, have = [buf[pos:]], len(buf) - pos
    while have < need and not eof:
        more = stream.read(max(chunk, need - have))
        if not more:
            eof = True
            break
        parts.append(more)
        have += len(more)
    return b"".join(parts), 0, eof


def iter_records(
    stream: BinaryIO,
    path: str = "<stream>",
    check_crc: bool = True,
    chunk: int = READ_CHUNK,
    max_record_bytes: int | None = None,
) -> Iterator[tuple[int, int, bytes]]:
    """Yields ``(record index, byte offset, record bytes)`` for each frame of an uncompressed stream.

    Offsets count bytes of the decompressed stream. The stream is read ``chunk`` bytes at a time (a record longer
    than that in one read of its own size) and frames are cut from the buffer, so the cost per record is two C CRC
    calls and a slice, not several ``read`` calls; the stream is read past the last frame it yields. Each length
    header is checked against ``max_record_bytes`` (default :func:`record_limit`, 1024 MB) before its record is
    read or decompressed, so a header that lies (a huge length over a short or compressed body) costs no memory.

    Raises:
      RecordError: a truncated frame, a CRC mismatch, or a record over the size limit, naming the file, record
        index and byte offset.
    """
    limit = record_limit() if max_record_bytes is None else max_record_bytes
    buf, pos, index, offset, eof = b"", 0, 0, 0, False
    unpack_header, unpack_crc, value = framing.HEADER.unpack_from, framing.CRC.unpack_from, google_crc32c.value
    mask_delta, checked_header = framing.MASK_DELTA, None  # the last header whose length CRC matched (often reused)
    while True:
        if len(buf) - pos < 12:
            try:
                buf, pos, eof = _fill(stream, buf, pos, 12, chunk, eof)
            except READ_ERRORS as e:
                raise read_error(f"Cannot decompress: {e}", path, index, offset, COMPRESSION_HINT) from None
            if len(buf) == pos:
                return
            if len(buf) - pos < 12:
                raise _cut_short(f"Truncated record header ({len(buf) - pos} of 12 bytes)", path, index, offset)
        length, length_crc = unpack_header(buf, pos)
        header = buf[pos : pos + 12]
        if check_crc and header != checked_header:
            if masked_crc(header[:8]) != length_crc:
                raise _length_crc_error(buf[pos : pos + 2056], path, index, offset)
            checked_header = header
        if length > limit:
            check_record_size(length, limit, file=path, record=index, offset=offset)
        end = pos + 12 + length
        if len(buf) < end + 4:
            try:
                buf, pos, eof = _fill(stream, buf, pos, 16 + length, chunk, eof)
            except READ_ERRORS as e:
                raise read_error(f"Cannot read record of {length} bytes: {e}", path, index, offset) from None
            end = pos + 12 + length
            if len(buf) < end + 4:
                got = min(length, max(0, len(buf) - pos - 12))
                raise _cut_short(f"Truncated record: {got} of {length} data bytes", path, index, offset)
        data = buf[pos + 12 : end]
        if check_crc:
            crc = value(data)
            if (((crc >> 15) | (crc << 17)) + mask_delta) & 0xFFFFFFFF != unpack_crc(buf, end)[0]:
                raise RecordError("Data CRC mismatch: the record is corrupt", file=path, record=index, offset=offset)
        yield index, offset, data
        index += 1
        offset += 16 + length
        pos = end + 4
