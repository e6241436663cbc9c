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
* a sparse matrix variable converts as its dense twin ``full(S)`` (double, complex or logical: float64, complex128,
  uint8; values exactly ``loadmat(...).toarray()``'s), its dense size checked against ``--max_mat_variable_mb``
  from the header before anything is loaded; a sparse matrix inside a cell or struct is named and skipped;
* empty arrays are skipped; function handles and objects are named and skipped, and refused (SchemaError) when
  named in ``--datasets``.

Memory: ``loadmat`` reads a variable whole (a compressed v7 variable cannot be read from the middle), so a worker
holds the variables it converts, about twice their bytes at peak (SciPy's array and the C-order copy written
from); one worker reads all row ranges of a file, in order (``FileIndex.sequential``), loading it once. Structs
(rows mode) and cells (datasets mode) are loaded at planning too: their fields and cells are not in the header.
Before anything is loaded, each variable's size is checked against ``MatlabOptions.max_variable_bytes``
(``--max_mat_variable_mb``): the bytes its header declares (dimensions x class), or for a cell, struct or other
container its stored bytes (a compressed one inflated and counted, nothing kept).

References: MathWorks, "MAT-File Format" (Level 4 and Level 5 MAT-files); ``scipy.io.loadmat``, ``scipy.io.whosmat``.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import hdf5layout as layout, matheader, matlimits, mattext
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    Columns,
    FileIndex,
    RowRange,
    check_empty_rows,
    check_names,
    leaf_specs,
    log,
    refuse_special_file,
    row_bytes,
    row_spec,
)
from tfrecord_etl.transforms.sources.container import (
    MODE_FLAG,
    ContainerSource,
    check_leading_lengths,
    choose_group,
    datasets_index,
    log_skipped,
)
from tfrecord_etl.transforms.sources.matsparse import dense
from tfrecord_etl.transforms.sources.matvalues import (
    FUNCTION_WORKSPACE,
    OTHER,
    Leaf,
    MatVariable,
    as_stored,
    cell_items,
    converted_spec,
    refuse,
    value_at,
    value_leaves,
    with_complex,
)
from tfrecord_etl.transforms.storage import fileio

MATLAB5_MAGIC = b"MATLAB 5.0 MAT-file"  # the header text of v6 and v7 files (v7.3 says "MATLAB 7.3": HDF5)


