"""MATLAB v4, v6 and v7 ``.mat`` files (MATLAB's ``save`` before ``-v7.3``; ``scipy.io.savemat``'s) through SciPy.

v7.3 files are HDF5 and go through :class:`Hdf5Source`; a ``.mat`` input is routed by its first bytes
(:func:`transforms.sources.format_of`). Planning scans the variable headers as ``scipy.io.whosmat`` does (name,
dimensions, class, and the complex flag whosmat leaves out), without loading a numeric variable; reading is
``scipy.io.loadmat``. What a file converts to is what its v7.3 twin converts to through ``hdf5layout`` (same
features, dtypes, rows, row groups and items, so the records are byte-identical):

* rows are MATLAB's first dimension (row i is ``A(i,:)``); ``array`` in datasets mode has MATLAB's shape;
* numeric arrays keep their MATLAB class's dtype (MATLAB may store a double array of small integers as uint8 bytes:
  ``loadmat(mat_dtype=True)``), complex ones complex64/complex128 (complex integers a ``real``/``imag`` compound, as
  the v7.3 compound); ``char`` arrays strings, one per row, and a cell of char row vectors held by a cell or a struct
  array one list of strings (:mod:`mattext`); ``logical`` uint8;
* a 1x1 struct's fields are variables ``/s/field`` (nested: ``/s/t/field``); a struct array's field and a cell array
  hold one array per element: ``--container_mode datasets`` converts each as ``/s/field{k}`` / ``/c{k}`` (MATLAB's
  linear index, column-major); cells holding structs or cells are named and skipped, empty cells left out;
* empty arrays are skipped; sparse matrices, function handles and objects are named and skipped, and refused
  (SchemaError) when named in ``--datasets``: save a sparse matrix full (``full(S)``) or as its ``find`` triplets.

Memory: ``loadmat`` reads a variable whole (a compressed v7 variable cannot be read from the middle), so a worker
holds the variables it converts, about twice their bytes at peak (SciPy's array and the C-order copy written
from); one worker reads all row ranges of a file, in order (``FileIndex.sequential``), loading it once. Structs
(rows mode) and cells (datasets mode) are loaded at planning too: their fields and cells are not in the header.
Before anything is loaded, each variable's size is checked against ``SourceOptions.max_variable_bytes``
(``--max_mat_variable_mb``): the bytes its header declares (dimensions x class), or for a cell, struct or other
container its stored bytes (a compressed one inflated and counted, nothing kept).

References: MathWorks, "MAT-File Format" (Level 4 and Level 5 MAT-files); ``scipy.io.loadmat``, ``scipy.io.whosmat``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
import zlib

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import hdf5layout as layout, matnesting, mattext
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    Columns,
    FileIndex,
    RowRange,
    _check_empty_rows,
    _check_names,
    _leaf_specs,
    _refuse_special_file,
    _row_bytes,
    _row_spec,
    log,
)
from tfrecord_etl.transforms.sources.container import (
    MODE_FLAG,
    ContainerSource,
    check_leading_lengths,
    choose_group,
    datasets_index,
)
from tfrecord_etl.transforms.sources.mattext import as_codes, matlab_shape, string_cells
from tfrecord_etl.transforms.storage import fileio

MATLAB5_MAGIC = b"MATLAB 5.0 MAT-file"  # the header text of v6 and v7 files (v7.3 says "MATLAB 7.3": HDF5)
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

    @property
    def dtype(self) -> np.dtype | None:
        """The converted dtype of a numeric, char or logical variable (None for other classes)."""
        if self.mclass not in CLASS_DTYPES:
            return None
        return (
            _complex_dtype(np.dtype(CLASS_DTYPES[self.mclass]))
            if self.is_complex
            else np.dtype(CLASS_DTYPES[self.mclass])
        )


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


def _complex_dtype(base: np.dtype) -> np.dtype:
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
    a = np.asarray(value)
    a = a.reshape(matlab_shape(a.shape))
    if a.dtype.kind == "U":
        return mattext.char_strings(as_codes(a, where), where)
    return np.ascontiguousarray(a, dtype=_target_dtype(a.dtype))


def _kind_of(value) -> str:
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
    kind = _kind_of(value)
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
        item, kind = f"{leaf.path}{{{k}}}", _kind_of(value)
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


def _refuse(leaf: Leaf, path: str, mode: str) -> None:
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


class MatlabSource(ContainerSource):
    """MATLAB v4-v7 ``.mat`` files through SciPy, with the modes, row groups and flags of :class:`Hdf5Source`
    (see the module docstring). Remote files are read through ``fileio`` streams (loadmat takes a file object)."""

    format_name = "matlab"
    suffixes = (".mat",)  # a v7.3 .mat is HDF5 by its first bytes; a v4 file has no magic: the suffix decides
    magic = (MATLAB5_MAGIC,)
    content_label = "a MATLAB v5/v7 .mat file"

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        """The header text, or (a writer with other text) the v5 version 0x0100 and endian indicator at 124."""
        return super().sniff(head) or head[124:128] in (b"\x00\x01IM", b"\x01\x00MI")

    def _stream(self, path: str):
        _refuse_special_file(path)
        return fileio.open_read(path)

    def variables(self, f, path: str) -> list[MatVariable]:
        """The variable headers of the open file ``f``, in file order (``scipy.io.whosmat``'s scan, which also
        reads each header's complex flag; nothing is loaded).

        Raises:
          SourceError: not a MATLAB v4-v7 file, or a damaged header (naming the file).
        """
        from scipy.io.matlab import _mio, _mio4, _mio5, _mio5_params

        from tfrecord_etl.transforms.sources import other_format_hint

        try:
            f.seek(0)
            reader, _ = _mio.mat_reader_factory(f, chars_as_strings=False, mat_dtype=True)
            v5 = isinstance(reader, _mio5.MatFile5Reader)
            classes, sparse = (
                (_mio5_params.mclass_info, _mio5_params.mxSPARSE_CLASS)
                if v5
                else (_mio4.mclass_info, _mio4.mxSPARSE_CLASS)
            )
            f.seek(0)
            reader.initialize_read()
            if v5:
                reader.read_file_header()
            out = []
            while not reader.end_of_stream():
                start = f.tell()
                hdr, stop = reader.read_var_header()
                name = hdr.name.decode("latin1") if hdr.name is not None else "None"
                mclass = (
                    "sparse"
                    if hdr.mclass == sparse
                    else ("logical" if hdr.is_logical else classes.get(hdr.mclass, "unknown"))
                )
                shape = matlab_shape(reader._matrix_reader.shape_from_header(hdr))
                compressed, is_complex = (
                    _array_flags(f, start, reader.byte_order) if v5 else (False, bool(hdr.is_complex))
                )
                out.append(
                    MatVariable(
                        name or FUNCTION_WORKSPACE,
                        shape,
                        mclass,
                        is_complex,
                        start,
                        int(stop),
                        compressed,
                        reader.byte_order if v5 else "<",
                    )
                )
                f.seek(stop)
            return out
        except SourceError:
            raise
        except Exception as e:  # noqa: BLE001 - SciPy raises ValueError/TypeError/MatReadError on damaged headers
            raise SourceError(
                f"Not a readable MATLAB v4-v7 .mat file: {e}",
                file=path,
                hint=other_format_hint(path, self.format_name) or "check that the file is complete",
            ) from None

    def _check_size(self, f, var: MatVariable, path: str) -> None:
        """Refuses a variable over ``max_variable_bytes`` before it is loaded (see the module docstring)."""
        limit = self.options.max_variable_bytes
        if var.dtype is not None:
            declared = math.prod(var.shape) * (4 if var.mclass == "char" else var.dtype.itemsize)  # char: '<U1'
        elif var.compressed:
            declared = _inflated_bytes(f, var, limit)
        else:
            declared = var.stop - var.start
        if declared <= limit and var.dtype is None and var.mclass not in ("sparse", "char", "logical") and self._v5(f):
            self._check_nesting(f, var, path)
        if declared > limit:
            raise SourceError(
                f"The variable holds {declared:,} bytes ({declared / 2**20:,.1f} MiB), over the limit "
                f"of {limit / 2**20:g} MiB for one variable (SciPy's loadmat reads a variable whole)",
                file=path,
                dataset=f"/{var.name}",
                hint="raise --max_mat_variable_mb if the file is trusted and the memory is there (about "
                "twice the variable at peak), choose other variables with --datasets, or save "
                "the file with -v7.3 (HDF5, read row range by row range)",
            )

    def _v5(self, f) -> bool:
        f.seek(124)
        return f.read(4) in (b"\x00\x01IM", b"\x01\x00MI")

    def _check_nesting(self, f, var: MatVariable, path: str) -> None:
        """Refuses a cell, struct, object or function handle whose arrays nest deeper than ``max_mat_nesting``
        (``--max_mat_nesting``) before SciPy loads it (see :mod:`matnesting`: deep nesting crashed the process)."""
        limit = self.options.max_mat_nesting
        try:
            depth = matnesting.nesting_depth(f, var.start, var.stop, var.compressed, var.byte_order, limit)
        except matnesting.Damaged as e:
            raise SourceError(
                f"Cannot read the variable's arrays: {e}",
                file=path,
                dataset=f"/{var.name}",
                hint="the file may be truncated or damaged (scipy.io.loadmat could not read it either)",
            ) from None
        if depth > limit:
            raise SourceError(
                f"The variable's arrays nest more than {limit} deep (cells or structs inside cells or "
                f"structs), over the limit of --max_mat_nesting {limit}: refused before loading (SciPy "
                f"reads each level by recursion in C)",
                file=path,
                dataset=f"/{var.name}",
                hint="raise --max_mat_nesting if the file is trusted (SciPy and NumPy crash near "
                "5,000 levels), or choose other variables with --datasets",
            )

    def _check_header_sizes(self, f, table: list[MatVariable], leaves: list[Leaf], path: str) -> None:
        """Checks the numeric, char and logical variables of ``leaves`` against the limit from their headers (a
        struct or cell was checked before it was loaded)."""
        tops = {leaf.path.strip("/").split("/")[0] for leaf in leaves}
        for var in table:
            if var.name in tops and var.dtype is not None:
                self._check_size(f, var, path)

    def _load(self, f, table: list[MatVariable], names, path: str) -> dict:
        """``{name: value}`` of the variables ``names`` (each checked against the limit first), loaded with
        ``loadmat(mat_dtype=True)``; a variable holding complex values is loaded again without ``mat_dtype``
        (SciPy's ``mat_dtype`` casts complex arrays to their real class, dropping the imaginary part) and its
        complex arrays take the class dtype from the first load."""
        from scipy.io import loadmat

        by_name = {v.name: v for v in table}
        names = sorted(set(names))
        for name in names:
            self._check_size(f, by_name[name], path)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                f.seek(0)
                typed = loadmat(f, mat_dtype=True, chars_as_strings=False, variable_names=names)
            if any(issubclass(w.category, np.exceptions.ComplexWarning) for w in caught):
                f.seek(0)
                kept = loadmat(f, chars_as_strings=False, variable_names=names)
                typed = {k: _with_complex(typed[k], kept[k]) for k in names}
        except Exception as e:  # noqa: BLE001 - SciPy raises OSError/ValueError/zlib.error on damaged data
            raise SourceError(
                f"Cannot read the variable(s) {', '.join(names)}: {e}",
                file=path,
                hint="the file may be truncated or damaged (scipy.io.loadmat cannot read it)",
            ) from None
        for w in caught:
            if not issubclass(w.category, np.exceptions.ComplexWarning):
                log.warning("'%s': SciPy says: %s", path, w.message)
        return {k: typed[k] for k in names}

    def leaves(self, f, table: list[MatVariable], path: str, tops=None, cells: bool = False) -> list[Leaf]:
        """Every leaf of the variables ``tops`` (default all) in walk order (sorted paths). Numeric, char and
        logical variables come from their header; structs (and, with ``cells``, cell arrays) are loaded."""
        chosen = sorted((v for v in table if tops is None or v.name in tops), key=lambda v: v.name)
        load = [v.name for v in chosen if 0 not in v.shape and (v.mclass == "struct" or (cells and v.mclass == "cell"))]
        loaded = self._load(f, table, load, path) if load else {}
        out = []
        for var in chosen:
            p = f"/{var.name}"
            if var.name == FUNCTION_WORKSPACE:
                out.append(Leaf(p, layout.INTERNAL))
            elif 0 in var.shape:
                out.append(Leaf(p, layout.EMPTY))
            elif var.mclass == "char":
                out.append(Leaf(p, layout.DATA, *mattext.char_spec(var.shape)))
            elif var.dtype is not None:
                out.append(Leaf(p, layout.DATA, var.dtype, var.shape))
            elif var.name in loaded:
                value = loaded[var.name]
                out += value_leaves(p, value) if value.dtype.names or var.mclass == "cell" else []  # no fields
            elif var.mclass == "cell":
                out.append(Leaf(p, layout.CELL))
            else:
                out.append(Leaf(p, SPARSE if var.mclass == "sparse" else OTHER, what=var.mclass))
        return sorted(out, key=lambda leaf: leaf.path.split("/"))

    def _named(self, f, table, path: str, cells: bool) -> list[Leaf]:
        """The leaves of ``--datasets`` (names with or without the leading ``/``), in the order given."""
        known = {v.name for v in table}
        tops = {n.strip("/").split("/")[0] for n in self.options.datasets}
        for name in self.options.datasets:
            if name.strip("/").split("/")[0] not in known:
                raise SourceError(
                    "No such variable",
                    file=path,
                    dataset=name,
                    hint=f"variables: {sorted(known)[:10]}; tfrecord-etl inspect FILE lists them",
                )
        by_path = {leaf.path: leaf for leaf in self.leaves(f, table, path, tops, cells)}
        out = []
        for name in self.options.datasets:
            leaf = by_path.get("/" + name.strip("/"))
            if leaf is None:
                raise SchemaError(
                    "Not a variable or struct field holding an array (a struct? name its fields)",
                    file=path,
                    dataset=name,
                    hint="tfrecord-etl inspect FILE lists them",
                )
            out.append(dataclasses.replace(leaf, path=name))
        return out

    def index(self, path: str) -> FileIndex:
        """Learns rows and features of ``path`` as :meth:`Hdf5Source.index` does for a v7.3 file.

        Raises:
          SourceError: unreadable file, unknown variable, a variable over the size limit.
          SchemaError: cells, empty, sparse or unsupported variables named in rows mode, lengths that differ, no
            variable with rows.
        """
        with self._stream(path) as f:
            table = self.variables(f, path)
            if self.loose:
                return self._index_datasets(f, table, path)
            if self.options.datasets:
                chosen = self._named(f, table, path, cells=False)
            else:
                chosen = self._default(f, table, path)
                if not chosen and self.switch_to_datasets(path):
                    return self._index_datasets(f, table, path)
            self._check_header_sizes(f, table, chosen, path)
        self._rows_indexed = True
        specs, lengths, data_row_bytes = [], {}, 0
        for leaf in chosen:
            if leaf.kind != layout.DATA:
                _refuse(leaf, path, "rows")
            data_row_bytes += mattext.stored_nbytes(leaf.dtype, leaf.shape[1:])
            specs += _leaf_specs(leaf.path.strip("/"), leaf.dtype, leaf.shape[1:], f"{path}, variable '{leaf.path}'")
            lengths[leaf.path] = leaf.shape[0]
        _check_names(specs, path)
        rows = check_leading_lengths(lengths, path, "variables")
        _check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(
            path, rows, tuple(specs), _row_bytes(specs), 1, tuple(lf.path for lf in chosen), sequential=True
        )

    def _default(self, f, table, path: str) -> list[Leaf]:
        """The leaves of the chosen row group (``--row_group``, largest first), skipped kinds logged in one line;
        [] when only cells and empty arrays are there (auto mode converts each cell then)."""
        from tfrecord_etl.transforms.sources.hdf5 import _log_skipped

        entries, skipped, by_path = [], {}, {}
        for leaf in self.leaves(f, table, path):
            if leaf.kind == layout.DATA:
                entries.append((leaf.path, leaf.shape[0], None, leaf.nbytes))
                by_path[leaf.path] = leaf
            elif leaf.kind != layout.INTERNAL:
                skipped.setdefault(leaf.kind, []).append(leaf.path)
        if not entries and self.options.container_mode == "auto" and skipped.get(layout.CELL):
            return []
        _log_skipped(skipped, path, "rows mode")
        if not entries:
            what = "; ".join(f"{kind}: {', '.join(paths[:3])}" for kind, paths in skipped.items())
            raise SchemaError(
                "The file holds no variable with rows" + (f" (skipped {what})" if what else ""),
                file=path,
                hint=f"{MODE_FLAG} datasets converts each cell as one Example" if skipped.get(layout.CELL) else None,
            )
        return [by_path[p] for p in choose_group(entries, self.options.row_group or None, path)]

    def _index_datasets(self, f, table, path: str) -> FileIndex:
        """Datasets mode: one row per variable, struct field or cell holding an array; features ``key``/``array``."""
        from tfrecord_etl.transforms.sources.hdf5 import _log_skipped

        named = bool(self.options.datasets)
        found = self._named(f, table, path, cells=True) if named else self.leaves(f, table, path, cells=True)
        items, sizes, specs, skipped = [], [], [], {}
        for leaf in found:
            if leaf.kind == layout.DATA:
                targets = [(leaf.path, leaf.dtype, leaf.shape)]
            elif leaf.kind == layout.CELL:
                cells = cell_items(leaf, None if named else skipped.setdefault("unconvertible cell", []), path)
                targets = [(item, *converted_spec(v)) for item, v in cells]
            elif named:
                _refuse(leaf, path, "datasets")
            else:
                if leaf.kind != layout.INTERNAL:
                    skipped.setdefault(leaf.kind, []).append(leaf.path)
                continue
            for item, dtype, shape in targets:
                if dtype.fields is not None:
                    if named:
                        raise SchemaError(
                            "Compound (complex integer) arrays are not supported in datasets mode",
                            file=path,
                            dataset=item,
                            hint="convert them in rows mode with --datasets",
                        )
                    skipped.setdefault("variable-length or compound", []).append(item)
                    continue
                specs.append(_row_spec(ARRAY, dtype, shape, f"{path}, variable '{item}'"))
                items.append(item)
                sizes.append(mattext.stored_nbytes(dtype, shape))
        _log_skipped(skipped, path, "datasets mode")
        if not items:
            raise SchemaError("The file holds no variable to convert", file=path)
        self._check_header_sizes(f, table, [leaf for leaf in found if leaf.kind == layout.DATA], path)
        return datasets_index(path, items, specs, sizes, "variable", sequential=True)

    def _arrays(self, path: str, items) -> dict:
        """``{item: array as stored}`` of ``items``, from this worker thread's loaded variables of ``path`` (rows
        mode keeps the converted arrays of its row group; datasets mode the variables of the current range)."""
        tops, converted = self.opened(path)
        missing = [i for i in items if i not in converted]
        if missing:
            needed = {i.strip("/").split("/")[0].split("{")[0] for i in missing}
            for name in set(tops) - needed:
                del tops[name]
            if not self.loose:
                converted.clear()
            to_load = needed - set(tops)
            if to_load:
                with self._stream(path) as f:
                    tops.update(self._load(f, self.variables(f, path), to_load, path))
            for item in missing:
                converted[item] = as_stored(value_at(tops, item), f"{path}, variable '{item}'")
            if not self.loose:
                tops.clear()  # rows mode keeps the converted arrays only
            else:
                for item in list(converted):
                    if item not in items:
                        del converted[item]
        return converted

    def read(self, rr: RowRange) -> Columns:
        try:
            arrays = self._arrays(rr.path, rr.items)
        except (SourceError, SchemaError):
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - SciPy raises ValueError/zlib.error on damaged data
            self.close()
            raise SourceError(
                f"Cannot read {rr.describe()}: {e}",
                file=rr.path,
                hint="the file may be damaged (scipy.io.loadmat cannot read it)",
            ) from None
        return self.columns(rr, arrays.__getitem__, lambda n: arrays[n][rr.start : rr.stop])

    def open_for_read(self, path: str):
        """``({variable: loaded value}, {item: array as stored})``, filled by :meth:`_arrays` (see :meth:`opened`)."""
        return {}, {}


def _with_complex(typed, kept):
    """``typed`` (loaded with ``mat_dtype``) with each complex array of ``kept`` (loaded without it) put back in
    the class dtype ``typed`` shows for it (structs and cells walked in parallel)."""
    if type(kept) is np.ndarray and kept.dtype.kind == "c":
        dtype = _complex_dtype(np.dtype(typed.dtype))
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
                out[idx][n] = _with_complex(typed[idx][n], kept[idx][n])
        return out
    if typed.dtype == object and kept.dtype == object:
        out = np.empty(typed.shape, object)
        for idx in np.ndindex(typed.shape):
            out[idx] = _with_complex(typed[idx], kept[idx])
        return out
    return typed


MI_COMPRESSED, COMPLEX_FLAG = 15, 0x0800


def _array_flags(f, start: int, byte_order: str) -> tuple[bool, bool]:
    """``(compressed, complex)`` of the v5 variable at byte ``start``: its tag's data type (miCOMPRESSED: 15), then
    the complex bit of its Array Flags subelement (MAT-File Format, Level 5: the tag, 8 bytes, then the flags'
    tag, 8 bytes, then the flags word; inflated from the first compressed bytes for a compressed variable).
    SciPy's header object keeps that bit to itself."""
    f.seek(start)
    tag = f.read(8)
    order = "little" if byte_order == "<" else "big"
    compressed = int.from_bytes(tag[:4], order) == MI_COMPRESSED
    if compressed:
        body = zlib.decompressobj().decompress(f.read(min(int.from_bytes(tag[4:8], order), 4096)), 24)
    else:
        body = tag + f.read(16)
    return compressed, bool(int.from_bytes(body[16:20], order) & COMPLEX_FLAG)


def _inflated_bytes(f, var: MatVariable, limit: int) -> int:
    """The bytes a compressed (miCOMPRESSED) variable inflates to, counted in 1 MiB steps without keeping them,
    stopping once over ``limit``."""
    f.seek(var.start + 8)
    inflater, remaining, total = zlib.decompressobj(), var.stop - var.start - 8, 0
    while remaining > 0 and total <= limit:
        chunk = f.read(min(2**20, remaining))
        if not chunk:
            break
        remaining -= len(chunk)
        while chunk and total <= limit:
            total += len(inflater.decompress(chunk, 2**20))
            chunk = inflater.unconsumed_tail
    return total
