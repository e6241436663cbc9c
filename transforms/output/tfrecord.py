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
import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

from tfrecord_etl.transforms import checksum, compression as backends
from tfrecord_etl.transforms.errors import RecordError, SourceError

COMPRESSIONS = ("none", "gzip", "zlib")
# Shard suffixes written. zlib shards end in .deflate, the name Apache Beam gives the same format
# (CompressionTypes.DEFLATE) and detects with CompressionTypes.AUTO, so ReadFromTFRecord, TFDV and TFX ImportExampleGen
# read them as they are; .zlib and .zz (older outputs) are still read as zlib.
SUFFIXES = {"none": "", "gzip": ".gz", "zlib": ".deflate"}
ZLIB_SUFFIXES = (".deflate", ".zlib", ".zz")
INDEX_SUFFIX = ".idx"  # the index file of a shard (--index): data-00000-of-00004.tfrecord -> data-00000-of-00004.idx
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def require_fast_crc32c() -> None:
    """Raises RuntimeError when google-crc32c has no C implementation (framing would be 50x slower)."""
    if google_crc32c.implementation != "c":
        raise RuntimeError(
            "google-crc32c is installed without its C extension (implementation="
            f"{google_crc32c.implementation!r}); reinstall it with a wheel for this platform: "
            "pip install --force-reinstall google-crc32c"
        )


