"""MATLAB values as convert sees them: a variable's header (:class:`MatVariable`), the leaves of a loaded value
(:class:`Leaf`: arrays, cells, structs' fields, what is skipped), and a loaded array as its v7.3 (HDF5) twin stores
it (dtype, MATLAB's shape, char arrays as strings), so both files convert to the same records.

Reference: MathWorks, "MAT-File Format" (the array classes); ``scipy.io.loadmat`` (the loaded types).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.sources import hdf5layout as layout, mattext
from tfrecord_etl.transforms.sources.container import MODE_FLAG
from tfrecord_etl.transforms.sources.matsparse import dense, sparse_class
from tfrecord_etl.transforms.sources.mattext import as_codes, matlab_shape, string_cells

# the dtype each MATLAB class is stored as: the v7.3 file's HDF5 dtype (char: UTF-16 code units, converted to strings
# by mattext; logical: uint8)
CLASS_DTYPES = {
    "double": "<f8",
    "single": "<f4",
    "int8": "|i1",
    "uint8": "|u1",
    "int16": "<i2",
    "uint16": "<u2",
    "int32": "<i4",
    "uint32": "<u4",
    "int64": "<i8",
    "uint64": "<u8",
    "char": "<u2",
    "logical": "|u1",
}


STRUCT, SPARSE, OTHER = "matlab-struct", "matlab-sparse", "unsupported MATLAB class"


FUNCTION_WORKSPACE = "__function_workspace__"  # MATLAB's own storage behind function handles, never a variable


@dataclasses.dataclass(frozen=True)
class MatVariable:
    """One variable's header: name, MATLAB dimensions, class (whosmat's names: ``double``, ``char``, ``logical``,
    ``cell``, ``struct``, ``sparse``, ``function``, ``object``...), complex flag, and its byte span in the file."""

    name: str
    shape: tuple[int, ...]
    mclass: str
    is_complex: bool
    start: int
    stop: int
    compressed: bool = False
    byte_order: str = "<"  # the file's ("<" or ">"): how the v5 elements of a nesting walk are read
    logical: bool = False  # a sparse variable's values are logical (MATLAB's sparse is double or logical)

    @property
    def dtype(self) -> np.dtype | None:
        """The converted dtype of a numeric, char or logical variable, and of a sparse matrix (converted dense:
        :func:`matsparse.sparse_class`); None for other classes."""
        mclass = sparse_class(self.logical) if self.mclass == "sparse" else self.mclass
        if mclass not in CLASS_DTYPES:
            return None
        return complex_dtype(np.dtype(CLASS_DTYPES[mclass])) if self.is_complex else np.dtype(CLASS_DTYPES[mclass])


@dataclasses.dataclass
class Leaf:
    """What convert sees at one path: ``kind`` (``hdf5layout.DATA``, ``CELL``, ``EMPTY``, :data:`SPARSE`,
    :data:`OTHER`...), the converted ``dtype`` and MATLAB ``shape`` of DATA, and the cell elements of a CELL."""

    path: str
    kind: str
    dtype: np.dtype | None = None
    shape: tuple[int, ...] = ()
    cells: list | None = None
    what: str = ""  # the MATLAB class of an unsupported leaf

    @property
    def nbytes(self) -> int:
        return mattext.stored_nbytes(self.dtype, self.shape) if self.dtype is not None else 0


def complex_dtype(base: np.dtype) -> np.dtype:
    """complex64/complex128 for single/double, a ``real``/``imag`` compound for integer classes (as in v7.3)."""
    if base.kind == "f":
        return np.dtype(f"<c{2 * base.itemsize}")
    return np.dtype([("real", base), ("imag", base)])


def converted_spec(value) -> tuple[np.dtype, tuple[int, ...]]:
    """``(dtype, MATLAB shape)`` a loaded array converts to (:func:`as_stored`'s): char arrays strings, a cell of
    char row vectors one list of strings (:mod:`mattext`)."""
    cells = string_cells(value)
    if cells is not None:
        return mattext.list_spec(matlab_shape(c.shape)[-1] if c.size else 0 for c in cells)
    shape = matlab_shape(np.shape(value))
    if value.dtype.kind == "U":
        return mattext.char_spec(shape)
    return _target_dtype(value.dtype), shape


def _target_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a loaded array is stored as: char -> uint16 (its code units; :func:`converted_spec` gives the
    strings'), logical -> uint8, little-endian."""
    if dtype.kind == "U":
        return np.dtype("<u2")
    if dtype.kind == "b":
        return np.dtype("|u1")
    if dtype.names:
        return np.dtype([(n, dtype[n].newbyteorder("<")) for n in dtype.names])
    return dtype.newbyteorder("<")


def as_stored(value, where: str) -> np.ndarray:
    """A loaded array as the v7.3 path reads it: a C-contiguous little-endian array of :func:`_target_dtype`, in
    MATLAB's shape (char arrays as strings, :mod:`mattext`).

    Raises:
      SchemaError: a character beyond U+FFFF (MATLAB's char is one UTF-16 code unit; only a foreign writer
        stores more).
    """
    cells = string_cells(value)
    if cells is not None:
        return mattext.strings_list([as_codes(c, where) for c in cells], where)
    a = dense(value) if kind_of(value) == SPARSE else np.asarray(value)
    a = a.reshape(matlab_shape(a.shape))
    if a.dtype.kind == "U":
        return mattext.char_strings(as_codes(a, where), where)
    return np.ascontiguousarray(a, dtype=_target_dtype(a.dtype))


def kind_of(value) -> str:
    """The kind of a loaded element (a struct field or a cell's content)."""
    import scipy.sparse

    if scipy.sparse.issparse(value):
        return SPARSE
    if type(value) is not np.ndarray:  # MatlabFunction, MatlabObject, MatlabOpaque (ndarray subclasses), others
        return OTHER
    if value.dtype.names and all(value.dtype[n].kind == "O" for n in value.dtype.names):
        return STRUCT if value.size else layout.EMPTY
    if value.dtype == object:
        return layout.CELL if value.size else layout.EMPTY
    return layout.DATA if value.size else layout.EMPTY


def value_leaves(path: str, value) -> list[Leaf]:
    """The leaves of a loaded value at ``path`` in walk order (fields sorted by name, as h5py lists a v7.3 group)."""
    kind = kind_of(value)
    if kind == layout.DATA:
        return [Leaf(path, kind, *converted_spec(value))]
    if kind == layout.CELL:
        return [Leaf(path, kind, cells=list(value.ravel(order="F")))]
    if kind != STRUCT:
        return [Leaf(path, kind, what=type(value).__name__)]
    names = sorted(value.dtype.names)
    if value.size == 1:
        return [leaf for n in names for leaf in value_leaves(f"{path}/{n}", value.flat[0][n])]
    flat = value.ravel(order="F")  # a struct array: each field holds one array per element, as a cell array
    return [Leaf(f"{path}/{n}", layout.CELL, cells=[element[n] for element in flat]) for n in names]


def value_at(tops: dict, item: str):
    """The loaded value of ``item`` (``/v``, ``/s/field``, ``/c{k}``, ``/s/field{k}``) among loaded variables."""
    base, k = item, None
    if item.endswith("}") and "{" in item:
        base, k = item[:-1].rsplit("{", 1)
    parts = base.strip("/").split("/")
    value = tops[parts[0]]
    for part in parts[1:]:
        if value.size != 1:  # a struct array's field: element k's (only as the last part, with {k})
            return value.ravel(order="F")[int(k) - 1][part]
        value = value.flat[0][part]
    if k is not None:
        value = value.ravel(order="F")[int(k) - 1]
    return value


def cell_items(leaf: Leaf, skipped: list | None, path: str) -> list[tuple[str, object]]:
    """``[(item, value)]`` of the cells of a CELL leaf holding arrays (``name{k}``, MATLAB's 1-based linear index);
    empty cells are left out; a cell holding a struct, a cell or another class is appended to ``skipped``, or
    refused when it is None.

    Raises:
      SchemaError: such a cell and ``skipped`` is None (naming the cell).
    """
    out = []
    for k, value in enumerate(leaf.cells, 1):
        item, kind = f"{leaf.path}{{{k}}}", kind_of(value)
        if kind == layout.EMPTY:
            continue
        if kind == layout.CELL and string_cells(value) is not None:
            kind = layout.DATA  # a cell of strings: one list of strings
        if kind != layout.DATA:
            if skipped is not None:
                skipped.append(item)
                continue
            what = {STRUCT: "a struct", layout.CELL: "a nested cell array", SPARSE: "a sparse matrix"}.get(
                kind, f"a {type(value).__name__}"
            )
            raise SchemaError(
                f"Cell {item} holds {what}: only cells of arrays are converted",
                file=path,
                dataset=item,
                hint="store the cell's arrays as separate variables, or choose other variables with --datasets",
            )
        out.append((item, value))
    return out


def refuse(leaf: Leaf, path: str, mode: str) -> None:
    """Refuses a leaf named in ``--datasets`` that ``mode`` cannot convert (SchemaError naming it and why)."""
    if leaf.kind == SPARSE:
        raise SchemaError(
            "A MATLAB sparse matrix is not converted (its stored form is not an array of rows)",
            file=path,
            dataset=leaf.path,
            hint="save it full (full(S)) or as its [i, j, v] = find(S) "
            "triplets, or choose other variables with --datasets",
        )
    if leaf.kind == OTHER:
        raise SchemaError(
            f"A MATLAB {leaf.what} (function handle, object or opaque class) holds no array",
            file=path,
            dataset=leaf.path,
            hint="choose other variables with --datasets",
        )
    if leaf.kind == layout.EMPTY:
        raise SchemaError(
            "The variable is an empty array (no elements)",
            file=path,
            dataset=leaf.path,
            hint="choose other variables with --datasets",
        )
    if leaf.kind == layout.CELL and mode == "rows":
        raise SchemaError(
            "The variable is a MATLAB cell array (or a struct array's field), not rows of values",
            file=path,
            dataset=leaf.path,
            hint=f"use {MODE_FLAG} datasets: each cell becomes one Example",
        )


def with_complex(typed, kept):
    """``typed`` (loaded with ``mat_dtype``) with each complex array of ``kept`` (loaded without it) put back in
    the class dtype ``typed`` shows for it (structs and cells walked in parallel)."""
    if type(kept) is np.ndarray and kept.dtype.kind == "c":
        dtype = complex_dtype(np.dtype(typed.dtype))
        if dtype.kind == "c":
            return kept.astype(dtype)
        out = np.empty(kept.shape, dtype)
        out["real"], out["imag"] = kept.real, kept.imag
        return out
    if type(typed) is not np.ndarray or type(kept) is not np.ndarray or typed.shape != kept.shape:
        return typed
    if typed.dtype.names and kept.dtype.names:
        out = typed.copy()
        for idx in np.ndindex(typed.shape):
            for n in typed.dtype.names:
                out[idx][n] = with_complex(typed[idx][n], kept[idx][n])
        return out
    if typed.dtype == object and kept.dtype == object:
        out = np.empty(typed.shape, object)
        for idx in np.ndindex(typed.shape):
            out[idx] = with_complex(typed[idx], kept[idx])
        return out
    return typed
