"""HDF5 source: datasets through h5py; nothing outside the named file is read (external storage, virtual
datasets), never-written storage is refused, and a chunk cache per worker thread reads each chunk once."""

from __future__ import annotations

import math

from tfrecord_etl.transforms.codec import flatten_fields
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import conventions, hdf5layout as layout, hdf5links as links, hdf5matlab, hdf5nwb
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    KEY,
    Columns,
    FileIndex,
    RowRange,
    check_empty_rows,
    check_names,
    leaf_specs,
    loosen_all,
    refuse_special_file,
    row_bytes,
    row_spec,
)
from tfrecord_etl.transforms.sources.categoricals import apply_specs, hdf5_columns, read_hdf5
from tfrecord_etl.transforms.sources.container import (
    MODE_FLAG,
    ContainerSource,
    check_dataset_count,
    check_leading_lengths,
    choose_group,
    datasets_index,
    log_skipped,
)
from tfrecord_etl.transforms.sources.hdf5filters import (
    check_filters,
    load_filter_plugins,
    plugins_loaded,
    read_error,
)
from tfrecord_etl.transforms.sources.hdf5layout import walk  # noqa: F401 - the tree's import name
from tfrecord_etl.transforms.sources.hdf5storage import (
    HDF5_CHUNK_CACHE_BYTES,
    bound_metadata_cache,
    check_storage,
    chunk_ranges,
    dataset_for_read,
)
from tfrecord_etl.transforms.sources.matsparse import as_dataset
from tfrecord_etl.transforms.sources.signatures import other_format_hint
from tfrecord_etl.transforms.storage import fileio

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".nc4", ".h5ad", ".loom", ".mnc")


