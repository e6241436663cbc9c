"""The arrays of a Zarr store (v2 or v3) as the Zarr source and inspect see them: the store opened through
:class:`zarrbounded.BoundedStore`, its root node, the walk of its tree (the consolidated metadata when there is some,
else node by node), and each array's dimension names (v3 ``dimension_names``, v2 xarray's ``_ARRAY_DIMENSIONS``),
dtype, rows per stored unit (chunk or shard) and bytes. Metadata only: no chunk is read.

References: the Zarr v2 and v3 specifications (zarr-specs); ``zarr`` 3.x (``open_group``, ``Group.members``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from tfrecord_etl._install import pip_install
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import zarrstore
from tfrecord_etl.transforms.sources.base import log
from tfrecord_etl.transforms.storage import fileio


def open_store(path: str, options):
    """A :class:`zarrbounded.BoundedStore` over the store ``path``.

    Raises:
      SourceError: the ``zarr`` package is not installed (the ``zarr`` extra: ``pip install '.[zarr]'``).
      SourceError: ``path`` is not a Zarr store (no ``zarr.json``, ``.zgroup``, ``.zarray`` or ``.zmetadata`` at its
        root).
    """
    kind = zarrstore.store_kind(path, remote_probe=not fileio.is_local(path))
    if kind is None:
        raise SourceError(
            "Not a Zarr store: no zarr.json (v3) or .zgroup/.zarray/.zmetadata (v2) at its root",
            file=path,
            hint="name the store's root directory (or its .zip, or its gs:// / s3:// prefix)",
        )
    try:  # deferred: zarr (optional), which zarrbounded imports
        from tfrecord_etl.transforms.sources.zarrbounded import BoundedStore
    except ImportError as e:
        raise SourceError(
            f"Reading a Zarr store needs the zarr package ({e})", file=path, hint=f"{pip_install('zarr')} (zarr 3.x)"
        ) from None
    return BoundedStore(
        path, kind, getattr(options, "allow_fill_value", False), getattr(options, "follow_symlinks", False)
    )


def open_node(store):
    """The root of ``store``: a ``zarr.Group`` (consolidated metadata used when present) or a ``zarr.Array``.

    Raises:
      SourceError: metadata zarr cannot read (naming the store and zarr's error).
    """
    import zarr

    try:
        try:
            with warnings.catch_warnings():  # "Consolidated metadata is currently not part in the Zarr format 3
                warnings.filterwarnings("ignore", message="Consolidated metadata")  # specification": read as such
                return zarr.open_group(store=store, mode="r")
        except (FileNotFoundError, KeyError, ValueError, TypeError) as e:
            if (
                "array" not in str(e).lower()
                and "not found" not in str(e).lower()
                and not type(e).__name__.endswith("NotFoundError")
            ):
                raise
            return zarr.open_array(store=store, mode="r")
    except SourceError:
        raise
    except Exception as e:  # noqa: BLE001 - zarr raises many kinds for damaged metadata
        raise SourceError(
            f"Cannot read the Zarr store's metadata: {type(e).__name__}: {e}",
            file=store.path,
            hint="check that the store is complete (tfrecord-etl inspect STORE)",
        ) from None


def walk(node, path: str, max_arrays: int, store=None, unreadable: dict | None = None) -> list[tuple[str, object]]:
    """``[(name, zarr.Array)]`` of every array under ``node`` (a group or an array; a root array is named by the
    store's base name), sorted by name; every name checked by :func:`zarrstore.check_key`. Without consolidated
    metadata the tree is walked node by node through ``store``'s listing, and each node zarr cannot open (zarr 3.1
    refuses the ``fill_value: 0`` of a zarr 2 ``|S1`` array) is added to ``unreadable`` (``{name: error}``).

    Raises:
      SourceError: a name leading outside the store; more than ``max_arrays`` arrays (``--max_datasets``).
    """
    import zarr

    if isinstance(node, zarr.Array):
        return [(root_name(path), node)]
    found = members(node, store, path, {} if unreadable is None else unreadable, max_arrays)
    out = []
    for name, obj in found:
        zarrstore.check_key(name, path)
        if isinstance(obj, zarr.Array):
            out.append((name, obj))
            if len(out) > max_arrays:
                raise SourceError(
                    f"The store holds more than {max_arrays:,} arrays",
                    file=path,
                    hint="raise --max_datasets, or name the arrays with --datasets",
                )
    return sorted(out, key=lambda item: item[0])


def members(group, store, path: str, unreadable: dict, limit: int) -> list:
    """``[(name, node)]`` of every node below ``group``: from its consolidated metadata when it has some (no read),
    else node by node (:func:`_walk_nodes`; zarr's own concurrent walk fails whole on one node it cannot read)."""
    if store is None or getattr(group.metadata, "consolidated_metadata", None) is not None:
        return list(group.members(max_depth=None))
    return _walk_nodes(store, "", path, unreadable, limit)


def _walk_nodes(store, prefix: str, path: str, unreadable: dict, limit: int) -> list:
    """``[(name, node)]`` below the group at ``prefix``, one node at a time (see :func:`walk`)."""
    import zarr

    out = []
    for child in store.children(prefix):
        name = f"{prefix}/{child}" if prefix else child
        zarrstore.check_key(name, path)
        if not any(store.has(f"{name}/{m}") for m in ("zarr.json", ".zarray", ".zgroup")):
            continue  # a chunk, or a directory of chunks
        try:
            node = zarr.open(store=store, path=name, mode="r")
        except SourceError:
            raise
        except Exception as e:  # noqa: BLE001 - zarr raises many kinds for metadata it cannot read
            unreadable[name] = f"{type(e).__name__}: {e}"
            continue
        out.append((name, node))
        if isinstance(node, zarr.Group) and len(out) <= limit:
            out.extend(_walk_nodes(store, name, path, unreadable, limit))
    return out


def log_unreadable(unreadable: dict, path: str) -> None:
    if unreadable:
        shown = "; ".join(f"{n} ({e[:120]})" for n, e in sorted(unreadable.items())[:3])
        log.warning(
            "Skipping %d node(s) of '%s' that zarr cannot read: %s%s",
            len(unreadable),
            path,
            shown,
            " and more" if len(unreadable) > 3 else "",
        )


def root_name(path: str) -> str:
    """The feature name of a store whose root is an array: its base name without ``.zarr``/``.zip``."""
    base = path.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".zip", ".zarr"):
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
    return base or "array"


def dimension_names(array) -> tuple[str, ...] | None:
    """The dimension names of ``array``: v3 ``dimension_names``, v2 xarray's ``_ARRAY_DIMENSIONS``; None if absent."""
    meta = array.metadata
    names = getattr(meta, "dimension_names", None) if meta.zarr_format == 3 else array.attrs.get("_ARRAY_DIMENSIONS")
    if not names or any(n is None for n in names):
        return None
    return tuple(str(n) for n in names)


def leading_dimension(name: str, array) -> str | None:
    """The leading dimension of ``array`` qualified by its group (``group/time``), None when unnamed."""
    dims = dimension_names(array)
    if not dims or not array.shape:
        return None
    parent = name.rsplit("/", 1)[0] if "/" in name else ""
    return f"{parent}/{dims[0]}" if parent else dims[0]


def chunk_rows(array) -> int:
    """The rows of one stored unit of ``array``: its shard's (v3 sharding: one read unit) or chunk's first dim."""
    if not array.shape:
        return 1
    return int((array.shards or array.chunks)[0])


def array_dtype(array, where: str) -> np.dtype:
    """The NumPy dtype ``array`` reads as; variable-length strings (v2 object/vlen, v3 ``string``) are ``object``.

    Raises:
      SchemaError: a dtype NumPy and TFRecords cannot carry.
    """
    dt = array.dtype
    if not isinstance(dt, np.dtype) or dt.kind in "OT":
        return np.dtype(object)
    if dt.kind in "mM" or dt.hasobject:
        raise SchemaError(
            f"Unsupported Zarr dtype {dt}",
            file=where,
            hint="store it as integers (xarray writes datetimes as integers with units)",
        )
    return dt


def vlen_check(dtype, where):
    """``leaf_specs``' check of an object dtype: none here."""
    return None  # every object dtype here is a variable-length string (zarr refuses pickled objects)


def array_bytes(array) -> int:
    """The bytes ``array`` declares (variable-length strings counted as 8 bytes each)."""
    dt = array.dtype
    itemsize = dt.itemsize if isinstance(dt, np.dtype) and dt.kind not in "OT" else 8
    return int(math.prod(array.shape)) * itemsize