def masked_crc(data) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_records(records: Iterable[bytes]) -> bytes:
    """The frames of all ``records``, concatenated: one write per batch. The length header of each
    distinct record length is computed once per call (records of one batch mostly share a length)."""
    value, pack_len, pack_crc = google_crc32c.value, _LEN.pack, _CRC.pack
    headers: dict[int, bytes] = {}
    parts: list[bytes] = []
    for record in records:
        n = len(record)
        header = headers.get(n)
        if header is None:
            length = pack_len(n)
            header = headers[n] = length + pack_crc(masked_crc(length))
        crc = value(record)
        parts += (header, record, pack_crc((((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF))
    return b"".join(parts)


def frame_fixed(num_rows: int, width: int, fill) -> np.ndarray:
    """Frames ``num_rows`` records of ``width`` bytes each, vectorized, with the record data written in
    place: ``fill(view)`` receives the ``(rows, width)`` data columns of the framed buffer and writes the
    records there (no intermediate block; one copy of the data). The length and its CRC are the same
    for every row, so only the data CRCs are computed per row (google-crc32c, in C).

    Returns a ``(rows, 16 + width)`` uint8 array whose bytes are the framed records.
    """
    return _framed(num_rows, width, fill)[0]


def _framed(num_rows: int, width: int, fill) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`frame_fixed`'s buffer, with the records' data CRCs and masked data CRCs (uint64 arrays), from which
    ``checksum.frames_crc32c`` combines the CRC32C of the framed bytes without reading them."""
    out = np.empty((num_rows, 16 + width), np.uint8)
    length = struct.pack("<Q", width)
    out[:, :8] = np.frombuffer(length, np.uint8)
    out[:, 8:12] = np.frombuffer(_CRC.pack(masked_crc(length)), np.uint8)
    data = out[:, 12 : 12 + width]
    fill(data)
    value = google_crc32c.value
    crcs = np.fromiter((value(row) for row in data), dtype=np.uint64, count=num_rows)
    masked = (((crcs >> 15) | (crcs << 17)) + _MASK_DELTA) & 0xFFFFFFFF
    out[:, 12 + width :] = masked.astype("<u4").view(np.uint8).reshape(num_rows, 4)
    return out, crcs, masked


def frame_block(block: np.ndarray) -> np.ndarray:
    """Frames every row of a ``(rows, width)`` uint8 block as one record; see :func:`frame_fixed`."""
    rows, width = block.shape

    def fill(view):
        view[...] = block

    return frame_fixed(rows, width, fill)


def frame_encoded(batch) -> np.ndarray:
    """Frames a fixed-layout ``codec.EncodedBatch`` (``tails`` None): its rows are assembled directly in
    the framed buffer. Returns ``(rows, 16 + width)`` uint8."""
    return frame_fixed(batch.num_rows, batch.width, batch.layout.fill)


def frame_padded(block: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Frames records of different lengths laid out in a padded block (``codec.EncodedBatch.padded``: row ``i``'s
    record at ``block[i, 12:12 + lengths[i]]``, 4 spare bytes after the longest), vectorized: the headers and the
    masked CRCs are written into the block's spare bytes (one CRC of the length per distinct length), then the
    frames are packed end to end. Returns the framed bytes as a flat uint8 array."""
    rows, width = block.shape
    if not rows:
        return np.zeros(0, np.uint8)
    lengths = np.asarray(lengths, np.int64)
    block[:, :8] = lengths.astype("<u8").view(np.uint8).reshape(rows, 8)
    distinct, which = np.unique(lengths, return_inverse=True)
    header_crcs = np.array([masked_crc(_LEN.pack(n)) for n in distinct.tolist()], "<u4")
    block[:, 8:12] = header_crcs[which].view(np.uint8).reshape(rows, 4)
    value = google_crc32c.value
    if len(distinct) * 8 <= rows:  # few lengths: the rows of each, as a 2-D array iterated in C
        crcs = np.empty(rows, np.uint64)
        for k, n in enumerate(distinct.tolist()):
            same = np.flatnonzero(which == k)
            part = block[:, 12 : 12 + n] if len(same) == rows else block[same, 12 : 12 + n]
            crcs[same] = np.fromiter(map(value, part), np.uint64, len(same))
    else:
        view = block.reshape(-1)  # google-crc32c refuses memoryviews; a NumPy slice is one view per record
        starts = (np.arange(rows, dtype=np.int64) * width + 12).tolist()
        crcs = np.fromiter((value(view[s : s + n]) for s, n in zip(starts, lengths.tolist())), np.uint64, rows)
    masked = ((((crcs >> 15) | (crcs << 17)) + _MASK_DELTA) & 0xFFFFFFFF).astype("<u4")
    ends = np.arange(rows, dtype=np.int64) * width + 12 + lengths
    block.reshape(-1)[ends[:, None] + np.arange(4)] = masked.view(np.uint8).reshape(rows, 4)
    return _packed_frames(block, lengths + 16)


def _packed_frames(block: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """The first ``frames[i]`` bytes of each row of ``block``, end to end: a slice copy per run of rows of one length
    when there are few runs (sorted or uniform data), else a boolean mask over the block."""
    rows, width = block.shape
    cuts = np.flatnonzero(np.diff(frames)) + 1
    if len(cuts) * 64 > rows:
        return block[np.arange(width) < frames[:, None]]
    out = np.empty(int(frames.sum()), np.uint8)
    pos = 0
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), rows]):
        n = int(frames[a])
        out[pos : pos + (b - a) * n].reshape(b - a, n)[...] = block[a:b, :n]
        pos += (b - a) * n
    return out


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
        _length, crc = _HEADER.unpack_from(head)
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


def index_name(shard_name: str) -> str:
    """The name of a shard's index file: its last ``.tfrecord`` becomes ``.idx``
    (``data-00000-of-00004.tfrecord`` -> ``data-00000-of-00004.idx``; ``mnist-train.tfrecord-00000-of-00001`` ->
    ``mnist-train.idx-00000-of-00001``), so patterns such as ``*.tfrecord*`` never match an index file; a name
    without ``.tfrecord`` gets ``.idx`` appended."""
    head, sep, tail = shard_name.rpartition(".tfrecord")
    return f"{head}{INDEX_SUFFIX}{tail}" if sep else shard_name + INDEX_SUFFIX


def index_text(lengths: np.ndarray) -> bytes:
    """A ``tfrecord2idx`` index of records whose data lengths (bytes) are ``lengths``, in file order: one line
    ``"<byte offset> <frame length>"`` per record, the frame length being 8 + 4 + data + 4 bytes, offsets counted
    from the start of the (uncompressed) file. The format of the ``tfrecord`` package's ``tools/tfrecord2idx.py``
    (what its multi-worker ``TFRecordDataset`` seeks with) and of NVIDIA DALI's ``tfrecord2idx``."""
    frames = np.asarray(lengths, dtype=np.int64) + 16
    offsets = np.cumsum(frames) - frames
    return "".join(f"{o} {n}\n" for o, n in zip(offsets.tolist(), frames.tolist())).encode()


def parse_index(data: bytes, path: str = "<index>") -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, frame lengths)`` (int64, bytes) of a ``tfrecord2idx`` index file's text, each checked: two
    integers per line, lengths of at least 16 bytes, every record starting where the one before ends.

    Raises:
      RecordError: a malformed line or offsets that do not follow each other, naming the file and line.
    """
    values = _parse_index_fast(data)
    if values is not None:
        lines = None
    else:
        lines = data.decode("ascii", "replace").splitlines()
        values = np.zeros((len(lines), 2), np.int64)
    for i, line in enumerate(lines or ()):
        parts = line.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise RecordError(
                f"Index line {i + 1} is not 'offset length': {line[:80]!r}",
                file=path,
                hint="rewrite the output with --index",
            )
        values[i] = int(parts[0]), int(parts[1])
    offsets, frames = values[:, 0], values[:, 1]
    bad = np.flatnonzero((frames < 16) | (offsets != np.cumsum(frames) - frames))
    if bad.size:
        raise RecordError(
            f"Index line {bad[0] + 1}: record at byte {offsets[bad[0]]} of {frames[bad[0]]} bytes "
            "does not follow the record before it",
            file=path,
            hint="rewrite the output with --index",
        )
    return offsets, frames


def _parse_index_fast(data: bytes) -> np.ndarray | None:
    """``(lines, 2)`` int64 of an index text in the canonical form (``"<digits> <digits>\\n"`` lines, 1 to 18 digits
    each), checked and parsed with NumPy; None for any other text (the line-by-line parse then says what is wrong)."""
    if not data:
        return np.zeros((0, 2), np.int64)
    b = np.frombuffer(data, np.uint8)
    is_sep = (b == 0x20) | (b == 0x0A)
    where = np.flatnonzero(is_sep)
    if len(where) % 2 or b[-1] != 0x0A or not ((b >= 0x30) & (b <= 0x39) | is_sep).all():
        return None
    seps = b[where]
    runs = np.diff(np.concatenate(([-1], where))) - 1  # digits before each separator
    if not ((seps[0::2] == 0x20).all() and (seps[1::2] == 0x0A).all() and (runs >= 1).all() and (runs <= 18).all()):
        return None
    return np.fromstring(data.decode("ascii"), dtype=np.int64, sep=" ").reshape(-1, 2)


def scan_frames(stream: BinaryIO, size: int, path: str = "<stream>") -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, frame lengths)`` (int64, bytes) of every record of an uncompressed stream of ``size`` bytes,
    reading only the 12-byte frame headers (their length CRC checked) and seeking over the data.

    Raises:
      RecordError: a header whose CRC fails or a frame that runs past ``size``, naming the record and offset.
    """
    offsets, frames, offset = [], [], 0
    while offset < size:
        stream.seek(offset)
        header = stream.read(12)
        if len(header) < 12:
            raise RecordError(
                f"Truncated record header ({len(header)} of 12 bytes)", file=path, record=len(offsets), offset=offset
            )
        length, crc = _HEADER.unpack(header)
        if masked_crc(header[:8]) != crc:
            raise RecordError(
                "Length CRC mismatch: corrupt data or not an uncompressed TFRecord file",
                file=path,
                record=len(offsets),
                offset=offset,
            )
        if offset + 16 + length > size:
            raise RecordError(
                f"Truncated record: {length} data bytes announced, the file ends first",
                file=path,
                record=len(offsets),
                offset=offset,
            )
        offsets.append(offset)
        frames.append(16 + length)
        offset += 16 + length
    return np.array(offsets, np.int64), np.array(frames, np.int64)