class MatlabSource(ContainerSource):
    """MATLAB v4-v7 ``.mat`` files through SciPy, with the modes, row groups and flags of :class:`Hdf5Source`
    (see the module docstring). Remote files are read through ``fileio`` streams (loadmat takes a file object)."""

    options_models = (
        "options_container.ContainerOptions",
        "options_matlab.MatlabOptions",
    )  # its flags: sources/options_*.py

    format_name = "matlab"
    help_label = "MATLAB .mat"
    suffixes = (".mat",)  # a v7.3 .mat is HDF5 by its first bytes; a v4 file has no magic: the suffix decides
    magic = (MATLAB5_MAGIC,)
    content_label = "a MATLAB v5/v7 .mat file"

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        """The header text, or (a writer with other text) the v5 version 0x0100 and endian indicator at 124."""
        return super().sniff(head) or head[124:128] in (b"\x00\x01IM", b"\x01\x00MI")

    def open_stream(self, path: str):
        refuse_special_file(path)
        return fileio.open_read(path)

    def variables(self, f, path: str) -> list[MatVariable]:
        """The variable headers of the open file ``f`` (:func:`matheader.variables`)."""
        return matheader.variables(f, path, self.format_name)

    def limits(self):
        """This source's ``MatlabOptions`` (``--max_mat_variable_mb``, ``--max_mat_nesting``)."""
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.options_matlab import MatlabOptions

        return self.options.of(MatlabOptions)

    def _load(self, f, table: list[MatVariable], names, path: str) -> dict:
        """``{name: value}`` of the variables ``names`` (each checked against the limit first), loaded with
        ``loadmat(mat_dtype=True)``; a variable holding complex values is loaded again without ``mat_dtype``
        (SciPy's ``mat_dtype`` casts complex arrays to their real class, dropping the imaginary part) and its
        complex arrays take the class dtype from the first load."""
        from scipy.io import loadmat

        by_name = {v.name: v for v in table}
        names = sorted(set(names))
        for name in names:
            matlimits.check_size(f, by_name[name], path, self.limits())
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                f.seek(0)
                typed = loadmat(f, mat_dtype=True, chars_as_strings=False, variable_names=names)
            if any(issubclass(w.category, np.exceptions.ComplexWarning) for w in caught):
                f.seek(0)
                kept = loadmat(f, chars_as_strings=False, variable_names=names)
                typed = {k: with_complex(typed[k], kept[k]) for k in names}
        except Exception as e:  # noqa: BLE001 - SciPy raises OSError/ValueError/zlib.error on damaged data
            raise SourceError(
                f"Cannot read the variable(s) {', '.join(names)}: {e}",
                file=path,
                hint="the file may be truncated or damaged (scipy.io.loadmat cannot read it)",
            ) from None
        for w in caught:
            if not issubclass(w.category, np.exceptions.ComplexWarning):
                log.warning("'%s': SciPy says: %s", path, w.message)
        # a sparse matrix dense in its header's class (savemat's logical one loads as uint8, like a double's bytes)
        return {k: dense(typed[k], by_name[k].logical) if by_name[k].mclass == "sparse" else typed[k] for k in names}

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
                out.append(Leaf(p, OTHER, what=var.mclass))
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
        with self.open_stream(path) as f:
            table = self.variables(f, path)
            if self.loose:
                return self._index_datasets(f, table, path)
            if self.options.datasets:
                chosen = self._named(f, table, path, cells=False)
            else:
                chosen = self._default(f, table, path)
                if not chosen and self.switch_to_datasets(path):
                    return self._index_datasets(f, table, path)
            matlimits.check_header_sizes(f, table, chosen, path, self.limits())
        self._rows_indexed = True
        specs, lengths, data_row_bytes = [], {}, 0
        for leaf in chosen:
            if leaf.kind != layout.DATA:
                refuse(leaf, path, "rows")
            data_row_bytes += mattext.stored_nbytes(leaf.dtype, leaf.shape[1:])
            specs += leaf_specs(leaf.path.strip("/"), leaf.dtype, leaf.shape[1:], f"{path}, variable '{leaf.path}'")
            lengths[leaf.path] = leaf.shape[0]
        check_names(specs, path)
        rows = check_leading_lengths(lengths, path, "variables")
        check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(
            path, rows, tuple(specs), row_bytes(specs), 1, tuple(lf.path for lf in chosen), sequential=True
        )

    def _default(self, f, table, path: str) -> list[Leaf]:
        """The leaves of the chosen row group (``--row_group``, largest first), skipped kinds logged in one line;
        [] when only cells and empty arrays are there (auto mode converts each cell then)."""
        entries, skipped, by_path = [], {}, {}
        for leaf in self.leaves(f, table, path):
            if leaf.kind == layout.DATA:
                entries.append((leaf.path, leaf.shape[0], None, leaf.nbytes))
                by_path[leaf.path] = leaf
            elif leaf.kind != layout.INTERNAL:
                skipped.setdefault(leaf.kind, []).append(leaf.path)
        if not entries and self.options.container_mode == "auto" and skipped.get(layout.CELL):
            return []
        log_skipped(skipped, path, "rows mode")
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
                refuse(leaf, path, "datasets")
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
                specs.append(row_spec(ARRAY, dtype, shape, f"{path}, variable '{item}'"))
                items.append(item)
                sizes.append(mattext.stored_nbytes(dtype, shape))
        log_skipped(skipped, path, "datasets mode")
        if not items:
            raise SchemaError("The file holds no variable to convert", file=path)
        data = [leaf for leaf in found if leaf.kind == layout.DATA]
        matlimits.check_header_sizes(f, table, data, path, self.limits())
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
                with self.open_stream(path) as f:
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
