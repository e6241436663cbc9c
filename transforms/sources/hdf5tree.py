"""The dataset tree of an HDF5 file, for ``tfrecord-etl inspect FILE.h5`` (no external tool such as h5ls):
every object with its dtype, shape, chunks and filters, and the row groups (datasets sharing a leading length,
which convert reads together), and the categorical columns (:mod:`categoricals`). Metadata only: no data is read
but the names of categorical columns, no link is followed."""

from __future__ import annotations

from tfrecord_etl.transforms.codec import normalize_dtype
from tfrecord_etl.transforms.errors import SchemaError, SourceError, printable
from tfrecord_etl.transforms.sources import categoricals, conventions, hdf5layout as layout, hdf5nwb
from tfrecord_etl.transforms.sources.base import SourceOptions
from tfrecord_etl.transforms.sources.hdf5 import Hdf5Source
from tfrecord_etl.transforms.sources.hdf5links import link_status
from tfrecord_etl.transforms.sources.hdf5matlab import is_matlab
from tfrecord_etl.transforms.sources.matlab import MatlabSource
from tfrecord_etl.transforms.sources.matsparse import SPARSE_NOTE, SparseView, is_sparse
from tfrecord_etl.transforms.sources.netcdf3 import NetCdf3Source

MAX_OBJECTS = 10_000  # entries listed before the walk stops (the summary says so)


def hdf5_tree(path: str, max_objects: int = MAX_OBJECTS) -> dict:
    """``{"file", "objects": [...], "row_groups": [...], "truncated"}`` of the HDF5 file ``path``.

    Each object: ``path``, ``kind`` (``group``, ``dataset``, ``scalar``, ``dimension-scale``, ``soft link``,
    ``external link``: with ``convert``, what convert does with it and why), and for datasets ``dtype``, ``shape``,
    ``chunks``, ``filters``, ``storage``
    (``contiguous``, ``chunked``, ``compact``, ``external``, ``virtual``). Row groups: ``{"rows", "datasets",
    "flag"}`` for the datasets with a leading axis (scalars and dimension scales, which convert skips, are left
    out), largest group first (the one convert reads by default; ``--row_group N`` picks another), each with the
    ``--datasets`` flag that converts it. MATLAB variables (``matlab``: true) have their rows on HDF5's last axis.

    Raises:
      SourceError: not a readable HDF5 file (naming it).
    """
    import h5py

    f, stream = Hdf5Source(SourceOptions()).open_file(path)
    objects, truncated, entries = [], False, []
    try:
        collector = conventions.Hdf5Roles(f)
        for full, link, obj in layout.walk(f):
            if len(objects) >= max_objects:
                truncated = True
                break
            if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
                objects.append(_link_entry(full, link, path))
                continue
            if isinstance(obj, Exception) or obj is None:  # a damaged or unsupported object: listed, not fatal
                objects.append({"path": full, "kind": "unreadable", "target": str(obj)})
                continue
            if is_sparse(obj):  # a MATLAB v7.3 sparse matrix: one variable, listed as for a v4-v7 file
                entry = _sparse_entry(full, obj)
                objects.append(entry)
                if entry["kind"] == layout.DATA:
                    collector.observe(full, obj, layout.DATA)
                    entries.append((full, entry["shape"][0], None, entry.pop("bytes")))
                continue
            if isinstance(obj, h5py.Group):
                objects.append({"path": full, "kind": "matlab-internal" if full in layout.MATLAB_INTERNAL else "group"})
                continue
            try:
                kind = layout.kind_of(obj, full)
            except SourceError as e:  # a MATLAB attribute of the wrong type: listed, as convert refuses it
                objects.append({"path": full, "kind": "unreadable", "target": e.message})
                continue
            collector.observe(full, obj, kind)
            objects.append(_dataset_entry(full, obj, kind))
            if kind == layout.CELL and not is_matlab(obj):  # an HDF5 object reference (NWB's links), no MATLAB cell
                objects[-1].update(kind="object reference", target=hdf5nwb.reference_targets(f, obj))
            if objects[-1]["kind"] in (layout.DATA, layout.SCALE):
                rows, _ = layout.rows_and_shape(obj)
                entries.append((full, rows, layout.leading_dimension(obj), layout.data_bytes(obj)))
        roles = collector.roles([e[0] for e in entries])
        nwb = (_text(f.attrs.get("nwb_version", "2.x")), hdf5nwb.tree_groups(f)) if hdf5nwb.is_nwb(f, path) else None
        found = categoricals.hdf5_columns(f, [e[0] for e in entries])
    finally:
        f.close()
        if stream is not None:
            stream.close()
    tree = {"file": path, "objects": objects, "truncated": truncated, "categoricals": _categoricals(found)}
    if nwb is None:
        return _with_groups(tree, entries, roles)
    tree.update(format=f"NWB {nwb[0]} (HDF5)", nwb=True, row_groups=nwb[1][0], default=nwb[1][1])
    for o in objects:  # what is not data: the file's metadata, its schema
        role = hdf5nwb.role(o["path"], o["path"].count("/") == 1 and o["kind"] != "group")
        if role and o["kind"] not in ("group", "soft link", "external link"):
            o["role"] = role
    return tree


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _categoricals(found) -> list[dict]:
    """The tree's ``categoricals``: ``{"feature", "column", "categories", "ordered", "origin"}`` of each column."""
    return [
        {
            "feature": c.feature,
            "column": c.column,
            "categories": list(c.categories.values),
            "ordered": c.categories.ordered,
            "origin": c.categories.origin,
        }
        for c in found
    ]


