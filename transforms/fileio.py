"""File access through Beam's ``FileSystems``, so local, gs:// and s3:// paths take one code path."""
from __future__ import annotations

import os
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from tfrecord_etl.transforms.errors import SourceError

_RAW = CompressionTypes.UNCOMPRESSED


def match(pattern: str) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of every file matching ``pattern``, sorted by path.

    Raises:
      SourceError: nothing matches, or the pattern names a directory.
    """
    try:
        results = FileSystems.match([pattern])[0].metadata_list
    except Exception as e:  # Beam raises BeamIOError for an unmatched pattern on some filesystems
        raise SourceError(f"Cannot match input pattern: {e}", file=pattern,
                          hint="check the path or glob; quote it so the shell does not expand it") from None
    files = sorted((m.path, m.size_in_bytes) for m in results if not is_dir(m.path))
    if not files:
        hint = "the pattern names a directory: add a glob such as /*.h5" if results or is_dir(pattern) else \
            "check the path or glob; quote it so the shell does not expand it"
        raise SourceError("No input file matches the pattern", file=pattern, hint=hint)
    return files


def is_dir(path: str) -> bool:
    fs = FileSystems.get_filesystem(path)
    if isinstance(fs, LocalFileSystem):
        return os.path.isdir(path)
    return path.endswith("/")


def is_local(path: str) -> bool:
    return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def open_read(path: str) -> BinaryIO:
    """A seekable binary stream over ``path``, uncompressed whatever its suffix."""
    try:
        return FileSystems.open(path, compression_type=_RAW)
    except Exception as e:
        raise SourceError(f"Cannot open file: {e}", file=path) from None


def open_write(path: str) -> BinaryIO:
    """A binary stream that creates (or truncates) ``path``; local parent directories are created."""
    return FileSystems.create(path, compression_type=_RAW)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def basename(path: str) -> str:
    return FileSystems.split(path)[1]


def dirname(path: str) -> str:
    return FileSystems.split(path)[0]


def rename(src: str, dst: str) -> None:
    """Moves ``src`` to ``dst``, replacing ``dst`` (the commit of a temp file). Paths are literal: local
    files use ``os.replace`` (atomic), since Beam's local ``delete`` treats a path as a glob."""
    if is_local(src) and is_local(dst):
        os.replace(src, dst)
        return
    if exists(dst):
        FileSystems.delete([dst])
    FileSystems.rename([src], [dst])


def size(path: str) -> int:
    """Size in bytes of the file ``path``, taken literally (a ``[`` in the path is not a glob).

    Raises:
      SourceError: the file does not exist.
    """
    try:
        if is_local(path):
            return os.path.getsize(path)
        from tfrecord_etl.transforms.outdir import escape_glob
        return FileSystems.match([escape_glob(path)])[0].metadata_list[0].size_in_bytes
    except (OSError, IndexError, Exception) as e:  # noqa: BLE001 - BeamIOError for a missing remote path
        raise SourceError(f"Cannot read the size of the file: {e}", file=path) from None


def delete(paths: list[str]) -> None:
    """Deletes the files ``paths`` that exist, each by its literal path (never a glob)."""
    remote = []
    for p in paths:
        if is_local(p):
            if os.path.lexists(p):
                os.unlink(p)
        elif exists(p):
            remote.append(p)
    if remote:
        FileSystems.delete(remote)


def read_bytes(path: str) -> bytes:
    with open_read(path) as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    with open_write(path) as f:
        f.write(data)
