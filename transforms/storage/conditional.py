"""Conditional requests on object stores: read an object with its version, and write or delete it only while
its version is still the one read, in one request the store evaluates atomically (S3: ``If-Match`` /
``If-None-Match`` on ``PutObject``, ``If-Match`` on ``DeleteObject``; GCS: ``ifGenerationMatch``). How two runs
racing on one gs:// or s3:// output or collection cannot both commit (``metadata.json``, ``collection.json``, the
output directory's lock). Local files take other means (``O_EXCL``, ``flock``, ``rename``): here they get plain
reads, writes and deletes (:mod:`transforms.storage.fileio`).
"""

from __future__ import annotations

import re
import sys
import threading
import uuid

from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.storage import fileio, lightfs, remote

ABSENT = "absent"  # the version of an object that does not exist: a conditional write that creates it


class VersionConflict(Exception):
    """A conditional write or delete found the object at another version than the one expected (another writer
    won)."""


def _object(path: str):
    """``("s3" | "gs", client, bucket, key)`` of an s3:// or gs:// ``path``; ``(None, None, None, None)`` for other
    filesystems."""
    found = fileio._opener(path)
    if found is None:
        return None, None, None, None
    return ({"S3FileSystem": "s3", "GCSFileSystem": "gs"}[found[0]], found[1], *lightfs.bucket_key(path))


def _s3_code(e) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code"))


_S3_CONFLICT = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
_S3_MISSING = ("404", "NoSuchKey", "NotFound")


def version(path: str) -> str | None:
    """The version of the object ``path`` as its store names it (S3: the ETag, from a HEAD; GCS: the generation),
    :data:`ABSENT` when there is no such object, and None on other filesystems (local files, where the output
    directory's lock is exclusive)."""
    kind, client, bucket, key = _object(path)
    if kind == "s3":
        try:
            return client.head_object(Bucket=bucket, Key=key)["ETag"]
        except client.exceptions.ClientError as e:
            if _s3_code(e) in _S3_MISSING:
                return ABSENT
            raise
    if kind == "gs":
        blob = client.bucket(bucket).get_blob(key)
        return ABSENT if blob is None else str(blob.generation)
    return None


def read_version(path: str) -> str | None:
    """The version (S3 ETag, GCS generation) of the remote object ``path``: the one this process's reads are
    pinned to (:func:`fileio.pinned_version`, no request), else asked for (:func:`version`: one request); None for
    a local file."""
    if fileio.is_local(path):
        return None
    return fileio.pinned_version(path) or version(path)


def read_versioned(path: str) -> tuple[bytes | None, str | None]:
    """``(bytes, version)`` of the object ``path``, the bytes being exactly that version's (its reads are pinned to
    the version of the first one: S3 the GET's ETag, GCS the generation), so a caller can replace or delete the
    object only if nobody did since it read it (:func:`write_if_version`, :func:`delete_if_version`).
    ``(None, ABSENT)`` when there is no such object; on other filesystems ``(bytes or None, None)``.

    Raises:
      OSError: the object kept changing while it was read (3 tries).
    """
    for attempt in range(3):
        try:
            stream = fileio._range_reader(path)
            if stream is None:
                return (fileio.read_bytes(path) if fileio.exists(path) else None), None
            with stream:
                return stream.read(), stream.raw._obj.version or None
        except FileNotFoundError:  # GCS
            return None, ABSENT
        except (OSError, remote.ObjectChanged):  # replaced between two of its requests: read the new version
            fileio.forget_objects()
            if attempt == 2:
                raise
        except Exception as e:  # noqa: BLE001 - botocore's NoSuchKey
            if _s3_code(e) in _S3_MISSING:
                return None, ABSENT
            raise
    raise AssertionError("unreachable")


def write_if_version(path: str, data: bytes, expected: str) -> None:
    """Writes ``data`` as the object ``path`` in one request, only while its version is still ``expected`` (from
    :func:`version`; :data:`ABSENT`: only when there is none): S3 ``PutObject`` with ``If-Match: <ETag>`` or
    ``If-None-Match: *`` (S3's conditional writes), GCS an upload with ``ifGenerationMatch`` (0 for none), the
    preconditions both stores evaluate atomically. On other filesystems, a plain :func:`write_bytes`.

    Raises:
      VersionConflict: the store refused the write (HTTP 412, or S3's 409 for a concurrent conditional write).
    """
    kind, client, bucket, key = _object(path)
    if kind == "s3":
        condition = {"IfNoneMatch": "*"} if expected == ABSENT else {"IfMatch": expected}
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
        except client.exceptions.ClientError as e:
            if _s3_code(e) in _S3_CONFLICT:
                raise VersionConflict(path) from None
            raise
    elif kind == "gs":
        from google.api_core.exceptions import PreconditionFailed

        try:
            client.bucket(bucket).blob(key).upload_from_string(
                data, if_generation_match=0 if expected == ABSENT else int(expected)
            )
        except PreconditionFailed:
            raise VersionConflict(path) from None
    else:
        fileio.write_bytes(path, data)
        return
    fileio.forget_objects()