def _sparse_entry(full: str, group) -> dict:
    """The tree's entry of a MATLAB v7.3 sparse matrix: its dense dtype and MATLAB shape, as :func:`matlab_tree`
    lists a v4-v7 one (``class sparse (converted dense: full(S))``), the storage and filters of its ``data``."""
    try:
        view = SparseView(group)
    except SourceError as e:
        return {"path": full, "kind": "unreadable", "target": e.message}
    stored = _dataset_entry(full, view.parts[0], layout.DATA)
    logical = " logical" if view.dtype.kind == "u" else ""
    complex_ = " complex" if view.dtype.kind == "c" else ""
    empty = layout.kind_of(view, full) == layout.EMPTY  # as matlab_tree lists an empty one: no dtype, no shape
    return {
        **stored,
        "kind": layout.EMPTY if empty else layout.DATA,
        "dtype": "-" if empty else str(view.dtype),
        "shape": [] if empty else [view.m, view.n],
        "chunks": None,
        "filters": stored["filters"] + [f"class sparse{logical}{complex_} ({SPARSE_NOTE})"],
        "matlab": False,  # the shape shown is MATLAB's already
        "bytes": layout.data_bytes(view),
    }


def _link_entry(full: str, link, path: str) -> dict:
    """The tree's entry of a soft link (its target) or an external link (its target and what convert does)."""
    import h5py

    if isinstance(link, h5py.SoftLink):
        return {"path": full, "kind": "soft link", "target": link.path}
    why = link_status(link, path, True)
    return {
        "path": full,
        "kind": "external link",
        "target": f"{link.filename}:{link.path}",
        "convert": f"convert refuses it: {why}" if why else "convert follows it with --allow_external_storage",
    }


def _dataset_entry(full: str, obj, kind: str) -> dict:
    """The tree's entry of a dataset of ``kind``: dtype (``unsupported dtype`` when convert refuses it), shape,
    chunks, filters, storage (``contiguous``, ``chunked``, ``compact``, ``external``, ``virtual``), MATLAB or not."""
    plist = obj.id.get_create_plist()
    storage = (
        "virtual"
        if obj.is_virtual
        else (
            "external"
            if plist.get_external_count()
            else {0: "compact", 1: "contiguous", 2: "chunked"}.get(plist.get_layout(), "other")
        )
    )
    filters = [
        str(plist.get_filter(i)[3].decode(errors="replace") or plist.get_filter(i)[0])
        for i in range(plist.get_nfilters())
    ]
    try:
        dtype = str(obj.dtype)
        if obj.dtype.fields is None and obj.dtype.subdtype is None and obj.dtype.kind != "O":
            normalize_dtype(obj.dtype)  # e.g. float128: no portable form
    except (TypeError, ValueError, SchemaError) as e:  # HDF5 time types, float128...: convert refuses them
        dtype, kind = (
            (f"no NumPy dtype ({e})" if not isinstance(e, SchemaError) else dtype),
            "unsupported dtype",
        )
    return {
        "path": full,
        "kind": kind,
        "dtype": dtype,
        "shape": list(obj.shape),
        "chunks": list(obj.chunks) if obj.chunks else None,
        "filters": filters,
        "storage": storage,
        "matlab": is_matlab(obj),
    }


