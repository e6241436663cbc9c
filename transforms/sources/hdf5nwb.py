"""NWB files (Neurodata Without Borders 2.x, neuroscience's HDF5 standard: ``nwb.org``) converted by their own
conventions in rows mode (``docs/converting/nwb.md``).

An NWB file is an HDF5 file whose root carries ``nwb_version`` (and ``neurodata_type`` ``NWBFile``); every typed
group carries ``neurodata_type`` and ``namespace``. What this module knows of it:

* **TimeSeries** (and every subtype: ElectricalSeries, SpatialSeries, ImageSeries, ...): a typed group holding a
  ``data`` dataset (first axis = time) and either a ``timestamps`` dataset (float64 seconds, one per row) or a
  scalar ``starting_time`` with a ``rate`` attribute (Hz). One TimeSeries is one row group: its ``data`` rows with
  its ``timestamps`` rows. A regularly sampled series keeps its two numbers as metadata, not a computed column
  (``t_i = starting_time + i / rate``, what pynwb's ``get_timestamps()`` computes): every converted feature is a
  dataset of the file, which ``verify --source`` compares value for value.
* **DynamicTable** (electrodes, units, trials, ...): a typed group with ``colnames`` and an ``id`` dataset; a
  table is one row group: ``id`` and each column of ``id``'s length. Ragged columns (a ``<col>_index`` beside
  them) and columns of object references are left out (listed in the group's note).
* **File metadata** (``file_create_date``, ``identifier``, ``session_start_time``, ``/general``'s scalars) and the
  schema under ``/specifications`` are never joined to data rows: they describe the file.
* The attributes that say what the numbers mean (``unit``, ``conversion``, ``offset``, ``resolution`` of
  ``data``; ``starting_time``, ``rate``; the group's ``neurodata_type``) go to ``metadata.json``'s ``sources``
  entry (:func:`attributes`), never to per-row features.

Which group convert takes: ``--row_group N`` (the numbering of :func:`row_groups`: TimeSeries in walk order, then
tables), else the only TimeSeries, else (no TimeSeries) the only table; several candidates are refused in one
line listing each with its flag, and a file with neither is refused as holding no data. Metadata only: no data is
read here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.sources.base import log
from tfrecord_etl.transforms.sources.container import check_dataset_count

SPECIFICATIONS = "/specifications"  # the file's own copy of its schema (YAML text): never data
SERIES, TABLE = "TimeSeries", "table"
DATA_ATTRS = ("unit", "conversion", "offset", "resolution", "continuity")  # what a TimeSeries' numbers mean
MAX_LISTED = 6  # groups named in one refusal line


def _text(value):
    """A JSON value of an HDF5 attribute (bytes and NumPy scalars as Python ones; arrays as lists)."""
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [_text(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def is_nwb(f, path: str = "") -> bool:
    """True for an NWB file: ``nwb_version`` at the root, or a ``.nwb`` name with ``neurodata_type`` at the
    root. ``f``: an open ``h5py.File``."""
    attrs = f.attrs
    return "nwb_version" in attrs or (path.lower().endswith(".nwb") and "neurodata_type" in attrs)


@dataclasses.dataclass(frozen=True)
class NwbGroup:
    """One row group of an NWB file: a TimeSeries (``kind`` :data:`SERIES`) or a DynamicTable (:data:`TABLE`) at
    ``path``, its ``neurodata_type``, ``rows``, the ``datasets`` converted together (paths), their ``nbytes``, and
    a ``note`` (what is left out, how time is given)."""

    kind: str
    path: str
    neurodata_type: str
    rows: int
    datasets: tuple[str, ...]
    nbytes: int
    note: str = ""

    def describe(self, number: int) -> str:
        return f"{self.path} ({self.neurodata_type}, {self.rows} rows) -> --row_group {number}"


def _dataset(group, name: str):
    import h5py

    obj = group.get(name)  # (follows a soft link: NWB links shared timestamps)
    return obj if isinstance(obj, h5py.Dataset) else None


def _is_reference(dset) -> bool:
    import h5py

    try:
        return h5py.check_ref_dtype(dset.dtype) is not None
    except (TypeError, ValueError):
        return False


def _nbytes(dset) -> int:
    try:
        return int(dset.size) * dset.dtype.itemsize
    except (TypeError, ValueError):
        return 0


def _series(path: str, group, kind: str) -> NwbGroup | None:
    data = _dataset(group, "data")
    if data is None or data.ndim == 0 or data.shape[0] == 0:
        return None
    rows, names, note = int(data.shape[0]), [f"{path}/data"], ""
    stamps = _dataset(group, "timestamps")
    if stamps is not None:
        names.append(f"{path}/timestamps")  # (a length that differs is refused by the leading-length check)
    elif _dataset(group, "starting_time") is not None:
        note = "regular: starting_time and rate in metadata.json"
    return NwbGroup(
        SERIES, path, kind, rows, tuple(names), sum(_nbytes(group[n.rsplit("/", 1)[1]]) for n in names), note
    )


def _table(path: str, group, kind: str) -> NwbGroup | None:
    ids = _dataset(group, "id")
    if ids is None or ids.ndim != 1 or ids.shape[0] == 0:
        return None
    rows, names, left = int(ids.shape[0]), [f"{path}/id"], []
    for col in _text(group.attrs.get("colnames", [])) or []:
        dset = _dataset(group, col)
        if dset is None:
            continue
        if f"{col}_index" in group or _is_reference(dset) or dset.ndim == 0 or dset.shape[0] != rows:
            left.append(col)
        else:
            names.append(f"{path}/{col}")
    note = f"not converted: {', '.join(left)} (ragged or references)" if left else ""
    return NwbGroup(
        TABLE, path, kind, rows, tuple(names), sum(_nbytes(group[n.rsplit("/", 1)[1]]) for n in names), note
    )


def row_groups(f, count=None) -> tuple[list[NwbGroup], list[str]]:
    """``(groups, empty)``: the row groups of the open NWB file ``f``, TimeSeries first then tables, each in path
    order, and the paths of TimeSeries with no data rows (e.g. an ImageSeries whose frames are in external files).
    ``count``: None, or called with the number of datasets walked so far (it raises to stop the walk)."""
    import h5py

    series, tables, empty, datasets = [], [], [], 0
    stack, seen = [(f, "")], {hash(f.id)}  # a group reached twice by hard links is visited once (no cycle)
    while stack:
        group, prefix = stack.pop()
        for key in sorted(group.keys(), reverse=True):  # reversed onto the stack: visited in name order
            full = f"{prefix}/{key}"
            if full == SPECIFICATIONS or not isinstance(group.get(key, getlink=True), h5py.HardLink):
                continue
            obj = group.get(key)
            if not isinstance(obj, h5py.Group) or hash(obj.id) in seen:
                datasets += isinstance(obj, h5py.Dataset)
                if count is not None and isinstance(obj, h5py.Dataset):
                    count(datasets)
                continue
            seen.add(hash(obj.id))
            kind = _text(obj.attrs.get("neurodata_type"))
            if kind is not None and ("timestamps" in obj or "starting_time" in obj):
                found = _series(full, obj, str(kind))
                (series if found else empty).append(found or full)
            elif kind is not None and "id" in obj and "colnames" in obj.attrs:
                found = _table(full, obj, str(kind))
                if found:
                    tables.append(found)
            stack.append((obj, full))
    series.sort(key=lambda g: g.path)
    tables.sort(key=lambda g: g.path)
    return series + tables, sorted(empty)


def default_choice(groups: list[NwbGroup]) -> tuple[int | None, str]:
    """``(number, why)`` of the group convert takes without ``--row_group`` (1-based), or ``(None, why)``."""
    series = [g for g in groups if g.kind == SERIES]
    pool = series or groups
    if len(pool) == 1:
        return groups.index(pool[0]) + 1, (
            "the only TimeSeries" if series else "the only table with rows (no TimeSeries)"
        )
    if not pool:
        return None, "no TimeSeries with data and no table with rows"
    what = f"{len(series)} TimeSeries" if series else f"{len(pool)} tables with rows and no TimeSeries"
    return None, f"the file holds {what}"


def _metadata_only(f) -> str:
    """The file's root datasets (``/file_create_date``, ``/identifier``, ...), the first five."""
    import h5py

    names = [k for k in sorted(f.keys()) if f.get(k, getclass=True) is h5py.Dataset]
    return ", ".join("/" + n for n in names[:5]) + (", ..." if len(names) > 5 else "")


