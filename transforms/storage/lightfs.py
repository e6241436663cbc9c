"""The file operations of reading an output without Apache Beam: the light reader's filesystem.

:mod:`tfrecord_etl.transforms.storage.fileio` goes through Beam's ``FileSystems`` when Beam is installed (the pipelines,
the launcher, the workers: one code path for local, gs:// and s3:// paths, configured by the pipeline options).
Without Beam (``pip install .``, the reader's install: NumPy and google-crc32c only), ``fileio`` takes
these instead, for what reading needs: match a pattern, a file's size, whether it exists, join and split paths.
Local paths use :mod:`os`; ``s3://`` paths a boto3 client and ``gs://`` paths a
google-cloud-storage client, made as below, when those libraries are installed (``tfrecord-etl[s3]``,
``tfrecord-etl[gcs]``); the bytes of remote objects are read by ``fileio``'s bounded ranged GETs with the same
clients. Path semantics follow Beam's filesystems (``apache_beam/io/localfilesystem.py``,
``apache_beam/io/gcp/gcsfilesystem.py``, ``apache_beam/io/aws/s3filesystem.py``): a local ``split`` makes the
head absolute, a remote ``join`` puts one ``/`` between parts, and in an object pattern ``*`` matches within one
path segment, ``**`` across segments, as Beam's ``FileSystem.translate_pattern``.
"""

from __future__ import annotations

import os
import re
import threading

from tfrecord_etl._install import pip_install

_SCHEME = re.compile(r"^([a-zA-Z][-a-zA-Z0-9+.]*)://")
_CLIENTS: dict[str, object] = {}
_LOCK = threading.Lock()


def scheme(path: str) -> str:
    """``"s3"``, ``"gs"``, another URL scheme, or ``""`` for a local path (no ``scheme://`` prefix), as Beam's
    ``FileSystems.get_scheme``."""
    m = _SCHEME.match(path)
    return m.group(1) if m else ""


def bucket_key(path: str) -> tuple[str, str]:
    """``(bucket, object name)`` of an ``s3://`` or ``gs://`` path.

    Raises:
      ValueError: the path names no object (no bucket, or nothing after it).
    """
    m = re.match(r"^(?:s3|gs)://([^/]+)/(.+)$", path, re.DOTALL)
    if m is None:
        raise ValueError(f"{path!r} is not an s3:// or gs:// object path (scheme://bucket/name)")
    return m.group(1), m.group(2)


def _unsupported(path: str) -> ImportError:
    return ImportError(
        f"Cannot read {path!r} without Apache Beam: the light reader reads local paths, s3:// "
        "(setup.py's s3 extra) and gs:// (its gcs extra); for other filesystems "
        f"{pip_install('beam')}"
    )


def s3_client():
    """This process's boto3 S3 client: endpoint, credentials and region from boto3's own configuration (the
    ``AWS_*`` environment variables such as ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``~/.aws/config``);
    the pipelines' ``--s3_*`` flags are Beam options and need Beam.

    Raises:
      ImportError: boto3 is not installed (with the pip command that installs it).
    """
    with _LOCK:
        if "s3" not in _CLIENTS:
            try:
                import boto3
            except ImportError:
                raise ImportError(f"Reading s3:// paths needs boto3: {pip_install('s3')}") from None
            _CLIENTS["s3"] = boto3.session.Session().client("s3")
        return _CLIENTS["s3"]


def gcs_client():
    """This process's google-cloud-storage client, made as Beam makes its own (``gcsio.create_storage_client``):
    the application default credentials, or an anonymous client when there are none (public buckets; the
    ``STORAGE_EMULATOR_HOST`` variable points it at an emulator).

    Raises:
      ImportError: google-cloud-storage is not installed (with the pip command that installs it).
    """
    with _LOCK:
        if "gs" not in _CLIENTS:
            try:
                from google.cloud import storage
            except ImportError:
                raise ImportError(f"Reading gs:// paths needs google-cloud-storage: {pip_install('gcs')}") from None
            import google.auth

            try:
                credentials, project = google.auth.default()
            except google.auth.exceptions.DefaultCredentialsError:
                _CLIENTS["gs"] = storage.Client.create_anonymous_client()
            else:
                _CLIENTS["gs"] = storage.Client(credentials=credentials, project=project)
        return _CLIENTS["gs"]


