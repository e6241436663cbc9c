"""Zarr source: the arrays of a Zarr store (v2 or v3; a local directory store, a zip store, or a gs:// / s3://
prefix) through the ``zarr`` package (3.x) and its codecs, read through :class:`zarrbounded.BoundedStore` (keys
confined to the store, sizes and decompressed sizes bounded by the metadata, never-written chunks refused unless
``--allow_fill_value``).

The model is the HDF5 containers' (``hdf5layout``): arrays with the same leading length on the same leading
dimension (xarray's ``_ARRAY_DIMENSIONS`` attribute in v2, ``dimension_names`` in v3; a coordinate variable is on
its own dimension) form a row group; rows mode converts the largest group unless ``--datasets`` or ``--row_group
N`` says otherwise; ``--container_mode datasets`` converts each array as one Example (``key``, ``array``). Values are
the stored ones: no CF decoding (``scale_factor``, ``_FillValue``, time units stay attributes), as for NetCDF.
Planning reads metadata only (the consolidated metadata when the store has it: one read for the whole tree); row
ranges are aligned to the arrays' chunks (to shards for sharded v3 arrays).
"""

from __future__ import annotations

import math
import os

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import zarrstore
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    Columns,
    FileIndex,
    RowRange,
    check_empty_rows,
    check_names,
    leaf_specs,
    row_bytes,
    row_spec,
)
from tfrecord_etl.transforms.sources.container import (
    MODE_FLAG,
    ContainerSource,
    check_leading_lengths,
    choose_group,
    datasets_index,
)
from tfrecord_etl.transforms.sources.zarrarrays import (
    array_bytes,
    array_dtype,
    chunk_rows,
    leading_dimension,
    log_unreadable,
    open_node,
    open_store,
    vlen_check,
    walk,
)
from tfrecord_etl.transforms.storage import fileio

ZARR_SUFFIXES = (".zarr", ".zarr.zip", ".zarr/")
MAX_CHUNK_ALIGN_ROWS = 2**20  # row ranges align to the arrays' common chunk rows up to this many rows