def unframe(frame: bytes, path: str = "<stream>", record: int = 0, offset: int = 0) -> bytes:
    """The data of one whole frame (``8 + 4 + data + 4`` bytes), its length and both CRCs checked.

    Raises:
      RecordError: a short frame, a length that differs from the frame's size, or a CRC mismatch.
    """
    if len(frame) < 16:
        raise RecordError(
            f"Truncated record: {len(frame)} bytes at the indexed offset", file=path, record=record, offset=offset
        )
    length, length_crc = _HEADER.unpack_from(frame)
    if masked_crc(frame[:8]) != length_crc or length != len(frame) - 16:
        raise RecordError(
            f"The frame at the indexed offset is not a record of {len(frame) - 16} bytes",
            file=path,
            record=record,
            offset=offset,
            hint="the index does not match the shard: rewrite the output with --index",
        )
    data = frame[12 : 12 + length]
    if masked_crc(data) != _CRC.unpack_from(frame, 12 + length)[0]:
        raise RecordError("Data CRC mismatch: the record is corrupt", file=path, record=record, offset=offset)
    return data


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
            framed, crcs, masked = _framed(batch.num_rows, batch.width, batch.layout.fill)
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


_READ_ERRORS = (OSError, EOFError, MemoryError, OverflowError, *backends.all_errors())
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


# files that are no array source (the sources' own magic bytes are theirs: transforms.sources.content_format)
_MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"{", "a JSON file"))


