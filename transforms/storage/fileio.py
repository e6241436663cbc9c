"""File access through Beam's ``FileSystems``, so local, gs:// and s3:// paths take one code path.

Without Apache Beam installed (the reader's install, ``pip install .``) the reads go through
:mod:`tfrecord_etl.transforms.storage.lightfs` instead (local files, and s3:// and gs:// objects with the same bounded
reads as below); writing needs Beam."""

from __future__ import annotations

import collections
import contextlib
import io
import os
import re
import threading
import weakref
from typing import BinaryIO

from tfrecord_etl._install import pip_install
from tfrecord_etl.transforms.errors import InputChangedError, SourceError
from tfrecord_etl.transforms.storage import lightfs

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
    return _BEAM[0]


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
    except ImportError:
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
    filesystems); :func:`match` is the checked form."""
    fs = _beam_filesystems()
    if fs is None:
        return lightfs.match(pattern)
    return [(m.path, m.size_in_bytes) for m in fs.match([pattern])[0].metadata_list]


def is_dir(path: str) -> bool:
    """Whether ``path`` is a local directory, or a remote path ending in ``/``."""
    if is_local(path):
        return os.path.isdir(path)
    return path.endswith("/")


def is_local(path: str) -> bool:
    """Whether ``path`` is a local path: no ``scheme://`` prefix (Beam's ``LocalFileSystem`` takes those)."""
    return not lightfs.scheme(path)


_CLIENTS_LOCK = threading.Lock()
_CLIENTS: dict[tuple[str, str], object] = {}  # one client per process, scheme and options (both kinds thread-safe)
# PipelineOptions -> its key in _CLIENTS: get_all_options re-parses every option of every registered
# PipelineOptions class (~19 ms, half the launcher's CPU per remote file indexed), so it is computed once per object
_OPTION_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
READ_AHEAD = 64 * 1024  # bytes: a read smaller than this (a header, HDF5 metadata) fetches this much
PREFETCH_THREADS = 8  # requests in flight per worker for the chunks of one row range
PREFETCH_KEEP_BYTES = 16 * 2**20  # prefetched chunks kept per open stream beyond the latest prefetch
SMALL_READS_PER_OBJECT = 8 * READ_AHEAD  # bytes of an object's small reads (HDF5 metadata) kept for its next open
OBJECT_CACHE_BYTES = 64 * 2**20  # all objects' kept bytes in one process (least recently opened dropped first)


class _RemoteObject:
    """One s3:// or gs:// object as this process knows it: ``fetch(start, n)`` (pinned to the version first
    opened: S3 ``If-Match`` its ETag, GCS its generation, so an object replaced while a job reads it fails with
    an error instead of mixing two versions), its size, and the small reads made from it so far (the first
    :data:`READ_AHEAD` bytes and up to :data:`SMALL_READS_PER_OBJECT` of read-aheads: a .npy header, HDF5
    superblock, object headers and B-tree nodes), which the next open in this process reuses once the server
    says the object is unchanged (a conditional request: S3 ``If-None-Match`` the ETag answered 304 with no body,
    GCS the same generation in the metadata). Every row range opens its file again (planning once, then each
    shard or range), so without them each open fetched the same head and metadata again: converting a 0.4 MB
    HDF5 file of 4 datasets in 3 shards made the server send 3.2x the file, 1.05x with them."""

    def __init__(self, fetch, size: int, path: str, head: bytes, version: str = ""):
        self.fetch, self.size, self.path, self.version = fetch, size, path, version
        self.small: list[tuple[int, bytes]] = [(0, head)] if head else []
        self.kept = len(head)
        self.lock = threading.Lock()

    def cached(self, pos: int) -> tuple[int, bytes] | None:
        for start, data in self.small:
            if start <= pos < start + len(data):
                return start, data
        return None

    def keep(self, start: int, data: bytes) -> None:
        with self.lock:
            if self.kept + len(data) <= SMALL_READS_PER_OBJECT:
                self.small = self.small + [(start, data)]
                self.kept += len(data)