def _with_groups(tree: dict, entries, roles) -> dict:
    """``tree`` with its ``row_groups`` and ``default`` (:func:`conventions.tree_groups`) and each object's
    ``role`` (why a coordinate, bounds or metadata dataset describes the data), where the conventions say."""

    tree["row_groups"], tree["default"] = conventions.tree_groups(entries, roles)
    for o in tree["objects"]:
        role = conventions.describe_role(roles, o["path"])
        if role and o.get("kind") != "dimension-scale":  # (listed as a coordinate variable already)
            o["role"] = role
    return tree


def netcdf3_tree(path: str) -> dict:
    """:func:`hdf5_tree`'s form for a NetCDF-3 file: every variable (``dataset``, or ``scalar`` for 0-d) with its
    dimensions, and the row groups (variables sharing their first dimension) convert chooses from.

    Raises:
      SourceError: not a readable NetCDF-3 file (naming it).
    """

    source = NetCdf3Source(SourceOptions())
    f = source.open_file(path)
    objects, entries = [], []
    try:
        roles = conventions.netcdf3_roles(f)
        for name, var in f.variables.items():
            storage = "record variable" if var.isrec else "fixed-size"
            objects.append(
                {
                    "path": name,
                    "kind": "dataset" if var.shape else "scalar",
                    "dtype": str(var.data.dtype),
                    "shape": list(var.shape),
                    "chunks": None,
                    "filters": [f"dims {', '.join(var.dimensions)}"] if var.dimensions else [],
                    "storage": storage,
                }
            )
            if var.shape:
                entries.append((name, int(var.shape[0]), var.dimensions[0], int(var.data.nbytes)))
        found = _categoricals(categoricals.netcdf3_columns(f, [e[0] for e in entries]))
    finally:
        source.close_file(f)
    tree = {"file": path, "format": "NetCDF-3", "objects": objects, "truncated": False, "categoricals": found}
    return _with_groups(tree, entries, roles)