def client(path: str):
    """The client for ``path``'s scheme (``s3`` or ``gs``).

    Raises:
      ImportError: another scheme, or its library is not installed.
    """
    kind = scheme(path)
    if kind == "s3":
        return s3_client()
    if kind == "gs":
        return gcs_client()
    raise _unsupported(path)


def translate_pattern(pattern: str) -> str:
    """A regular expression matching what the glob ``pattern`` matches: ``*`` and ``?`` within one ``/``-separated
    segment, ``**`` across segments, ``[...]`` a character class (``[!...]`` negated); as Beam's
    ``FileSystem.translate_pattern``, itself based on :func:`fnmatch.translate`."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if i < n and pattern[i] == "*":
                out.append(".*")
                i += 1
            else:
                out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append("\\[")
            else:
                stuff = pattern[i:j].replace("\\", "\\\\")
                i = j + 1
                out.append("[^" + stuff[1:] + "]" if stuff.startswith("!") else "[" + stuff + "]")
        else:
            out.append(re.escape(c))
    return r"(?s)" + "".join(out) + r"\Z"


def match(pattern: str) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of the files matching ``pattern`` (unsorted; empty when none), found as Beam's
    ``FileSystem.match`` finds them: a pattern without ``*``, ``?`` or ``[`` is the one path if it exists; else
    everything under the pattern's literal prefix (local files: the prefix's directory, walked; objects: the
    names starting with it) that :func:`translate_pattern` of the pattern matches.

    Raises:
      ImportError: a scheme the light reader does not read, or its library is not installed.
    """
    kind = scheme(pattern)
    if kind not in ("", "s3", "gs"):
        raise _unsupported(pattern)
    if pattern.endswith("/"):
        pattern += "*"
    literal = re.match(r"^[^[*?]*", pattern).group(0)
    if literal == pattern:
        try:
            return [(pattern, size(pattern))]
        except FileNotFoundError:
            return []
    if not kind:
        found = [
            (os.path.join(d, f), os.path.getsize(os.path.join(d, f)))
            for d, _, files in os.walk(os.path.dirname(literal))
            for f in files
        ]
    else:
        bucket, prefix = re.match(r"^\w+://([^/]*)/?(.*)$", literal, re.DOTALL).groups()
        head = f"{kind}://{bucket}/"
        if kind == "s3":
            pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            found = [(head + o["Key"], int(o["Size"])) for page in pages for o in page.get("Contents", [])]
        else:
            found = [(head + b.name, int(b.size or 0)) for b in gcs_client().list_blobs(bucket, prefix=prefix)]
    wanted = re.compile(translate_pattern(pattern)).match
    return [(p, n) for p, n in found if wanted(p)]


def size(path: str) -> int:
    """Size in bytes of the file or object ``path``, taken literally.

    Raises:
      FileNotFoundError: it does not exist.
      ImportError: as :func:`client`.
    """
    kind = scheme(path)
    if not kind:
        return os.path.getsize(path)
    bucket, key = bucket_key(path)
    if kind == "s3":
        c = s3_client()
        try:
            return int(c.head_object(Bucket=bucket, Key=key)["ContentLength"])
        except c.exceptions.ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                raise FileNotFoundError(f"No such object: {path}") from None
            raise
    if kind == "gs":
        blob = gcs_client().bucket(bucket).get_blob(key)
        if blob is None:
            raise FileNotFoundError(f"No such object: {path}")
        return int(blob.size or 0)
    raise _unsupported(path)


def exists(path: str) -> bool:
    """Whether the file, directory or object ``path`` exists (a remote "directory" ending in ``/`` exists when an
    object's name starts with it)."""
    if not scheme(path):
        return os.path.exists(path)
    if path.endswith("/"):
        return bool(match(path + "**"))
    try:
        size(path)
    except FileNotFoundError:
        return False
    return True


def join(base: str, *parts: str) -> str:
    """``parts`` appended to ``base``: :func:`os.path.join` for local paths, one ``/`` between remote parts."""
    if not scheme(base):
        return os.path.join(base, *parts)
    path = base
    for p in parts:
        path = path.rstrip("/") + "/" + p.lstrip("/")
    return path


def split(path: str) -> tuple[str, str]:
    """``(head, last component)`` of ``path``; a local head is absolute, a remote one keeps ``scheme://``."""
    kind = scheme(path)
    if not kind:
        return os.path.split(os.path.abspath(path))
    path = path.strip()
    start = len(kind) + 3
    last = path[start:].rfind("/")
    if last < 0:
        return path, ""
    return path[: start + last], path[start + last + 1 :]
