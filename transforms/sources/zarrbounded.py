"""The read-only Zarr store of :mod:`zarrstore` (its rules are described there): a ``zarr.abc.store.Store``, so this
module imports ``zarr`` (the ``zarr`` extra) and is imported only when a Zarr store is read."""

from __future__ import annotations

import asyncio
import os
import stat
import zipfile

from zarr.abc.store import Store

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.zarrstore import (
    MAX_METADATA_BYTES,
    METADATA_KEYS,
    ChunkBound,
    check_consolidated,
    check_key,
    declared_size,
    inner_chunks,
)
from tfrecord_etl.transforms.storage import fileio


class BoundedStore(Store):
    """The read-only store of ``path`` (kind from :func:`store_kind`); see the module docstring. ``bounds`` maps
    array paths to their :class:`ChunkBound` once the tree is known (:meth:`set_bounds`); keys under no known array
    are bounded as metadata."""

    supports_writes = False
    supports_deletes = False
    supports_partial_writes = False
    supports_listing = True

    def __init__(self, path: str, kind: str, allow_fill_value: bool = False, follow_symlinks: bool = False):
        super().__init__(read_only=True)
        self.path, self.kind = path, kind
        self.root = path.rstrip("/")
        self.allow_fill_value, self.follow_symlinks = allow_fill_value, follow_symlinks
        self.bounds: dict[str, ChunkBound] = {}
        self.missing: list[str] = []  # chunk keys found missing (with allow_fill_value)
        self.real_root = os.path.realpath(path) if kind == "dir" else None
        self._zip = zipfile.ZipFile(path) if kind == "zip" else None
        self._zip_infos = {i.filename: i for i in self._zip.infolist()} if self._zip else {}

    def __eq__(self, other):
        return isinstance(other, BoundedStore) and other.path == self.path

    def __hash__(self):
        return hash(self.path)

    def __getstate__(self):
        raise TypeError("BoundedStore is opened by each worker")

    def set_bounds(self, bounds: dict[str, ChunkBound]) -> None:
        self.bounds = dict(bounds)

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
        super().close()

    # --- reading one key --------------------------------------------------------------------------------------
    def _array_of(self, key: str) -> str | None:
        parent = key.rsplit("/", 1)[0] if "/" in key else ""
        while True:
            if parent in self.bounds:
                return parent
            if not parent:
                return None
            parent = parent.rsplit("/", 1)[0] if "/" in parent else ""

    def _where(self, key: str) -> str:
        return f"{self.path}/{key}" if self.kind != "zip" else f"{self.path}:{key}"

    def _read(self, key: str, limit: int, byte_range) -> bytes | None:
        """The bytes of ``key`` (``byte_range``: a zarr ByteRequest), None when absent; its size checked first."""
        if self.kind == "dir":
            full = os.path.join(self.path, *key.split("/"))
            if not os.path.lexists(full):
                return None
            real = os.path.realpath(full)
            if not self.follow_symlinks and not (real + os.sep).startswith(self.real_root.rstrip(os.sep) + os.sep):
                raise SourceError(
                    f"The Zarr key {key!r} is a symbolic link leading outside the store (to {real!r}): refused",
                    file=self.path,
                    hint="pass --follow_symlinks to read it, or copy the data into the store",
                )
            try:
                st = os.stat(real)
            except OSError:
                return None
            if not stat.S_ISREG(st.st_mode):
                if stat.S_ISDIR(st.st_mode):
                    return None
                raise SourceError(f"The Zarr key {key!r} is not a regular file: refused, never opened", file=self.path)
            self._check_size(key, st.st_size, limit)
            with open(real, "rb") as f:
                return _ranged(f, st.st_size, byte_range)
        if self.kind == "zip":
            info = self._zip_infos.get(key)
            if info is None:
                return None
            self._check_size(key, info.file_size, limit)
            with self._zip.open(info) as f:
                data = f.read(limit + 1)  # (the declared size may lie: never more than the limit)
            self._check_size(key, len(data), limit)
            return _slice(data, byte_range)
        full = f"{self.root}/{key}"
        try:
            stream = fileio.open_read(full)
        except SourceError:
            if not fileio.exists(full):
                return None
            raise
        with stream:
            size = stream.raw._obj.size if hasattr(stream, "raw") and hasattr(stream.raw, "_obj") else None
            if size is not None:
                self._check_size(key, size, limit)
            else:
                size = stream.seek(0, 2)
                self._check_size(key, size, limit)
                stream.seek(0)
            return _ranged(stream, size, byte_range)

    def _check_size(self, key: str, size: int, limit: int) -> None:
        if size > limit:
            raise SourceError(
                f"The Zarr key {key!r} holds {size:,} bytes, more than any encoding of what its "
                f"metadata declares ({limit:,} bytes at most): refused",
                file=self.path,
                hint="the store is damaged or hostile; check its chunks against its metadata",
            )

    def get_sync(self, key: str, byte_range=None) -> bytes | None:
        """The checked bytes of ``key`` (see the module docstring), None when absent (and allowed to be)."""
        check_key(key, self.path)
        name = key.rsplit("/", 1)[-1]
        array = None if name in METADATA_KEYS else self._array_of(key)
        bound = self.bounds.get(array) if array is not None else None
        limit = bound.stored if bound is not None else MAX_METADATA_BYTES
        data = self._read(key, limit, byte_range)
        if name in (".zmetadata", "zarr.json") and data is not None:
            check_consolidated(data, key, self.path)
        if data is None:
            if bound is not None:
                if not self.allow_fill_value:
                    raise SourceError(
                        f"The chunk {key!r} of {_label(array)} was never written: zarr would read it as the fill value",
                        file=self.path,
                        hint="pass --allow_fill_value if the fill value is the intended data (zarr "
                        "skips chunks equal to the fill value unless write_empty_chunks=True)",
                    )
                self.missing.append(key)
            return None
        if bound is not None and byte_range is None and bound.codec and bound.decoded is not None:
            self._check_decoded(key, array, bound.codec, data, bound.decoded, "chunk")
        if bound is not None and bound.inner_codec:  # a shard: each inner chunk as zarr's sharding codec reads it
            if byte_range is None:
                for offset, length in inner_chunks(bound, data):
                    self._check_decoded(
                        key,
                        array,
                        bound.inner_codec,
                        data[offset : offset + length],
                        bound.inner_decoded,
                        "inner chunk",
                    )
            elif not self._is_index(bound, byte_range):
                self._check_decoded(key, array, bound.inner_codec, data, bound.inner_decoded, "inner chunk")
        return data

    def _check_decoded(self, key: str, array: str, codec: str, data: bytes, limit: int, what: str) -> None:
        """Refuses ``data`` (one chunk compressed by ``codec``) when it declares or decompresses (streamed, stopped
        at the bound) to more than the ``limit`` bytes its shape and dtype declare."""
        declared = declared_size(codec, data, limit)
        if declared is not None and declared > limit:
            raise SourceError(
                f"The {what} {key!r} of {_label(array)} decompresses ({codec}) to more than the "
                f"{limit:,} bytes its shape and dtype declare ({declared:,} or more): refused before "
                f"it is decompressed (a codec bomb?)",
                file=self.path,
                hint="the store is damaged or hostile; rewrite the array with zarr",
            )

    @staticmethod
    def _is_index(bound, byte_range) -> bool:
        """True when ``byte_range`` is the shard index's (a suffix, or the first bytes with the index at the start)."""
        from zarr.abc.store import RangeByteRequest, SuffixByteRequest

        if isinstance(byte_range, SuffixByteRequest):
            return True
        return (
            bound.index_at_start
            and isinstance(byte_range, RangeByteRequest)
            and byte_range.start == 0
            and byte_range.end - byte_range.start == bound.index_bytes
        )

    # --- the zarr Store API -----------------------------------------------------------------------------------
    async def get(self, key, prototype=None, byte_range=None):
        from zarr.core.buffer import default_buffer_prototype

        prototype = prototype or default_buffer_prototype()
        if self.kind == "remote":
            data = await asyncio.to_thread(self.get_sync, key, byte_range)
        else:
            data = self.get_sync(key, byte_range)
        return None if data is None else prototype.buffer.from_bytes(data)

    async def get_partial_values(self, prototype, key_ranges):
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        check_key(key, self.path)
        if self.kind == "dir":
            return os.path.isfile(os.path.join(self.path, *key.split("/")))
        if self.kind == "zip":
            return key in self._zip_infos
        return await asyncio.to_thread(fileio.exists, f"{self.root}/{key}")

    async def set(self, key, value):
        raise SourceError("The Zarr store is read-only here", file=self.path)

    async def delete(self, key):
        raise SourceError("The Zarr store is read-only here", file=self.path)

    def _all_keys(self) -> list[str]:
        if self.kind == "zip":
            return [n for n in self._zip_infos if not n.endswith("/")]
        if self.kind == "dir":
            out = []
            for top, _dirs, files in os.walk(self.path):
                rel = os.path.relpath(top, self.path)
                for f in files:
                    out.append(f if rel == "." else f"{rel.replace(os.sep, '/')}/{f}")
            return out
        root = self.root + "/"
        return [p[len(root) :] for p, _ in fileio.match(root + "**")]

    def stored_keys(self, prefix: str) -> tuple[set[str] | None, int]:
        """``(keys, bytes)`` of the files stored under the array prefix ``prefix`` ("" for a root array), metadata
        documents left out, keys relative to the prefix; ``(None, 0)`` for a remote store (a listing costs requests
        there: its never-written chunks are refused when read). Time and memory grow with the files present only."""
        start = f"{prefix}/" if prefix else ""
        keys, total = set(), 0
        if self.kind == "zip":
            for name, info in self._zip_infos.items():
                if name.startswith(start) and not name.endswith("/") and name.rsplit("/", 1)[-1] not in METADATA_KEYS:
                    keys.add(name[len(start) :])
                    total += info.file_size
            return keys, total
        if self.kind != "dir":
            return None, 0
        top = os.path.join(self.path, *prefix.split("/")) if prefix else self.path
        for folder, _, files in os.walk(top):
            rel = os.path.relpath(folder, top)
            for name in files:
                if name in METADATA_KEYS:
                    continue
                keys.add(name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}")
                try:
                    total += os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    pass
        return keys, total

    def has(self, key: str) -> bool:
        """True when ``key`` exists (a file of a directory or zip store, an object of a remote one)."""
        check_key(key, self.path)
        if self.kind == "dir":
            return os.path.isfile(os.path.join(self.path, *key.split("/")))
        if self.kind == "zip":
            return key in self._zip_infos
        return fileio.exists(f"{self.root}/{key}")

    def children(self, prefix: str) -> list[str]:
        """The names directly below ``prefix`` ("" for the root), sorted."""
        if self.kind == "dir":
            where = os.path.join(self.path, *prefix.split("/")) if prefix else self.path
            try:
                return sorted(n for n in os.listdir(where) if os.path.isdir(os.path.join(where, n)))
            except OSError:
                return []
        start = f"{prefix}/" if prefix else ""
        return sorted(
            {
                k[len(start) :].split("/", 1)[0]
                for k in self._all_keys()
                if k.startswith(start) and "/" in k[len(start) :]
            }
        )

    async def list(self):
        for k in self._all_keys():
            yield k

    async def list_prefix(self, prefix: str):
        for k in self._all_keys():
            if k.startswith(prefix):
                yield k

    async def list_dir(self, prefix: str):
        prefix = prefix.rstrip("/")
        if self.kind == "dir":
            where = os.path.join(self.path, *prefix.split("/")) if prefix else self.path
            try:
                names = sorted(os.listdir(where))
            except OSError:
                return
            for n in names:
                yield n
            return
        seen = set()
        start = f"{prefix}/" if prefix else ""
        for k in self._all_keys():
            if k.startswith(start):
                child = k[len(start) :].split("/", 1)[0]
                if child not in seen:
                    seen.add(child)
                    yield child


def _label(array: str) -> str:
    return f"array '{array}'" if array else "the store's root array"


def _ranged(f, size: int, byte_range) -> bytes:
    if byte_range is None:
        return f.read()
    start, stop = _bounds(byte_range, size)
    f.seek(start)
    return f.read(max(0, stop - start))


def _slice(data: bytes, byte_range) -> bytes:
    if byte_range is None:
        return data
    start, stop = _bounds(byte_range, len(data))
    return data[start:stop]


def _bounds(byte_range, size: int) -> tuple[int, int]:
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

    if isinstance(byte_range, RangeByteRequest):
        return byte_range.start, min(byte_range.end, size)
    if isinstance(byte_range, OffsetByteRequest):
        return byte_range.offset, size
    if isinstance(byte_range, SuffixByteRequest):
        return max(0, size - byte_range.suffix), size
    raise TypeError(f"Unexpected byte range {byte_range!r}")
