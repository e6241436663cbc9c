"""File access through Beam's ``FileSystems``, so local, gs:// and s3:// paths take one code path.

Without Apache Beam installed (the reader's install, ``pip install .``) the reads go through
:mod:`tfrecord_etl.transforms.storage.lightfs` instead (local files, and s3:// and gs:// objects with the same bounded
reads as below); writing needs Beam.

A gs:// path is checked before this process's first request to Google Cloud Storage
(:func:`gcsaccess.check`: one TCP connection, a few seconds at most): an endpoint that cannot be reached is one
:class:`ConfigError` line at once, not two minutes of the client's retries ending in a ``RetryError``, or a
connection error read as a missing file."""

from __future__ import annotations

import io
import os
import re
from typing import BinaryIO

from tfrecord_etl._install import pip_install
from tfrecord_etl.transforms.errors import ConfigError, InputChangedError, SourceError
from tfrecord_etl.transforms.storage import gcsaccess, lightfs, remote, storeops
from tfrecord_etl.transforms.storage.remote import READ_AHEAD, forget_objects  # noqa: F401 - fileio's names

_RAW = "uncompressed"  # Beam's CompressionTypes.UNCOMPRESSED
_GLOB_CHARS = re.compile(r"([*?\[\]])")


_BEAM: list = []  # [Beam's FileSystems class, or None when apache_beam is not installed], once looked up


def _beam_filesystems():
    """Beam's ``FileSystems``, or None when apache_beam is not installed (the light reader)."""
    if not _BEAM:
        try:
            from apache_beam.io.filesystems import FileSystems
        except ImportError:
            FileSystems = None
        _BEAM.append(FileSystems)
    fs = _BEAM[0]
    if fs is not None:  # a worker too: gs:// on an emulator or with --no_auth needs no 20 s credential search
        gcsaccess.anonymous_where_no_credentials_apply(fs._pipeline_options)
    if fs is not None and fs._pipeline_options is None:
        # a process that never built a pipeline nor ran a command (the reader, verify or inspect from Python, a
        # notebook): Beam's S3 filesystem refuses to work without options ("Must provide one of client or
        # options"), so it gets the defaults, which leave endpoint, region and credentials to boto3's own chain
        # (AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ~/.aws), as the light reader's client does
        from apache_beam.options.pipeline_options import PipelineOptions  # deferred: Beam, loaded above

        # (a GCS emulator named by STORAGE_EMULATOR_HOST takes no credentials: the commands connect to it so too)
        fs.set_options(PipelineOptions(["--no_auth"] if os.environ.get("STORAGE_EMULATOR_HOST") else []))
    return fs


def __getattr__(name: str):
    """``fileio.FileSystems``: Beam's, imported on first use (PEP 562), so importing this module needs no Beam."""
    if name == "FileSystems":
        return _needs_beam("Beam's FileSystems")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _needs_beam(what: str):
    """Beam's ``FileSystems`` for ``what`` (a write, a delete, a read of another scheme than the light reader's), or
    ImportError saying what to install."""
    fs = _beam_filesystems()
    if fs is None:
        raise ImportError(
            f"{what} needs Apache Beam: {pip_install('beam')} (reading needs only NumPy and google-crc32c)"
        )
    return fs


def check_reachable(path: str) -> None:
    """For a gs:// ``path``: that Google Cloud Storage (its emulator, its proxy) can be reached, checked once per
    process and endpoint (:func:`gcsaccess.check`); nothing for other paths.

    Raises:
      ConfigError: it cannot be reached, or ``STORAGE_EMULATOR_HOST`` (or the variable naming the endpoint or
        its proxy) holds no address; one line naming the host, the reason and what to set.
    """
    if lightfs.scheme(path).lower() == "gs":
        gcsaccess.check([path])


def escape_glob(path: str) -> str:
    """``path`` with ``*``, ``?``, ``[`` and ``]`` made literal for Beam's ``FileSystems.match``."""
    return _GLOB_CHARS.sub(r"[\1]", path)