class ZarrSource(ContainerSource):
    """Zarr stores (see the module docstring). ``index``/``read`` take the store's root path as the "file"."""

    options_models = (
        "options_container.ContainerOptions",
        "options_hdf5.Hdf5Options",
    )  # its flags: sources/options_*.py

    format_name = "zarr"
    help_label = "Zarr"
    suffixes = ZARR_SUFFIXES
    content_label = "a Zarr store"

    def pin_files(self, paths):
        """Pins each local store's root metadata document (``zarr.json``/``.zmetadata``/``.zgroup``/``.zarray``) or
        zip file: a store rewritten while a run reads it fails as changed."""
        self.pins = {}
        for p in paths:
            target = _pin_target(p)
            if target is not None:
                self.pins[p] = (target, fileio.pin(target))

    def read_pinned(self, rr: RowRange) -> Columns:
        pinned = getattr(self, "pins", {}).get(rr.path)
        if pinned:
            fileio.check_pin(pinned[0], pinned[1], "Zarr store metadata")
        columns = self.read(rr)
        if pinned:
            fileio.check_pin(pinned[0], pinned[1], "Zarr store metadata")
        return columns

    def _tree(self, path: str):
        """``(store, {name: array})`` of ``path`` with the store's chunk bounds set."""
        store = open_store(path, self.options)
        unreadable = {}
        arrays = dict(walk(open_node(store), path, self.options.max_datasets, store, unreadable))
        named = [n.strip("/") for n in self.options.datasets or ()]
        for name in named:
            if name in unreadable:
                raise SourceError(f"zarr cannot read the array: {unreadable[name]}", file=path, dataset=name)
        if not named and path not in self.__dict__.setdefault("_warned", set()):
            log_unreadable(unreadable, path)
            self._warned.add(path)
        store.set_bounds({_key_of(name, arrays[name], path): zarrstore.chunk_bound(a) for name, a in arrays.items()})
        return store, arrays

    def index(self, path: str) -> FileIndex:
        """Learns rows and features of the store ``path`` from its metadata only.

        Raises:
          SourceError: not a Zarr store, hostile keys or names, unknown array names.
          SchemaError: unsupported dtypes, 0-d arrays in rows mode, lengths that differ, no array.
        """
        store, arrays = self._tree(path)
        try:
            if self.loose:
                return self._index_arrays(arrays, path, store)
            names = list(self.options.datasets or self._default_arrays(arrays, path) or [])
            if not names and self.switch_to_datasets(path):
                return self._index_arrays(arrays, path, store)
            self._rows_indexed = True
            specs, lengths, align, data_row_bytes = [], {}, 1, 0
            for name in names:
                arr = _array(arrays, name, path)
                if not arr.shape:
                    raise SchemaError(
                        "Array is a scalar (0-d): it has no rows",
                        file=path,
                        dataset=name,
                        hint=f"use {MODE_FLAG} datasets (each array -> one Example)",
                    )
                where = f"{path}, array '{name}'"
                dtype = array_dtype(arr, where)
                row_shape = tuple(arr.shape[1:])
                if dtype.kind != "O":
                    data_row_bytes += dtype.itemsize * math.prod(row_shape)
                check_stored(store, name, arr, path, self.options.allow_fill_value)
                specs += leaf_specs(name.strip("/"), dtype, row_shape, where, vlen_check)
                lengths[name] = int(arr.shape[0])
                rows = chunk_rows(arr)
                align = math.lcm(align, rows) if math.lcm(align, rows) <= MAX_CHUNK_ALIGN_ROWS else max(align, rows)
        finally:
            store.close()
        check_names(specs, path)
        rows = check_leading_lengths(lengths, path, "arrays", "STORE")
        check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(path, rows, tuple(specs), row_bytes(specs), align, tuple(names))

    def _default_arrays(self, arrays: dict, path: str) -> list[str]:
        entries, scalars = [], []
        for name, arr in arrays.items():
            if not arr.shape:
                scalars.append(name)
                continue
            entries.append((name, int(arr.shape[0]), leading_dimension(name, arr), array_bytes(arr)))
        if not entries:
            if self.options.container_mode == "auto" and scalars:
                return []
            raise SchemaError(
                "The store holds no array with rows",
                file=path,
                hint=f"use {MODE_FLAG} datasets (each array -> one Example)" if scalars else None,
            )
        return choose_group(entries, self.options.row_group or None, path)

    def _index_arrays(self, arrays: dict, path: str, store) -> FileIndex:
        names = list(self.options.datasets) if self.options.datasets else list(arrays)
        specs, sizes, items = [], [], []
        for name in names:
            arr = _array(arrays, name, path)
            where = f"{path}, array '{name}'"
            dtype = array_dtype(arr, where)
            if dtype.kind == "O" or dtype.fields is not None:
                if self.options.datasets:
                    raise SchemaError(
                        "String and structured arrays are not supported in datasets mode",
                        file=path,
                        dataset=name,
                        hint="convert them in rows mode with --datasets",
                    )
                continue
            check_stored(store, name, arr, path, self.options.allow_fill_value)
            specs.append(row_spec(ARRAY, dtype, arr.shape, where))
            sizes.append(array_bytes(arr))
            items.append(name)
        return datasets_index(path, items, specs, sizes, "array", "store")

    def open_for_read(self, path: str):
        """``(store, {name: array})`` of ``path`` (see :meth:`opened`)."""
        return self._tree(path)

    def close_handle(self, handle) -> None:
        handle[0].close()

    def read(self, rr: RowRange) -> Columns:
        """The rows ``rr.start:rr.stop`` of each array of ``rr.items`` (datasets mode: each array whole).

        Raises:
          SourceError: a refused chunk (see :mod:`zarrstore`), or any failure to decode (naming the rows).
        """
        try:
            _, arrays = self.opened(rr.path)
            return self.columns(
                rr,
                lambda n: np.asarray(_array(arrays, n, rr.path)[...]),
                lambda n: _as_numpy(_array(arrays, n, rr.path)[rr.start : rr.stop]),
            )
        except SourceError:
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - zarr and its codecs raise many kinds for damaged chunks
            self.close()
            raise SourceError(
                f"Cannot read {rr.describe()}: {type(e).__name__}: {e}",
                file=rr.path,
                hint="check the store's chunks (tfrecord-etl inspect STORE)",
            ) from None


