"""Requests on one object or one prefix of an object store, made with the store's own client (boto3,
google-cloud-storage: the clients :mod:`fileio` gets from Beam's filesystems or the light reader, ``found`` being
``fileio._opener``'s ``(filesystem name, client, opener)`` or None for other filesystems): a HEAD, a listing, a
gs:// move and delete. Not Beam's ``FileSystems`` for these: Beam's S3 and GCS calls retry on top of the client's
own retries (5 s doubled, 7 times: about 10 minutes for one call on a store that went away), and its GCS rename
and delete go through the JSON batch API, which emulators refuse."""

from __future__ import annotations

from tfrecord_etl.transforms.storage import lightfs


def list_prefix(found, directory: str) -> list[tuple[str, int]] | None:
    """``(path, size in bytes)`` of every object under the s3:// or gs:// ``directory`` (its children and theirs),
    listed with the store's client (S3 ``ListObjectsV2`` pages, GCS ``list_blobs``; not Beam's, which retries for
    minutes on a store that went away: :func:`head`); None for other filesystems. Nothing is globbed."""
    if found is None:
        return None
    kind, client, _ = found
    bucket, key = lightfs.bucket_key(directory.rstrip("/") + "/")
    scheme = "s3" if kind == "S3FileSystem" else "gs"
    if kind != "S3FileSystem":
        return [(f"{scheme}://{bucket}/{b.name}", int(b.size or 0)) for b in client.list_blobs(bucket, prefix=key)]
    out, token = [], None
    while True:
        page = client.list_objects_v2(Bucket=bucket, Prefix=key, **({"ContinuationToken": token} if token else {}))
        out += [(f"{scheme}://{bucket}/{o['Key']}", int(o["Size"])) for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not token:
            return out


def head(found, path: str) -> tuple[bool, int] | None:
    """``(exists, size in bytes)`` of the s3:// or gs:// object ``path`` from one HEAD (S3 ``HeadObject``, GCS the
    object's metadata) with the store's client, or None for other filesystems. Why not Beam's ``FileSystems``:
    its S3 and GCS calls retry on top of the client's own retries with Beam's exponential backoff (5 s doubled, 7
    retries: about 10 minutes for one call), so a run whose store went away waited minutes per call before it
    could say so (found with the S3 gateway stopped during a run); the client's retries (a burst of ``503
    SlowDown``: ``remote.store_retries``) are kept."""
    if found is None:
        return None
    kind, client, _ = found
    bucket, key = lightfs.bucket_key(path)
    if kind == "S3FileSystem":
        try:
            return True, int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        except client.exceptions.ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return False, 0
            raise
    blob = client.bucket(bucket).get_blob(key)
    return (False, 0) if blob is None else (True, int(blob.size or 0))


def gcs_blob(found, path: str):
    """The google-cloud-storage ``Blob`` of the gs:// ``path`` (the client Beam's filesystem is configured with),
    or None for other filesystems."""
    if found is None or found[0] != "GCSFileSystem":
        return None
    bucket, key = lightfs.bucket_key(path)
    return found[1].bucket(bucket).blob(key)


def gcs_move(source, target) -> bool:
    """Moves the gs:// object ``source`` to ``target`` with one object's requests (``rewriteTo``, repeated while the
    store asks to continue a large copy, then a delete), not Beam's GCS batch API (``copy_batch`` and
    ``delete_batch`` post multipart batches, which fake-gcs-server and other emulators answer with a response
    google-cloud-storage refuses: "Bad response: not multi-part"); the copy replaces ``target`` in place, so there
    is no moment without one. ``source``, ``target``: :func:`gcs_blob`'s; False (nothing done) when either
    is None (a path not on gs://)."""
    if source is None or target is None:
        return False
    token = None
    while True:
        token, _, _ = target.rewrite(source, token=token)
        if token is None:
            break
    gcs_delete(source)
    return True


def gcs_delete(blob) -> None:
    from google.api_core.exceptions import NotFound  # deferred: google-cloud-storage, a gs:// path's only

    try:
        blob.delete()
    except NotFound:
        pass


def abort_uploads(found, directory: str, names) -> list[str]:
    """Aborts the unfinished S3 multipart uploads of the children ``names`` of the s3:// ``directory`` (those of
    :mod:`objectcreate` writes whose worker was killed: no object, but parts the store keeps and bills until the
    upload is aborted or a lifecycle rule removes it), each by its exact key; returns the names whose uploads were
    aborted. Nothing elsewhere: a GCS resumable session that was never finalized holds no object and expires by
    itself (a week); other filesystems have no uploads."""
    if found is None or found[0] != "S3FileSystem":
        return []
    client, names = found[1], set(names)
    bucket, prefix = lightfs.bucket_key(directory.rstrip("/") + "/")
    gone, marker = [], {}
    while True:
        page = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix, **marker)
        for upload in page.get("Uploads", []):
            name = upload["Key"][len(prefix) :]
            if name in names:
                client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                gone.append(name)
        if not page.get("IsTruncated"):
            return sorted(set(gone))
        marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
