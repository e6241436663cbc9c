"""A read-only Zarr store (``zarr.abc.store.Store``) over a local directory store, a zip store or a gs:// / s3://
prefix, that reads nothing it was not asked for and nothing it should not:

- **keys** with an empty, ``.`` or ``..`` component, a backslash or a leading ``/`` are refused (a consolidated
  metadata document naming ``../x`` would otherwise read outside the store); a local key whose real path (symlinks
  resolved) leaves the store's root is refused unless ``follow_symlinks`` (``--follow_symlinks``); only regular
  files are read (never a FIFO or a device);
- **sizes**: a metadata document is read only up to :data:`MAX_METADATA_BYTES`, a chunk (or shard) only up to what
  any encoding of its declared shape and dtype can take (:func:`stored_limit`): its size is checked before it is
  read (``os.stat``, the zip's directory, the object's size from the first ranged GET);
- **codec bombs**: a compressed chunk declaring (blosc, lz4, zstd frame header) or decompressing to (gzip, zlib,
  bz2, lzma: a bounded streaming decompression) more bytes than the chunk's declared shape holds is refused before
  zarr decompresses it;
- **never-written chunks** (zarr reads them as the fill value) are refused unless ``allow_fill_value``;
- **remote** keys are objects read through :func:`transforms.fileio.open_read` (one bounded ranged GET each read,
  pinned to the version first seen), several at a time (zarr asks for a range's chunks concurrently).

Zarr specifications: v2 (https://zarr-specs.readthedocs.io/en/latest/v2/v2.0.html) and v3 (core, sharding codec).
"""
from __future__ import annotations

import bz2
import dataclasses
import lzma
import math
import os
import struct
import zipfile
import zlib

from tfrecord_etl.transforms import fileio
from tfrecord_etl.transforms.errors import SourceError

METADATA_KEYS = ("zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata")
ROOT_MARKERS = ("zarr.json", ".zmetadata", ".zgroup", ".zarray")  # what a store's root holds (detection)
MAX_METADATA_BYTES = 64 * 2**20  # one metadata document (a consolidated .zmetadata of a large store included)
MAX_VLEN_CHUNK_BYTES = 256 * 2**20  # a chunk of variable-length strings: its size is not declared
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def check_key(key: str, where: str) -> None:
    """Refuses a store key that could name something outside the store.

    Raises:
      SourceError: an empty, ``.`` or ``..`` component, a backslash, a NUL or a leading ``/`` (naming the key).
    """
    parts = key.split("/")
    if key.startswith("/") or "\\" in key or "\0" in key or any(p in ("", ".", "..") for p in parts):
        raise SourceError(f"The Zarr store names the key {key!r}, which leads outside the store (an empty, '.' or "
                          f"'..' component, or an absolute path): refused", file=where,
                          hint="the store's metadata is damaged or hostile; rewrite it with zarr")


def check_consolidated(data: bytes, key: str, where: str) -> None:
    """Checks every member name of a consolidated metadata document (v2 ``.zmetadata``, or a v3 ``zarr.json``'s
    ``consolidated_metadata``) with :func:`check_key` before zarr builds the tree from it (a name ``../x`` would make
    zarr look outside the store). A document that is not JSON is left to zarr to report.

    Raises:
      SourceError: a member name leading outside the store.
    """
    import json
    try:
        doc = json.loads(data)
    except ValueError:
        return
    if not isinstance(doc, dict):
        return
    members = doc.get("metadata") if key.endswith(".zmetadata") else \
        (doc.get("consolidated_metadata") or {}).get("metadata") if isinstance(doc.get("consolidated_metadata"),
                                                                           dict) else None
    if not isinstance(members, dict):
        return
    prefix = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    for name in members:
        check_key(prefix + str(name), where)


@dataclasses.dataclass(frozen=True)
class ChunkBound:
    """What one array's stored chunks may hold: ``decoded`` bytes of one chunk (or shard) as declared (None for
    variable-length strings), ``stored`` the most bytes its file may have, ``codec``: the outermost compressor's
    name (the first applied when decoding) or None."""

    decoded: int | None
    stored: int
    codec: str | None


def stored_limit(decoded: int | None, inner_chunks: int = 1) -> int:
    """The most bytes any encoding of ``decoded`` bytes takes: the bytes plus 1/64 (the worst case of deflate,
    zstd, lz4 and blosc on incompressible data is well under 1%) plus 1 KiB of headers and checksums, plus 16 bytes
    per inner chunk of a shard (its index); :data:`MAX_VLEN_CHUNK_BYTES` when the size is not declared."""
    if decoded is None:
        return MAX_VLEN_CHUNK_BYTES
    return decoded + decoded // 64 + 1024 + 16 * inner_chunks + 64 * inner_chunks