def match(pattern: str) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of every file matching ``pattern``, sorted by path.

    Raises:
      SourceError: nothing matches, or the pattern names a directory.
    """
    try:
        results = find(pattern)
    except (ImportError, ConfigError):
        raise
    except Exception as e:  # Beam raises BeamIOError for an unmatched pattern on some filesystems
        raise SourceError(
            f"Cannot match input pattern: {e}",
            file=pattern,
            hint="check the path or glob; quote it so the shell does not expand it",
        ) from None
    files = sorted((p, n) for p, n in results if not is_dir(p))
    if not files:
        hint = (
            "the pattern names a directory: add a glob such as /*.h5"
            if results or is_dir(pattern)
            else "check the path or glob; quote it so the shell does not expand it"
        )
        raise SourceError("No input file matches the pattern", file=pattern, hint=hint)
    return files


def find(pattern: str) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of what ``pattern`` matches, as the filesystem lists it (unsorted; ``[]`` when
    nothing matches). Errors of the filesystem propagate (Beam's ``BeamIOError`` for an unmatched pattern on some
    filesystems); :func:`match` is the checked form. ConfigError: a gs:// endpoint that cannot be reached
    (:func:`check_reachable`)."""
    check_reachable(pattern)
    fs = _beam_filesystems()
    if fs is None:
        return lightfs.match(pattern)
    return [(m.path, m.size_in_bytes) for m in fs.match([pattern])[0].metadata_list]


def list_prefix(directory: str) -> list[tuple[str, int]] | None:
    """:func:`storeops.list_prefix` of the s3:// or gs:// ``directory`` (every object under it, listed with the
    store's client); None for other filesystems."""
    return storeops.list_prefix(_opener(directory), directory)


def is_dir(path: str) -> bool:
    """Whether ``path`` is a local directory, or a remote path ending in ``/``."""
    if is_local(path):
        return os.path.isdir(path)
    return path.endswith("/")


def is_local(path: str) -> bool:
    """Whether ``path`` is a local path: no ``scheme://`` prefix (Beam's ``LocalFileSystem`` takes those)."""
    return not lightfs.scheme(path)


def absolute(path: str) -> str:
    """``path`` made absolute against the working directory when it is local and relative (``data/*.h5`` ->
    ``/home/me/data/*.h5``; ``..`` and ``.`` resolved lexically, a trailing ``/`` kept, glob characters and span
    placeholders left as they are); an absolute path, an empty one and a ``scheme://`` URL as given. What the
    launcher does to the paths it is given, so that a worker running in another directory names the same files."""
    if not path or not is_local(path) or os.path.isabs(path):
        return path
    resolved = os.path.normpath(os.path.join(os.getcwd(), path))
    return resolved + "/" if path.endswith(("/", os.sep)) and not resolved.endswith("/") else resolved


def _opener(path: str):
    """``(filesystem name, client, opener)`` of the s3:// or gs:// ``path``: the client Beam's filesystem for it
    is configured with (its pipeline options), or without Beam the light reader's (:mod:`lightfs`); None for
    other filesystems (a local path without looking Beam up)."""
    if is_local(path):
        return None
    fs = _beam_filesystems()
    if fs is None:
        light = remote.LIGHT_OPENERS.get(lightfs.scheme(path))
        return None if light is None else (light[0], light[1](), light[2])
    fs = fs.get_filesystem(path)
    kind = remote.OPENERS.get(type(fs).__name__)
    return None if kind is None else (type(fs).__name__, kind[0](fs), kind[1])


def _range_reader(path: str):
    """A buffered :class:`remote.RangeReader` over the s3:// or gs:// ``path``, or None for other filesystems (local
    files, read through Beam's ``FileSystems``). The object's size and first :data:`READ_AHEAD` bytes are known
    once it is open (one request; its metadata reads come from this process's earlier open of the same version:
    :class:`remote.RemoteObject`), so the
    header of a .npy or the superblock of an HDF5 file is read before h5py takes its lock, and concurrent
    planning overlaps it; then bounded GETs, reads smaller than :data:`READ_AHEAD` served from one read-ahead of
    that size."""
    found = _opener(path)
    if found is None:
        return None
    kind, client, opener = found
    # one entry per endpoint and path, whichever options object made the client (the launcher's and the
    # pipeline's differ, and both read the same objects)
    key = (kind, remote.endpoint(client), path)
    obj = opener(client, path, remote.known(key))
    remote.remember(key, obj)
    return io.BufferedReader(remote.RangeReader(obj), buffer_size=READ_AHEAD)


