"""Creating an s3:// or gs:// object under its final name at once: nothing is visible under that name until the
object is complete, and it is created only where no object has the name. How a shard reaches an object store
with one write of its bytes (the temporary + rename commit makes the store write each shard twice: S3's
``CopyObject`` and GCS's ``rewriteTo`` are copies on the store's own disks).

- **S3**: a multipart upload (``CreateMultipartUpload``, ``UploadPart`` for each :data:`PART_BYTES`) completed
  with ``If-None-Match: *`` (S3's conditional writes:
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); an object of at most one part is
  one ``PutObject`` with the same condition. On any error the upload is aborted (``AbortMultipartUpload``), never
  completed: its parts never become an object.
- **GCS**: a resumable upload session started with ``ifGenerationMatch=0`` (google-resumable-media's
  ``ResumableUpload``; https://cloud.google.com/storage/docs/performing-resumable-uploads), chunks of
  :data:`PART_BYTES` sent as they fill, the last one only when the caller says the object is complete; on an error
  the session is cancelled and its last chunk never sent, so no object appears. (google-cloud-storage's own
  ``BlobWriter`` finalizes the upload when it is closed, even by the garbage collector after an error: a partial
  object under the final name.) An object of at most one chunk is one upload with ``ifGenerationMatch=0``.

The caller's ``before_create`` runs just before the request that makes the object visible (the output's commit
guard, ``runlock.check_commit``). When the name is taken already (the store answers 412), it is another attempt of
the same write that finished first (a runner retried or duplicated the bundle): its size and CRC32C are read back
and compared with ours; equal, ours is dropped and the write counts as done; different, that object (at the version
read) is deleted and ours completed in its place, once.

Memory: at most two parts per open object (the one being filled and the one in flight); one request in flight,
from a thread of the object's own, so encoding and the upload overlap. Retries of each request are the store
client's (botocore's ``standard`` mode, ``remote.store_retries``; google-resumable-media's retry strategy).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

import google_crc32c

from tfrecord_etl.transforms.storage import conditional, fileio, lightfs

log = logging.getLogger(__name__)

PART_BYTES = 16 << 20  # S3 part / GCS chunk size (bytes; S3's minimum is 5 MiB, GCS chunks a multiple of 256 KiB)
PARTS_PER_SIZE = 1000  # S3 allows 10,000 parts per upload: the part size doubles after every 1,000 (16 GB, ...)
READ_BACK_BYTES = 8 << 20  # the read of another attempt's object, to compare its CRC32C


class ObjectCreate:
    """A write-only binary stream that becomes the object ``path`` when :meth:`finish` is called, or nothing when
    :meth:`abort` is (:func:`open_create` makes one). ``size`` (bytes) and ``crc32c`` (an int) are those of the bytes
    written so far."""

    def __init__(self, client, path: str, part_bytes: int):
        self.path, self._client, self._part = path, client, part_bytes
        self._bucket, self._key = lightfs.bucket_key(path)
        self._buf = bytearray()
        self.size, self.crc32c, self.sent = 0, 0, 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: concurrent.futures.Future | None = None
        self._taken = False  # the store refused a part because the name is taken: parts are only counted from then

    # -- the stream
    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self._buf += view
        self.size += len(view)
        while len(self._buf) > (n := self._next_part_bytes()):  # strictly more: the last part waits for finish
            chunk = bytes(self._buf[:n])
            del self._buf[:n]
            self._send(chunk)
        return len(view)

    def flush(self) -> None:
        pass

    def _next_part_bytes(self) -> int:
        return self._part

    def _send(self, chunk: bytes) -> None:
        """Uploads ``chunk`` (a part that is not the last) from the object's thread, after the previous one."""
        self._wait()
        self.crc32c = google_crc32c.extend(self.crc32c, chunk)
        self.sent += len(chunk)
        if self._taken:
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tf-etl-upload")
        self._pending = self._pool.submit(self._upload_part, chunk)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    # -- the end
    def finish(self, before_create: Callable[[], None] = lambda: None) -> None:
        """Sends what is left and makes the object visible under its name, if no object has it (see the module);
        ``before_create`` runs just before the request that creates it, and may raise to abandon the object.

        Raises:
          OSError: the store failed (after its client's retries), or the name was taken by an object with other
            bytes twice. Whatever ``before_create`` raises. On any error the object is not created: call
            :meth:`abort`.
        """
        self._wait()
        last = bytes(self._buf)
        self._buf = bytearray()
        self.crc32c = google_crc32c.extend(self.crc32c, last)
        try:
            if self._taken or not self._create(last, before_create):
                self._settle(None if self._taken else last, before_create)
        finally:
            self._close_pool()

    def abort(self) -> None:
        """Drops what was sent (S3 ``AbortMultipartUpload``, GCS the session cancelled): no object appears."""
        try:
            self._wait()
        except Exception:  # noqa: BLE001 - the error being handled is the caller's; this part is dropped anyway
            pass
        try:
            self._drop()
        except Exception as e:  # noqa: BLE001 - an upload left behind is removed by the run's commit (S3), or expires
            log.warning("Cannot abort the upload of %s: %s", self.path, e)
        self._close_pool()

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _settle(self, last: bytes | None, before_create: Callable[[], None]) -> None:
        """The name was taken. The other attempt's object is kept if its bytes are ours (size and CRC32C); else it
        is deleted (at the version read) and ours created in its place, once, where the bytes can still be sent
        (``last`` is None when the name was taken before the last part: GCS evaluates ``ifGenerationMatch`` when
        a session starts, and may on each part, and the bytes since were only counted; or the store dropped the
        session): there the write fails, for the runner's retry of the bundle to create it.

        Raises:
          OSError: the object could not be created in the other's place, naming it and what to do."""
        found = _read_back(self.path)
        if found is not None and found[:2] == (self.size, self.crc32c):
            log.info(
                "%s: another attempt of this write created the same %d bytes first; keeping it", self.path, self.size
            )
            self._drop()
            return
        other = f"another object ({found[0]} bytes, CRC32C {found[1]:08x})" if found else "another object"
        if found is not None:
            log.warning(
                "%s: %s took the name this write creates (%d bytes, CRC32C %08x); replacing it",
                self.path,
                other,
                self.size,
                self.crc32c,
            )
            conditional.delete_if_version(self.path, found[2])
        if last is not None and self._create(last, before_create, again=True):
            return
        raise OSError(
            f"Cannot create {self.path}: {other} took its name while it was written"
            + ("; it was deleted" if found else "")
            + ": run the job again (a runner retries the bundle by itself) to write it"
        )

    # -- per store
    def _upload_part(self, chunk: bytes) -> None:
        raise NotImplementedError

    def _create(self, last: bytes, before_create: Callable[[], None], again: bool = False) -> bool:
        """Sends ``last`` and creates the object, calling ``before_create`` just before the request that makes it
        visible; False when the store refused because the name is taken. ``again``: the second try, after
        :meth:`_settle` deleted another object of that name (``last`` was sent the first time)."""
        raise NotImplementedError

    def _drop(self) -> None:
        raise NotImplementedError