def choose(f, path: str, options) -> list[str]:
    """The datasets rows mode converts from the open NWB file ``f`` at ``path``: those of row group
    ``options.row_group`` (1-based, :func:`row_groups`' numbering), else of :func:`default_choice`'s group. A file
    with several groups logs one WARNING line naming the others with their flags.

    Raises:
      SourceError: more datasets than ``options.max_datasets`` (``--max_datasets``).
      SchemaError: no TimeSeries with data and no table with rows (the file holds metadata only); ``number``
        beyond the groups; several TimeSeries (or, with none, several tables) and no ``number`` (one line
        listing each with its ``--row_group`` flag).
    """
    groups, empty = row_groups(f, lambda n: check_dataset_count(n, path, options))
    number = options.row_group or None
    if not groups:
        none = f"TimeSeries without data rows: {', '.join(empty[:3])}; " if empty else ""
        raise SchemaError(
            f"The NWB file holds no data: no TimeSeries with data and no table with rows ({none}file metadata only: "
            f"{_metadata_only(f)})",
            file=path,
            hint="the file describes a session but records nothing in it (tfrecord-etl inspect FILE lists it): convert "
            "the file that holds the recordings, or name a metadata dataset with --datasets",
        )
    if number is None:
        number, why = default_choice(groups)
        if number is None:
            pool = [(i, g) for i, g in enumerate(groups, 1) if g.kind == groups[0].kind]
            listing = "; ".join(g.describe(i) for i, g in pool[:MAX_LISTED])
            more = f"; and {len(pool) - MAX_LISTED} more" if len(pool) > MAX_LISTED else ""
            raise SchemaError(
                f"Which NWB data to convert is not clear: {why}: {listing}{more}",
                file=path,
                hint="choose one with --row_group N (tfrecord-etl inspect FILE lists them), or name datasets with "
                "--datasets",
            )
    else:
        why = "--row_group"
    if number > len(groups):
        raise SchemaError(
            f"--row_group {number} asked, but the NWB file holds {len(groups)} row group(s) (TimeSeries and tables)",
            file=path,
            hint="tfrecord-etl inspect FILE lists them",
        )
    chosen = groups[number - 1]
    if len(groups) > 1:
        others = "; ".join(g.describe(i) for i, g in enumerate(groups[: MAX_LISTED + 1], 1) if i != number)
        log.warning(
            "'%s' is an NWB file: converting %s %s (%s, %d rows: %s); file metadata is not converted. Others: %s%s",
            path,
            chosen.kind,
            chosen.path,
            why,
            chosen.rows,
            ", ".join(n.rsplit("/", 1)[1] for n in chosen.datasets),
            others,
            "; ..." if len(groups) > MAX_LISTED + 1 else "",
        )
    return list(chosen.datasets)


