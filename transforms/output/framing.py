"""TFRecord frames, cut and checked a batch at a time: the frame layout and its masked CRC32Cs, the frames of a
batch of records written at once (NumPy), a shard's index file (``--index``), the headers of an uncompressed stream
scanned and one frame checked, and what a file that is not TFRecord looks like (for the error that says so). Pure
Python over bytes and NumPy arrays; :mod:`tfrecord` reads and writes whole files with them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import BinaryIO

import google_crc32c
import numpy as np

from tfrecord_etl.transforms import sources
from tfrecord_etl.transforms.errors import RecordError

INDEX_SUFFIX = ".idx"  # the index file of a shard (--index): data-00000-of-00004.tfrecord -> data-00000-of-00004.idx
MASK_DELTA = 0xA282EAD8
HEADER = struct.Struct("<QI")
LEN = struct.Struct("<Q")
CRC = struct.Struct("<I")


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
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def frame_records(records: Iterable[bytes]) -> bytes:
    """The frames of all ``records``, concatenated: one write per batch. The length header of each
    distinct record length is computed once per call (records of one batch mostly share a length)."""
    value, pack_len, pack_crc = google_crc32c.value, LEN.pack, CRC.pack
    headers: dict[int, bytes] = {}
    parts: list[bytes] = []
    for record in records:
        n = len(record)
        header = headers.get(n)
        if header is None:
            length = pack_len(n)
            header = headers[n] = length + pack_crc(masked_crc(length))
        crc = value(record)
        parts += (header, record, pack_crc((((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF))
    return b"".join(parts)


def frame_fixed(num_rows: int, width: int, fill) -> np.ndarray:
    """Frames ``num_rows`` records of ``width`` bytes each, vectorized, with the record data written in
    place: ``fill(view)`` receives the ``(rows, width)`` data columns of the framed buffer and writes the
    records there (no intermediate block; one copy of the data). The length and its CRC are the same
    for every row, so only the data CRCs are computed per row (google-crc32c, in C).

    Returns a ``(rows, 16 + width)`` uint8 array whose bytes are the framed records.
    """
    return framed(num_rows, width, fill)[0]


def framed(num_rows: int, width: int, fill) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`frame_fixed`'s buffer, with the records' data CRCs and masked data CRCs (uint64 arrays), from which
    ``checksum.frames_crc32c`` combines the CRC32C of the framed bytes without reading them."""
    out = np.empty((num_rows, 16 + width), np.uint8)
    length = struct.pack("<Q", width)
    out[:, :8] = np.frombuffer(length, np.uint8)
    out[:, 8:12] = np.frombuffer(CRC.pack(masked_crc(length)), np.uint8)
    data = out[:, 12 : 12 + width]
    fill(data)
    value = google_crc32c.value
    crcs = np.fromiter((value(row) for row in data), dtype=np.uint64, count=num_rows)
    masked = (((crcs >> 15) | (crcs << 17)) + MASK_DELTA) & 0xFFFFFFFF
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
    header_crcs = np.array([masked_crc(LEN.pack(n)) for n in distinct.tolist()], "<u4")
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
    masked = ((((crcs >> 15) | (crcs << 17)) + MASK_DELTA) & 0xFFFFFFFF).astype("<u4")
    ends = np.arange(rows, dtype=np.int64) * width + 12 + lengths
    block.reshape(-1)[ends[:, None] + np.arange(4)] = masked.view(np.uint8).reshape(rows, 4)
    return packed_frames(block, lengths + 16)


def packed_frames(block: np.ndarray, frames: np.ndarray) -> np.ndarray:
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
    values = parse_index_fast(data)
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


def parse_index_fast(data: bytes) -> np.ndarray | None:
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
        length, crc = HEADER.unpack(header)
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
    length, length_crc = HEADER.unpack_from(frame)
    if masked_crc(frame[:8]) != length_crc or length != len(frame) - 16:
        raise RecordError(
            f"The frame at the indexed offset is not a record of {len(frame) - 16} bytes",
            file=path,
            record=record,
            offset=offset,
            hint="the index does not match the shard: rewrite the output with --index",
        )
    data = frame[12 : 12 + length]
    if masked_crc(data) != CRC.unpack_from(frame, 12 + length)[0]:
        raise RecordError("Data CRC mismatch: the record is corrupt", file=path, record=record, offset=offset)
    return data


# files that are no array source (the sources' own magic bytes are theirs: transforms.sources.content_format)
MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"{", "a JSON file"))


def foreign_format(head: bytes) -> str | None:
    """What a file that is not TFRecord looks like from its first bytes: an array source's file (HDF5, .npy, zip,
    NetCDF-3, MATLAB, by the source registry's ``magic``), a format no source reads (WAV, IDL...:
    ``sources.unread_format``), a PNG, JPEG or JSON file, or None. Used only after its first frame header failed
    its CRC, so a TFRecord is never misnamed."""
    fmt = sources.content_format(head)  # (the registry, every format's module, loads here on first use)
    if fmt is not None:
        return sources.REGISTRY[fmt].content_label
    unread = sources.unread_format("", head, by_suffix=False)
    if unread is not None:
        return f"{unread.label}, a format tfrecord-etl does not read"
    for magic, what in MAGIC:
        if head.startswith(magic):
            return what
    return None
