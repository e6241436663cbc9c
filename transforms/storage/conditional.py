"""Conditional requests on object stores: read an object with its version, and write or delete it only while
its version is still the one read, in one request the store evaluates atomically (S3: ``If-Match`` /
``If-None-Match`` on ``PutObject``, ``If-Match`` on ``DeleteObject``; GCS: ``ifGenerationMatch``). How two runs
racing on one gs:// or s3:// output or collection cannot both commit (``metadata.json``, ``collection.json``, the
output directory's lock). Local files take other means (``O_EXCL``, ``flock``, ``rename``): here they get plain
reads, writes and deletes (:mod:`transforms.storage.fileio`).
"""

from __future__ import annotations

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