MAX_OBJECTS = 4096  # objects known per process (each a few hundred bytes besides its kept reads)
_OBJECTS: collections.OrderedDict[tuple, tuple[_RemoteObject, int]] = collections.OrderedDict()  # obj, bytes
_OBJECTS_LOCK = threading.Lock()
_OBJECTS_BYTES = [0]  # the kept bytes counted at each object's latest open


def _known(key: tuple) -> _RemoteObject | None:
    with _OBJECTS_LOCK:
        entry = _OBJECTS.get(key)
    return entry[0] if entry else None


def _remember(key: tuple, obj: _RemoteObject) -> None:
    with _OBJECTS_LOCK:
        old = _OBJECTS.pop(key, None)
        _OBJECTS_BYTES[0] += obj.kept - (old[1] if old else 0)
        _OBJECTS[key] = (obj, obj.kept)
        while len(_OBJECTS) > 1 and (_OBJECTS_BYTES[0] > OBJECT_CACHE_BYTES or len(_OBJECTS) > MAX_OBJECTS):
            _, (_, kept) = _OBJECTS.popitem(last=False)
            _OBJECTS_BYTES[0] -= kept


def forget_objects() -> None:
    """Drops what this process knows of remote objects (sizes, versions, metadata reads): the next open of each
    asks the server again. Called when a read finds an object changed."""
    with _OBJECTS_LOCK:
        _OBJECTS.clear()
        _OBJECTS_BYTES[0] = 0


class _RangeReader(io.RawIOBase):
    """A seekable read-only stream over one object in object storage (s3:// or gs://) whose every read is one
    bounded ranged GET (``Range: bytes=a-b``) of exactly the bytes asked (never past the object's end), so the
    server sends nothing that is not used. ``fetch(start, n)`` makes the request (boto3's ``get_object`` or
    google-cloud-storage's ``Blob.download_as_bytes``). Beam's own streams fetch more than is read: its S3 stream
    asks for ``bytes=N-`` (to the end of the object) and closes the body after 16 MiB or at the next seek, so a
    reader that seeks (h5py between chunks) made the server send 10x the file; its GCS stream (google-cloud-
    storage's ``BlobReader``) fetches 16 MiB at every read after a seek."""

    def __init__(self, obj: _RemoteObject):
        self._obj, self._size, self._path = obj, obj.size, obj.path
        self._pos = 0
        self._blocks: list[tuple[int, bytes]] = []  # prefetched (offset, bytes), newest first; see prefetch

    def _get(self, start: int, n: int) -> bytes:
        try:
            data = self._obj.fetch(start, n)
        except _ObjectChanged:
            forget_objects()
            raise OSError(
                f"{self._path} changed while it was read (its ETag or generation is not the one first "
                f"read): run again to read the new version"
            ) from None
        if len(data) != n:
            raise OSError(f"The server returned {len(data)} bytes for a range of {n} at byte {start} of {self._path}")
        return data

    def prefetch(self, ranges, max_gap: int = READ_AHEAD, threads: int = PREFETCH_THREADS) -> None:
        """Fetches the byte ranges ``[(offset, length)]`` (e.g. the HDF5 chunks of a row range) with up to
        ``threads`` requests in flight, ranges less than ``max_gap`` bytes apart coalesced into one request, and
        keeps them, with earlier ones up to :data:`PREFETCH_KEEP_BYTES` in all; reads inside them need no request.
        A range already held (by an earlier prefetch: a chunk shared by two row ranges; or by the object's kept
        metadata reads) is not fetched again. A reader that seeks from chunk to chunk then waits one round trip
        per row range instead of one per chunk (several reads in flight per worker)."""
        kept: list[tuple[int, bytes]] = []
        needed: list[tuple[int, int]] = []
        for offset, length in sorted((int(o), int(n)) for o, n in ranges if n > 0):
            end = min(offset + length, self._size)
            held = next(
                ((start, data) for start, data in self._blocks if start <= offset and end <= start + len(data)), None
            )
            if held is not None:
                kept.append((offset, held[1][offset - held[0] : end - held[0]]))
            elif offset < end:
                needed.append((offset, end))
        merged: list[list[int]] = []
        for offset, end in needed:
            if merged and offset - merged[-1][1] < max_gap:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([offset, end])
        merged = [r for r in (self._uncached(a, b) for a, b in merged) if r[0] < r[1]]
        fetched: list[tuple[int, bytes]] = []
        if len(merged) == 1:
            fetched = [(merged[0][0], self._get(merged[0][0], merged[0][1] - merged[0][0]))]
        elif merged:
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(min(threads, len(merged))) as pool:
                datas = list(pool.map(lambda r: self._get(r[0], r[1] - r[0]), merged))
            fetched = [(r[0], d) for r, d in zip(merged, datas)]
        # newest first; older blocks stay while they fit in PREFETCH_KEEP_BYTES (the other datasets of the same
        # row range, whose chunks the next range may share)
        blocks, total = fetched + kept, sum(len(d) for _, d in fetched + kept)
        for block in self._blocks:
            if total + len(block[1]) > PREFETCH_KEEP_BYTES:
                break
            blocks.append(block)
            total += len(block[1])
        self._blocks = blocks

    def _uncached(self, a: int, b: int) -> list[int]:
        """``[a, b)`` without the ends this process already holds (small reads kept by :class:`_RemoteObject`):
        a read-ahead of HDF5 metadata often holds the first chunk after it."""
        for start, data in sorted(self._obj.small):
            end = start + len(data)
            if start <= a < end:
                a = end
            if start < b <= end:
                b = start
        return [a, b]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"negative seek position {base + offset} in {self._path}")
        self._pos = base + offset
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        kept = self._obj.cached(self._pos)  # the head, HDF5 metadata read before: no request
        for start, data in ([kept] if kept else []) + self._blocks:  # then prefetched chunks: no request
            if start <= self._pos < start + len(data):
                n = min(n, start + len(data) - self._pos)
                memoryview(b)[:n] = data[self._pos - start : self._pos - start + n]
                self._pos += n
                return n
        data = self._get(self._pos, n)
        if n <= READ_AHEAD:  # a small read (BufferedReader's read-ahead): metadata, kept for the next open
            self._obj.keep(self._pos, data)
        memoryview(b)[:n] = data
        self._pos += n
        return n


