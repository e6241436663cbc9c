"""What the datasets of an HDF5 file are, for the source and for ``tfrecord-etl inspect FILE.h5``: the walk,
each dataset's kind (data, scalar, dimension scale, MATLAB cell, ...), the MATLAB v7.3 orientation and the row
groups (datasets converted together). Metadata only: no data is read, no link is followed.

Container formats built on HDF5 and what this module knows of them:

* netCDF-4 (Unidata, "NetCDF-4 file format"): coordinate variables are dimension scales (``CLASS=DIMENSION_SCALE``);
  a dimension without a variable is a scale whose ``NAME`` starts ``This is a netCDF dimension but not a netCDF
  variable`` (a placeholder, never data). Variables on the same leading dimension form one row group, as xarray
  groups variables by dimension; which group is the default follows the CF conventions (``conventions``).
* AnnData ``.h5ad``: ``/X`` and the ``/obs`` columns share ``n_obs`` rows, ``/var`` columns ``n_vars``: two row groups.
* MATLAB v7.3 ``.mat`` (an HDF5 file behind a 512-byte user block; what such a variable is: :mod:`hdf5matlab`):
  every variable carries a ``MATLAB_class``
  attribute and is stored column-major, so HDF5 sees its dimensions reversed (a MATLAB 1000x20 matrix is an HDF5
  (20, 1000) dataset). Such datasets are read transposed back: MATLAB's first dimension is the row axis. Cell
  arrays are datasets of object references into ``/#refs#``; ``/#refs#`` and ``/#subsystem#`` are MATLAB's own
  storage, never a variable. Empty arrays (``MATLAB_empty``) store their dimensions, not data. Complex arrays are
  compounds of ``real`` and ``imag``: they convert to complex64/complex128. Character arrays (``MATLAB_class``
  ``char``) become strings, one per row (:mod:`mattext`), and a cell of char row vectors inside a cell or a struct
  array one list of strings; logicals uint8: exact. A sparse matrix (a group of compressed columns) is read as its
  dense twin ``full(S)`` (:mod:`matsparse`).
* PyTables and pandas ``HDFStore`` (``format='table'``): a table is a compound dataset (``CLASS`` ``TABLE``); the
  search indexes PyTables keeps beside it (``/df/_i_table/<column>/...``, ``CLASS`` ``INDEXARRAY``,
  ``CACHEARRAY``, ``LASTROWARRAY``, ``EARRAY``) are never data, nor are the category tables pandas writes for its
  categorical columns (``/df/meta/<field>/meta/table``: :mod:`pdcategoricals` maps the column's codes to them).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.sources.hdf5matlab import (
    char_spec,
    char_strings,
    complex_dtype,
    converted,
    is_char,
    is_empty,
    is_matlab,
    list_spec,
    matlab_order,
    string_cells,
    string_list,
)
from tfrecord_etl.transforms.sources.matsparse import SparseView, is_sparse

MATLAB_INTERNAL = ("/#refs#", "/#subsystem#")
NETCDF_DIMENSION_ONLY = b"This is a netCDF dimension but not a netCDF variable"

# kinds of a dataset; rows mode converts DATA and SCALE (coordinate variables: real values on their dimension),
# datasets mode also SCALAR and the cells of CELL; the others are listed and skipped
DATA, SCALAR, SCALE, DIMENSION, CELL, EMPTY, INTERNAL, PYTABLES_INDEX, PANDAS_META = (
    "dataset",
    "scalar",
    "dimension-scale",
    "netcdf-dimension",
    "matlab-cell",
    "matlab-empty",
    "matlab-internal",
    "pytables-index",
    "pandas-categories",
)
PYTABLES_INDEX_CLASSES = (b"INDEXARRAY", b"CACHEARRAY", b"LASTROWARRAY", b"EARRAY")
_PYTABLES_INDEX_PATH = re.compile(r".*/_i_[^/]+/[^/]+/[^/]+")  # /<where>/_i_<table>/<column>/<array>
_PANDAS_META_PATH = re.compile(r".*/meta/[^/]+/meta/table")  # /<key>/meta/<field>/meta/table


def walk(f):
    """Yields ``(path, link, object)`` for every object below the open file ``f``, depth first in name order.

    ``object`` is the h5py Group or Dataset, None for a soft or external link (never followed), or the exception
    raised opening it. The walk keeps its own stack (1,200 nested groups need no recursion) and visits a group
    reached twice by hard links once (a link to an ancestor is no cycle). MATLAB's own groups (``/#refs#``,
    ``/#subsystem#``) are yielded but not entered: their datasets are reached through cell references; nor is a
    MATLAB v7.3 sparse matrix's group (one variable: :mod:`matsparse`).
    """
    import h5py

    seen = {hash(f.id)}  # h5py's identity of an object (ObjectID compares by it); holding the IDs kept groups open
    stack = [(iter(sorted(f.keys())), f, "")]
    while stack:
        keys, group, prefix = stack[-1]
        key = next(keys, None)
        if key is None:
            stack.pop()
            continue
        full = f"{prefix}/{key}"
        link = group.get(key, getlink=True)
        if not isinstance(link, h5py.HardLink):
            yield full, link, None
            continue
        try:
            obj = group[key]
        except Exception as e:  # noqa: BLE001 - the caller decides: refuse (index) or list it (tree)
            yield full, link, e
            continue
        if isinstance(obj, h5py.Group):
            if hash(obj.id) in seen:
                continue
            seen.add(hash(obj.id))
            if full not in MATLAB_INTERNAL and not is_sparse(obj):  # a sparse matrix is one variable (matsparse)
                stack.append((iter(sorted(obj.keys())), obj, full))
        yield full, link, obj


def is_keras(f) -> bool:
    """True for a Keras weights / model file (``keras_version`` or ``layer_names`` at the root or in
    ``/model_weights``, as ``save_weights`` and the legacy ``.h5`` model format write)."""
    for group in (f, f.get("model_weights")):
        if group is not None and ("keras_version" in group.attrs or "layer_names" in group.attrs):
            return True
    return False


def kind_of(dset, path: str) -> str:
    """The kind of dataset ``dset`` at ``path`` (one of DATA, SCALAR, SCALE, DIMENSION, CELL, EMPTY, INTERNAL,
    PYTABLES_INDEX, PANDAS_META)."""
    import h5py

    if path.startswith(tuple(p + "/" for p in MATLAB_INTERNAL)):
        return INTERNAL
    attrs = dset.attrs
    cls = attrs.get("CLASS")
    if cls == b"DIMENSION_SCALE":
        name = attrs.get("NAME", b"")
        return DIMENSION if isinstance(name, bytes) and name.startswith(NETCDF_DIMENSION_ONLY) else SCALE
    if cls in PYTABLES_INDEX_CLASSES and _PYTABLES_INDEX_PATH.fullmatch(path):
        return PYTABLES_INDEX
    if cls == b"TABLE" and _PANDAS_META_PATH.fullmatch(path) and "values_kind" in attrs:
        return PANDAS_META
    if is_empty(dset, path) or (isinstance(dset, SparseView) and dset.size == 0):
        return EMPTY
    try:
        if h5py.check_ref_dtype(dset.dtype) is not None:
            return CELL
    except (TypeError, ValueError):
        pass  # no NumPy dtype: the caller refuses it with its own message
    return SCALAR if dset.ndim == 0 else DATA


def dtype_of(dset):
    """The NumPy dtype of a dataset's elements as converted: a MATLAB complex array (compound ``real``/``imag``) is
    complex, a MATLAB char array strings (``'<U{n}'``, :mod:`mattext`); any other dataset keeps its dtype, a
    subarray dtype (``('<f8', (3,))``, an HDF5 array type) included, which h5py reads as extra trailing axes (see
    :func:`array_spec`)."""
    if is_char(dset):
        return char_spec(dset)[0]
    as_complex = complex_dtype(dset)
    return dset.dtype if as_complex is None else as_complex


def array_spec(dset):
    """``(dtype, shape)`` of the whole dataset as :func:`read_whole` returns it: MATLAB variables in MATLAB's
    orientation, a subarray dtype's dimensions appended after the dataset's (its base dtype, as h5py reads it)."""
    if is_char(dset):
        return char_spec(dset)
    cells = string_cells(dset)
    if cells is not None:
        return list_spec(cells)
    dtype = dtype_of(dset)
    shape = tuple(int(d) for d in dset.shape)
    if is_matlab(dset) and len(shape) > 1:
        shape = shape[::-1]
    if dtype.subdtype is not None:
        dtype, sub = dtype.subdtype
        shape += tuple(sub)
    return dtype, shape


def rows_and_shape(dset) -> tuple[int, tuple[int, ...]]:
    """``(rows, row shape)`` of a dataset of kind DATA as converted: MATLAB variables transposed (rows = MATLAB's
    first dimension, HDF5's last). The row shape holds the dataset's axes only: a subarray dtype's dimensions
    follow them (:func:`~tfrecord_etl.transforms.sources.base.leaf_specs` appends them)."""
    if is_char(dset):
        _, shape = char_spec(dset)
        return shape[0], shape[1:]
    shape = tuple(int(d) for d in dset.shape)
    if is_matlab(dset) and len(shape) > 1:
        shape = shape[::-1]
    return shape[0], shape[1:]


def chunk_rows(dset) -> int:
    """Rows per HDF5 chunk along the row axis (1 for unchunked datasets)."""
    if not dset.chunks:
        return 1
    return int(dset.chunks[-1] if is_matlab(dset) and dset.ndim > 1 else dset.chunks[0])


def read_rows(dset, start: int, stop: int):
    """Rows ``[start, stop)`` of a DATA dataset as a C-contiguous NumPy array of shape ``(stop - start, *row
    shape, *subarray shape)``; MATLAB variables are sliced on HDF5's last axis and transposed back."""
    if is_char(dset):
        return char_strings(dset, matlab_order(dset, dset[..., start:stop]))
    if is_matlab(dset) and dset.ndim > 1:
        return converted(dset, matlab_order(dset, dset[..., start:stop]))
    return converted(dset, dset[start:stop])


def read_whole(dset):
    """The whole dataset as a NumPy array of :func:`array_spec`'s shape (MATLAB variables in MATLAB's
    orientation)."""
    if is_char(dset):
        return char_strings(dset, matlab_order(dset, np.asarray(dset[()])))
    cells = string_cells(dset)
    if cells is not None:
        return string_list(dset, cells)
    return converted(dset, matlab_order(dset, np.asarray(dset[()])))


def leading_dimension(dset) -> str | None:
    """The name of the dimension scale attached to the row axis (netCDF-4 / xarray), or None."""
    if is_matlab(dset) or dset.ndim == 0:
        return None
    if dset.attrs.get("CLASS") == b"DIMENSION_SCALE":
        return dset.name  # a coordinate variable is its own dimension
    try:
        scales = list(dset.dims[0].values())
    except Exception:  # noqa: BLE001 - a damaged DIMENSION_LIST: no dimension known
        return None
    return scales[0].name if scales else None


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """Datasets converted together: same rows and, where dimension scales say so, the same leading dimension.

    ``nbytes``: the bytes of all its datasets (the default group is the largest).
    """

    rows: int
    dimension: str | None
    datasets: tuple[str, ...]
    nbytes: int
    context: str | None = None  # the top-level group of its datasets, where rule 4 of ``conventions`` applies
    rank: int = 1  # ``conventions``' rank: 0 record dimension, 1 data variables, 2 coordinates/bounds/metadata

    def describe(self, number: int) -> str:
        dim = f" on dimension '{self.dimension}'" if self.dimension else ""
        names = ", ".join(self.datasets[:3]) + (f" and {len(self.datasets) - 3} more" if len(self.datasets) > 3 else "")
        return f"group {number}: {self.rows} rows{dim}, {len(self.datasets)} dataset(s) ({names})"


def group_rows(entries, context=None, join_unnamed: bool = True) -> list[RowGroup]:
    """Row groups of ``entries`` = ``[(path, rows, dimension or None, nbytes)]``, largest first (by bytes, then by
    datasets, then rows), datasets in walk order. Datasets of the same length on different named dimensions (a
    square lat/lon grid) are separate groups; an unnamed one joins the named group of its length only when that
    is the only one and ``join_unnamed`` (a file that attaches dimension scales passes False: equal length alone
    is no shared axis there). ``context``: None, or a function of a path (its top-level group): datasets without
    a dimension then group by equal length only within one context; a group on a dimension scale spanning
    several contexts has context None."""
    by_key: dict = {}
    for path, rows, dim, nbytes in entries:
        where = context(path) if context is not None and dim is None else None
        by_key.setdefault((rows, dim, where), []).append((path, nbytes))
    named = {}
    for rows, dim, _ in by_key:
        if dim is not None:
            named.setdefault(rows, []).append(dim)
    for rows, dim, where in list(by_key):
        if dim is None and join_unnamed and len(named.get(rows, ())) == 1:
            by_key.setdefault((rows, named[rows][0], None), []).extend(by_key.pop((rows, None, where)))
    order = {path: i for i, (path, *_) in enumerate(entries)}
    groups = []
    for (rows, dim, where), items in by_key.items():
        paths = tuple(sorted((p for p, _ in items), key=order.get))
        if context is not None and where is None:
            tops = {context(p) for p in paths}
            where = tops.pop() if len(tops) == 1 else None
        groups.append(RowGroup(rows, dim, paths, sum(n for _, n in items), where))
    return sorted(groups, key=lambda g: (-g.nbytes, -len(g.datasets), -g.rows, g.datasets))


def data_bytes(dset) -> int:
    """Bytes of the dataset's stored values; a cell of strings counts its list's (2 per code unit, as the v4-v7
    reader counts it)."""
    try:
        cells = string_cells(dset)
        if cells is not None:
            dtype, shape = list_spec(cells)
            return shape[0] * (dtype.itemsize // 4) * 2
        return int(math.prod(dset.shape)) * dset.dtype.itemsize
    except (TypeError, ValueError):
        return 0


def check_vlen(dtype, where: str) -> None:
    """``codec.leaf_specs``' check of a variable-length HDF5 dtype: variable-length strings pass.

    Raises:
      SchemaError: variable-length numeric data (``where``: the file and dataset).
    """
    import h5py  # (the HDF5 source's own dependency, imported where it reads)

    if h5py.check_string_dtype(dtype) is None:
        raise SchemaError(
            "Unsupported dtype: variable-length numeric data", file=where, hint="store it as a fixed-shape dataset"
        )