def delete_if_version(path: str, expected: str) -> None:
    """Deletes the object ``path`` only while its version is still ``expected`` (from :func:`read_versioned` or
    :func:`version`), in one request the store evaluates atomically: S3 ``DeleteObject`` with ``If-Match: <ETag>``
    (S3's conditional deletes, general purpose and directory buckets:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-deletes.html), GCS ``ifGenerationMatch``.
    An object already gone is not an error. On other filesystems, a plain :func:`delete`.

    Raises:
      VersionConflict: the object was replaced since (HTTP 412): it is another writer's now, and kept.
    """
    kind, client, bucket, key = _object(path)
    if kind == "s3":
        try:
            client.delete_object(Bucket=bucket, Key=key, IfMatch=expected)
        except client.exceptions.ClientError as e:
            if _s3_code(e) in _S3_CONFLICT:
                raise VersionConflict(path) from None
            if _s3_code(e) not in _S3_MISSING:
                raise
    elif kind == "gs":
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            client.bucket(bucket).blob(key).delete(if_generation_match=int(expected))
        except PreconditionFailed:
            raise VersionConflict(path) from None
        except NotFound:
            pass
    else:
        fileio.delete([path])
        return
    fileio.forget_objects()


PROBE_PREFIX = ".tf-etl-probe-"  # the object check_conditional_writes writes and deletes (ours: a run's own name)
PROBE = re.compile(r"^\.tf-etl-probe-[0-9a-f]{32}$")  # its names: a killed run's leftover is removed by the next
_CHECKED: set = set()  # (scheme, endpoint) whose conditional writes this process saw honoured
_CHECKED_LOCK = threading.Lock()


def check_conditional_writes(directory: str) -> None:
    """Refuses an object store that ignores conditional writes, once per process and endpoint: creates the object
    ``directory/.tf-etl-probe-<random>`` with a conditional create (S3 ``If-None-Match: *``, GCS
    ``ifGenerationMatch=0``), creates it again the same way, which the store must refuse (412), then deletes it.
    The output's lock and commit rest on that refusal (of two launchers exactly one takes the lock; a run whose
    directory another run committed meanwhile commits nothing); a store that ignores the condition (an older S3
    API, a gateway or proxy dropping the header) would let both go on, so it is refused rather than trusted: never
    silently weaker. Three requests; nothing on local files.

    Raises:
      ConfigError: the second create was accepted, naming the store and what to do.
    """
    kind, client, _, _ = _object(fileio.join(directory, PROBE_PREFIX))
    if kind is None:
        return
    key = (kind, remote.endpoint(client))
    with _CHECKED_LOCK:
        if key in _CHECKED:
            return
    probe = fileio.join(directory, f"{PROBE_PREFIX}{uuid.uuid4().hex}")
    write_if_version(probe, b"1", ABSENT)
    try:
        try:
            write_if_version(probe, b"2", ABSENT)
        except VersionConflict:
            pass
        else:
            header = "If-None-Match: *" if kind == "s3" else "ifGenerationMatch=0"
            raise ConfigError(
                f"The object store ({key[1] or kind}) ignores conditional writes: a create with {header} replaced "
                "an object that exists, so two runs on one output could both take its lock and commit",
                file=directory,
                hint="use a store (or a version of it) that supports conditional writes, as AWS S3, Google Cloud "
                "Storage and SeaweedFS do, and no proxy that drops the header; or write to a local or shared "
                "file system",
            )
        _check_conditional_delete(kind, probe, key[1] or kind)
    finally:
        _delete_probe(kind, client, probe)
    with _CHECKED_LOCK:
        _CHECKED.add(key)


def _check_conditional_delete(kind: str, probe: str, store: str) -> None:
    """A delete of ``probe`` on a version it does not have must be refused; a store that deletes it anyway
    (fake-gcs-server ignores ``ifGenerationMatch`` on deletes) is named in one warning line: the lock's release and
    a stale lock's takeover are conditional deletes, and there a run taken over as stale could remove its
    successor's lock, whose commit guard then refuses to commit (a failed run, never a mixed output)."""
    try:
        delete_if_version(probe, '"0"' if kind == "s3" else "1")
    except VersionConflict:
        return
    if version(probe) == ABSENT:
        print(
            f"[tfrecord-etl] warning: the object store ({store}) ignores conditional deletes (a delete with a "
            "version the object does not have removed it): a run whose lock was taken over as stale could remove "
            "its successor's lock, which then commits nothing (it fails; no output is mixed)",
            file=sys.stderr,
            flush=True,
        )


def _delete_probe(kind: str, client, probe: str) -> None:
    bucket, key = lightfs.bucket_key(probe)
    try:
        if kind == "s3":
            client.delete_object(Bucket=bucket, Key=key)
        else:
            client.bucket(bucket).blob(key).delete()
    except Exception:  # noqa: BLE001 - the store already failed us; the probe is ours and harmless
        pass