def _client(scheme: str, options, make):
    """The cached client of ``scheme`` for the pipeline options ``options``, made by ``make()`` once."""
    key = ""
    if options is not None:
        key = _OPTION_KEYS.get(options)
        if key is None:
            key = _OPTION_KEYS[options] = repr(options.get_all_options(drop_default=True))
    client = _CLIENTS.get((scheme, key))
    if client is None:
        with _CLIENTS_LOCK:  # planning's threads start together: one makes it (each took 0.2 s of the GIL)
            client = _CLIENTS.get((scheme, key))
            if client is None:
                client = _CLIENTS[(scheme, key)] = make()
    return client


def _s3_client(fs):
    """The cached boto3 client for Beam's ``S3FileSystem`` ``fs``, made from the same ``S3Options`` (endpoint,
    credentials, region) as Beam's own (``apache_beam/io/aws/clients/s3/boto3_client.py``). Beam builds a new one
    for every file it opens: ~200 ms of botocore loading its JSON service models, 90% of the time to index a small
    file on an S3 API (cProfile of planning 30 .npy files on a moto server: 6.7 of 7.4 s in
    ``boto3.session.client``)."""
    options = getattr(fs, "_options", None)

    def make():
        from apache_beam.io.aws.clients.s3 import boto3_client

        return boto3_client.Client(options=options).client

    return _client("s3", options, make)