def _read_back(path: str) -> tuple[int, int, str] | None:
    """``(size in bytes, CRC32C, version)`` of the object ``path`` as stored now, read whole; None when there is
    none (it went between the refusal and this read)."""
    fileio.forget_objects()
    ver = conditional.version(path)
    if ver in (None, conditional.ABSENT):
        return None
    crc, size = 0, 0
    stream = fileio._range_reader(path)
    with stream:
        while chunk := stream.read(READ_BACK_BYTES):
            crc, size = google_crc32c.extend(crc, chunk), size + len(chunk)
    return size, crc, ver


class _S3Create(ObjectCreate):
    """A multipart upload, completed with ``If-None-Match: *``; one ``PutObject`` with it for one part."""

    def __init__(self, client, path: str, part_bytes: int):
        super().__init__(client, path, part_bytes)
        self._upload_id: str | None = None
        self._parts: list[dict] = []

    def _next_part_bytes(self) -> int:
        return self._part << min(len(self._parts) // PARTS_PER_SIZE, 9)

    def _upload_part(self, chunk: bytes) -> None:
        c = self._client
        if self._upload_id is None:
            self._upload_id = c.create_multipart_upload(Bucket=self._bucket, Key=self._key)["UploadId"]
        number = len(self._parts) + 1
        etag = c.upload_part(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=chunk
        )["ETag"]
        self._parts.append({"ETag": etag, "PartNumber": number})

    def _create(self, last: bytes, before_create: Callable[[], None], again: bool = False) -> bool:
        c = self._client
        try:
            if self._upload_id is None:
                before_create()
                c.put_object(Bucket=self._bucket, Key=self._key, Body=last, IfNoneMatch="*")
                return True
            if last and not again:
                self._upload_part(last)
            before_create()
            c.complete_multipart_upload(
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
                IfNoneMatch="*",
            )
        except c.exceptions.ClientError as e:
            code = conditional._s3_code(e)
            if code in conditional._S3_CONFLICT:
                return False
            if code == "NoSuchUpload" and self._parts:  # completed, its answer lost and the request retried
                return False
            raise
        self._upload_id = None
        return True

    def _drop(self) -> None:
        if self._upload_id is None:
            return
        try:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id)
        except self._client.exceptions.ClientError as e:
            if conditional._s3_code(e) not in ("NoSuchUpload", "404"):
                raise
        self._upload_id = None