def open_read(path: str) -> BinaryIO:
    """A seekable binary stream over ``path``, uncompressed whatever its suffix.

    Raises:
      SourceError: it cannot be opened. ConfigError: a gs:// endpoint that cannot be reached
        (:func:`check_reachable`).
    """
    check_reachable(path)
    try:
        stream = _range_reader(path)
        if stream is None and is_local(path):
            stream = open(path, "rb")  # what Beam's LocalFileSystem.open does for uncompressed reads
        return stream or _needs_beam(f"Reading {path}").open(path, compression_type=_RAW)
    except ImportError:
        raise
    except Exception as e:
        raise SourceError(f"Cannot open file: {e}", file=path) from None


def open_write(path: str) -> BinaryIO:
    """A binary stream that creates (or truncates) ``path``; local parent directories are created."""
    check_reachable(path)
    return _needs_beam(f"Writing {path}").create(path, compression_type=_RAW)


def _path_fs(path: str):
    """The filesystem module for the path functions below: :mod:`lightfs` for a local path (what Beam's
    ``LocalFileSystem`` does: ``os.path``; importing Beam's FileSystems, and with it Beam's GCP modules, costs a reader
    about 2 s) and without Beam, else Beam's ``FileSystems`` (every scheme registered, pipeline options applied)."""
    return (_beam_filesystems() if not is_local(path) else None) or lightfs


def exists(path: str) -> bool:
    check_reachable(path)  # an unreachable endpoint is not a missing file
    found = _head(path)
    if found is not None:
        return found[0]
    return _path_fs(path).exists(path)


def _head(path: str) -> tuple[bool, int] | None:
    """:func:`storeops.head`: ``(exists, size)`` of an s3:// or gs:// object from one HEAD; None elsewhere."""
    return storeops.head(_opener(path), path)


def join(base: str, *parts: str) -> str:
    return _path_fs(base).join(base, *parts)


def basename(path: str) -> str:
    return _path_fs(path).split(path)[1]


def dirname(path: str) -> str:
    return _path_fs(path).split(path)[0]


def rename(src: str, dst: str) -> None:
    """Moves ``src`` to ``dst``, replacing ``dst`` (the commit of a temp file). Paths are literal: local
    files use ``os.replace`` (atomic), since Beam's local ``delete`` treats a path as a glob."""
    if is_local(src) and is_local(dst):
        os.replace(src, dst)
        return
    if storeops.gcs_move(storeops.gcs_blob(_opener(src), src), storeops.gcs_blob(_opener(dst), dst)):
        return
    fs = _needs_beam(f"Renaming {src}")
    if exists(dst):
        fs.delete([dst])
    fs.rename([src], [dst])


def size(path: str) -> int:
    """Size in bytes of the file ``path``, taken literally (a ``[`` in the path is not a glob).

    Raises:
      SourceError: the file does not exist. ConfigError: a gs:// endpoint that cannot be reached
        (:func:`check_reachable`).
    """
    check_reachable(path)
    try:
        if is_local(path):
            return os.path.getsize(path)
        found = _head(path)
        if found is not None:
            if not found[0]:
                raise FileNotFoundError(f"No such object: {path}")
            return found[1]
        fs = _beam_filesystems()
        if fs is None:
            return lightfs.size(path)
        return fs.match([escape_glob(path)])[0].metadata_list[0].size_in_bytes
    except ImportError:
        raise
    except (OSError, IndexError, Exception) as e:  # noqa: BLE001 - BeamIOError for a missing remote path
        raise SourceError(f"Cannot read the size of the file: {e}", file=path) from None