def _gcs_client(fs):
    """The cached google-cloud-storage client for Beam's ``GCSFileSystem`` ``fs``, made as Beam makes its own
    (``gcsio.create_storage_client``: the pipeline's credentials, or an anonymous client without them; the
    ``STORAGE_EMULATOR_HOST`` variable points it at an emulator). Beam makes one per file opened."""
    options = getattr(fs, "_pipeline_options", None)

    def make():
        from apache_beam.io.gcp import gcsio
        from apache_beam.options.pipeline_options import PipelineOptions

        return gcsio.create_storage_client(options if options is not None else PipelineOptions())

    return _client("gs", options, make)


class _ObjectChanged(Exception):
    """The object's version is no longer the one first read (S3 412 Precondition Failed, GCS 404 of a
    generation)."""


def _s3_opener(client, path: str, known: _RemoteObject | None) -> _RemoteObject:
    """The s3:// object ``path``. Opening is one request: ``GET Range: bytes=0-`` of the first :data:`READ_AHEAD`
    bytes, whose ``Content-Range`` gives the object's size and ``ETag`` its version (a HEAD only for an empty
    object), ``If-None-Match`` the ETag of ``known`` (this process's last open of it), which is returned when the
    server answers 304 Not Modified; later reads are ``If-Match`` the ETag."""
    bucket, key = lightfs.bucket_key(path)
    unless = {"IfNoneMatch": known.version} if known is not None and known.version else {}
    try:
        first = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{READ_AHEAD - 1}", **unless)
    except client.exceptions.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code"))
        if unless and code in ("304", "NotModified"):
            return known
        if code != "InvalidRange":
            raise
        first, head = client.head_object(Bucket=bucket, Key=key), b""  # an empty object
        size = first["ContentLength"]
    else:
        with contextlib.closing(first["Body"]) as body:
            head = body.read()
        size = int(first.get("ContentRange", "").rsplit("/", 1)[-1] or len(head))
    pinned = {"IfMatch": first["ETag"]} if first.get("ETag") else {}

    def fetch(start: int, n: int) -> bytes:
        try:
            body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{start + n - 1}", **pinned)["Body"]
        except client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412", "NoSuchKey"):
                raise _ObjectChanged() from None
            raise
        with contextlib.closing(body):
            return body.read()

    return _RemoteObject(fetch, size, path, head, first.get("ETag") or "")


def _gcs_opener(client, path: str, known: _RemoteObject | None) -> _RemoteObject:
    """The gs:// object ``path``: its metadata (the size and generation: one request, as Beam's reader makes)
    and its first :data:`READ_AHEAD` bytes (a second one, unless ``known``, this process's last open of it, has
    the same generation: then ``known``). Reads are ``if_generation_match`` that generation. Bytes are the stored ones
    (``raw_download``, as Beam reads them: no decompressive transcoding)."""
    from google.api_core.exceptions import NotFound, PreconditionFailed

    bucket, name = lightfs.bucket_key(path)
    blob = client.bucket(bucket).get_blob(name)
    if blob is None:
        raise FileNotFoundError(f"No such object: {path}")
    generation = blob.generation  # a download may reset blob.generation from its response headers
    if known is not None and generation is not None and known.version == str(generation):
        return known
    pinned = {"if_generation_match": generation} if generation is not None else {}

    def fetch(start: int, n: int) -> bytes:
        try:
            return blob.download_as_bytes(start=start, end=start + n - 1, raw_download=True, checksum=None, **pinned)
        except (NotFound, PreconditionFailed):
            raise _ObjectChanged() from None

    size = int(blob.size or 0)
    return _RemoteObject(
        fetch,
        size,
        path,
        fetch(0, min(READ_AHEAD, size)) if size else b"",
        str(generation) if generation is not None else "",
    )


def _endpoint(client) -> str:
    meta = getattr(client, "meta", None)  # boto3
    if meta is not None:
        return str(getattr(meta, "endpoint_url", ""))
    return str(getattr(getattr(client, "_connection", None), "API_BASE_URL", ""))  # google-cloud-storage


_OPENERS = {"S3FileSystem": (_s3_client, _s3_opener), "GCSFileSystem": (_gcs_client, _gcs_opener)}
_LIGHT_OPENERS = {
    "s3": ("S3FileSystem", lightfs.s3_client, _s3_opener),
    "gs": ("GCSFileSystem", lightfs.gcs_client, _gcs_opener),
}