def chunk_bound(array) -> ChunkBound:
    """The :class:`ChunkBound` of a ``zarr.Array`` from its metadata (chunk or shard shape, dtype, codecs)."""
    meta = array.metadata
    itemsize = None if array.dtype.kind in "OTU" and not _fixed(array.dtype) else array.dtype.itemsize
    if meta.zarr_format == 2:
        comp = meta.compressor.get_config().get("id") if meta.compressor is not None else None
        decoded = None if itemsize is None else math.prod(meta.chunks) * itemsize
        if meta.filters:  # filters may change sizes (e.g. a vlen codec): no decoded bound on the compressor
            return ChunkBound(None, stored_limit(decoded) if decoded is not None else MAX_VLEN_CHUNK_BYTES, None)
        return ChunkBound(decoded, stored_limit(decoded), comp)
    outer = array.shards or array.chunks
    decoded = None if itemsize is None else math.prod(outer) * itemsize
    inner = math.prod(o // c for o, c in zip(outer, array.chunks)) if array.shards else 1
    codecs = [c.to_dict().get("name") for c in meta.codecs]
    last = codecs[-1] if codecs and not array.shards else None
    return ChunkBound(decoded, stored_limit(decoded, inner), last if last in _PEEKS else None)


def _fixed(dtype) -> bool:
    return dtype.kind in "SU" and dtype.itemsize > 0


def declared_size(codec: str, data: bytes, limit: int) -> int | None:
    """The bytes ``data`` (one chunk compressed by ``codec``) decodes to, as its header declares it (blosc, lz4,
    zstd with a content size) or as a streaming decompression of at most ``limit + 1`` bytes finds it (gzip,
    zlib, bz2, lzma, zstd without a content size); None when it cannot be told cheaply (then zarr's decoder and its
    shape check decide). A result above ``limit`` means a bomb."""
    peek = _PEEKS.get(codec)
    return None if peek is None else peek(data, limit)


def _blosc(data: bytes, limit: int) -> int | None:
    return struct.unpack_from("<I", data, 4)[0] if len(data) >= 16 else None


def _lz4(data: bytes, limit: int) -> int | None:
    return struct.unpack_from("<I", data, 0)[0] if len(data) >= 4 else None  # numcodecs' size prefix


def _zstd(data: bytes, limit: int) -> int | None:
    if data[:4] != ZSTD_MAGIC or len(data) < 6:
        return None
    fhd = data[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0:
        return _streamed(data, limit, "zstd")
    raw = data[pos:pos + size]
    if len(raw) < size:
        return None
    value = int.from_bytes(raw, "little")
    return value + 256 if size == 2 else value


def _streamed(data: bytes, limit: int, kind: str) -> int:
    if kind == "zstd":
        import zstandard
        reader = zstandard.ZstdDecompressor().stream_reader(data)
        return len(reader.read(limit + 1))
    if kind in ("gzip", "zlib"):
        d = zlib.decompressobj(47)  # gzip or zlib header, told by its first bytes
    elif kind == "bz2":
        d = bz2.BZ2Decompressor()
    else:
        d = lzma.LZMADecompressor()
    try:
        return len(d.decompress(data, max_length=limit + 1))
    except (zlib.error, OSError, EOFError, lzma.LZMAError):
        return 0  # a damaged stream: zarr's decoder reports it


_PEEKS = {"blosc": _blosc, "lz4": _lz4, "zstd": _zstd,
          "gzip": lambda d, n: _streamed(d, n, "gzip"), "zlib": lambda d, n: _streamed(d, n, "zlib"),
          "bz2": lambda d, n: _streamed(d, n, "bz2"), "lzma": lambda d, n: _streamed(d, n, "lzma")}


def store_kind(path: str, remote_probe: bool = False) -> str | None:
    """``"dir"``, ``"zip"`` or ``"remote"`` when ``path`` is a Zarr store by its content: a local directory (or a
    gs:// / s3:// prefix, probed only with ``remote_probe``: one request per marker) holding ``zarr.json`` (v3)
    or ``.zgroup``/``.zarray``/``.zmetadata`` (v2) at its root, or a local zip file holding one of them at its root;
    else None."""
    if fileio.is_local(path):
        if os.path.isdir(path):
            return "dir" if any(os.path.isfile(os.path.join(path, m)) for m in ROOT_MARKERS) else None
        if os.path.isfile(path):
            try:
                with open(path, "rb") as f:
                    if f.read(4) != b"PK\x03\x04":
                        return None
                with zipfile.ZipFile(path) as z:
                    names = set(z.namelist())
            except (OSError, zipfile.BadZipFile, ValueError):
                return None
            return "zip" if names & set(ROOT_MARKERS) else None
        return None
    if not remote_probe:
        return None
    root = path.rstrip("/")
    return "remote" if any(fileio.exists(f"{root}/{m}") for m in ROOT_MARKERS) else None