def attributes(f, names) -> dict:
    """``{path: {attribute: value}}``: what the NWB conventions say the converted datasets ``names`` mean, for
    ``metadata.json``'s ``sources`` entry: each dataset's ``unit``, ``conversion``, ``offset``, ``resolution``,
    ``continuity`` (the value in ``unit`` is ``data * conversion + offset``), and for each TimeSeries or table
    holding one, its ``neurodata_type`` and, for a regularly sampled series, ``starting_time`` (seconds, from
    the file's ``timestamps_reference_time``) and ``rate`` (Hz). JSON values only; empty for no such attribute."""
    out: dict = {}
    for name in names:
        dset = f.get(name)
        if dset is None:
            continue
        own = {k: _text(dset.attrs[k]) for k in DATA_ATTRS if k in dset.attrs}
        if own:
            out[name] = own
        parent_path = name.rsplit("/", 1)[0] or "/"
        parent = f.get(parent_path)
        if parent is None or parent_path in out or "neurodata_type" not in parent.attrs:
            continue
        info = {"neurodata_type": _text(parent.attrs["neurodata_type"])}
        start = _dataset(parent, "starting_time")
        if start is not None and start.ndim == 0 and "timestamps" not in parent:
            info["starting_time"] = _text(start[()])
            info["rate"] = _text(start.attrs.get("rate"))
        out[parent_path] = info
    return out


def tree_groups(f) -> tuple[list[dict], dict]:
    """Inspect's row groups of the open NWB file ``f`` in ``conventions.tree_groups``' form (``group``, ``rows``,
    ``dimension``, ``datasets``, ``bytes``, ``flag``, ``top``, ``role``: the TimeSeries or table, its type and
    note) and ``{"group": number or None, "why": ...}``: the one convert takes by default, and why."""
    groups, empty = row_groups(f)
    rows = [
        {
            "group": i,
            "rows": g.rows,
            "dimension": None,
            "datasets": list(g.datasets),
            "bytes": g.nbytes,
            "flag": "--datasets " + ",".join(g.datasets),
            "top": None,
            "role": f"{g.kind} {g.path}: {g.neurodata_type}" + (f"; {g.note}" if g.note else ""),
        }
        for i, g in enumerate(groups, 1)
    ]
    number, why = default_choice(groups)
    if not groups and empty:
        why += f" (TimeSeries without data rows: {', '.join(empty[:3])})"
    return rows, {"group": number, "why": why}


def role(path: str, depth_one_dataset: bool) -> str | None:
    """Inspect's note on an NWB dataset that is not data: file metadata (a dataset at the root, or under
    ``/general``), the schema (under ``/specifications``), a regular series' ``starting_time``."""
    if path.startswith(SPECIFICATIONS + "/"):
        return "NWB schema"
    if path.endswith("/starting_time") and not depth_one_dataset:
        return "a regular series' start: in metadata.json with its rate"
    if depth_one_dataset or (path.startswith("/general/") and path.count("/") == 2):
        return "NWB file metadata: never joined to data rows"
    return None


def reference_targets(f, dset, limit: int = 10_000) -> str:
    """What a dataset of HDF5 object (or region) references points at, for inspect: ``/a/b`` for one target, or
    the first three and the count of distinct targets (of the first ``limit`` references read)."""
    import h5py

    region = h5py.check_ref_dtype(dset.dtype) is h5py.RegionReference
    what = "region reference" if region else "object reference"
    try:
        refs = np.asarray(dset[()] if dset.ndim == 0 else dset[: min(dset.shape[0], limit)]).ravel()
        names = sorted({f[r].name if r else "(null)" for r in refs})
    except Exception as e:  # noqa: BLE001 - a damaged reference: said, not fatal for inspect
        return f"{what}s (unreadable: {e})"
    shown = ", ".join(names[:3]) + (f", ... ({len(names)} targets)" if len(names) > 3 else "")
    return f"{what}{'s' if refs.size != 1 else ''} -> {shown}"