def _opener(path: str):
    """``(filesystem name, client, opener)`` of the s3:// or gs:// ``path``: the client Beam's filesystem for it
    is configured with (its pipeline options), or without Beam the light reader's (:mod:`lightfs`); None for
    other filesystems (a local path without looking Beam up)."""
    if is_local(path):
        return None
    fs = _beam_filesystems()
    if fs is None:
        light = _LIGHT_OPENERS.get(lightfs.scheme(path))
        return None if light is None else (light[0], light[1](), light[2])
    fs = fs.get_filesystem(path)
    kind = _OPENERS.get(type(fs).__name__)
    return None if kind is None else (type(fs).__name__, kind[0](fs), kind[1])


def _range_reader(path: str):
    """A buffered :class:`_RangeReader` over the s3:// or gs:// ``path``, or None for other filesystems (local
    files, read through Beam's ``FileSystems``). The object's size and first :data:`READ_AHEAD` bytes are known
    once it is open (one request; its metadata reads come from this process's earlier open of the same version:
    :class:`_RemoteObject`), so the
    header of a .npy or the superblock of an HDF5 file is read before h5py takes its lock, and concurrent
    planning overlaps it; then bounded GETs, reads smaller than :data:`READ_AHEAD` served from one read-ahead of
    that size."""
    found = _opener(path)
    if found is None:
        return None
    kind, client, opener = found
    # one entry per endpoint and path, whichever options object made the client (the launcher's and the
    # pipeline's differ, and both read the same objects)
    key = (kind, _endpoint(client), path)
    obj = opener(client, path, _known(key))
    _remember(key, obj)
    return io.BufferedReader(_RangeReader(obj), buffer_size=READ_AHEAD)


def open_read(path: str) -> BinaryIO:
    """A seekable binary stream over ``path``, uncompressed whatever its suffix."""
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
    return _needs_beam(f"Writing {path}").create(path, compression_type=_RAW)


def _path_fs(path: str):
    """The filesystem module for the path functions below: :mod:`lightfs` for a local path (what Beam's
    ``LocalFileSystem`` does: ``os.path``; importing Beam's FileSystems, and with it Beam's GCP modules, costs a reader
    about 2 s) and without Beam, else Beam's ``FileSystems`` (every scheme registered, pipeline options applied)."""
    return (_beam_filesystems() if not is_local(path) else None) or lightfs


def exists(path: str) -> bool:
    return _path_fs(path).exists(path)


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
    fs = _needs_beam(f"Renaming {src}")
    if exists(dst):
        fs.delete([dst])
    fs.rename([src], [dst])


def size(path: str) -> int:
    """Size in bytes of the file ``path``, taken literally (a ``[`` in the path is not a glob).

    Raises:
      SourceError: the file does not exist.
    """
    try:
        if is_local(path):
            return os.path.getsize(path)
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
    or generation (:class:`_RemoteObject`).

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
    ``path`` is gone or differs from ``pinned`` (:func:`pin`): in size, or for a local file in its modification
    time (``st_mtime_ns``: a rewrite of the same size). A remote object is compared by size only."""
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
    to (:class:`_RemoteObject`: planning opened it; no request), else None (a local file, or an object this
    process has not opened). :func:`conditional.read_version` asks the store when there is none."""
    found = _opener(path)
    if found is None:
        return None
    obj = _known((found[0], _endpoint(found[1]), path))
    return obj.version if obj is not None and obj.version else None


def prefetch(stream, ranges) -> bool:
    """Asks ``stream`` (from :func:`open_read`) to fetch the byte ranges ``[(offset, length)]`` concurrently before
    they are read; True when it can (remote s3:// and gs:// streams), False for the others (local files need no
    help)."""
    raw = getattr(stream, "raw", None)
    if isinstance(raw, _RangeReader):
        raw.prefetch(ranges)
        return True
    return False
