"""HDF5 source: datasets through h5py; nothing outside the named file is read (external storage, virtual
datasets), never-written storage is refused, and a chunk cache per worker thread reads each chunk once."""
from __future__ import annotations

import math

from tfrecord_etl.transforms import fileio
from tfrecord_etl.transforms.codec import flatten_fields
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources.base import (Columns, FileIndex, RowRange, Source, SourceOptions, _check_empty_rows,
                                      _check_names, _leaf_specs, _refuse_special_file, _row_bytes, log)


HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".nc4", ".mat", ".h5ad")
HDF5_CHUNK_CACHE_BYTES = 64 * 2**20  # per open file: a chunk spanning several row ranges is decompressed once


class Hdf5Source(Source):
    """HDF5 datasets through h5py: local files by path (HDF5's own driver, so virtual datasets resolve),
    remote ones over a ``FileSystems`` stream (h5py reads file-like objects).

    Nothing outside the named file is read unless it is safe (issue 10): datasets with external raw
    storage are refused unless ``allow_external_storage`` and every external file lies in the input's own
    directory; virtual datasets (VDS) are read only when every source file lies there too; unallocated
    storage (read as the fill value) is refused unless ``allow_fill_value``; declared sizes are checked
    against the file size. Each worker thread keeps its last file open with a chunk cache of
    ``HDF5_CHUNK_CACHE_BYTES``, so a chunk spanning several row ranges of a shard is decompressed once.
    """

    format_name = "hdf5"
    suffixes = HDF5_SUFFIXES

    def _open(self, path: str):
        import h5py
        _refuse_special_file(path)
        cache = dict(rdcc_nbytes=HDF5_CHUNK_CACHE_BYTES, rdcc_nslots=10007)
        if fileio.is_local(path):
            try:
                return h5py.File(path, "r", **cache), None
            except Exception as e:
                raise SourceError(f"Not a readable HDF5 file: {e}", file=path,
                                  hint="check that the file is HDF5 and complete") from None
        stream = fileio.open_read(path)
        try:
            return h5py.File(stream, "r", **cache), stream
        except Exception as e:
            stream.close()
            raise SourceError(f"Not a readable HDF5 file: {e}", file=path,
                              hint="check that the file is HDF5 and complete") from None

    def index(self, path: str) -> FileIndex:
        import h5py
        f, stream = self._open(path)
        try:
            names = list(self.options.datasets or self._all_datasets(f, path))
            specs, lengths, chunk_rows, data_row_bytes = [], {}, 1, 0
            for name in names:
                dset = self._dataset(f, name, path)
                if dset.ndim == 0:
                    raise SchemaError("Dataset is a scalar (0-d): it has no rows", file=path, dataset=name,
                                      hint="choose datasets with a leading axis with --datasets")
                _check_filters(dset, path, name)
                try:
                    dtype = dset.dtype
                except TypeError as e:
                    raise SchemaError(f"Unsupported HDF5 type: {e}", file=path, dataset=name) from None
                _check_storage(dset, path, name, self.options)
                data_row_bytes += dtype.itemsize * math.prod(dset.shape[1:])
                specs += _leaf_specs(name.strip("/"), dtype, dset.shape[1:], f"{path}, dataset '{name}'",
                                     _hdf5_vlen_check(h5py))
                lengths[name] = dset.shape[0]
                if dset.chunks:
                    chunk_rows = max(chunk_rows, dset.chunks[0])
        finally:
            f.close()
            if stream is not None:
                stream.close()
        _check_names(specs, path)
        if len(set(lengths.values())) > 1:
            items = list(lengths.items())
            listing = ", ".join(f"'{n}': {v}" for n, v in items[:6]) + \
                (f" and {len(items) - 6} more" if len(items) > 6 else "")  # one short line, not 1,200 characters
            raise SchemaError(f"Datasets have different leading lengths ({listing})", file=path,
                              hint="choose datasets of equal length with --datasets; python -m pipelines.inspect "
                                   "FILE lists the row groups and the flag for each")
        rows = next(iter(lengths.values()))
        _check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(path, rows, tuple(specs), _row_bytes(specs), chunk_rows, tuple(names))

    def _all_datasets(self, f, path: str) -> list[str]:
        """Every dataset with a leading axis, depth first in name order; links are not followed.

        Dimension scales (netCDF-4 coordinates) and 0-d datasets are skipped with one warning (see
        :func:`walk` for the order and the links).
        """
        import h5py
        found, skipped = [], {"scalar": [], "dimension-scale": []}
        for full, _, obj in walk(f):
            if isinstance(obj, Exception):
                raise SchemaError(f"Cannot open HDF5 object: {obj}", file=path, dataset=full,
                                  hint="choose other datasets with --datasets") from None
            if isinstance(obj, h5py.Dataset):
                if obj.attrs.get("CLASS") == b"DIMENSION_SCALE" or obj.ndim == 0:
                    skipped["scalar" if obj.ndim == 0 else "dimension-scale"].append(full)
                    continue
                found.append(full)
        parts = [f"{len(v)} {k} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for k, v in skipped.items() if v]
        if parts:  # one line per file, not one per dataset (a NetCDF file has dozens)
            log.warning("Skipping %s datasets in '%s'", " and ".join(parts), path)
        if not found:
            raise SchemaError("The file holds no dataset with rows", file=path)
        return found

    def _dataset(self, f, name: str, path: str):
        import h5py
        try:
            obj = f[name]
        except KeyError:
            raise SourceError("No such dataset", file=path, dataset=name,
                              hint="python -m pipelines.inspect FILE lists its datasets; then pass --datasets") from None
        except Exception as e:
            raise SchemaError(f"Cannot open HDF5 object: {e}", file=path, dataset=name) from None
        if not isinstance(obj, h5py.Dataset):
            raise SourceError("Not a dataset (a group?)", file=path, dataset=name)
        return obj

    def _opened(self, path: str):
        """This worker thread's open file ``path`` (the previous one is closed when another is asked for)."""
        current = getattr(self._local, "open", None)
        if current is not None and current[0] == path:
            return current[1]
        self.close()
        f, stream = self._open(path)
        self._local.open = (path, f, stream, {})
        return f

    def _opened_dataset(self, path: str, name: str):
        """The open dataset ``name`` of this thread's open file: HDF5's chunk cache belongs to the open
        dataset, so it stays open between the row ranges of a shard."""
        f = self._opened(path)
        datasets = self._local.open[3]
        if name not in datasets:
            datasets[name] = _dataset_for_read(f, name, path)
        return datasets[name]

    def close(self) -> None:
        current = getattr(self._local, "open", None)
        self._local.open = None
        if current is not None:
            current[3].clear()
            current[1].close()
            if current[2] is not None:
                current[2].close()

    def read(self, rr: RowRange) -> Columns:
        columns = {}
        for name in rr.items:
            try:
                data = self._opened_dataset(rr.path, name)[rr.start:rr.stop]
            except Exception as e:
                self.close()
                raise SourceError(f"Cannot read rows {rr.start}-{rr.stop - 1}: {e}", file=rr.path,
                                  dataset=name, hint="the file may be corrupt or need an HDF5 filter "
                                  "plugin (e.g. pip install hdf5plugin)") from None
            columns.update(flatten_fields(name.strip("/"), data))
        return columns


def walk(f):
    """Yields ``(path, link, object)`` for every object below the open file ``f``, depth first in name order.

    ``object`` is the h5py Group or Dataset, None for a soft or external link (never followed), or the exception
    raised opening it. The walk keeps its own stack (1,200 nested groups need no recursion) and visits a group
    reached twice by hard links once (a link to an ancestor is no cycle). Shared by the source's index and the
    tree of ``pipelines.inspect FILE.h5`` (``hdf5tree``).
    """
    import h5py
    seen = {f.id}
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
            if obj.id in seen:
                continue
            seen.add(obj.id)
            stack.append((iter(sorted(obj.keys())), obj, full))
        yield full, link, obj


def _dataset_for_read(f, name: str, path: str):
    """``f[name]``, opened (local files) with the input's directory as the prefix of external and virtual
    source files (HDF5 resolves relative external names against the working directory otherwise). HDF5
    refuses a second prefix for a dataset already open, so readers close their files after each shard."""
    import os

    import h5py
    dset = f[name]
    if not fileio.is_local(path) or not (dset.id.get_create_plist().get_external_count() or dset.is_virtual):
        return dset  # (remote files have neither: refused at planning)
    del dset  # closed, so that it can be opened again with the prefixes
    prefix = os.path.dirname(os.path.abspath(path)).encode() + b"/"
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_efile_prefix(prefix)
    dapl.set_virtual_prefix(prefix)
    dapl.set_chunk_cache(10007, HDF5_CHUNK_CACHE_BYTES, 0.75)
    return h5py.Dataset(h5py.h5d.open(f.id, name.encode(), dapl))


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
        raise SourceError(f"The {what} '{name}' lies outside the input file's directory: refused, never read",
                          file=path, dataset=dataset, hint="move it next to the HDF5 file (or use h5repack to "
                                                           "copy its data into the file)")
    try:
        mode = os.stat(real).st_mode
    except OSError as e:
        raise SourceError(f"The {what} '{name}' cannot be opened: {e.strerror}", file=path, dataset=dataset,
                          hint="without it the dataset would read as its fill value") from None
    if not stat.S_ISREG(mode):
        raise SourceError(f"The {what} '{name}' is not a regular file: refused, never opened", file=path,
                          dataset=dataset)
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
            raise SourceError(f"The dataset's data is stored in external file(s) {names[:3]}, outside the HDF5 "
                              f"file: refused", file=path, dataset=name,
                              hint="pass --allow_external_storage to read external files that lie in the "
                                   "input file's own directory")
        if not fileio.is_local(path):
            raise SourceError("External storage of a remote HDF5 file is not read", file=path, dataset=name)
        for i, ext in enumerate(names):
            real = _confined(ext, path, "external file", name)
            _, offset, size = plist.get_external(i)
            if size != h5py.h5f.UNLIMITED and offset + size > os.path.getsize(real):
                raise SourceError(f"The external file '{ext}' holds {os.path.getsize(real)} bytes, fewer than the "
                                  f"{offset + size} the dataset declares", file=path, dataset=name)
        return
    if dset.is_virtual:
        if not fileio.is_local(path):
            raise SourceError("Virtual datasets of a remote HDF5 file are not read", file=path, dataset=name,
                              hint="copy the file and its source files to a local directory")
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
        raise SourceError(f"The dataset was never (fully) written: {what}, and they would read as the fill "
                          "value", file=path, dataset=name,
                          hint="pass --allow_fill_value if the fill value is the intended data")


def _hdf5_vlen_check(h5py):
    def check(dtype, where):
        if h5py.check_string_dtype(dtype) is None:
            raise SchemaError("Unsupported dtype: variable-length numeric data", file=where,
                              hint="store it as a fixed-shape dataset")
    return check


def _check_filters(dset, path: str, name: str) -> None:
    import h5py
    plist = dset.id.get_create_plist()
    for i in range(plist.get_nfilters()):
        code, _, _, fname = plist.get_filter(i)
        if not h5py.h5z.filter_avail(code):
            label = fname.decode(errors="replace") if isinstance(fname, bytes) else fname
            raise SourceError(f"HDF5 filter {code} ({label}) is not available here", file=path, dataset=name,
                              hint="install a plugin for it (e.g. pip install hdf5plugin) or recompress "
                                   "the file with gzip (h5repack -f GZIP=4)")