def pin(path: str, known_size: int | None = None) -> tuple[int, int | None]:
    """What a run records of an input when it plans, to tell at read time that the input is the one planned:
    ``(size in bytes, st_mtime_ns)`` of a local file (one ``os.stat``, symlinks followed); ``(size, None)`` of a
    remote object (``known_size`` as given, e.g. from the listing, else asked for), whose version its reads pin by ETag
    or generation (:class:`remote.RemoteObject`).

    Raises:
      SourceError: the file cannot be stat'ed.
    """
    if is_local(path):
        try:
            st = os.stat(path)
        except OSError as e:
            raise SourceError(f"Cannot read the size of the file: {e.strerror}", file=path) from None
        return st.st_size, st.st_mtime_ns
    return (size(path) if known_size is None else known_size), None


def check_pin(path: str, pinned: tuple[int, int | None], what: str = "Input file") -> None:
    """Raises InputChangedError (``<what> changed while it was read (...): run again``, naming the file) when
    ``path`` differs from ``pinned`` (:func:`pin`): in size, or for a local file in its modification time
    (``st_mtime_ns``: a rewrite of the same size), or is gone. A remote object is compared by size only.

    A local file that is not there names both causes: a worker that does not reach the launcher's files (another
    machine, container or mount) or a file deleted or moved since the run was planned; every worker must reach the
    same path (s3://, gs://, a shared mount)."""
    planned_size, planned_mtime = pinned
    try:
        if planned_mtime is not None:
            st = os.stat(path)
            now = st.st_size, st.st_mtime_ns
        else:
            now = size(path), None
    except (OSError, SourceError):
        now = None
    if now == (planned_size, planned_mtime):
        return
    if now is None and planned_mtime is not None:
        raise InputChangedError(
            f"{what} not found on the worker that reads it, though the run planned it ({planned_size} bytes): "
            "the worker does not reach the launcher's files (another machine, container or mount), or the file "
            "was deleted or moved since",
            file=path,
            hint="every worker must reach the same path: use s3:// or gs://, or a mount every worker shares at "
            "that path; if the file was deleted or moved, restore it, then run the command again",
        )
    detail = (
        "it is gone"
        if now is None
        else f"{now[0]} bytes, {planned_size} when the run was planned"
        if now[0] != planned_size
        else "rewritten: its modification time is not the one planned"
    )
    raise InputChangedError(
        f"{what} changed while it was read ({detail}): run again",
        file=path,
        hint="wait until whatever writes it has finished, then run the command again",
    )


def delete(paths: list[str]) -> None:
    """Deletes the files ``paths`` that exist, each by its literal path (never a glob)."""
    remote = []
    for p in paths:
        if is_local(p):
            if os.path.lexists(p):
                os.unlink(p)
        elif (blob := storeops.gcs_blob(_opener(p), p)) is not None:
            storeops.gcs_delete(blob)  # one request, not Beam's batch API (storeops.gcs_move)
        elif exists(p):
            remote.append(p)
    if remote:
        _needs_beam(f"Deleting {remote[0]}").delete(remote)


def read_bytes(path: str) -> bytes:
    with open_read(path) as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    with open_write(path) as f:
        f.write(data)


def pinned_version(path: str) -> str | None:
    """The version (S3 ETag, GCS generation) of the remote object ``path`` that this process's reads are pinned
    to (:class:`remote.RemoteObject`: planning opened it; no request), else None (a local file, or an object this
    process has not opened). :func:`conditional.read_version` asks the store when there is none."""
    found = _opener(path)
    if found is None:
        return None
    obj = remote.known((found[0], remote.endpoint(found[1]), path))
    return obj.version if obj is not None and obj.version else None


def prefetch(stream, ranges) -> bool:
    """Asks ``stream`` (from :func:`open_read`) to fetch the byte ranges ``[(offset, length)]`` concurrently before
    they are read; True when it can (remote s3:// and gs:// streams), False for the others (local files need no
    help)."""
    raw = getattr(stream, "raw", None)
    if isinstance(raw, remote.RangeReader):
        raw.prefetch(ranges)
        return True
    return False
