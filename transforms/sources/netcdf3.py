"""NetCDF-3 source (classic ``CDF\\x01`` and 64-bit offset ``CDF\\x02`` files) through SciPy's ``netcdf_file``,
memory-mapped: variables on the same leading dimension form a row group, as in netCDF-4 files (``hdf5layout``).

netCDF-4 files are HDF5 and go through :class:`Hdf5Source`; a ``.nc`` input is routed by its magic bytes
(:func:`transforms.sources.format_of`). Values are the stored ones: ``scale_factor``/``add_offset``/``_FillValue``
are not applied (``maskandscale=False``), so the conversion is exact; the attributes stay in the file.
Reference: Unidata, "The NetCDF Classic Format Specification"; ``scipy.io.netcdf_file``.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import categoricals, conventions
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
)
from tfrecord_etl.transforms.sources.signatures import other_format_hint
from tfrecord_etl.transforms.storage import fileio

NETCDF3_MAGIC = (b"CDF\x01", b"CDF\x02")


class NetCdf3Source(ContainerSource):
    """NetCDF-3 files, memory-mapped (local files only; copy a remote one first: SciPy reads a file object's
    variables whole at open, before any size could be checked).

    Rows mode: the variables of ``options.datasets`` (names with or without a leading ``/``), else the row
    group ``options.row_group`` of the variables grouped by their first dimension, by default the CF data
    variables on the record dimension, else the largest group of data variables (:mod:`conventions`); 0-d
    variables are skipped (one warning). Datasets mode: each variable is one Example (``key``, ``array``).
    """

    options_models = ("options_container.ContainerOptions",)  # its flags: sources/options_*.py

    format_name = "netcdf3"
    help_label = "netCDF"
    suffixes = (".nc", ".cdf", ".nc3", ".mnc")  # .mnc: MINC1 (MINC2 is HDF5: the first bytes decide)
    magic = NETCDF3_MAGIC
    content_label = "a NetCDF-3 file"

    def open_file(self, path: str):
        from scipy.io import netcdf_file

        refuse_special_file(path)
        if not fileio.is_local(path):
            raise SourceError(
                "NetCDF-3 files are read memory-mapped from local disk",
                file=path,
                hint="copy the file to a local directory first (or convert it to netCDF-4)",
            )
        try:
            return _streaming_aware(netcdf_file)(path, "r", mmap=True, maskandscale=False)
        except Exception as e:  # noqa: BLE001 - SciPy raises TypeError/ValueError/OSError on damaged headers
            raise SourceError(
                f"Not a readable NetCDF-3 file: {e}",
                file=path,
                hint=other_format_hint(path, self.format_name) or "check that the file is complete",
            ) from None

    @staticmethod
    def close_file(f) -> None:
        with warnings.catch_warnings():  # "Cannot close a netcdf_file opened with mmap=True ...": views are gone
            warnings.simplefilter("ignore")
            f.close()

    def _variable(self, f, name: str, path: str):
        key = name.lstrip("/")
        if key not in f.variables:
            raise SourceError(
                "No such variable",
                file=path,
                dataset=name,
                hint=f"variables: {sorted(f.variables)[:10]}; tfrecord-etl inspect FILE lists them",
            )
        return f.variables[key]

    def index(self, path: str) -> FileIndex:
        """Learns rows and features (see the class).

        Raises:
          SourceError: unreadable or remote file, unknown variable.
          SchemaError: 0-d variables in rows mode, lengths that differ, no variable with rows.
        """
        f = self.open_file(path)
        try:
            if self.loose:
                return self._index_variables(f, path)
            names = list(self.options.datasets or self._default_variables(f, path) or [])
            if not names and self.switch_to_datasets(path):
                return self._index_variables(f, path)
            self._rows_indexed = True
            specs, lengths, data_row_bytes = [], {}, 0
            for name in names:
                var = self._variable(f, name, path)
                if not var.shape:
                    raise SchemaError(
                        "Variable is a scalar (0-d): it has no rows",
                        file=path,
                        dataset=name,
                        hint=f"use {MODE_FLAG} datasets (each variable -> one Example)",
                    )
                dtype = var.data.dtype
                data_row_bytes += dtype.itemsize * int(np.prod(var.shape[1:]))
                specs += leaf_specs(name.strip("/"), dtype, var.shape[1:], f"{path}, variable '{name}'")
                lengths[name] = int(var.shape[0])
            found = categoricals.netcdf3_columns(f, names)
            specs = categoricals.apply_specs(specs, found, self.options.categoricals, path)
        finally:
            self.close_file(f)
        check_names(specs, path)
        rows = check_leading_lengths(lengths, path, "variables")
        check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(path, rows, tuple(specs), row_bytes(specs), 1, tuple(names))

    def _default_variables(self, f, path: str) -> list[str]:
        entries, scalars = [], []
        for name, var in f.variables.items():
            if not var.shape:
                scalars.append(name)
                continue
            entries.append((name, int(var.shape[0]), var.dimensions[0], int(var.data.nbytes)))
        if scalars:
            log.warning(
                "Skipping %d scalar (%s%s) variables in '%s' (rows mode)",
                len(scalars),
                ", ".join(scalars[:3]),
                ", ..." if len(scalars) > 3 else "",
                path,
            )
        if not entries:
            if self.options.container_mode == "auto" and scalars:
                return []  # index() converts each variable instead
            raise SchemaError(
                "The file holds no variable with rows",
                file=path,
                hint=f"use {MODE_FLAG} datasets (each variable -> one Example)",
            )
        return choose_group(entries, self.options.row_group or None, path, conventions.netcdf3_roles(f))

    def _index_variables(self, f, path: str) -> FileIndex:
        names = [n.lstrip("/") for n in self.options.datasets] if self.options.datasets else list(f.variables)
        specs, sizes = [], []
        for name in names:
            var = self._variable(f, name, path)
            specs.append(row_spec(ARRAY, var.data.dtype, var.shape, f"{path}, variable '{name}'"))
            sizes.append(int(var.data.nbytes))
        return datasets_index(path, names, specs, sizes, "variable")

    def open_for_read(self, path: str):
        return self.open_file(path)

    def close_handle(self, handle) -> None:
        self.close_file(handle)

    def read(self, rr: RowRange) -> Columns:
        try:
            f = self.opened(rr.path)
            columns = self.columns(
                rr,
                lambda n: np.array(self._variable(f, n, rr.path).data),  # copies: the map closes
                lambda n: np.array(self._variable(f, n, rr.path).data[rr.start : rr.stop]),
            )
            if self.loose:
                return columns
            found = categoricals.cached(self, rr.path, rr.items, lambda: categoricals.netcdf3_columns(f, rr.items))
            return categoricals.apply_columns(columns, found, self.options.categoricals, rr.path, rr.start)
        except SourceError:
            raise
        except Exception as e:  # noqa: BLE001
            self.close()
            raise SourceError(f"Cannot read {rr.describe()}: {e}", file=rr.path) from None


STREAMING = -1  # numrecs 0xFFFFFFFF ("streaming": indeterminate), as SciPy reads it (a signed 32-bit integer)
_SUBCLASSES: dict = {}
_WARNED: set = set()  # files whose partial record was reported


def _streaming_aware(netcdf_file):
    """SciPy's ``netcdf_file`` class, extended to read a file whose ``numrecs`` is STREAMING (0xFFFFFFFF), which
    the NetCDF classic format specification allows (Unidata, "The NetCDF Classic Format Specification":
    ``numrecs = NON_NEG | STREAMING``, the record count then follows from the file size). SciPy takes it for -1
    records (every record variable read as empty: 0 rows, nothing converted). Here the count is the whole
    records between the first record variable's ``begin`` and the end of the file, a record being the sum of
    the record variables' sizes, each padded to 4 bytes (unpadded when there is only one record variable, as the
    specification says); bytes of a trailing partial record are named in a warning. The rest is SciPy's."""
    if netcdf_file not in _SUBCLASSES:

        class StreamingAwareNetcdfFile(netcdf_file):
            def _read_numrecs(self):
                super()._read_numrecs()
                self.__dict__["_streaming"] = self._recs == STREAMING
                self.__dict__["_record_vars"] = []  # (begin, unpadded bytes per record) of each record variable

            def _read_var(self):
                var = super()._read_var()
                _, _, shape, _, _, size, _, begin, _ = var
                if self._streaming and shape and shape[0] is None:
                    self._record_vars.append((int(begin), math.prod(shape[1:]) * size))
                    self.__dict__["_recs"] = self._records_in_file()[0]  # SciPy uses it after the last variable
                return var

            def _read_var_array(self):
                super()._read_var_array()
                if (
                    self._streaming
                    and self._record_vars
                    and self._records_in_file()[1]
                    and self.filename not in _WARNED
                ):  # once per process, not again for each row range
                    _WARNED.add(self.filename)
                    count, rest = self._records_in_file()
                    log.warning(
                        "'%s': numrecs is STREAMING: %d records counted from the file size; the %d bytes "
                        "after them (a partial record) are ignored",
                        self.filename,
                        count,
                        rest,
                    )

            def _records_in_file(self) -> tuple[int, int]:
                """(whole records, bytes left over) after the first record variable's begin."""
                sizes = [n for _, n in self._record_vars]
                record = sizes[0] if len(sizes) == 1 else sum(n + -n % 4 for n in sizes)
                available = max(0, os.fstat(self.fp.fileno()).st_size - min(b for b, _ in self._record_vars))
                return divmod(available, record) if record else (0, 0)

        _SUBCLASSES[netcdf_file] = StreamingAwareNetcdfFile
    return _SUBCLASSES[netcdf_file]
