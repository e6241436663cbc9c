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
- **remote** keys are objects read through :func:`transforms.storage.fileio.open_read` (one bounded ranged GET each read,
  pinned to the version first seen), several at a time (zarr asks for a range's chunks concurrently).

Zarr specifications: v2 (https://zarr-specs.readthedocs.io/en/latest/v2/v2.0.html) and v3 (core, sharding codec).
"""

from __future__ import annotations

import bz2
import dataclasses
import json
import lzma
import math
import os
import struct
import zipfile
import zlib

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.storage import fileio

METADATA_KEYS = ("zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata")
ROOT_MARKERS = ("zarr.json", ".zmetadata", ".zgroup", ".zarray")  # what a store's root holds (detection)
MAX_METADATA_BYTES = 64 * 2**20  # one metadata document (a consolidated .zmetadata of a large store included)
MAX_VLEN_CHUNK_BYTES = 256 * 2**20  # a chunk of variable-length strings: its size is not declared
MAX_VLEN_DECODED_BYTES = 2**30  # ... and what its compressor may inflate it to
FILTER_GROWTH = 16  # v2 filters (astype, fixedscaleoffset...) change an item's size at most this much (u1 -> c16)
STREAM_STEP = 2**20  # a streamed decompression keeps at most this much at a time
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def check_key(key: str, where: str) -> None:
    """Refuses a store key that could name something outside the store.

    Raises:
      SourceError: an empty, ``.`` or ``..`` component, a backslash, a NUL or a leading ``/`` (naming the key).
    """
    parts = key.split("/")
    if key.startswith("/") or "\\" in key or "\0" in key or any(p in ("", ".", "..") for p in parts):
        raise SourceError(
            f"The Zarr store names the key {key!r}, which leads outside the store (an empty, '.' or "
            f"'..' component, or an absolute path): refused",
            file=where,
            hint="the store's metadata is damaged or hostile; rewrite it with zarr",
        )


def check_consolidated(data: bytes, key: str, where: str) -> None:
    """Checks every member name of a consolidated metadata document (v2 ``.zmetadata``, or a v3 ``zarr.json``'s
    ``consolidated_metadata``) with :func:`check_key` before zarr builds the tree from it (a name ``../x`` would make
    zarr look outside the store). A document that is not JSON is left to zarr to report.

    Raises:
      SourceError: a member name leading outside the store.
    """
    try:
        doc = json.loads(data)
    except ValueError:
        return
    if not isinstance(doc, dict):
        return
    members = (
        doc.get("metadata")
        if key.endswith(".zmetadata")
        else (doc.get("consolidated_metadata") or {}).get("metadata")
        if isinstance(doc.get("consolidated_metadata"), dict)
        else None
    )
    if not isinstance(members, dict):
        return
    prefix = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    for name in members:
        check_key(prefix + str(name), where)


@dataclasses.dataclass(frozen=True)
class ChunkBound:
    """What one array's stored chunks may hold: ``decoded`` bytes the outermost compressor may decode one chunk (or
    shard) to (its shape and dtype; None when unknown), ``stored`` the most bytes its file may have, ``codec``: the
    outermost compressor's name (the first applied when decoding) or None. A sharded array's inner chunks:
    ``inner_codec`` (their compressor), ``inner_decoded`` (the bytes of one), ``inner_count`` and ``index_bytes``
    (the shard index's size, at the shard's end unless ``index_at_start``)."""

    decoded: int | None
    stored: int
    codec: str | None
    inner_codec: str | None = None
    inner_decoded: int = 0
    inner_count: int = 0
    index_bytes: int = 0
    index_at_start: bool = False


def stored_limit(decoded: int | None, inner_chunks: int = 1) -> int:
    """The most bytes any encoding of ``decoded`` bytes takes: the bytes plus 1/64 (the worst case of deflate,
    zstd, lz4 and blosc on incompressible data is well under 1%) plus 1 KiB of headers and checksums, plus 16 bytes
    per inner chunk of a shard (its index); :data:`MAX_VLEN_CHUNK_BYTES` when the size is not declared."""
    if decoded is None:
        return MAX_VLEN_CHUNK_BYTES
    return decoded + decoded // 64 + 1024 + 16 * inner_chunks + 64 * inner_chunks


def chunk_bound(array) -> ChunkBound:
    """The :class:`ChunkBound` of a ``zarr.Array`` from its metadata (chunk or shard shape, dtype, codecs): every
    compressor's output is bounded, by the chunk's bytes, by :data:`FILTER_GROWTH` times them behind v2 filters, by
    :data:`MAX_VLEN_DECODED_BYTES` for variable-length strings; a shard's inner chunks each by their own bytes."""
    meta = array.metadata
    itemsize = None if array.dtype.kind in "OTU" and not _fixed(array.dtype) else array.dtype.itemsize
    if meta.zarr_format == 2:
        comp = meta.compressor.get_config().get("id") if meta.compressor is not None else None
        decoded = None if itemsize is None else math.prod(meta.chunks) * itemsize
        comp = comp if comp in _PEEKS else None
        if meta.filters:  # filters may change sizes (a vlen codec, astype): a looser bound on the compressor
            grown = MAX_VLEN_DECODED_BYTES if decoded is None else decoded * FILTER_GROWTH + 1024
            return ChunkBound(grown, stored_limit(decoded) if decoded is not None else MAX_VLEN_CHUNK_BYTES, comp)
        return ChunkBound(MAX_VLEN_DECODED_BYTES if decoded is None else decoded, stored_limit(decoded), comp)
    outer = array.shards or array.chunks
    decoded = None if itemsize is None else math.prod(outer) * itemsize
    inner = math.prod(o // c for o, c in zip(outer, array.chunks)) if array.shards else 1
    codecs = [c.to_dict().get("name") for c in meta.codecs]
    if not array.shards:
        last = codecs[-1] if codecs else None
        return ChunkBound(
            MAX_VLEN_DECODED_BYTES if decoded is None else decoded,
            stored_limit(decoded, inner),
            last if last in _PEEKS else None,
        )
    sharding = meta.codecs[0]
    inner_names = [c.to_dict().get("name") for c in sharding.codecs]
    inner_codec = inner_names[-1] if inner_names and inner_names[-1] in _PEEKS else None
    index_names = [c.to_dict().get("name") for c in sharding.index_codecs]
    at_start = str(getattr(sharding.index_location, "value", sharding.index_location)) == "start"
    return ChunkBound(
        decoded,
        stored_limit(decoded, inner),
        None,
        inner_codec,
        MAX_VLEN_DECODED_BYTES if itemsize is None else math.prod(array.chunks) * itemsize,
        inner,
        16 * inner + (4 if "crc32c" in index_names else 0),
        at_start,
    )


def inner_chunks(bound: ChunkBound, shard: bytes) -> list[tuple[int, int]]:
    """``[(offset, length)]`` of the inner chunks a whole shard's index lists (empty entries left out; entries
    outside the shard too: zarr's decoder refuses those)."""
    if bound.index_bytes < 16 * bound.inner_count or len(shard) < bound.index_bytes:
        return []
    index = shard[: bound.index_bytes] if bound.index_at_start else shard[len(shard) - bound.index_bytes :]
    out = []
    for i in range(bound.inner_count):
        offset, length = struct.unpack_from("<QQ", index, 16 * i)
        if offset != 2**64 - 1 and offset + length <= len(shard):
            out.append((offset, length))
    return out


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
    raw = data[pos : pos + size]
    if len(raw) < size:
        return None
    value = int.from_bytes(raw, "little")
    return value + 256 if size == 2 else value


def _streamed(data: bytes, limit: int, kind: str) -> int:
    """The bytes ``data`` decompresses to, counted in pieces of :data:`STREAM_STEP` that are not kept, the count
    stopped once it passes ``limit`` (memory stays at a piece whatever the stream holds)."""
    if kind == "zstd":
        import zstandard

        reader, total = zstandard.ZstdDecompressor().stream_reader(data), 0
        try:
            while total <= limit:
                piece = reader.read(STREAM_STEP)
                if not piece:
                    break
                total += len(piece)
        except zstandard.ZstdError:
            return 0  # a damaged stream: zarr's decoder reports it
        return total
    if kind in ("gzip", "zlib"):
        d = zlib.decompressobj(47)  # gzip or zlib header, told by its first bytes
    elif kind == "bz2":
        d = bz2.BZ2Decompressor()
    else:
        d = lzma.LZMADecompressor()
    total, pending = 0, data
    try:
        while total <= limit:
            if kind in ("gzip", "zlib"):
                piece = d.decompress(pending, STREAM_STEP)
                pending = d.unconsumed_tail
            else:
                piece = d.decompress(pending, max_length=STREAM_STEP)
                pending = b""
            if not piece:
                break
            total += len(piece)
    except (zlib.error, OSError, EOFError, lzma.LZMAError):
        return 0  # a damaged stream: zarr's decoder reports it
    return total


_PEEKS = {
    "blosc": _blosc,
    "lz4": _lz4,
    "zstd": _zstd,
    "gzip": lambda d, n: _streamed(d, n, "gzip"),
    "zlib": lambda d, n: _streamed(d, n, "zlib"),
    "bz2": lambda d, n: _streamed(d, n, "bz2"),
    "lzma": lambda d, n: _streamed(d, n, "lzma"),
}


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