def matlab_tree(path: str) -> dict:
    """:func:`hdf5_tree`'s form for a MATLAB v4-v7 ``.mat`` file: every variable and struct field (``dataset``,
    ``matlab-cell``, ``matlab-empty``, ``matlab-sparse``...) with its MATLAB class, dtype and shape, and the row
    groups convert chooses from. Structs are loaded to list their fields (within ``--max_mat_variable_mb``'s
    default); numeric variables are read from their headers only.

    Raises:
      SourceError: not a readable MATLAB v4-v7 file, or a struct over the size limit (naming it).
    """

    source = MatlabSource(SourceOptions())
    with source.open_stream(path) as f:
        table = source.variables(f, path)
        leaves = source.leaves(f, table, path)
    classes = {
        f"/{v.name}": (
            v.mclass
            + (" logical" if v.logical else "")
            + (" complex" if v.is_complex else "")
            + (f" ({SPARSE_NOTE})" if v.mclass == "sparse" else ""),
            v.compressed,
        )
        for v in table
    }
    objects, entries = [], []
    for leaf in leaves:
        if leaf.kind == layout.INTERNAL:
            continue
        mclass, compressed = classes.get(
            leaf.path, ("struct field", classes.get("/" + leaf.path.strip("/").split("/")[0], ("", False))[1])
        )
        objects.append(
            {
                "path": leaf.path,
                "kind": "dataset" if leaf.kind == layout.DATA else leaf.kind,
                "dtype": str(leaf.dtype) if leaf.dtype is not None else leaf.what or "-",
                "shape": list(leaf.shape) if leaf.kind == layout.DATA else [],
                "chunks": None,
                "filters": [f"class {mclass}"],
                "storage": "compressed" if compressed else "uncompressed",
            }
        )
        if leaf.kind == layout.DATA:
            entries.append((leaf.path, leaf.shape[0], None, leaf.nbytes))
    groups = [
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
    return {"file": path, "format": "MATLAB v4-v7 .mat", "objects": objects, "row_groups": groups, "truncated": False}


def render_tree(tree: dict) -> str:
    """The text form of :func:`hdf5_tree`: one line per object, then the row groups."""
    lines = [
        f"{tree.get('format', 'HDF5')} file {tree['file']}: {len(tree['objects'])} objects"
        + (f" (listing stopped at {MAX_OBJECTS})" if tree["truncated"] else "")
    ]
    for o in tree["objects"]:
        if o["kind"] in ("group", "matlab-internal"):
            lines.append(
                f"  {o['path']}/"
                + ("  [MATLAB's own storage: read through cell references]" if o["kind"] == "matlab-internal" else "")
            )
        elif "link" in o["kind"]:
            lines.append(
                f"  {o['path']} -> {o['target']} ({o['kind']}, not followed"
                + (f"; {o['convert']})" if o.get("convert") else ")")
            )
        elif o["kind"] == "unreadable":
            lines.append(f"  {o['path']}  [unreadable: {o['target']}]")
        else:
            extra = [o["storage"]] + ([f"chunks {o['chunks']}"] if o["chunks"] else []) + o["filters"]
            skip = {
                "object reference": f"  [{o.get('target')}: not converted]",
                "dataset": "",
                "dimension-scale": "  [coordinate variable]",
                "unsupported dtype": "  [unsupported dtype: convert refuses it]",
                "matlab-cell": "  [MATLAB cell: --container_mode datasets converts each cell]",
                layout.PYTABLES_INDEX: "  [PyTables search index: skipped by convert]",
                layout.PANDAS_META: "  [pandas category names: convert writes its table's column as them]",
            }.get(o["kind"], f"  [{o['kind']}: skipped by convert]")
            if o.get("matlab"):
                extra.append("MATLAB column-major: rows on the last axis")
            if o.get("role"):
                skip += f"  [{o['role']}]"
            lines.append(f"  {o['path']:<40} {o['dtype']:<12} {o['shape']!s:<18} {', '.join(extra)}{skip}")
    if tree.get("categoricals"):
        lines.append(
            "categorical columns (convert writes each row's category name, UTF-8, a missing value as the empty "
            "string; --categoricals codes writes the codes; metadata.json and schema.pbtxt keep the names either way):"
        )
        for c in tree["categoricals"]:
            names = ", ".join(c["categories"][:5]) + (", ..." if len(c["categories"]) > 5 else "")
            renamed = f" (codes in '{c['column']}')" if c["column"] != c["feature"] else ""
            ordered = ", ordered" if c["ordered"] else ""
            lines.append(
                printable(
                    f"  {c['feature']}{renamed}: {len(c['categories'])} categories{ordered} from {c['origin']}: {names}"
                )
            )
    lines.append(
        "row groups (datasets converted together share their leading dimension; convert reads the default "
        "below unless --row_group N or --datasets says otherwise):"
    )
    for g in tree["row_groups"]:
        shown = g["flag"] if len(g["flag"]) <= 200 else g["flag"][:200] + f"... ({len(g['datasets'])} datasets)"
        n = len(g["datasets"])
        dim = f" on '{g['dimension']}'" if g["dimension"] else ""
        top = f" under '{g['top']}'" if g.get("top") else ""
        role = f" ({g['role']})" if g.get("role") else ""
        lines.append(
            f"  group {g['group']}: {g['rows']} rows{dim}{top}, {n} dataset{'s' if n > 1 else ''}, "
            f"{g['bytes']} bytes{role}  ->  --row_group {g['group']} or {shown}"
        )
    default = tree.get("default")
    if default and tree["row_groups"]:
        lines.append(
            f"default: convert takes group {default['group']}: {default['why']}"
            if default["group"]
            else f"default: none, convert refuses to choose: {default['why']}; pass --row_group N or --datasets"
        )
    if not tree["row_groups"] and tree.get("nwb"):
        lines.append(f"  none: convert refuses the file: {default['why'] if default else 'no data'}")
    elif not tree["row_groups"]:
        lines.append(
            "  none: no dataset with rows; convert (--container_mode auto) makes each dataset and MATLAB cell "
            "one Example"
        )
    return "\n".join(lines)
