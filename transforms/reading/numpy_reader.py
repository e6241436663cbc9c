"""The NumPy reader of an output directory (``reader.iter_numpy``): shards read in large chunks, frames cut and
records decoded a block at a time with NumPy (:class:`codec.block.BlockDecoder`), batches of rows or single rows.
No TensorFlow, Beam or pyarrow import.

Each shard is checked before and while it is read, so a shard changed after it was written is refused with a
``RecordError`` naming it rather than read as rows in another order, twice, or not at all:

* its size against ``metadata.json``'s ``bytes`` before a byte is read (a shard cut short, even at a record boundary,
  or one with a record duplicated and another dropped);
* with ``check_checksums`` (the default) and a recorded ``crc32c``: a local shard's CRC32C before its first row is
  decoded (``shardcheck.check_shard``: once per process and file version, so later epochs do not read it twice), and the
  CRC32C of the bytes as they are read (google-crc32c over each chunk), compared at the end of the shard (a remote
  shard is checked this way only: its rows come before the verdict);
* its record count at its end.

The frame of every record is checked (its length header's CRC, its size against ``max_record_bytes``); the data CRC
of every record too, unless the shard's CRC32C was checked before reading (it covers every byte the record CRCs
cover, so a second check per record would find nothing the first did not).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import numpy as np

from tfrecord_etl.transforms.codec.block import MIN_BLOCK, BlockDecoder, ragged, stack
from tfrecord_etl.transforms.codec.spec import FeatureSpec
from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import metadata, tfrecord
from tfrecord_etl.transforms.reading import collection_reader, shardcheck
from tfrecord_etl.transforms.storage import fileio

CHUNK = 16 << 20  # bytes read at a time (a record longer than that: one read of its own size)
_MASK_DELTA = 0xA282EAD8
_HINT = "the output was changed after it was written: check it with tfrecord-etl verify DIR, and convert it again"


def shards_of(
    output_dir: str, features: Sequence[str] | None, split: str | None, spans, trust_spans: bool = False
) -> tuple[list[FeatureSpec], list[tuple[dict, str, str]]]:
    """``(features read, [(metadata.json shard entry, path, compression)])`` of an output or collection, in order
    (``trust_spans``: see :func:`collection_reader.parts`)."""
    specs, parts = collection_reader.parts(output_dir, spans, split, features, trust_spans)
    shards = [
        (shard, path, part.meta["compression"])
        for part in parts
        for shard, path in zip(part.meta["shards"], metadata.shard_paths(part.dir, part.meta))
    ]
    return specs, shards


def iter_pieces(
    specs: Sequence[FeatureSpec],
    shards,
    max_record_bytes: int | None = None,
    max_features: int | None = None,
    check_checksums: bool = True,
    align: int = 1,
) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """Yields ``({name: array of k rows}, k)`` over the records of ``shards`` (``shards_of``), in order: one piece per
    run of records of one length (a block) or of mixed ones; each shard checked (see the module). ``align``: chunks
    are read to hold a multiple of that many records of one length (a batch size: batches are then slices)."""
    decoder = BlockDecoder(specs, max_features)
    limit = tfrecord.record_limit() if max_record_bytes is None else max_record_bytes
    for shard, path, compression in shards:
        yield from _shard_pieces(decoder, shard, path, compression, limit, check_checksums, align)


def batches(pieces, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """``{name: array of batch_size rows}`` from pieces (:func:`iter_pieces`); the last batch holds the rest.
    Whole batches inside a piece are slices of it (no copy)."""
    pending, have = [], 0
    for piece, k in pieces:
        start = 0
        if have:
            start = min(batch_size - have, k)
            pending.append(_rows(piece, 0, start))
            have += start
            if have == batch_size:
                yield _concat(pending)
                pending, have = [], 0
        while k - start >= batch_size:
            yield _rows(piece, start, start + batch_size)
            start += batch_size
        if start < k:
            pending.append(_rows(piece, start, k))
            have += k - start
    if have:
        yield _concat(pending)


def rows(specs: Sequence[FeatureSpec], pieces) -> Iterator[dict[str, np.ndarray]]:
    """One ``{name: array}`` per row of the pieces: 0-d arrays for scalar features, as the per-record decoder gives."""
    for piece, k in pieces:
        fixed = [(s.name, piece[s.name]) for s in specs if not ragged(s)]
        varying = [(s.name, piece[s.name]) for s in specs if ragged(s)]
        for i in range(k):
            row = {name: arr[i, ...] for name, arr in fixed}
            for name, arr in varying:
                row[name] = arr[i]
            yield {s.name: row[s.name] for s in specs} if varying else row


def _rows(piece: dict, a: int, b: int) -> dict:
    return {name: arr[a:b] for name, arr in piece.items()}


def _concat(pieces: list[dict]) -> dict:
    if len(pieces) == 1:
        return pieces[0]
    return {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}


def _shard_pieces(
    decoder: BlockDecoder, shard: dict, path: str, compression: str, limit: int, check_checksums: bool, align: int = 1
) -> Iterator[tuple[dict, int]]:
    tfrecord.check_regular(path)
    size = fileio.size(path)
    shardcheck.check_shard(shard, path, size, check_checksum=False)  # the size, before anything is read
    expected = shard.get("crc32c") if check_checksums and isinstance(shard.get("crc32c"), str) else None
    checked = None  # the local file version whose CRC32C matched, before reading
    if expected is not None and fileio.is_local(path):
        shardcheck.check_shard(shard, path, size, check_checksum=True)
        checked = shardcheck.file_version(path)
        checked = checked if checked in shardcheck.CHECKED else None
    with fileio.open_read(path) as raw:
        same = checked is not None and _fstat_version(path, raw) == checked
        # else the CRC32C of the stored bytes as read: of the chunks themselves when uncompressed, else of what the
        # decompressor reads (tfrecord.ChecksumReader)
        stream_crc = expected is not None and not same
        counted = tfrecord.ChecksumReader(raw) if stream_crc and compression != "none" else None
        stream = tfrecord.open_decompressed(counted or raw, compression)
        crc = _Crc() if stream_crc and counted is None else None
        count = yield from _stream_pieces(decoder, stream, path, limit, not same, crc, align)
        if counted is not None:
            try:
                counted.drain()  # bytes after the last frame (a gzip trailer) are part of the file
            except tfrecord.READ_ERRORS as e:
                raise RecordError(f"Cannot read the shard to its end: {e}", file=path) from None
            crc = counted
        if same and _fstat_version(path, raw) != checked:
            raise RecordError("Shard changed while it was read", file=path, hint=_HINT)
    if count != shard["records"]:
        raise RecordError(f"Shard holds {count} records, metadata says {shard['records']}", file=path, hint=_HINT)
    if stream_crc:
        got = tfrecord.crc32c_hex(crc.crc)
        if (crc.bytes, got) != (size, expected):
            raise RecordError(
                f"Shard's CRC32C is {got} ({crc.bytes} bytes read), metadata.json says {expected}: "
                "it was replaced by another file or swapped with another shard after it was written, "
                "or changed while it was read",
                file=path,
                hint=_HINT,
            )


def _fstat_version(path: str, raw) -> tuple | None:
    """``shardcheck.file_version`` of the open file ``raw`` (its descriptor's stat), or None."""
    try:
        st = os.fstat(raw.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class _Crc:
    """The CRC32C and count of the bytes of an uncompressed shard, extended chunk by chunk as they are read."""

    def __init__(self):
        self.crc, self.bytes = 0, 0

    def add(self, data: np.ndarray) -> None:
        self.crc = google_crc32c.extend(self.crc, data)
        self.bytes += len(data)


def _fill(stream, left: bytes | bytearray, need: int, crc: _Crc | None) -> tuple[bytearray, int]:
    """A new buffer holding ``left`` then at least ``need`` more bytes of ``stream`` (fewer at its end), read in place
    (``readinto``); returns it and how many bytes it holds. A new buffer each time: decoded arrays never alias it, but
    a caller's view of an older one stays valid."""
    size = len(left) + need
    buf = bytearray(size)
    buf[: len(left)] = left
    view, have = memoryview(buf), len(left)
    readinto = getattr(stream, "readinto", None)
    while have < size:
        if readinto is not None:
            n = readinto(view[have:])
        else:
            more = stream.read(size - have)
            n = len(more)
            view[have : have + n] = more
        if not n:
            break
        if crc is not None:
            crc.add(np.frombuffer(buf, np.uint8, n, have))
        have += n
    view.release()
    return buf, have


def _next_read(buf, end: int, left: int, filled: int, align: int) -> int:
    """Bytes to read next so the buffer ends at a frame boundary: the first read of a stream takes one header, the
    others chunks of about :data:`CHUNK` sized by the frame length there (a multiple of ``align`` frames)."""
    if left < 12:
        return 12 - left if not filled else CHUNK
    frame = int.from_bytes(buf[end : end + 8], "little") + 16
    step = frame * align if frame * align <= CHUNK else frame
    return max(frame, -(-CHUNK // step) * step) - left


def _truncated(buf, pos: int, left: int, path: str, index: int, offset: int) -> RecordError:
    """The error for a stream that ends ``left`` bytes into a frame (its header or its data)."""
    where = {"file": path, "record": index, "offset": offset, "hint": tfrecord.CUT_HINT}
    if left < 12:
        return RecordError(f"Truncated record header ({left} of 12 bytes)", **where)
    length = int.from_bytes(buf[pos : pos + 8], "little")
    return RecordError(f"Truncated record: {max(0, min(length, left - 12))} of {length} data bytes", **where)


def _decode_runs(decoder, buf, arr: np.ndarray, runs, path: str, index: int, base: int, record_crcs: bool):
    """Yields ``(piece, records)`` for the runs of one buffer (``(start, data length, frames)`` each, from
    :func:`_runs`): long runs decoded as blocks, short ones gathered and decoded one record at a time
    (:func:`_mixed`). ``index``: the first record's index; ``base``: the stream offset of ``buf[0]``."""
    mixed: list[tuple[int, int]] = []  # (frame start, data length) of short runs, decoded one by one
    for start, length, k in runs:
        if k < MIN_BLOCK:
            mixed += [(start + j * (length + 16), length) for j in range(k)]
            continue
        if mixed:
            yield _mixed(decoder, buf, mixed, path, index, base, record_crcs)
            index += len(mixed)
            mixed = []
        frames = arr[start : start + k * (length + 16)].reshape(k, length + 16)
        data = frames[:, 12 : 12 + length]
        first = base + start
        if record_crcs:
            _check_crcs(frames, length, path, index, first)
        try:
            piece = decoder.decode(data)
        except RecordError as e:
            j = e.context.get("record", 0)
            raise _decode_error(e, path, index + j, first + j * (length + 16)) from None
        yield piece, k
        index += k
    if mixed:
        yield _mixed(decoder, buf, mixed, path, index, base, record_crcs)


def _stream_pieces(decoder, stream, path: str, limit: int, record_crcs: bool, crc: _Crc | None, align: int = 1):
    """Yields the pieces of one decompressed stream; returns its record count. Reads are sized to end at a frame
    boundary when frames have one length (and hold a multiple of ``align`` of them), so runs are not cut. The next
    chunk is read (and decompressed) by a thread while this one is decoded: file reads, decompression and NumPy's
    copies release the GIL, as tf.data's parallel reads overlap its parsing."""
    buf, filled, pos, index, offset, eof = bytearray(), 0, 0, 0, 0, False
    checked = None  # the last length header whose CRC matched
    pending = None  # (future of the next _fill, bytes kept from this buffer, bytes asked)
    reader_thread = ThreadPoolExecutor(1, thread_name_prefix="tfrecord-etl-read")
    try:
        while True:
            if pending is not None:
                future, left, need = pending
                pending = None
                try:
                    buf, filled = future.result()
                except tfrecord.READ_ERRORS as e:
                    error = tfrecord.read_error(
                        f"Cannot decompress: {e}", path, index, offset, tfrecord.COMPRESSION_HINT
                    )
                    raise error from None
                eof, pos = filled - left < need, 0
            arr = np.frombuffer(buf, np.uint8, filled)
            runs, end, checked = _runs(buf, filled, arr, pos, limit, checked, path, index, offset)
            left = filled - end
            if not eof:  # read the next chunk while this one is decoded
                need = _next_read(buf, end, left, filled, align)
                pending = reader_thread.submit(_fill, stream, bytes(buf[end:filled]), need, crc), left, need
            for piece in _decode_runs(decoder, buf, arr, runs, path, index, offset - pos, record_crcs):
                yield piece
                index += piece[1]
            offset += end - pos
            pos = end
            if eof:
                if left:
                    raise _truncated(buf, pos, left, path, index, offset)
                return index
    finally:  # the stream is closed after this: no read may still be running on it
        reader_thread.shutdown(wait=True)


def _runs(buf, n: int, arr: np.ndarray, pos: int, limit: int, checked, path: str, index: int, offset: int):
    """``([(frame start, data length, frames)], end, checked header)``: the whole frames in ``buf[pos:]``, as runs of
    consecutive frames with one length header (found by comparing the headers of growing windows of frames at once).
    Each distinct header's CRC is checked, each length against ``limit``."""
    runs, first = [], pos
    while n - pos >= 12:
        header = bytes(buf[pos : pos + 12])
        length = int.from_bytes(header[:8], "little")
        where = {"file": path, "record": index, "offset": offset + pos - first}
        if header != checked:
            if tfrecord.masked_crc(header[:8]) != int.from_bytes(header[8:], "little"):
                known = tfrecord.foreign_format(bytes(buf[pos : pos + 2056])) if where["offset"] == 0 else None
                if known:
                    raise RecordError(
                        f"Not a TFRecord file: it starts like {known}",
                        file=path,
                        hint="convert arrays with tfrecord-etl convert --input FILE; inspect "
                        "and verify read TFRecord outputs",
                    )
                raise RecordError(
                    "Length CRC mismatch: corrupt data or wrong compression",
                    **where,
                    hint="check the compression (gzip/zlib/none) of this file",
                )
            checked = header
        if length > limit:
            tfrecord.check_record_size(length, limit, **where)
        frame = length + 16
        if n - pos < frame:
            break
        most, k, step = (n - pos) // frame, 1, 16
        want = np.zeros(16, np.uint8)
        want[:12] = arr[pos : pos + 12]
        want = want.view("<u8")
        while k < most:
            m = min(most, k + step)
            # the 12 header bytes of each frame copied into 16 zeroed ones (one strided copy), compared as 2 words
            heads = np.zeros((m - k, 16), np.uint8)
            heads[:, :12] = arr[pos + k * frame : pos + m * frame].reshape(m - k, frame)[:, :12]
            words = heads.view("<u8")
            same = words[:, 0] == want[0]
            same &= words[:, 1] == want[1]
            if not same.all():
                k += int(np.argmin(same))
                break
            k, step = m, step * 4
        runs.append((pos, length, k))
        pos += k * frame
        index += k
    return runs, pos, checked


def _check_crcs(frames: np.ndarray, length: int, path: str, index: int, offset: int) -> None:
    """Checks the data CRC of each frame of ``frames`` (``(k, 16 + length)`` uint8)."""
    value = google_crc32c.value
    crcs = np.fromiter((value(row) for row in frames[:, 12 : 12 + length]), np.uint64, frames.shape[0])
    masked = (((crcs >> 15) | (crcs << 17)) + _MASK_DELTA) & 0xFFFFFFFF
    stored = np.ascontiguousarray(frames[:, 12 + length :]).view("<u4")[:, 0]
    bad = np.flatnonzero(masked != stored)
    if bad.size:
        j = int(bad[0])
        raise RecordError(
            "Data CRC mismatch: the record is corrupt", file=path, record=index + j, offset=offset + j * (length + 16)
        )


def _mixed(
    decoder: BlockDecoder,
    buf: bytes,
    frames: list[tuple[int, int]],
    path: str,
    index: int,
    base: int,
    record_crcs: bool,
) -> tuple[dict, int]:
    """The piece of records of different lengths (``frames``: ``(frame start in buf, data length)``), decoded one by
    one (:meth:`BlockDecoder.decode_one`); ``base`` + a start is the record's offset in the stream."""
    out = []
    for j, (start, length) in enumerate(frames):
        record = bytes(buf[start + 12 : start + 12 + length])
        if record_crcs and tfrecord.masked_crc(record) != int.from_bytes(
            buf[start + 12 + length : start + 16 + length], "little"
        ):
            raise RecordError(
                "Data CRC mismatch: the record is corrupt", file=path, record=index + j, offset=base + start
            )
        try:
            out.append(decoder.decode_one(record))
        except RecordError as e:
            raise _decode_error(e, path, index + j, base + start) from None

    return {s.name: stack(s, [row[s.name] for row in out]) for s in decoder.specs}, len(out)


def _decode_error(e: RecordError, path: str, record: int, offset: int) -> RecordError:
    return RecordError(
        f"Cannot decode example: {e.message}",
        hint=e.hint,
        file=path,
        record=record,
        offset=offset,
        payload_offset=e.context.get("offset"),
    )