class Hdf5Source(ContainerSource):
    """HDF5 datasets through h5py: local files by path (HDF5's own driver, so virtual datasets resolve),
    remote ones over a ``FileSystems`` stream (h5py reads file-like objects).

    Nothing outside the named file is read unless it is safe: datasets with external raw
    storage are refused unless ``allow_external_storage`` and every external file lies in the input's own
    directory; virtual datasets (VDS) are read only when every source file lies there too; unallocated
    storage (read as the fill value) is refused unless ``allow_fill_value``; declared sizes are checked
    against the file size. Each worker thread keeps its last file open with a chunk cache of
    ``HDF5_CHUNK_CACHE_BYTES``, so a chunk spanning several row ranges of a shard is decompressed once.
    """

    options_models = ("options_container.ContainerOptions", "options_hdf5.Hdf5Options")  # flags: options_*.py

    format_name = "hdf5"
    help_label = "HDF5"
    suffixes = HDF5_SUFFIXES
    magic = (b"\x89HDF\r\n\x1a\n",)  # the superblock's signature (a MATLAB v7.3 .mat is found by it too)
    magic_offsets = (0,) + tuple(2**k for k in range(9, 64))  # HDF5 spec: at 0 or after a user block of 512 * 2**n
    content_label = "an HDF5 file (.h5, netCDF-4, MATLAB v7.3)"

    def open_file(self, path: str):
        """``(h5py.File, remote stream or None)`` of ``path`` (hdf5plugin's filters are registered when a dataset
        needs them: ``hdf5filters.ensure_filters``)."""
        import h5py

        refuse_special_file(path)
        cache = {"rdcc_nbytes": HDF5_CHUNK_CACHE_BYTES, "rdcc_nslots": 10007}
        if fileio.is_local(path):
            try:
                return h5py.File(path, "r", **cache), None
            except Exception as e:
                raise SourceError(
                    f"Not a readable HDF5 file: {e}",
                    file=path,
                    hint=other_format_hint(path, "hdf5") or "check that the file is HDF5 and complete",
                ) from None
        stream = fileio.open_read(path)
        try:
            return h5py.File(stream, "r", **cache), stream
        except Exception as e:
            stream.close()
            raise SourceError(
                f"Not a readable HDF5 file: {e}", file=path, hint="check that the file is HDF5 and complete"
            ) from None

    def index(self, path: str) -> FileIndex:
        """Learns rows and features of ``path``.

        Rows mode: the datasets of ``options.datasets``, else the row group ``options.row_group`` (1-based) of
        :func:`conventions.ranked_groups`, by default the one the container's conventions name
        (:mod:`conventions`: CF data variables, the record dimension, top-level groups; then the largest); a
        file with several groups logs them with the flag that selects each; an NWB file by its conventions
        (:mod:`hdf5nwb`). Datasets mode: every dataset (and MATLAB cell) is one row, features ``key``, ``array``.

        Raises:
          SourceError: unreadable file, missing dataset, filter not available, external/unallocated storage.
          SchemaError: unsupported dtype, 0-d or cell datasets in rows mode, lengths that differ, no data.
        """
        f, stream = self.open_file(path)
        try:
            bound_metadata_cache(f)  # the walk visits every object
            if self.loose:
                return self._index_datasets(f, path)
            names = list(self.options.datasets or self._default_datasets(f, path) or [])
            if not names and self.switch_to_datasets(path):
                return self._index_datasets(f, path)
            self._rows_indexed = True
            specs, lengths, chunk_rows, data_row_bytes = [], {}, 1, 0
            attributes = hdf5nwb.attributes(f, names) if hdf5nwb.is_nwb(f, path) else None  # (metadata.json)
            for name in names:
                dset, dtype = self._row_dataset(f, name, path)
                rows, row_shape = layout.rows_and_shape(dset)
                data_row_bytes += dtype.itemsize * math.prod(row_shape)
                specs += leaf_specs(name.strip("/"), dtype, row_shape, f"{path}, dataset '{name}'", layout.check_vlen)
                lengths[name] = rows
                chunk_rows = max(chunk_rows, layout.chunk_rows(dset))
            specs = apply_specs(specs, hdf5_columns(f, names), self.options.categoricals, path)
        except SourceError as e:  # e.g. a MATLAB attribute of the wrong type (hdf5layout names only the dataset)
            raise e.with_context(file=path) from None
        finally:
            f.close()
            if stream is not None:
                stream.close()
        check_names(specs, path)
        rows = check_leading_lengths(lengths, path, "datasets")
        check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(path, rows, tuple(specs), row_bytes(specs), chunk_rows, tuple(names), attributes=attributes)

    def _row_dataset(self, f, name: str, path: str):
        """``(dataset, dtype as converted)`` of ``name`` for rows mode, after the checks before any read: not a cell
        array, not a scalar, its filters available, a supported type, storage in the file (``check_storage``).

        Raises:
          SourceError / SchemaError: naming the file and the dataset.
        """
        dset = self._dataset(f, name, path)
        if layout.kind_of(dset, name) == layout.CELL:
            raise SchemaError(
                "The dataset holds object references (a MATLAB cell array?), not rows of values",
                file=path,
                dataset=name,
                hint=f"use {MODE_FLAG} datasets: each cell becomes one Example",
            )
        if dset.ndim == 0:
            raise SchemaError(
                "Dataset is a scalar (0-d): it has no rows",
                file=path,
                dataset=name,
                hint=f"choose datasets with a leading axis with --datasets, or use {MODE_FLAG} datasets",
            )
        check_filters(dset, path, name)
        try:
            dtype = layout.dtype_of(dset)
        except (TypeError, ValueError) as e:
            raise SchemaError(f"Unsupported HDF5 type: {e}", file=path, dataset=name) from None
        check_storage(dset, path, name, self.options)
        return dset, dtype

    def _classified(self, f, path: str, skipped: dict, errors: list):
        """Yields ``(path, dataset, kind)`` of every dataset in walk order, one at a time (holding them all open
        cost about 16 KB each: 20,000 datasets took 320 MB); adds ``{reason: [paths]}`` of those skipped to
        ``skipped``: unsupported types are skipped here (listed, their first error appended to ``errors``), and
        refused only when nothing else is left.

        Raises:
          SourceError: more than ``options.max_datasets`` datasets (``--max_datasets``).
        """
        import h5py

        count = 0
        for full, link, obj in layout.walk(f):
            if isinstance(obj, Exception):
                raise SchemaError(
                    f"Cannot open HDF5 object: {obj}",
                    file=path,
                    dataset=full,
                    hint="choose other datasets with --datasets",
                ) from None
            if obj is None and isinstance(link, h5py.ExternalLink):
                obj = links.followed_dataset(f, full, link, path, self.options.allow_external_storage, skipped)
            obj = as_dataset(obj)  # a MATLAB v7.3 sparse matrix's group: read as the dense matrix
            if obj is None:
                continue
            count += 1
            check_dataset_count(count, path, self.options)
            try:
                obj.dtype  # noqa: B018 - reading the type raises for the ones h5py cannot map
            except (TypeError, ValueError) as e:  # HDF5 time types; float128 wider than any NumPy type here
                skipped.setdefault("unsupported-type", []).append(full)
                errors.append(SchemaError(f"Unsupported HDF5 type: {e}", file=path, dataset=full))
                continue
            yield full, obj, layout.kind_of(obj, full)

    def _default_datasets(self, f, path: str) -> list[str]:
        """The datasets of the chosen row group (see :meth:`index`); skipped kinds are logged in one line."""
        if self.options.container_mode == "auto" and layout.is_keras(f):
            return []  # a weights file has no rows: index() converts each weight as one Example
        if hdf5nwb.is_nwb(f, path):  # TimeSeries and tables by the NWB conventions; file metadata never joined
            return hdf5nwb.choose(f, path, self.options)
        skipped, errors, entries = {}, [], []
        roles = conventions.Hdf5Roles(f)
        for full, dset, kind in self._classified(f, path, skipped, errors):
            roles.observe(full, dset, kind)
            if kind in (layout.DATA, layout.SCALE):
                rows, _ = layout.rows_and_shape(dset)
                entries.append((full, rows, layout.leading_dimension(dset), layout.data_bytes(dset)))
            elif kind != layout.INTERNAL:
                skipped.setdefault(kind, []).append(full)
        first_error = errors[0] if errors else None
        if (
            not entries
            and first_error is None
            and self.options.container_mode == "auto"
            and (skipped.get(layout.SCALAR) or skipped.get(layout.CELL))
        ):
            return []  # index() converts each dataset instead
        log_skipped(skipped, path, "rows mode")
        if not entries:
            if first_error is not None:
                raise first_error
            raise SchemaError(
                "The file holds no dataset with rows",
                file=path,
                hint=f"use {MODE_FLAG} datasets to convert each dataset (scalars, cells) as one Example"
                if skipped
                else None,
            )
        keras = (
            f" This is a Keras weights file: {MODE_FLAG} datasets converts one Example per weight."
            if layout.is_keras(f)
            else ""
        )  # (reached with container mode rows: auto converts each weight)
        return choose_group(entries, self.options.row_group or None, path, roles.roles([e[0] for e in entries]), keras)

    def _index_datasets(self, f, path: str) -> FileIndex:
        """Datasets mode: one row per dataset (or per cell of a cell array), features ``key``/``array``."""
        names = self.options.datasets
        skipped = {}
        if names:
            found = ((n, d, layout.kind_of(d, n)) for n, d in ((n, self._dataset(f, n, path)) for n in names))
        else:
            found = self._classified(f, path, skipped, [])
        items, sizes, spec = [], [], None  # a small record per dataset: its name and size (the specs merged)
        for full, dset, kind in found:
            if kind in (layout.INTERNAL, layout.DIMENSION, layout.EMPTY) or (
                kind in (layout.PYTABLES_INDEX, layout.PANDAS_META) and not names  # named: converted as asked
            ):
                if kind != layout.INTERNAL:
                    skipped.setdefault(kind, []).append(full)
                continue
            targets = (
                [(full, dset)]
                if kind != layout.CELL
                else hdf5matlab.cells(
                    f, full, dset, path, None if names else skipped.setdefault("unconvertible cell", [])
                )
            )
            for item, target in targets:
                check_filters(target, path, item)
                check_storage(target, path, item, self.options)
                dtype, shape = layout.array_spec(target)
                if dtype.kind == "O" or dtype.fields is not None:
                    if names:
                        raise SchemaError(
                            "Variable-length and compound datasets are not supported in datasets mode",
                            file=path,
                            dataset=item,
                            hint="convert them in rows mode with --datasets",
                        )
                    skipped.setdefault("variable-length or compound", []).append(item)
                    continue
                row = row_spec(ARRAY, dtype, shape, f"{path}, dataset '{item}'")
                spec = row if spec is None else loosen_all((spec, row))
                items.append(item)
                sizes.append(layout.data_bytes(target))
                check_dataset_count(len(items), path, self.options)  # cells count too
        log_skipped(skipped, path, "datasets mode")
        return datasets_index(path, items, [spec] if items else [], sizes, "dataset")

    def _dataset(self, f, name: str, path: str):
        try:
            obj = (
                links.resolve(f, name, path, self.options.allow_external_storage)
                if links.has_links(f, name)
                else f[name]
            )
        except SourceError:
            raise
        except KeyError:
            raise SourceError(
                "No such dataset",
                file=path,
                dataset=name,
                hint="tfrecord-etl inspect FILE lists its datasets; then pass --datasets",
            ) from None
        except Exception as e:
            raise SchemaError(f"Cannot open HDF5 object: {e}", file=path, dataset=name) from None
        if (found := as_dataset(obj)) is None:  # (a MATLAB v7.3 sparse matrix's group is one)
            raise SourceError("Not a dataset (a group?)", file=path, dataset=name)
        return found

    def open_for_read(self, path: str):
        """``[h5py.File, remote stream or None, {name: open dataset}]`` of ``path`` (see :meth:`opened`)."""
        f, stream = self.open_file(path)
        if self.loose:  # datasets mode opens every dataset of the file in turn
            bound_metadata_cache(f)
        return f, stream, {}

    def close_handle(self, handle) -> None:
        f, stream, datasets = handle
        datasets.clear()
        f.close()
        if stream is not None:
            stream.close()

    def _opened_dataset(self, path: str, name: str):
        """The open dataset ``name`` of this thread's open file: HDF5's chunk cache belongs to the open
        dataset, so it stays open between the row ranges of a shard."""
        f, _, datasets = self.opened(path)
        if name not in datasets:
            if self.loose:  # datasets mode reads each dataset once: only the last stays open (a cell array's)
                datasets.clear()
            datasets[name] = dataset_for_read(f, name, path)
        return datasets[name]

    def read(self, rr: RowRange) -> Columns:
        if self.loose:
            keys, arrays = [], []
            for item in rr.items:
                keys.append(item.encode())
                arrays.append(self._read_item(rr.path, item))
            return {KEY: keys, ARRAY: arrays}
        columns = {}
        stream = None
        if not fileio.is_local(rr.path):
            stream = self.opened(rr.path)[1]
        for name in rr.items:
            dset = None
            try:
                dset = self._opened_dataset(rr.path, name)
                if stream is not None:  # remote: the range's chunks fetched concurrently first
                    fileio.prefetch(stream, chunk_ranges(dset, rr.start, rr.stop))
                data = layout.read_rows(dset, rr.start, rr.stop)
            except Exception as e:
                if not plugins_loaded():  # e.g. a virtual dataset whose sources need a plugin: register, retry
                    load_filter_plugins()
                    self.close()
                    return self.read(rr)
                error = read_error(e, dset, rr.path, name, f"Cannot read rows {rr.start}-{rr.stop - 1}")
                self.close()
                raise error from None
            columns.update(flatten_fields(name.strip("/"), data))
        return read_hdf5(self, rr, columns)

    def _read_item(self, path: str, item: str):
        """Datasets mode: the whole dataset ``item``, or the cell ``name{k}`` of a cell array."""
        dset = None
        try:
            if item.endswith("}") and "{" in item:
                name, k = item[:-1].rsplit("{", 1)
                f = self.opened(path)[0]
                ref = self._opened_dataset(path, name)[()].ravel()[int(k) - 1]
                dset = f[ref]
            else:
                dset = self._opened_dataset(path, item)
            return layout.read_whole(dset)
        except Exception as e:
            if not plugins_loaded():  # a cell's target or a virtual dataset's sources may need a plugin
                load_filter_plugins()
                self.close()
                return self._read_item(path, item)
            error = read_error(e, dset, path, item, "Cannot read the dataset")
            self.close()
            raise error from None