def check_stored(store, name: str, array, path: str, allow_fill_value: bool) -> None:
    """Checks at planning that a local store holds every chunk (or shard) the array's shape declares: a
    never-written chunk reads as the fill value, so a store declaring ``(10**15, 4)`` with one chunk written would
    plan (and write) 32 PB of fill values. Only the files present are listed and only up to the first missing chunk's
    coordinates are computed: time and memory grow with the chunks present, never with the declared shape. Remote
    stores are checked chunk by chunk when read (a listing costs requests).

    Raises:
      SourceError: chunks missing and not ``allow_fill_value`` (``--allow_fill_value``): naming the array, its
        declared shape and bytes, the chunks and bytes present, the first missing chunk and the flag.
    """
    keys, present = store.stored_keys(_key_of(name, array, path))
    if keys is None or allow_fill_value or not array.shape:
        return
    unit = array.shards or array.chunks
    grid = [-(-int(n) // int(c)) for n, c in zip(array.shape, unit)]
    declared = math.prod(grid)
    if len(keys) >= declared:
        return
    first = None
    coords = [0] * len(grid)
    for _ in range(len(keys) + 1):  # the first missing one is among the first len(keys) + 1, in C order
        key = array.metadata.encode_chunk_key(tuple(coords))
        if key not in keys:
            first = key
            break
        for axis in reversed(range(len(grid))):  # the next coordinates (itertools.product would list each axis)
            coords[axis] += 1
            if coords[axis] < grid[axis]:
                break
            coords[axis] = 0
    shape = "(" + ", ".join(f"{int(n):,}" for n in array.shape) + ")"
    raise SourceError(
        f"The array declares shape {shape}, {array_bytes(array):,} bytes in {declared:,} chunks, but "
        f"the store holds {len(keys):,} of its chunk files ({present:,} bytes): the others (the first: "
        f"{first!r}) were never written and would read as the fill value",
        file=path,
        dataset=name,
        hint="pass --allow_fill_value if the fill value is the intended data (zarr skips chunks equal "
        "to the fill value unless write_empty_chunks=True)",
    )


def _as_numpy(data) -> np.ndarray:
    """A NumPy array of what zarr read: variable-length strings as an object array of UTF-8 ``bytes``."""
    data = np.asarray(data)
    if data.dtype.kind in "OT":
        out = np.empty(data.shape, dtype=object)
        flat, src = out.reshape(-1), data.reshape(-1)
        for i, v in enumerate(src):
            flat[i] = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        return out
    return data


def _array(arrays: dict, name: str, path: str):
    arr = arrays.get(name.strip("/"))
    if arr is None:
        shown = ", ".join(sorted(arrays)[:10])
        raise SourceError(
            "No such array", file=path, dataset=name, hint=f"arrays: {shown}; tfrecord-etl inspect STORE lists them"
        )
    return arr


def _key_of(name: str, array, path: str) -> str:
    """The store key prefix of the array ``name`` ("" for a root array)."""
    return array.path if array.path is not None else name


def _pin_target(path: str) -> str | None:
    if not fileio.is_local(path):
        return None
    if os.path.isfile(path):
        return path
    for marker in zarrstore.ROOT_MARKERS:
        candidate = os.path.join(path, marker)
        if os.path.isfile(candidate):
            return candidate
    return None