def foreign_format(head: bytes) -> str | None:
    """What a file that is not TFRecord looks like from its first bytes: an array source's file (HDF5, .npy, zip,
    NetCDF-3, MATLAB, by the source registry's ``magic``), a PNG, JPEG or JSON file, or None. Used only after its
    first frame header failed its CRC, so a TFRecord is never misnamed."""
    from tfrecord_etl.transforms import sources

    fmt = sources.content_format(head)
    if fmt is not None:
        return sources.REGISTRY[fmt].content_label
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    return None


def iter_records(
    stream: BinaryIO,
    path: str = "<stream>",
    check_crc: bool = True,
    chunk: int = READ_CHUNK,
    max_record_bytes: int | None = None,
) -> Iterator[tuple[int, int, bytes]]:
    """Yields ``(record index, byte offset, record bytes)`` for each frame of an uncompressed stream.

    Offsets count bytes of the decompressed stream. The stream is read ``chunk`` bytes at a time (a
    record longer than that in one read of its own size) and frames are cut from the buffer, so the
    cost per record is two C CRC calls and a slice, not several ``read`` calls; the stream is read
    past the last frame it yields.

    Each length header is checked against ``max_record_bytes`` (default :func:`record_limit`, 1024 MB)
    before its record is read or decompressed, so a header that lies (a huge length over a short or
    compressed body) costs no memory.

    Raises:
      RecordError: a truncated frame, a CRC mismatch, or a record over the size limit, naming the file,
        record index and byte offset.
    """
    limit = record_limit() if max_record_bytes is None else max_record_bytes
    buf, pos, index, offset, eof = b"", 0, 0, 0, False
    unpack_header, unpack_crc, value = _HEADER.unpack_from, _CRC.unpack_from, google_crc32c.value
    checked_header = None  # the last header whose length CRC matched (records often share a length)

    def fill(need: int) -> None:
        """Makes ``buf[pos:]`` hold at least ``need`` bytes, or all that is left of the stream."""
        nonlocal buf, pos, eof
        parts, have = [buf[pos:]], len(buf) - pos
        while have < need and not eof:
            more = stream.read(max(chunk, need - have))
            if not more:
                eof = True
                break
            parts.append(more)
            have += len(more)
        buf, pos = b"".join(parts), 0

    while True:
        if len(buf) - pos < 12:
            try:
                fill(12)
            except _READ_ERRORS as e:
                raise RecordError(
                    f"Cannot decompress: {e}",
                    file=path,
                    record=index,
                    offset=offset,
                    hint="check the compression (gzip/zlib/none) of this file",
                ) from None
            if len(buf) == pos:
                return
            if len(buf) - pos < 12:
                raise RecordError(
                    f"Truncated record header ({len(buf) - pos} of 12 bytes)",
                    file=path,
                    record=index,
                    offset=offset,
                    hint="the file was cut short; rewrite it",
                )
        length, length_crc = unpack_header(buf, pos)
        header = buf[pos : pos + 12]
        if check_crc and header != checked_header:
            if masked_crc(header[:8]) != length_crc:
                known = foreign_format(bytes(buf[pos : pos + 2056])) if offset == 0 else None
                if known:
                    raise RecordError(
                        f"Not a TFRecord file: it starts like {known}",
                        file=path,
                        hint="convert arrays with tfrecord-etl convert --input FILE; inspect "
                        "and verify read TFRecord outputs",
                    )
                raise RecordError(
                    "Length CRC mismatch: corrupt data or wrong compression",
                    file=path,
                    record=index,
                    offset=offset,
                    hint="check the compression (gzip/zlib/none) of this file",
                )
            checked_header = header
        if length > limit:
            check_record_size(length, limit, file=path, record=index, offset=offset)
        end = pos + 12 + length
        if len(buf) < end + 4:
            try:
                fill(16 + length)
            except _READ_ERRORS as e:
                raise RecordError(
                    f"Cannot read record of {length} bytes: {e}", file=path, record=index, offset=offset
                ) from None
            end = pos + 12 + length
            if len(buf) < end + 4:
                got = min(length, max(0, len(buf) - pos - 12))
                raise RecordError(
                    f"Truncated record: {got} of {length} data bytes",
                    file=path,
                    record=index,
                    offset=offset,
                    hint="the file was cut short; rewrite it",
                )
        data = buf[pos + 12 : end]
        if check_crc:
            crc = value(data)
            if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF != unpack_crc(buf, end)[0]:
                raise RecordError("Data CRC mismatch: the record is corrupt", file=path, record=index, offset=offset)
        yield index, offset, data
        index += 1
        offset += 16 + length
        pos = end + 4
