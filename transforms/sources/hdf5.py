"""HDF5 source: datasets through h5py; nothing outside the named file is read (external storage, virtual
datasets), never-written storage is refused, and a chunk cache per worker thread reads each chunk once."""

from __future__ import annotations

import math

from tfrecord_etl.transforms.codec import flatten_fields
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import conventions, hdf5layout as layout, hdf5links as links
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    KEY,
    Columns,
    FileIndex,
    RowRange,
    SourceOptions,
    _check_empty_rows,
    _check_names,
    _leaf_specs,
    _refuse_special_file,
    _row_bytes,
    _row_spec,
    log,
    loosen_all,
)
from tfrecord_etl.transforms.sources.container import (
    MODE_FLAG,
    ContainerSource,
    check_leading_lengths,
    choose_group,
    datasets_index,
)
from tfrecord_etl.transforms.sources.hdf5filters import (
    check_filters,
    ensure_filters,
    load_filter_plugins,
    plugins_loaded,
    read_error,
)
from tfrecord_etl.transforms.sources.hdf5layout import walk  # noqa: F401 - the tree's import name
from tfrecord_etl.transforms.storage import fileio

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".nc4", ".h5ad", ".loom", ".mnc")
HDF5_CHUNK_CACHE_BYTES = 64 * 2**20  # per open file: a chunk spanning several row ranges is decompressed once
# HDF5's metadata cache of a file whose objects are all visited (planning's walk, datasets mode): parsed object
# headers take about 12 bytes of memory per byte the cache counts, and the library's default lets it grow to 32 MiB
# (planning 20,000 datasets of two values: +51 MB of memory at its 4 MiB, +10 MB at 1 MiB, +1 MB at 256 KiB)
WALK_METADATA_CACHE_BYTES = 256 * 2**10


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

    format_name = "hdf5"
    suffixes = HDF5_SUFFIXES
    magic = (b"\x89HDF\r\n\x1a\n",)  # the superblock's signature (a MATLAB v7.3 .mat is found by it too)
    magic_offsets = (0,) + tuple(2**k for k in range(9, 64))  # HDF5 spec: at 0 or after a user block of 512 * 2**n
    content_label = "an HDF5 file (.h5, netCDF-4, MATLAB v7.3)"

    def _open(self, path: str):
        """``(h5py.File, remote stream or None)`` of ``path`` (hdf5plugin's filters are registered when a dataset
        needs them: ``hdf5filters.ensure_filters``)."""
        import h5py

        _refuse_special_file(path)
        cache = {"rdcc_nbytes": HDF5_CHUNK_CACHE_BYTES, "rdcc_nslots": 10007}
        if fileio.is_local(path):
            try:
                return h5py.File(path, "r", **cache), None
            except Exception as e:
                from tfrecord_etl.transforms.sources import other_format_hint

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
        file with several groups logs them with the flag that selects each. Datasets mode: every data dataset (and every cell of a MATLAB cell array) is one
        row, features ``key`` and ``array``.

        Raises:
          SourceError: unreadable file, missing dataset, filter not available, external/unallocated storage.
          SchemaError: unsupported dtype, 0-d or cell datasets in rows mode, lengths that differ, no data.
        """
        import h5py

        f, stream = self._open(path)
        try:
            bound_metadata_cache(f)  # the walk visits every object
            if self.loose:
                return self._index_datasets(f, path)
            names = list(self.options.datasets or self._default_datasets(f, path) or [])
            if not names and self.switch_to_datasets(path):
                return self._index_datasets(f, path)
            self._rows_indexed = True
            specs, lengths, chunk_rows, data_row_bytes = [], {}, 1, 0
            for name in names:
                dset = self._dataset(f, name, path)
                kind = layout.kind_of(dset, name)
                if kind == layout.CELL:
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
                _check_storage(dset, path, name, self.options)
                rows, row_shape = layout.rows_and_shape(dset)
                data_row_bytes += dtype.itemsize * math.prod(row_shape)
                specs += _leaf_specs(
                    name.strip("/"), dtype, row_shape, f"{path}, dataset '{name}'", _hdf5_vlen_check(h5py)
                )
                lengths[name] = rows
                chunk_rows = max(chunk_rows, layout.chunk_rows(dset))
        except SourceError as e:  # e.g. a MATLAB attribute of the wrong type (hdf5layout names only the dataset)
            raise e.with_context(file=path) from None
        finally:
            f.close()
            if stream is not None:
                stream.close()
        _check_names(specs, path)
        rows = check_leading_lengths(lengths, path, "datasets")
        _check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(path, rows, tuple(specs), _row_bytes(specs), chunk_rows, tuple(names))

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
                obj = self._external(f, full, link, path, skipped)
            if not isinstance(obj, h5py.Dataset):
                continue
            count += 1
            _check_dataset_count(count, path, self.options)
            try:
                obj.dtype  # noqa: B018 - reading the type raises for the ones h5py cannot map
            except (TypeError, ValueError) as e:  # HDF5 time types; float128 wider than any NumPy type here
                skipped.setdefault("unsupported-type", []).append(full)
                errors.append(SchemaError(f"Unsupported HDF5 type: {e}", file=path, dataset=full))
                continue
            yield full, obj, layout.kind_of(obj, full)

    def _external(self, f, full: str, link, path: str, skipped: dict):
        """The dataset an external link found by the walk names, when it is followed (``--allow_external_storage``
        and its file a regular file in the input's directory: :mod:`hdf5links`); else None, and the link is added to
        ``skipped`` under the reason (one warning line names it)."""
        import h5py

        why = links.link_status(link, path, self.options.allow_external_storage)
        target = None
        if why is None:
            try:
                target = links.resolve(f, full, path, True)
            except (KeyError, SourceError) as e:
                why = f"unreadable: {e}"
        if why is None and not isinstance(target, h5py.Dataset):
            why = "to a group: name its datasets with --datasets"
        if why is not None:
            skipped.setdefault(f"external link not followed ({why})", []).append(
                f"{full} -> {link.filename}:{link.path}"
            )
            return None
        return target

    def _default_datasets(self, f, path: str) -> list[str]:
        """The datasets of the chosen row group (see :meth:`index`); skipped kinds are logged in one line."""
        if self.options.container_mode == "auto" and layout.is_keras(f):
            return []  # a weights file has no rows: index() converts each weight as one Example
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
        _log_skipped(skipped, path, "rows mode")
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
            if kind in (layout.INTERNAL, layout.DIMENSION, layout.EMPTY):
                if kind != layout.INTERNAL:
                    skipped.setdefault(kind, []).append(full)
                continue
            targets = (
                [(full, dset)]
                if kind != layout.CELL
                else _cells(f, full, dset, path, None if names else skipped.setdefault("unconvertible cell", []))
            )
            for item, target in targets:
                check_filters(target, path, item)
                _check_storage(target, path, item, self.options)
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
                row = _row_spec(ARRAY, dtype, shape, f"{path}, dataset '{item}'")
                spec = row if spec is None else loosen_all((spec, row))
                items.append(item)
                sizes.append(layout.data_bytes(target))
                _check_dataset_count(len(items), path, self.options)  # cells count too
        _log_skipped(skipped, path, "datasets mode")
        return datasets_index(path, items, [spec] if items else [], sizes, "dataset")

    def _dataset(self, f, name: str, path: str):
        import h5py

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
        if not isinstance(obj, h5py.Dataset):
            raise SourceError("Not a dataset (a group?)", file=path, dataset=name)
        return obj

    def open_for_read(self, path: str):
        """``[h5py.File, remote stream or None, {name: open dataset}]`` of ``path`` (see :meth:`opened`)."""
        f, stream = self._open(path)
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
            datasets[name] = _dataset_for_read(f, name, path)
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
        return columns

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


MAX_PREFETCH_CHUNKS = 4096  # a row range touching more chunks than this is read chunk by chunk


def chunk_ranges(dset, start: int, stop: int) -> list[tuple[int, int]]:
    """``[(byte offset, stored size)]`` of the chunks of ``dset`` holding rows ``start`` to ``stop`` (h5py's
    ``DatasetID.get_chunk_info_by_coord``; unallocated chunks skipped), or ``[]`` for a contiguous dataset (one
    read already), one with more than :data:`MAX_PREFETCH_CHUNKS` such chunks, or a layout h5py cannot list."""
    import itertools

    chunks = dset.chunks
    if not chunks or stop <= start or not dset.shape:
        return []
    first = start // chunks[0] * chunks[0]
    axes = [range(first, stop, chunks[0])] + [range(0, n, c) for n, c in zip(dset.shape[1:], chunks[1:])]
    if math.prod(len(a) for a in axes) > MAX_PREFETCH_CHUNKS:
        return []
    out = []
    try:
        for coord in itertools.product(*axes):
            info = dset.id.get_chunk_info_by_coord(coord)
            if info.byte_offset is not None and info.size:
                out.append((info.byte_offset, info.size))
    except Exception:  # noqa: BLE001 - an old HDF5 or an odd layout: read chunk by chunk as before
        return []
    return out


def _cells(f, name: str, dset, path: str, skipped: list | None = None):
    """Yields ``(item, dataset)`` of the cells of a cell array ``dset`` (object references), items ``name{k}`` with
    MATLAB's 1-based linear index (column-major, as MATLAB's ``c{k}``). A cell that is not a numeric/char/logical
    array (a nested cell, a struct, a null reference) is appended to ``skipped``, or refused when it is None.

    Raises:
      SchemaError: such a cell and ``skipped`` is None (naming the cell).
    """
    import h5py

    refs = dset[()].ravel()  # HDF5 stores MATLAB's dimensions reversed: C order here is MATLAB's column order
    for k, ref in enumerate(refs, 1):
        item = f"{name}{{{k}}}"
        try:
            target = f[ref] if ref else None
        except Exception as e:  # noqa: BLE001
            target = e
        if not isinstance(target, h5py.Dataset) or (
            h5py.check_ref_dtype(target.dtype) is not None and layout.string_cells(target) is None
        ):
            if skipped is not None:
                skipped.append(item)
                continue
            what = (
                "a null reference"
                if target is None
                else (
                    "a nested cell array"
                    if isinstance(target, h5py.Dataset)
                    else f"an unreadable reference ({target})"
                    if isinstance(target, Exception)
                    else "a struct or group"
                )
            )
            raise SchemaError(
                f"Cell {item} holds {what}: only cells of arrays are converted",
                file=path,
                dataset=item,
                hint="store the cell's arrays as separate variables, or choose other datasets with --datasets",
            )
        if layout.is_empty(target):
            continue  # an empty MATLAB array stores its dimensions, not data
        if target.is_virtual or target.id.get_create_plist().get_external_count():
            raise SchemaError(
                f"Cell {item} is stored outside the file (external or virtual storage): refused",
                file=path,
                dataset=item,
            )
        yield item, target  # one at a time: a cell array of 20,000 cells held them all open


def bound_metadata_cache(f, max_bytes: int = WALK_METADATA_CACHE_BYTES) -> None:
    """Caps the metadata cache of the open h5py file ``f`` at ``max_bytes`` (HDF5's ``H5Fset_mdc_config``: initial
    and maximum size; the HDF5 User's Guide, "Metadata Caching in HDF5"), so memory does not grow with the number
    of objects visited."""
    config = f.id.get_mdc_config()
    config.set_initial_size = True
    config.initial_size = config.max_size = max_bytes
    config.min_size = min(config.min_size, max_bytes)
    f.id.set_mdc_config(config)


def _check_dataset_count(count: int, path: str, options: SourceOptions) -> None:
    """Raises SourceError when ``count`` datasets (or datasets-mode items) exceed ``options.max_datasets``."""
    if count > options.max_datasets:
        raise SourceError(
            f"The file holds more than {options.max_datasets:,} datasets (--max_datasets)",
            file=path,
            hint="raise the limit with --max_datasets N if the file is what you meant (each dataset "
            "is walked at planning, and in datasets mode becomes one Example), or name the "
            "datasets to convert with --datasets",
        )


def _log_skipped(skipped: dict, path: str, mode: str) -> None:
    """One WARNING line per file for the datasets skipped, by reason (a NetCDF file has dozens)."""
    parts = [f"{len(v)} {k} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for k, v in skipped.items() if v]
    if parts:
        hint = (
            f"; {MODE_FLAG} datasets converts each scalar and each cell as one Example"
            if mode == "rows mode" and (skipped.get(layout.CELL) or skipped.get(layout.SCALAR))
            else ""
        )
        log.warning("Skipping %s datasets in '%s' (%s)%s", " and ".join(parts), path, mode, hint)


def _dataset_for_read(f, name: str, path: str):
    """``f[name]``, opened (local files) with the input's directory as the prefix of external and virtual
    source files (HDF5 resolves relative external names against the working directory otherwise). HDF5
    refuses a second prefix for a dataset already open, so readers close their files after each shard."""
    import os

    import h5py

    dset = links.resolve(f, name, path, True) if links.has_links(f, name) else f[name]  # (checked at planning)
    ensure_filters(dset)
    if not fileio.is_local(path) or not (dset.id.get_create_plist().get_external_count() or dset.is_virtual):
        return dset  # (remote files have neither: refused at planning)
    fid, dname = dset.file.id, dset.name  # (another file's, through an external link)
    del dset  # closed, so that it can be opened again with the prefixes
    prefix = os.path.dirname(os.path.abspath(path)).encode() + b"/"
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_efile_prefix(prefix)
    dapl.set_virtual_prefix(prefix)
    dapl.set_chunk_cache(10007, HDF5_CHUNK_CACHE_BYTES, 0.75)
    return h5py.Dataset(h5py.h5d.open(fid, dname.encode(), dapl))


def _confined(name: str, path: str, what: str, dataset: str) -> str:
    """The real path of ``name`` (relative names resolve against the input's directory), checked to be a
    regular file inside the input's directory.

    Raises:
      SourceError: outside the directory, missing, or not a regular file (a FIFO or device is never opened).
    """
    import os
    import stat

    base = os.path.dirname(os.path.realpath(path))
    real = os.path.realpath(os.path.join(base, name))
    if not real.startswith(base.rstrip(os.sep) + os.sep):
        raise SourceError(
            f"The {what} '{name}' lies outside the input file's directory: refused, never read",
            file=path,
            dataset=dataset,
            hint="move it next to the HDF5 file (or use h5repack to copy its data into the file)",
        )
    try:
        mode = os.stat(real).st_mode
    except OSError as e:
        raise SourceError(
            f"The {what} '{name}' cannot be opened: {e.strerror}",
            file=path,
            dataset=dataset,
            hint="without it the dataset would read as its fill value",
        ) from None
    if not stat.S_ISREG(mode):
        raise SourceError(
            f"The {what} '{name}' is not a regular file: refused, never opened", file=path, dataset=dataset
        )
    return real


def _check_storage(dset, path: str, name: str, options: SourceOptions) -> None:
    """Refuses a dataset whose values would come from outside the named file, or be invented.

    - external raw storage (``create_dataset(external=...)``): refused unless ``allow_external_storage``,
      and then every external file must be a regular file in the input's directory, big enough;
    - virtual datasets: every source file (other than the file itself) must be a regular file in the
      input's directory (a missing source would read as the fill value); remote inputs are refused;
    - storage not allocated (all or some chunks): read as the fill value, refused unless
      ``allow_fill_value``.

    Raises:
      SourceError: naming the file, the dataset and, for outside files, their path.
    """
    import os

    import h5py

    plist = dset.id.get_create_plist()
    n_external = plist.get_external_count()
    if n_external:
        names = [plist.get_external(i)[0].decode(errors="replace") for i in range(n_external)]
        if not options.allow_external_storage:
            raise SourceError(
                f"The dataset's data is stored in external file(s) {names[:3]}, outside the HDF5 file: refused",
                file=path,
                dataset=name,
                hint="pass --allow_external_storage to read external files that lie in the input file's own directory",
            )
        if not fileio.is_local(path):
            raise SourceError("External storage of a remote HDF5 file is not read", file=path, dataset=name)
        for i, ext in enumerate(names):
            real = _confined(ext, path, "external file", name)
            _, offset, size = plist.get_external(i)
            if size != h5py.h5f.UNLIMITED and offset + size > os.path.getsize(real):
                raise SourceError(
                    f"The external file '{ext}' holds {os.path.getsize(real)} bytes, fewer than the "
                    f"{offset + size} the dataset declares",
                    file=path,
                    dataset=name,
                )
        return
    if dset.is_virtual:
        if not fileio.is_local(path):
            raise SourceError(
                "Virtual datasets of a remote HDF5 file are not read",
                file=path,
                dataset=name,
                hint="copy the file and its source files to a local directory",
            )
        for vmap in dset.virtual_sources():
            if vmap.file_name != ".":
                _confined(vmap.file_name, path, "virtual dataset source file", name)
        return
    declared = dset.size * dset.dtype.itemsize
    if declared == 0 or dset.dtype.kind == "O":
        return
    layout = plist.get_layout()
    if layout == h5py.h5d.CONTIGUOUS:  # (HDF5 itself refuses to open one that extends beyond the file)
        if dset.id.get_offset() is None:
            _unallocated(path, name, "none of its storage is allocated", options)
    elif layout == h5py.h5d.CHUNKED:
        grid = math.prod(-(-n // c) for n, c in zip(dset.shape, dset.chunks))
        allocated = dset.id.get_num_chunks()
        if allocated < grid:
            _unallocated(path, name, f"{grid - allocated} of its {grid} chunks are not allocated", options)


def _unallocated(path: str, name: str, what: str, options: SourceOptions) -> None:
    if not options.allow_fill_value:
        raise SourceError(
            f"The dataset was never (fully) written: {what}, and they would read as the fill value",
            file=path,
            dataset=name,
            hint="pass --allow_fill_value if the fill value is the intended data",
        )


def _hdf5_vlen_check(h5py):
    def check(dtype, where):
        if h5py.check_string_dtype(dtype) is None:
            raise SchemaError(
                "Unsupported dtype: variable-length numeric data", file=where, hint="store it as a fixed-shape dataset"
            )

    return check
