"""The tree of a Zarr store for ``tfrecord-etl inspect STORE``: every group and array, in ``hdf5tree.hdf5_tree``'s
form, and the row groups convert chooses from. Metadata only."""

from __future__ import annotations

from tfrecord_etl.transforms.sources import hdf5layout as layout, zarrstore
from tfrecord_etl.transforms.sources.base import SourceOptions
from tfrecord_etl.transforms.sources.zarrarrays import (
    array_bytes,
    dimension_names,
    leading_dimension,
    members,
    open_node,
    open_store,
    root_name,
)


def zarr_tree(path: str, max_objects: int = 10_000) -> dict:
    """``hdf5tree.hdf5_tree``'s form for the Zarr store ``path`` (``tfrecord-etl inspect STORE``): every group
    and array with its dtype, shape, chunks, and as ``filters`` its shards, codecs, dimension names and fill value;
    then the row groups convert chooses from (largest first), each with its ``--datasets`` flag. Metadata only.

    Raises:
      SourceError: not a Zarr store, or metadata zarr cannot read (naming the store).
    """
    import zarr

    store = open_store(path, SourceOptions())
    try:
        node = open_node(store)
        objects, entries = [], []
        unreadable = {}
        if isinstance(node, zarr.Array):
            found = [(root_name(path), node)]
        else:
            found = members(node, store, path, unreadable, max_objects)
        found += list(unreadable.items())
        found.sort(key=lambda m: m[0])
        fmt = node.metadata.zarr_format
        for name, obj in found[:max_objects]:
            zarrstore.check_key(name, path)
            objects.append(_object_entry(name, obj))
            if isinstance(obj, zarr.Array) and obj.shape:
                entries.append((name, int(obj.shape[0]), leading_dimension(name, obj), array_bytes(obj)))
    finally:
        store.close()
    return {
        "file": path,
        "format": f"Zarr v{fmt}",
        "objects": objects,
        "row_groups": _row_groups(entries),
        "truncated": len(found) > max_objects,
    }


def _object_entry(name: str, obj) -> dict:
    """The tree's entry of one node: an array (dtype, shape, chunks; shards, codecs, dimensions and fill value as
    ``filters``), a group, or a node zarr cannot read (``obj`` is then zarr's error text)."""
    import zarr

    if isinstance(obj, str):
        return {"path": name, "kind": "unreadable", "target": f"zarr cannot read it: {obj}"}
    if not isinstance(obj, zarr.Array):
        return {"path": name, "kind": "group"}
    codecs = [type(c).__name__.replace("Codec", "").lower() for c in (*obj.filters, *obj.compressors)]
    extra = ([f"shards {list(obj.shards)}"] if obj.shards else []) + (
        [f"codecs {'+'.join(codecs)}"] if codecs else ["uncompressed"]
    )
    dims = dimension_names(obj)
    if dims:
        extra.append(f"dims {', '.join(dims)}")
    fill = obj.fill_value
    extra.append(f"fill {fill.item() if hasattr(fill, 'item') else fill!r}")
    if obj.metadata.zarr_format == 2 and obj.order == "F":
        extra.append("order F")
    return {
        "path": name,
        "kind": "dataset" if obj.shape else "scalar",
        "dtype": str(obj.dtype),
        "shape": list(obj.shape),
        "chunks": list(obj.chunks),
        "filters": extra,
        "storage": f"zarr v{obj.metadata.zarr_format}",
    }


def _row_groups(entries) -> list[dict]:
    """The row groups of ``entries`` (``(name, rows, dimension, bytes)``), largest first, each with its flag."""
    return [
        {
            "group": i,
            "rows": g.rows,
            "dimension": g.dimension,
            "datasets": list(g.datasets),
            "bytes": g.nbytes,
            "flag": "--datasets " + ",".join(g.datasets),
        }
        for i, g in enumerate(layout.group_rows(entries), 1)
    ]
