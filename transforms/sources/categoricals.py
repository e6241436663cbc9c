"""Categorical columns: integer codes stored beside the names they stand for, found by the conventions that say so,
and written as the names (``--categoricals strings``, the default) or as the codes (``--categoricals codes``), with
the mapping in ``metadata.json`` (the feature's ``categories``) and ``schema.pbtxt`` either way.

The conventions:

- AnnData >= 0.8 (``/obs/louvain`` a group with ``encoding-type`` ``categorical``, its ``codes`` and
  ``categories`` datasets and its ``ordered`` attribute): the names are written under the group's name,
  ``obs/louvain`` (the codes, with ``--categoricals codes``, under their dataset's, ``obs/louvain/codes``);
- AnnData 0.7 (``/obs/louvain`` a dataset of codes whose ``categories`` attribute references the names, in
  ``/obs/__categories/louvain``);
- AnnData 0.6 (``/obs`` and ``/var`` compound datasets, an integer field ``louvain`` whose names are in
  ``/uns/louvain_categories``): scanpy's ``10x_pbmc68k_reduced.h5ad``;
- pandas ``HDFStore`` tables (``format='table'``, PyTables; :mod:`pdcategoricals`): a field ``F`` of ``/df/table``
  whose ``F_meta`` attribute is ``category``, its names in the table ``/df/meta/F/meta/table``: the names are
  written under the column's name, ``df/table/label`` (one per row), the codes under the field's,
  ``df/table/values_block_0`` (``df/table/label`` for a ``data_columns`` column);
- CF conventions 3.5 (netCDF-4 and netCDF-3): an integer variable with ``flag_values`` and ``flag_meanings``
  (space-separated, one per value) and no ``flag_masks``; a variable with ``flag_masks`` holds bit fields, several
  meanings at once, and keeps its values.

A missing value (AnnData's and pandas' code -1, a CF variable's ``_FillValue``) is written as the empty string; a
column with an empty name among its categories is refused in strings mode (the two could not be told apart). Any
other code that names no category is refused with the row it is in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from tfrecord_etl.transforms.codec import Categories, FeatureSpec
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import pdcategoricals
from tfrecord_etl.transforms.sources.base import log

STRINGS, CODES = "strings", "codes"
MODES = (STRINGS, CODES)
FLAG = "--categoricals"


@dataclasses.dataclass(frozen=True)
class Column:
    """A categorical column of a file: ``column``, the name its codes are read under (``flatten_fields``'s name:
    ``obs/louvain``, ``obs/louvain/codes``); ``feature``, the name it is written under; its ``categories``;
    ``squeeze``: its codes are a width-1 axis of one column (a pandas block) and one name per row is written."""

    column: str
    feature: str
    categories: Categories
    squeeze: bool = False


def _text(value) -> str:
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode("utf-8")
    return str(value)


MAX_CATEGORIES = 1_000_000  # names read for one column (about 30 MB of cell ids); a column of more keeps its codes


def _names(dset, column: str, field: str | None = None) -> tuple[str, ...] | None:
    """The category names the dataset ``dset`` (or its compound field ``field``) holds (1-d: strings, UTF-8;
    numbers as their decimal text), or None (logged: the column is written as its codes) when it holds something
    else or more than :data:`MAX_CATEGORIES`."""
    import h5py

    dtype = getattr(dset, "dtype", None)
    if field is not None and dtype is not None and dtype.names is not None and field in dtype.names:
        dtype = dtype.fields[field][0]
    if not isinstance(dset, h5py.Dataset) or dset.ndim != 1 or dtype.fields is not None or dtype.subdtype:
        what = "not a dataset" if not isinstance(dset, h5py.Dataset) else f"a {dset.ndim}-d {dtype} dataset"
        log.warning("The categories of the categorical column '%s' are %s: its codes are written", column, what)
        return None
    if dset.shape[0] > MAX_CATEGORIES:
        log.warning(
            "'%s' holds %d category names, more than %d: its column is written as its codes",
            dset.name,
            dset.shape[0],
            MAX_CATEGORIES,
        )
        return None
    try:
        return tuple(_text(v) for v in (dset[()] if field is None else dset.fields(field)[()]))
    except (UnicodeDecodeError, TypeError, ValueError) as e:
        log.warning("'%s' holds no category names (%s): its column '%s' is written as its codes", dset.name, e, column)
        return None


def _is_int(dtype) -> bool:
    return dtype.fields is None and dtype.kind in "iu"


def cf_flags(attrs: Mapping, dtype, origin: str) -> Categories | None:
    """The :class:`Categories` of a CF flag variable (``flag_values`` + ``flag_meanings``, no ``flag_masks``) of an
    integer ``dtype``, else None; a variable whose values and meanings differ in number keeps its values (logged)."""
    if "flag_values" not in attrs or "flag_meanings" not in attrs or "flag_masks" in attrs or not _is_int(dtype):
        return None
    values = np.atleast_1d(np.asarray(attrs["flag_values"])).ravel()
    meanings = _text(np.asarray(attrs["flag_meanings"]).ravel()[0]).split()
    if len(meanings) != len(values) or values.dtype.kind not in "iu":
        log.warning(
            "%s: %d flag_values but %d flag_meanings: its values are written as stored",
            origin,
            len(values),
            len(meanings),
        )
        return None
    fill = attrs.get("_FillValue")
    missing = int(np.asarray(fill).ravel()[0]) if fill is not None else None
    return Categories(tuple(meanings), tuple(int(v) for v in values), False, STRINGS, missing, "flag_meanings")


def _anndata_root(f) -> bool:
    return all(k in f for k in ("X", "obs", "var")) or _attr(f.attrs, "encoding-type") == "anndata"


def _attr(attrs, key: str):
    value = attrs.get(key)
    return _text(value) if isinstance(value, bytes | str | np.bytes_) else value


def hdf5_columns(f, names: Sequence[str]) -> list[Column]:
    """The categorical columns among the datasets ``names`` (rows mode) of the open HDF5 file ``f``, in order."""
    import h5py

    out = []
    for name in names:
        try:
            dset = f[name]
        except (KeyError, ValueError):
            continue
        if not isinstance(dset, h5py.Dataset):
            continue
        base = name.strip("/")
        if dset.dtype.fields is not None and pdcategoricals.is_table(dset):  # pandas HDFStore (format='table')
            found = pdcategoricals.table_columns(f, dset, base, lambda d, c: _names(d, c, "values"))
            out += [Column(column, feature, cats, squeeze) for column, feature, cats, squeeze in found]
            continue
        if dset.dtype.fields is not None:  # AnnData 0.6: /obs, /var compounds, names in /uns/<field>_categories
            if base in ("obs", "var") and _anndata_root(f):
                for field in dset.dtype.names:
                    key = f"/uns/{field}_categories"
                    if _is_int(dset.dtype.fields[field][0]) and key in f:
                        values = _names(f[key], f"{name}/{field}")
                        if values is not None:
                            out.append(Column(f"{base}/{field}", f"{base}/{field}", Categories(values, origin=key)))
            continue
        if not _is_int(dset.dtype):
            continue
        parent = dset.parent
        if name.rstrip("/").endswith("/codes") and _attr(parent.attrs, "encoding-type") == "categorical":
            cats = parent.get("categories")
            values = _names(cats, name)
            if values is not None:  # AnnData >= 0.8
                ordered = bool(parent.attrs.get("ordered", False))
                feature = parent.name.strip("/")
                out.append(Column(base, feature, Categories(values, ordered=ordered, origin=cats.name)))
            continue
        ref = dset.attrs.get("categories")
        if isinstance(ref, h5py.Reference) and ref:  # AnnData 0.7: a reference to /obs/__categories/<name>
            try:
                cats = f[ref]
            except (KeyError, ValueError, RuntimeError) as e:  # a dangling reference
                cats = f"a reference that leads nowhere: {e}"
            values = _names(cats, name)
            if values is not None:
                ordered = bool(cats.attrs.get("ordered", False))
                out.append(Column(base, base, Categories(values, ordered=ordered, origin=cats.name)))
            continue
        flags = cf_flags(dset.attrs, dset.dtype, f"'{name}'")
        if flags is not None:
            out.append(Column(base, base, dataclasses.replace(flags, origin=f"{name} flag_meanings")))
    return out


def netcdf3_columns(f, names: Sequence[str]) -> list[Column]:
    """The CF flag variables among the variables ``names`` of an open ``scipy.io.netcdf_file``."""
    out = []
    for name in names:
        var = f.variables.get(name.lstrip("/"))
        if var is None:
            continue
        flags = cf_flags(var._attributes, var.data.dtype, f"'{name}'")
        if flags is not None:
            out.append(
                Column(name.strip("/"), name.strip("/"), dataclasses.replace(flags, origin=f"{name} flag_meanings"))
            )
    return out


def cached(source, path: str, items: Sequence[str], find) -> list[Column]:
    """The categorical columns of the datasets ``items`` of ``path`` (``find()`` once per worker thread and file:
    kept on the source's thread-local state beside the file it keeps open)."""
    cache = source._local.__dict__.setdefault("categoricals", {})
    key = (path, tuple(items))
    if key not in cache:
        if len(cache) > 64:
            cache.clear()
        cache[key] = find()
    return cache[key]


def read_hdf5(source, rr, columns: dict) -> dict:
    """:func:`apply_columns` for the HDF5 source's columns of the row range ``rr`` (its file open in ``source``)."""
    found = cached(source, rr.path, rr.items, lambda: hdf5_columns(source.opened(rr.path)[0], rr.items))
    return apply_columns(columns, found, source.options.categoricals, rr.path, rr.start)


def _width(categories: Categories) -> int:
    return max([1] + [len(v.encode()) for v in categories.values])


def apply_specs(specs: Sequence[FeatureSpec], columns: Sequence[Column], mode: str, where: str) -> list[FeatureSpec]:
    """``specs`` with each categorical column's spec: ``categories`` set; in strings mode renamed to its feature and
    of dtype ``|S<longest name in UTF-8 bytes>`` (one name per value of the codes; a ``squeeze`` column without its
    width-1 axis).

    Raises:
      SchemaError: strings mode and a column whose names cannot be told from a missing value (an empty name) or
        whose names end in a NUL byte (fixed-width bytes drop it).
    """
    found = {c.column: c for c in columns}
    out = []
    for spec in specs:
        c = found.get(spec.name)
        if c is None:
            out.append(spec)
            continue
        cats = dataclasses.replace(c.categories, written=mode)
        if mode == CODES:  # the codes as stored, under their dataset's name (as earlier versions wrote them)
            out.append(dataclasses.replace(spec, categories=cats))
            continue
        bad = next((v for v in cats.values if v == "" or v.endswith("\x00")), None)
        if bad is not None:
            what = (
                "an empty name, which a missing value would be written as too" if bad == "" else "a name ending in NUL"
            )
            raise SchemaError(
                f"Categorical column '{c.column}' ({cats.origin}) has {what}",
                file=where,
                hint=f"pass {FLAG} codes to write its codes (the names stay in metadata.json)",
            )
        shape = spec.shape[1:] if c.squeeze and spec.shape and spec.shape[0] == 1 else spec.shape
        out.append(dataclasses.replace(spec, name=c.feature, dtype=f"|S{_width(cats)}", shape=shape, categories=cats))
    return out


def to_strings(codes: np.ndarray, categories: Categories, path: str, column: str, first_row: int = 0) -> np.ndarray:
    """The names of ``codes`` (an integer array of rows), as ``|S<n>`` UTF-8 bytes of the same shape; a missing value
    (``categories.missing``) is ``b""``.

    Raises:
      SourceError: a code that names no category and is not the missing value (its row, ``first_row`` + index).
    """
    values = [v.encode() for v in categories.values]
    table = np.array(values + [b""], dtype=f"S{_width(categories)}")
    known = np.array(categories.code_list(), dtype=np.int64)
    order = np.argsort(known, kind="stable")
    ordered = known[order]
    flat = np.asarray(codes).astype(np.int64).ravel()
    pos = np.clip(np.searchsorted(ordered, flat), 0, max(0, len(ordered) - 1))
    found = ordered[pos] == flat if len(ordered) else np.zeros(flat.shape, bool)
    index = np.where(found, order[pos] if len(order) else 0, len(values))
    bad = ~found & (flat != categories.missing) if categories.missing is not None else ~found
    if bad.any():
        at = int(np.argmax(bad))
        per_row = max(1, flat.size // max(1, len(codes)))
        raise SourceError(
            f"Categorical column: code {flat[at]} at row {first_row + at // per_row} names none of its "
            f"{len(values)} categories ({categories.origin})"
            + (f" and is not the missing value {categories.missing}" if categories.missing is not None else ""),
            file=path,
            dataset=column,
            hint=f"pass {FLAG} codes to write the codes as stored",
        )
    return table[index].reshape(np.shape(codes))


def apply_columns(columns: dict, found: Sequence[Column], mode: str, path: str, first_row: int) -> dict:
    """The columns a source read (``{name: array}``) with, in strings mode, each categorical column renamed to its
    feature and its codes replaced by their names (:func:`to_strings`; a ``squeeze`` column without its width-1
    axis); in codes mode as read."""
    if not found or mode == CODES:
        return columns
    by_column = {c.column: c for c in found}
    out = {}
    for name, array in columns.items():
        c = by_column.get(name)
        if c is None:
            out[name] = array
        else:
            codes = np.asarray(array)
            if c.squeeze and codes.ndim > 1 and codes.shape[1] == 1:
                codes = codes[:, 0]
            out[c.feature] = to_strings(codes, c.categories, path, name, first_row)
    return out
