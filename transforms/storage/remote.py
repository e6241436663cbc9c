"""Remote objects (s3://, gs://) read by bounded ranged requests: the objects this process knows (size, version,
the small reads kept for the next open), the buffered range reader with its read-ahead and prefetch, and the
store clients, made once per endpoint and options. :mod:`fileio` opens paths through it; without Beam the clients
are the light reader's (:mod:`lightfs`)."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import io
import os
import threading
import time
import weakref

from tfrecord_etl.transforms.storage import gcsaccess, lightfs

CLIENTS_LOCK = threading.Lock()
CLIENTS: dict[tuple[str, str], object] = {}  # one client per process, scheme and options (both kinds thread-safe)
# PipelineOptions -> its key in CLIENTS: get_all_options re-parses every option of every registered
# PipelineOptions class (~19 ms, half the launcher's CPU per remote file indexed), so it is computed once per object
_OPTION_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
READ_AHEAD = 64 * 1024  # bytes: a read smaller than this (a header, HDF5 metadata) fetches this much
PREFETCH_THREADS = 8  # requests in flight per worker for the chunks of one row range
PREFETCH_KEEP_BYTES = 16 * 2**20  # prefetched chunks kept per open stream beyond the latest prefetch
SMALL_READS_PER_OBJECT = 8 * READ_AHEAD  # bytes of an object's small reads (HDF5 metadata) kept for its next open
OBJECT_CACHE_BYTES = 64 * 2**20  # all objects' kept bytes in one process (least recently opened dropped first)


# S3 requests' attempts (botocore's standard retry mode: exponential backoff with jitter, about 7 s of pauses in all
# before the 5th): enough for a burst of 503 SlowDown, short enough that a run whose store went away ends in minutes
S3_ATTEMPTS = "5"


def store_retries() -> None:
    """``AWS_MAX_ATTEMPTS`` = :data:`S3_ATTEMPTS` and ``AWS_RETRY_MODE=standard`` in this process's environment
    unless set (botocore reads them when a client is made: Beam's S3 clients and ours): botocore's default of 3
    attempts gave up on a burst of three ``503 SlowDown``, which a store under load sends as a matter of course.
    The launcher calls it before its first client (``configure_filesystems``), each worker in our DoFns'
    ``setup`` (``runlock.CarriesRun``). Idempotent."""
    os.environ.setdefault("AWS_MAX_ATTEMPTS", S3_ATTEMPTS)
    os.environ.setdefault("AWS_RETRY_MODE", "standard")


class RemoteObject:
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
_OBJECTS: collections.OrderedDict[tuple, tuple[RemoteObject, int]] = collections.OrderedDict()  # obj, bytes
_OBJECTS_LOCK = threading.Lock()
_OBJECTS_BYTES = [0]  # the kept bytes counted at each object's latest open


def known(key: tuple) -> RemoteObject | None:
    with _OBJECTS_LOCK:
        entry = _OBJECTS.get(key)
    return entry[0] if entry else None


def remember(key: tuple, obj: RemoteObject) -> None:
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


class RangeReader(io.RawIOBase):
    """A seekable read-only stream over one object in object storage (s3:// or gs://) whose every read is one
    bounded ranged GET (``Range: bytes=a-b``) of exactly the bytes asked (never past the object's end), so the
    server sends nothing that is not used. ``fetch(start, n)`` makes the request (boto3's ``get_object`` or
    google-cloud-storage's ``Blob.download_as_bytes``). Beam's own streams fetch more than is read: its S3 stream
    asks for ``bytes=N-`` (to the end of the object) and closes the body after 16 MiB or at the next seek, so a
    reader that seeks (h5py between chunks) made the server send 10x the file; its GCS stream (google-cloud-
    storage's ``BlobReader``) fetches 16 MiB at every read after a seek."""

    def __init__(self, obj: RemoteObject):
        self._obj, self._size, self._path = obj, obj.size, obj.path
        self._pos = 0
        self._blocks: list[tuple[int, bytes]] = []  # prefetched (offset, bytes), newest first; see prefetch

    def _get(self, start: int, n: int) -> bytes:
        try:
            data = self._obj.fetch(start, n)
        except ObjectChanged:
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
        """``[a, b)`` without the ends this process already holds (small reads kept by :class:`RemoteObject`):
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
    client = CLIENTS.get((scheme, key))
    if client is None:
        with CLIENTS_LOCK:  # planning's threads start together: one makes it (each took 0.2 s of the GIL)
            client = CLIENTS.get((scheme, key))
            if client is None:
                client = CLIENTS[(scheme, key)] = make()
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

        gcsaccess.anonymous_where_no_credentials_apply(options)
        return gcsio.create_storage_client(options if options is not None else PipelineOptions())

    return _client("gs", options, make)


class ObjectChanged(Exception):
    """The object's version is no longer the one first read (S3 412 Precondition Failed, GCS 404 of a
    generation)."""


def _s3_opener(client, path: str, known: RemoteObject | None) -> RemoteObject:
    """The s3:// object ``path``. Opening is one request: ``GET Range: bytes=0-`` of the first :data:`READ_AHEAD`
    bytes, whose ``Content-Range`` gives the object's size and ``ETag`` its version (a HEAD only for an empty
    object), ``If-None-Match`` the ETag of ``known`` (this process's last open of it), which is returned when the
    server answers 304 Not Modified; later reads are ``If-Match`` the ETag."""
    bucket, key = lightfs.bucket_key(path)
    unless = {"IfNoneMatch": known.version} if known is not None and known.version else {}
    try:
        first, head = _s3_get(
            lambda: client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{READ_AHEAD - 1}", **unless)
        )
    except client.exceptions.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code"))
        if unless and code in ("304", "NotModified"):
            return known
        if code != "InvalidRange":
            raise
        first, head = client.head_object(Bucket=bucket, Key=key), b""  # an empty object
        size = first["ContentLength"]
    else:
        size = int(first.get("ContentRange", "").rsplit("/", 1)[-1] or len(head))
    pinned = {"IfMatch": first["ETag"]} if first.get("ETag") else {}

    def fetch(start: int, n: int) -> bytes:
        try:
            return _s3_get(
                lambda: client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{start + n - 1}", **pinned)
            )[1]
        except client.exceptions.ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412", "NoSuchKey"):
                raise ObjectChanged() from None
            raise

    return RemoteObject(fetch, size, path, head, first.get("ETag") or "")


BODY_TRIES = 5  # GETs of one range whose body was cut off (botocore retries a request, never a body)


def _s3_get(request) -> tuple[dict, bytes]:
    """``(response, body bytes)`` of the GET ``request()``; a body cut off on the way (a connection reset in the
    middle, a proxy or load balancer dropping it: botocore's ``ResponseStreamingError`` or, for fewer bytes than
    its Content-Length, ``IncompleteReadError``) is asked for again, up to :data:`BODY_TRIES` GETs with a
    growing pause (0.2 s, doubled), since botocore's retries end once the response's head arrived. The request's
    own errors (a 503 SlowDown, a 412) are botocore's to retry or raise."""
    from botocore.exceptions import IncompleteReadError, ResponseStreamingError  # deferred: boto3, s3:// only
    from urllib3.exceptions import HTTPError  # deferred: boto3's urllib3

    for attempt in range(BODY_TRIES):
        response = request()
        try:
            with contextlib.closing(response["Body"]) as body:
                return response, body.read()
        except (ResponseStreamingError, IncompleteReadError, HTTPError, ConnectionError) as e:
            if attempt == BODY_TRIES - 1:
                raise OSError(f"the store cut off {BODY_TRIES} responses in a row ({type(e).__name__}: {e})") from None
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def _gcs_opener(client, path: str, known: RemoteObject | None) -> RemoteObject:
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
            raise ObjectChanged() from None

    size = int(blob.size or 0)
    return RemoteObject(
        fetch,
        size,
        path,
        fetch(0, min(READ_AHEAD, size)) if size else b"",
        str(generation) if generation is not None else "",
    )


def endpoint(client) -> str:
    meta = getattr(client, "meta", None)  # boto3
    if meta is not None:
        return str(getattr(meta, "endpoint_url", ""))
    return str(getattr(getattr(client, "_connection", None), "API_BASE_URL", ""))  # google-cloud-storage


OPENERS = {"S3FileSystem": (_s3_client, _s3_opener), "GCSFileSystem": (_gcs_client, _gcs_opener)}
LIGHT_OPENERS = {
    "s3": ("S3FileSystem", lightfs.s3_client, _s3_opener),
    "gs": ("GCSFileSystem", lightfs.gcs_client, _gcs_opener),
}
