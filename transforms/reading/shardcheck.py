"""The identity check of a shard before its offsets are trusted: its size and CRC32C against its ``metadata.json``
entry, the CRC32C read once per process and local file version. Shared by every reader (``reader``,
``numpy_reader``, ``random_access``, ``tfdata``).
"""

from __future__ import annotations

import os

import google_crc32c
import numpy as np

from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.storage import fileio

#: bytes read at a time for a local shard's CRC32C (unbuffered reads into one buffer: about twice the rate of new
#: 4 MiB bytes objects read through fileio)
CRC_CHUNK = 1 << 20


def file_crc32c(path: str) -> tuple[int, str]:
    """``(size in bytes, CRC32C as 8 hex digits)`` of a file's stored bytes (compressed as stored)."""
    checksum, size = google_crc32c.Checksum(), 0
    if fileio.is_local(path):  # one buffer, read into again and again (google-crc32c takes a NumPy view of it)
        buffer = bytearray(CRC_CHUNK)
        view, values = memoryview(buffer), np.frombuffer(buffer, np.uint8)
        with open(path, "rb", buffering=0) as f:
            while k := f.readinto(view):
                checksum.update(values[:k])
                size += k
        return size, checksum.hexdigest().decode()
    with fileio.open_read(path) as f:
        while chunk := f.read(1 << 22):
            checksum.update(chunk)
            size += len(chunk)
    return size, checksum.hexdigest().decode()


# (path, device, inode, size, st_mtime_ns, st_ctime_ns) of a local shard whose CRC32C matched its metadata
CHECKED: set[tuple] = set()


def file_version(path: str) -> tuple | None:
    """What identifies one version of a local file for :data:`CHECKED` (a rename, rewrite or copy changes it:
    ``st_ctime_ns`` moves on every rename); None for remote objects, which are not remembered."""
    if not fileio.is_local(path):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def check_shard(shard: dict, path: str, size: int | None = None, check_checksum: bool = True) -> None:
    """Checks that the file at ``path`` is the shard of the metadata.json entry ``shard``, before offsets into it
    are trusted: its size against ``shard["bytes"]`` (a stat), then, with ``check_checksum`` and when the entry
    records one, the CRC32C of its bytes against ``shard["crc32c"]``. The checksum costs one read of the whole
    shard (google-crc32c in C: at page-cache speed, about 0.1 s for a 192 MB shard); a local shard that matched
    is remembered for the process, by path, inode, size, modification and change time, so later
    ``RandomAccess`` objects and :func:`get` calls do not read it again until it is renamed, rewritten or replaced.
    An entry without ``crc32c`` (an output of an earlier version) is checked by size alone.

    Why not size and modification time alone: a shard swapped with another by renaming keeps its own mtime, and
    shards written within one clock tick of the file system (small shards, one worker) share it; copies and
    restores change it. The checksum is what tells two shards of the same size apart.

    Raises:
      RecordError: naming the shard, what differs, and what to do.
    """
    hint = "the output was changed after it was written: check it with tfrecord-etl verify DIR, and convert it again"
    size = fileio.size(path) if size is None else size
    if isinstance(shard.get("bytes"), int) and size != shard["bytes"]:
        raise RecordError(
            f"Shard holds {size} bytes, metadata.json says {shard['bytes']}: it was truncated, "
            "replaced or swapped with another after it was written",
            file=path,
            hint=hint,
        )
    expected = shard.get("crc32c")
    if not check_checksum or not isinstance(expected, str):
        return
    version = file_version(path)
    if version is not None and version in CHECKED:
        return
    got_size, got = file_crc32c(path)
    if (got_size, got) != (size, expected):
        raise RecordError(
            f"Shard's CRC32C is {got}, metadata.json says {expected}: it was replaced by another "
            "file or swapped with another shard after it was written",
            file=path,
            hint=hint,
        )
    if version is not None and version == file_version(path):
        CHECKED.add(version)


def shard_frames(shard: dict, path: str, directory: str, check_checksums: bool) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, frame lengths), both ``int64`` in bytes, of every record of the shard at ``path`` (its
    ``metadata.json`` entry ``shard``; ``directory`` the folder its index file is in): from its ``tfrecord2idx``
    index file when it has one (``--index``), else from its frame headers; the shard checked first
    (:func:`check_shard`).

    Raises:
      RecordError: the shard is not the one its metadata records, an index file too large for its record count,
        or offsets that do not account for the records and bytes the metadata records (hint: rewrite the output
        with ``--index``).
    """
    size = fileio.size(path)
    check_shard(shard, path, size, check_checksums)
    if "index" in shard:
        where = fileio.join(directory, shard["index"])
        if fileio.size(where) > 48 * (shard["records"] + 1):  # a line is at most 2 x 20 digits + 2
            raise RecordError(
                f"Index file of {fileio.size(where)} bytes for {shard['records']} records",
                file=where,
                hint="rewrite the output with --index",
            )
        offsets, frames = tfrecord.parse_index(fileio.read_bytes(where), where)
    else:
        where = path
        with fileio.open_read(path) as raw:
            offsets, frames = tfrecord.scan_frames(raw, size, path)
    end = int(offsets[-1] + frames[-1]) if len(offsets) else 0
    if len(offsets) != shard["records"] or end != size:
        raise RecordError(
            f"Index of {len(offsets)} records ending at byte {end} does not match the shard "
            f"({shard['records']} records in the metadata, {size} bytes)",
            file=where,
            hint="rewrite the output with --index",
        )
    return offsets, frames