class _Window:
    """The bytes of a GCS upload not yet persisted, as the seekable stream ``ResumableUpload`` reads its chunks
    from: positions are the object's byte offsets; bytes before the store's persisted offset are dropped."""

    def __init__(self):
        self.base, self.pos, self.data = 0, 0, bytearray()

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence != 0 or not self.base <= pos <= self.base + len(self.data):
            raise OSError(f"cannot seek an upload window [{self.base}, {self.base + len(self.data)}] to {pos}")
        self.pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        start = self.pos - self.base
        out = bytes(self.data[start:] if n is None or n < 0 else self.data[start : start + n])
        self.pos += len(out)
        return out

    def persisted(self, upto: int) -> None:
        del self.data[: upto - self.base]
        self.base = upto

    def available(self) -> int:
        return self.base + len(self.data) - self.pos


class _GcsCreate(ObjectCreate):
    """A resumable upload with ``ifGenerationMatch=0``, its last chunk sent by :meth:`finish`; one upload with it
    for one chunk."""

    def __init__(self, client, path: str, part_bytes: int):
        super().__init__(client, path, part_bytes)
        self._upload = None
        self._window = _Window()

    def _transport(self):
        return self._client._http  # the client's authorized session (google-cloud-storage's BlobWriter uses it too)

    def _upload_part(self, chunk: bytes) -> None:
        from google.resumable_media import InvalidResponse
        from google.resumable_media.requests import ResumableUpload  # deferred: gs:// outputs only

        try:
            if self._upload is None:
                url = (
                    f"{self._client.api_endpoint}/upload/storage/v1/b/{self._bucket}/o"
                    "?uploadType=resumable&ifGenerationMatch=0"
                )
                self._upload = ResumableUpload(url, self._part)
                self._upload.initiate(
                    self._transport(), self._window, {"name": self._key}, "application/octet-stream", stream_final=False
                )
            self._window.data += chunk
            self._transmit(final=False)
        except InvalidResponse as e:
            if getattr(e.response, "status_code", None) != 412:
                raise
            self._taken, self._window = True, _Window()
            self._drop()

    def _transmit(self, final: bool, before_create: Callable[[], None] = lambda: None) -> None:
        """Sends whole chunks while more than one chunk is held; with ``final``, all of it, ``before_create``
        called just before the last request (the one whose chunk is short, or empty: what finalizes the object)."""
        upload, window = self._upload, self._window
        while True:
            window.seek(upload.bytes_uploaded)
            if window.available() < self._part + (0 if final else 1):
                break
            upload.transmit_next_chunk(self._transport())
            window.persisted(upload.bytes_uploaded)
        if final:
            before_create()
            upload.transmit_next_chunk(self._transport())

    def _create(self, last: bytes, before_create: Callable[[], None], again: bool = False) -> bool:
        from google.api_core.exceptions import PreconditionFailed  # deferred: gs:// outputs only
        from google.resumable_media import InvalidResponse

        if self._upload is None:
            before_create()
            try:
                self._client.bucket(self._bucket).blob(self._key).upload_from_string(last, if_generation_match=0)
            except PreconditionFailed:
                return False
            return True
        try:
            if again:
                try:
                    self._upload.recover(self._transport())
                except InvalidResponse:  # the store dropped the session with its refusal (fake-gcs-server)
                    return False
            else:
                self._window.data += last
            self._transmit(True, before_create)
        except InvalidResponse as e:
            if getattr(e.response, "status_code", None) == 412:
                return False
            raise
        return True

    def _drop(self) -> None:
        if self._upload is None or self._upload.resumable_url is None or self._upload.finished:
            return
        try:
            self._transport().delete(self._upload.resumable_url, timeout=30)
        finally:
            self._upload = None


def open_create(path: str, part_bytes: int = PART_BYTES) -> ObjectCreate | None:
    """An :class:`ObjectCreate` for the s3:// or gs:// ``path`` (the store's client: Beam's filesystem's, with the
    pipeline options); None for other filesystems (local files: write a temporary and rename it)."""
    found = fileio._opener(path)
    if found is None:
        return None
    kind, client, _ = found
    if kind == "S3FileSystem":
        return _S3Create(client, path, max(part_bytes, 5 << 20))
    if kind == "GCSFileSystem":
        return _GcsCreate(client, path, max(256 << 10, part_bytes // (256 << 10) * (256 << 10)))
    return None
