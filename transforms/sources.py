"""Array sources: index a file (rows, features), plan row ranges, read one row range.

Sources know files and row ranges; the PTransforms in ``transforms/beam_io.py`` only wire them into
Beam. Files are opened through Beam's ``FileSystems`` (``transforms/fileio.py``), so gs:// and s3://
paths take the same code path as local ones. Input is never unpickled: object arrays are refused.

Formats and modes:

* ``hdf5``: row i of every chosen dataset is one Example. Compound dtypes become one feature per leaf
  field (``dataset/field/subfield``); variable-length strings become ``bytes`` features.
* ``npz`` ``rows``: row i of every member is one Example; ``arrays``: every member is one Example
  with features ``key`` (the member name) and ``array``.
* ``npy`` ``rows``: rows of one array (memory-mapped when local); ``files``: every file is one
  Example with features ``key`` (the file name without ``.npy``) and ``array``.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import struct
import threading
import zipfile
import zlib
from typing import BinaryIO, Sequence

import numpy as np

from transforms import fileio
from transforms.codec import VLEN_BYTES, FeatureSpec, flatten_fields, normalize_dtype
from transforms.errors import SchemaError, SourceError

log = logging.getLogger(__name__)

FORMATS = ("hdf5", "npz", "npy")
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".nc4", ".mat", ".h5ad")
DEFAULT_RANGE_BYTES = 8 * 2**20  # see README Performance: 64 MB ranges cost 1-1.5 s more kernel time per GB
# npz: uncompressed / compressed bytes of a member and of the whole archive. Deflate tops out near 1032
# (all zeros); real data measured with np.savez_compressed: float32 noise 1.1, int64 labels 11-27, 1% bool
# mask 49, 0.1% sparse uint8 image 264, a constant int64 array 684.
DEFAULT_MAX_COMPRESSION_RATIO = 500.0
RATIO_CHECK_MIN_BYTES = 2**20  # npz members of at most this many uncompressed bytes are never refused by ratio
DEFAULT_MAX_EMPTY_ROWS = 10**6  # rows mode: rows allowed when every row holds zero bytes
HDF5_CHUNK_CACHE_BYTES = 64 * 2**20  # per open file: a chunk spanning several row ranges is decompressed once
KEY, ARRAY = "key", "array"


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """How to read the inputs. ``target_range_bytes``: the size of one row range, in bytes."""

    format: str | None = None  # None: from the file suffix
    datasets: tuple[str, ...] | None = None
    npz_mode: str = "rows"
    npy_mode: str = "rows"
    target_range_bytes: int = DEFAULT_RANGE_BYTES
    max_compression_ratio: float = DEFAULT_MAX_COMPRESSION_RATIO  # npz members (uncompressed / compressed)
    max_empty_rows: int = DEFAULT_MAX_EMPTY_ROWS  # rows mode, rows of zero bytes
    allow_external_storage: bool = False  # hdf5: read external raw files confined to the input's directory
    allow_fill_value: bool = False  # hdf5: read unallocated storage as the fill value


@dataclasses.dataclass(frozen=True)
class RowRange:
    """Rows ``[start, stop)`` of ``path``; in ``arrays``/``files`` modes, rows are members or files.

    ``items`` names the datasets (hdf5), members (npz) or, in ``files`` mode (``item_files``), the
    files of the range.
    """

    path: str
    start: int
    stop: int
    items: tuple[str, ...] = ()
    item_files: bool = False

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def describe(self) -> str:
        return f"rows {self.start}-{self.stop - 1} of '{self.path}'"


@dataclasses.dataclass(frozen=True)
class FileIndex:
    """What planning learns of one file: rows, features (encoding not yet chosen), bytes per row."""

    path: str
    num_rows: int
    specs: tuple[FeatureSpec, ...]
    row_bytes: int
    chunk_rows: int = 1
    items: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()  # arrays/files modes: bytes of each row
    item_files: bool = False  # files mode: items are the files, one per row


Columns = dict  # feature name -> np.ndarray (rows, *shape) or list of per-row values


def format_of(path: str, options: SourceOptions) -> str:
    if options.format:
        return options.format
    lower = path.lower()
    if lower.endswith(".npz"):
        return "npz"
    if lower.endswith(".npy"):
        return "npy"
    if lower.endswith(HDF5_SUFFIXES):
        return "hdf5"
    raise SourceError("Cannot tell the input format from the file suffix", file=path,
                      hint=f"name it .h5/.npz/.npy or pass --format one of {FORMATS}")


def plan_row_ranges(index: FileIndex, target_bytes: int, start: int = 0, stop: int | None = None) -> list[RowRange]:
    """Splits a file into row ranges of about ``target_bytes`` each, aligned to HDF5 chunk rows.

    ``start``/``stop`` (rows) limit the split to part of a file whose rows are all ``row_bytes`` long
    (not to files of per-row ``sizes``); ranges then start at ``start`` and end at ``stop``.
    """
    if index.sizes:  # one row per member/file: group consecutive rows up to the target size
        ranges, start, acc = [], 0, 0
        for i, size in enumerate(index.sizes):
            if i > start and acc + size > target_bytes:
                ranges.append(RowRange(index.path, start, i, index.items[start:i], index.item_files))
                start, acc = i, 0
            acc += size
        if index.num_rows > start:
            ranges.append(RowRange(index.path, start, index.num_rows, index.items[start:], index.item_files))
        return ranges
    stop = index.num_rows if stop is None else stop
    rows = max(1, target_bytes // max(1, index.row_bytes))
    if index.chunk_rows > 1 and rows > index.chunk_rows:
        rows -= rows % index.chunk_rows
    return [RowRange(index.path, s, min(s + rows, stop), index.items) for s in range(start, stop, rows)]


def merge_specs(indexes: Sequence[FileIndex], loose: bool) -> tuple[FeatureSpec, ...]:
    """The features shared by all files.

    With ``loose`` (arrays/files modes) dtypes and dimensions that differ become None; otherwise any
    difference is a SchemaError naming both files.
    """
    first = indexes[0]
    specs = {s.name: s for s in first.specs}
    for other in indexes[1:]:
        theirs = {s.name: s for s in other.specs}
        if set(theirs) != set(specs):
            raise SchemaError(f"Files have different features: {sorted(specs)} in '{first.path}' but "
                              f"{sorted(theirs)} in '{other.path}'", hint="convert them in separate runs")
        for name, spec in specs.items():
            o = theirs[name]
            if spec.dtype == o.dtype and spec.shape == o.shape:
                continue
            if not loose:
                raise SchemaError(f"Feature '{name}' is {spec.dtype} {spec.shape} in '{first.path}' but "
                                  f"{o.dtype} {o.shape} in '{other.path}'", hint="convert them in separate runs")
            specs[name] = _loosen(spec, o)
    return tuple(specs.values())


def _loosen(a: FeatureSpec, b: FeatureSpec) -> FeatureSpec:
    dtype = a.dtype if a.dtype == b.dtype else None
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        shape = None
    else:
        shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
    return dataclasses.replace(a, dtype=dtype, shape=shape)


def _row_spec(name: str, dtype: np.dtype, row_shape: tuple, where: str) -> FeatureSpec:
    return FeatureSpec(name, normalize_dtype(dtype, where), tuple(int(d) for d in row_shape))


def _leaf_specs(name: str, dtype: np.dtype, row_shape: tuple, where: str, vlen_check=None) -> list[FeatureSpec]:
    """Feature specs of one array column: one per leaf field of a structured dtype."""
    if dtype.subdtype is not None:
        base, sub = dtype.subdtype
        return _leaf_specs(name, base, tuple(row_shape) + tuple(sub), where, vlen_check)
    if dtype.fields is not None:
        out = []
        for field in dtype.names:
            out.extend(_leaf_specs(f"{name}/{field}", dtype.fields[field][0], row_shape,
                                   f"{where}, field '{field}'", vlen_check))
        return out
    if dtype.kind == "O" and vlen_check is not None:
        vlen_check(dtype, where)
        return [FeatureSpec(name, VLEN_BYTES, tuple(int(d) for d in row_shape), "list")]
    return [_row_spec(name, dtype, row_shape, where)]


def _row_bytes(specs: Sequence[FeatureSpec]) -> int:
    total = 0
    for s in specs:
        itemsize = 64 if s.dtype in (None, VLEN_BYTES) else np.dtype(s.dtype).itemsize
        total += itemsize * (s.size or 1)
    return total


# ----------------------------------------------------------------------------------------------
# .npy headers and strided row reads (shared by .npy and .npz)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _NpyHeader:
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype
    data_offset: int


def _read_npy_header(stream: BinaryIO, where: str) -> _NpyHeader:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(stream)
        else:
            shape, fortran, dtype = fmt._read_array_header(stream, version)  # 3.0: utf-8 field names
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise SourceError(f"Not a readable .npy array: {e}", file=where,
                          hint="the file is truncated or not written by numpy.save") from None
    if dtype.hasobject:
        raise SchemaError("Array holds Python objects (a pickled object array); refused: input is never "
                          "unpickled", file=where, hint="save the data with a numeric or string dtype")
    return _NpyHeader(tuple(shape), fortran, dtype, stream.tell())


def _read_rows(stream: BinaryIO, h: _NpyHeader, start: int, stop: int, where: str,
               column_stream=None) -> np.ndarray:
    """Rows ``[start, stop)`` of an array stored after ``h.data_offset``; reads only those bytes.

    C order: one seek and one read. Fortran order: a seek and a read per column of the rows (the
    first axis varies fastest there), reassembled in C order. ``column_stream(c)``, when given,
    returns the stream to read column ``c`` from (one forward-only decompressor per column of a
    compressed npz member, so reading ranges in order decompresses each byte once).

    Raises:
      SourceError: fewer bytes than the header declares (naming the byte offset and the rows).
    """
    k, rest = stop - start, h.shape[1:]
    item = h.dtype.itemsize
    ncols = math.prod(rest)

    def read(offset, nbytes, f=stream):
        f.seek(h.data_offset + offset)
        data = f.read(nbytes)
        if len(data) != nbytes:
            raise SourceError(f"Truncated array data: {len(data)} of {nbytes} bytes at byte {offset}",
                              file=where, rows=f"{start}-{stop - 1}", hint="the file was cut short")
        return data

    if not h.fortran or len(h.shape) <= 1:
        return np.frombuffer(read(start * ncols * item, k * ncols * item), dtype=h.dtype).reshape((k, *rest))
    cols = np.empty((ncols, k), dtype=h.dtype)
    for c in range(ncols):
        f = column_stream(c) if column_stream is not None else stream
        cols[c] = np.frombuffer(read((c * h.shape[0] + start) * item, k * item, f), dtype=h.dtype)
    return np.ascontiguousarray(cols.T.reshape((k, *rest), order="F"))


def _refuse_special_file(path: str) -> None:
    """Refuses a local input that is not a regular file (FIFO, device, socket) before opening it: opening a
    FIFO blocks forever and a device has no end. Remote paths are objects, always regular.

    Raises:
      SourceError: naming the file and what it is.
    """
    if not fileio.is_local(path):
        return
    import os
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise SourceError(f"Cannot open file: {e.strerror}", file=path) from None
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a directory" if stat.S_ISDIR(mode) else "not a file")
        raise SourceError(f"Not a regular file ({kind}): refused, never opened", file=path,
                          hint="name regular .npy/.npz files as inputs")


def _data_bytes(h: _NpyHeader) -> int:
    """Bytes of the array data the header declares (exact: Python ints, no overflow)."""
    return h.dtype.itemsize * math.prod(h.shape)


def _check_declared(h: _NpyHeader, present: int, path: str, member: str | None = None) -> None:
    """Refuses a header that declares more bytes (header + shape x itemsize) than are present.

    ``present``: the file size (.npy) or the member's uncompressed size in the zip directory (.npz).

    Raises:
      SourceError: naming the file (and member), the declared shape and dtype, declared and present bytes.
    """
    declared = h.data_offset + _data_bytes(h)
    if declared > present:
        what = "member" if member is not None else "file"
        raise SourceError(f"Truncated array data: the .npy header declares shape {h.shape} of {h.dtype.str}, "
                          f"{declared} bytes with the header, but the {what} holds {present} bytes",
                          file=path, member=member,
                          hint="the file is truncated or its header is corrupt; rewrite it with numpy.save")


def _check_empty_rows(num_rows: int, data_row_bytes: int, options: "SourceOptions", path: str) -> None:
    """Rows of zero bytes (shape ``(N, 0)``) are not bounded by the file size: ``N`` is capped by
    ``options.max_empty_rows`` (``--max_empty_rows``).

    Raises:
      SourceError: more such rows than the limit (naming the file, the rows and the flag).
    """
    if data_row_bytes == 0 and num_rows > options.max_empty_rows:
        raise SourceError(f"Every row holds zero bytes and the header declares {num_rows} rows: more than "
                          f"the limit of {options.max_empty_rows} empty rows", file=path,
                          hint="raise --max_empty_rows if you really want that many empty Examples")


def _read_whole(stream: BinaryIO, h: _NpyHeader, where: str) -> np.ndarray:
    """The whole array (a 0-d array too), in C order."""
    flat = dataclasses.replace(h, shape=h.shape or (1,))
    return _read_rows(stream, flat, 0, flat.shape[0], where).reshape(h.shape)


# ----------------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------------

class Source:
    """Base: ``index(path)`` learns a file's rows and features; ``read(row_range)`` returns columns."""

    loose = False  # arrays/files modes: dtype and shape may vary between rows

    def __init__(self, options: SourceOptions):
        self.options = options
        self._local = threading.local()  # what a worker thread keeps open between row ranges

    def __getstate__(self):  # open files stay with the worker that opened them
        state = dict(self.__dict__)
        state.pop("_local", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    def index(self, path: str) -> FileIndex:
        raise NotImplementedError

    def read(self, rr: RowRange) -> Columns:
        raise NotImplementedError

    def close(self) -> None:
        """Closes what this worker thread keeps open between row ranges (reading again reopens it)."""


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
            listing = ", ".join(f"'{n}': {v}" for n, v in lengths.items())
            raise SchemaError(f"Datasets have different leading lengths ({listing})", file=path,
                              hint="choose datasets of equal length with --datasets")
        rows = next(iter(lengths.values()))
        _check_empty_rows(rows, data_row_bytes, self.options, path)
        return FileIndex(path, rows, tuple(specs), _row_bytes(specs), chunk_rows, tuple(names))

    def _all_datasets(self, f, path: str) -> list[str]:
        """Every dataset with a leading axis, depth first in name order; links are not followed.

        Dimension scales (netCDF-4 coordinates) and 0-d datasets are skipped with a warning. The walk
        keeps its own stack (1,200 nested groups need no recursion) and visits a group reached twice by
        hard links once (a link to an ancestor is no cycle).
        """
        import h5py
        found, seen = [], {f.id}
        stack = [(iter(sorted(f.keys())), f, "")]
        while stack:
            keys, group, prefix = stack[-1]
            key = next(keys, None)
            if key is None:
                stack.pop()
                continue
            full = f"{prefix}/{key}"
            if not isinstance(group.get(key, getlink=True), h5py.HardLink):
                continue
            try:
                obj = group[key]
            except Exception as e:
                raise SchemaError(f"Cannot open HDF5 object: {e}", file=path, dataset=full,
                                  hint="choose other datasets with --datasets") from None
            if isinstance(obj, h5py.Group):
                if obj.id not in seen:
                    seen.add(obj.id)
                    stack.append((iter(sorted(obj.keys())), obj, full))
            elif isinstance(obj, h5py.Dataset):
                if obj.attrs.get("CLASS") == b"DIMENSION_SCALE" or obj.ndim == 0:
                    log.warning("Skipping %s dataset '%s' in '%s'",
                                "scalar" if obj.ndim == 0 else "dimension-scale", full, path)
                    continue
                found.append(full)
        if not found:
            raise SchemaError("The file holds no dataset with rows", file=path)
        return found

    def _dataset(self, f, name: str, path: str):
        import h5py
        try:
            obj = f[name]
        except KeyError:
            raise SourceError("No such dataset", file=path, dataset=name,
                              hint="list the datasets with h5ls, then pass --datasets") from None
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


def _check_names(specs: Sequence[FeatureSpec], path: str) -> None:
    seen = set()
    for s in specs:
        if s.name in seen:
            raise SchemaError(f"Duplicate feature name '{s.name}'", file=path)
        seen.add(s.name)


class _OpenArchive:
    """One worker thread's open ``.npz``: the archive stream, its ZipFile and the open member streams.

    Member streams are kept open between row ranges, so ranges read in order (a planned shard)
    decompress each byte once: a range after the stream's position skips forward, one before it
    makes zipfile rewind and decompress from the member's start.
    """

    def __init__(self, path: str, stream, zf: zipfile.ZipFile):
        self.path, self.stream, self.zf = path, stream, zf
        self.members: dict = {}  # (member, column or -1) -> ZipExtFile
        self.headers: dict = {}  # member -> (_NpyHeader, ZipInfo, archive offset of its data or None)

    def close(self) -> None:
        for m in self.members.values():
            m.close()
        self.zf.close()
        self.stream.close()


MAX_COLUMN_STREAMS = 256  # Fortran-order compressed members: one decompressor per column up to this many


class _Inflater:
    """A forward stream over a deflated zip member's bytes that can be forked (the zlib state is copied).

    Fortran-order members keep one per column: the stream of column ``c`` is forked from column
    ``c - 1``'s, so reading ranges in order decompresses the member at most twice (the fork chain passes
    every column once, then each column's own stream) whatever the number of columns (a fresh
    decompressor per column would skip ``c`` columns each: ``ncols / 2`` passes). A seek backwards
    restarts from the member's start. The stream that reaches the member's end has passed every byte
    and checks the zip CRC-32 (BadZipFile), as zipfile does. Memory: the zlib window (32 KB) and one
    compressed chunk (64 KB) per stream.
    """

    CHUNK = 64 * 1024

    def __init__(self, raw, start: int, compress_size: int, size: int, crc: int):
        self._raw, self._start, self._csize, self._size, self._crc = raw, start, compress_size, size, crc
        self._reset()

    def _reset(self) -> None:
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        self._cpos, self._pos, self._tail, self._running = 0, 0, b"", 0

    def fork(self) -> "_Inflater":
        new = copy.copy(self)
        new._d = self._d.copy()
        return new

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._tail = b""

    def _produce(self, n: int) -> bytes:
        """Up to ``n`` (> 0) more bytes; b"" at the member's end."""
        while not self._d.eof:
            if not self._tail:
                if self._cpos >= self._csize:
                    break
                self._raw.seek(self._start + self._cpos)
                self._tail = self._raw.read(min(self.CHUNK, self._csize - self._cpos))
                if not self._tail:
                    raise EOFError("the archive ends inside the member's compressed data")
                self._cpos += len(self._tail)
            out = self._d.decompress(self._tail, n)
            self._tail = self._d.unconsumed_tail
            if out:
                self._pos += len(out)
                self._running = zlib.crc32(out, self._running)
                if self._pos >= self._size and self._running != self._crc:  # every byte passed this stream
                    raise zipfile.BadZipFile("Bad CRC-32 of the member's data: the archive is corrupt")
                return out
        return b""

    def read(self, n: int) -> bytes:
        n = max(0, min(n, self._size - self._pos))
        parts = []
        while n > 0:
            out = self._produce(n)
            if not out:
                break
            parts.append(out)
            n -= len(out)
        return b"".join(parts)

    def seek(self, target: int) -> int:
        if target < self._pos:
            self._reset()
        while self._pos < min(target, self._size):
            if not self._produce(min(target - self._pos, 2**20)):
                break
        return self._pos


class NpzSource(Source):
    """``.npz`` archives (np.savez and np.savez_compressed), members read through zipfile.

    Planning checks every member against the zip directory (no duplicate names, declared sizes no
    larger than the member, compression ratio at most ``max_compression_ratio``). Reading keeps one
    archive per worker thread open with its member decompressors (see :class:`_OpenArchive`); stored
    (uncompressed) members are read straight from the archive at their offset.
    """

    def __init__(self, options: SourceOptions):
        super().__init__(options)
        self.loose = options.npz_mode == "arrays"

    def _zip(self, path: str):
        _refuse_special_file(path)
        stream = fileio.open_read(path)
        try:
            return zipfile.ZipFile(stream), stream
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            stream.close()
            raise SourceError(f"Not a valid .npz (zip) archive: {e}", file=path) from None

    def _members(self, zf, path) -> list[str]:
        names = [n for n in zf.namelist() if n.endswith(".npy")]
        seen = set()
        for n in names:
            if n in seen:
                raise SourceError(f"The archive holds two members named '{n}': one would hide the other", file=path,
                                  member=n[:-4], hint="rewrite the archive with distinct member names")
            seen.add(n)
        if not names:
            raise SchemaError("The archive holds no .npy member", file=path)
        return names

    def _check_member(self, info: zipfile.ZipInfo, archive_bytes: int, path: str) -> None:
        """Compressed size within the archive; compression ratio within ``max_compression_ratio``."""
        member = info.filename[:-4]
        if info.compress_size > archive_bytes:
            raise SourceError(f"The zip directory declares {info.compress_size} compressed bytes, more than the "
                              f"archive's {archive_bytes} bytes", file=path, member=member,
                              hint="the archive is truncated or corrupt")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise SourceError(f"Stored (uncompressed) member declares {info.file_size} bytes but "
                                  f"{info.compress_size} stored bytes", file=path, member=member,
                                  hint="the archive's zip directory is corrupt")
            return
        if info.file_size <= RATIO_CHECK_MIN_BYTES:
            return
        ratio = info.file_size / max(1, info.compress_size)
        limit = self.options.max_compression_ratio
        if ratio > limit:
            raise SourceError(f"Member expands {ratio:.0f}x ({info.compress_size} compressed bytes to "
                              f"{info.file_size}), more than --max_compression_ratio {limit:g} (a zip bomb?)",
                              file=path, member=member,
                              hint="if the data is genuine (e.g. mostly zeros), raise --max_compression_ratio")

    def _check_total(self, zf, archive_bytes: int, path: str) -> None:
        """The archive as a whole within ``max_compression_ratio`` (many members just under the 1 MiB
        floor of the per-member check would otherwise add up to any size)."""
        total = sum(i.file_size for i in zf.infolist())
        limit = self.options.max_compression_ratio
        if total > RATIO_CHECK_MIN_BYTES and total > limit * max(1, archive_bytes):
            raise SourceError(f"The archive expands {total / max(1, archive_bytes):.0f}x in total ({archive_bytes} "
                              f"bytes to {total}), more than --max_compression_ratio {limit:g} (a zip bomb?)",
                              file=path, hint="if the data is genuine (e.g. mostly zeros), raise "
                              "--max_compression_ratio")

    def _header(self, zf, member: str, path: str) -> _NpyHeader:
        where = f"{path}, member '{member[:-4]}'"
        try:
            with zf.open(member) as m:
                return _read_npy_header(m, where)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
            raise SourceError(f"Cannot read member: {e}", file=path, member=member[:-4]) from None
        except (NotImplementedError, RuntimeError) as e:  # unknown compression method, encrypted member
            raise SourceError(f"Cannot read member: {e}", file=path, member=member[:-4],
                              hint="rewrite it with numpy.savez or numpy.savez_compressed") from None

    def index(self, path: str) -> FileIndex:
        """Learns rows and features; checks names, declared sizes and ratios (see the class).

        Raises:
          SourceError: not a zip, duplicate member names, a header declaring more bytes than the member
            holds, a member's ratio above ``max_compression_ratio``, too many rows of zero bytes.
          SchemaError: no .npy member, 0-d or differing members in rows mode, object arrays.
        """
        zf, stream = self._zip(path)
        with stream, zf:
            archive_bytes = stream.seek(0, 2)
            members = self._members(zf, path)
            for m in members:
                self._check_member(zf.getinfo(m), archive_bytes, path)
            self._check_total(zf, archive_bytes, path)
            headers = {}
            for m in members:
                headers[m] = self._header(zf, m, path)
                _check_declared(headers[m], zf.getinfo(m).file_size, path, m[:-4])
        if self.loose:
            sizes = tuple(_data_bytes(h) for h in headers.values())
            specs = (FeatureSpec(KEY, VLEN_BYTES, (), "list"), _merged_array_spec(headers.values(), path))
            return FileIndex(path, len(members), specs, max(sizes), 1, tuple(members), sizes)
        specs, lengths = [], {}
        for m, h in headers.items():
            if not h.shape:
                raise SchemaError("Member is 0-d: rows mode needs a leading axis", file=path, member=m[:-4],
                                  hint="use --npz_mode arrays (each member -> one Example)")
            lengths[m[:-4]] = h.shape[0]
            specs += _leaf_specs(m[:-4], h.dtype, h.shape[1:], f"{path}, member '{m[:-4]}'")
        _check_names(specs, path)
        if len(set(lengths.values())) > 1:
            raise SchemaError(f"Members have different leading lengths ({lengths})", file=path,
                              hint="use --npz_mode arrays (each member -> one Example)")
        num_rows = next(iter(lengths.values()))
        _check_empty_rows(num_rows, sum(_data_bytes(h) // max(1, h.shape[0]) for h in headers.values()),
                          self.options, path)
        return FileIndex(path, num_rows, tuple(specs), _row_bytes(specs), 1, tuple(members))

    # -- reading -----------------------------------------------------------------------------

    def _archive(self, path: str) -> _OpenArchive:
        """This thread's open archive for ``path`` (the previous one is closed: one open at a time)."""
        current = getattr(self._local, "archive", None)
        if current is not None and current.path == path:
            return current
        self.close()
        zf, stream = self._zip(path)
        self._local.archive = _OpenArchive(path, stream, zf)
        return self._local.archive

    def close(self) -> None:
        """Closes this thread's open archive, if any (reading again reopens it)."""
        current = getattr(self._local, "archive", None)
        self._local.archive = None
        if current is not None:
            current.close()

    def _member_header(self, arc: _OpenArchive, member: str):
        if member not in arc.headers:
            info = arc.zf.getinfo(member)
            h = self._header(arc.zf, member, arc.path)
            start = None
            if info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) and not info.flag_bits & 1:
                start = _member_data_start(arc.stream, info, arc.path)
            arc.headers[member] = (h, info, start)
        return arc.headers[member]

    def _column_inflater(self, arc: _OpenArchive, member: str, c: int) -> _Inflater:
        """Column ``c``'s stream of a deflated Fortran-order member, forked from column ``c - 1``'s."""
        key = (member, c)
        if key not in arc.members:
            _, info, data_start = arc.headers[member]
            prev = arc.members.get((member, c - 1))
            arc.members[key] = prev.fork() if isinstance(prev, _Inflater) else \
                _Inflater(arc.stream, data_start, info.compress_size, info.file_size, info.CRC)
        return arc.members[key]

    def _member_stream(self, arc: _OpenArchive, member: str, slot: int = -1):
        key = (member, slot)
        if key not in arc.members:
            arc.members[key] = arc.zf.open(member)
        return arc.members[key]

    def _read_member(self, arc: _OpenArchive, member: str, start: int | None, stop: int | None) -> np.ndarray:
        """Rows ``[start, stop)`` of a member (the whole array when ``start`` is None)."""
        h, info, data_start = self._member_header(arc, member)
        where = f"{arc.path}, member '{member[:-4]}'"
        if start is None:
            h = dataclasses.replace(h, shape=h.shape or (1,))
            start, stop, whole = 0, h.shape[0], True
        else:
            whole = False
        ncols = math.prod(h.shape[1:])
        if info.compress_type == zipfile.ZIP_STORED and data_start is not None:  # random access into the archive
            raw = dataclasses.replace(h, data_offset=data_start + h.data_offset)
            data = _read_rows(arc.stream, raw, start, stop, where)
        elif h.fortran and len(h.shape) > 1 and 1 < ncols <= MAX_COLUMN_STREAMS and not whole:
            if info.compress_type == zipfile.ZIP_DEFLATED and data_start is not None:
                column_stream = functools.partial(self._column_inflater, arc, member)
            else:  # bzip2/lzma: a fresh decompressor per column (each skips to its column once)
                column_stream = functools.partial(self._member_stream, arc, member)
            data = _read_rows(column_stream(0), h, start, stop, where, column_stream)
        else:
            data = _read_rows(self._member_stream(arc, member), h, start, stop, where)
        return data.reshape(arc.headers[member][0].shape) if whole else data

    def read(self, rr: RowRange) -> Columns:
        """The columns of ``rr``: ``{member: rows}`` (rows mode) or ``{key, array}`` (arrays mode).

        Raises:
          SourceError: the archive or a member cannot be read (naming file, member and rows).
        """
        arc = self._archive(rr.path)
        try:
            if self.loose:
                keys, arrays = [], []
                for m in rr.items:
                    arrays.append(self._read_member(arc, m, None, None))
                    keys.append(m[:-4].encode())
                return {KEY: keys, ARRAY: arrays}
            columns = {}
            for m in rr.items:
                columns.update(flatten_fields(m[:-4], self._read_member(arc, m, rr.start, rr.stop)))
            return columns
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError) as e:
            self.close()
            raise SourceError(f"Cannot read {rr.describe()}: {e}", file=rr.path) from None
        except BaseException:
            self.close()  # a failed stream is never reused
            raise


def _member_data_start(stream, info: zipfile.ZipInfo, path: str) -> int:
    """Archive offset of a member's (stored or compressed) data: after its local header (30 bytes, name, extra)."""
    stream.seek(info.header_offset)
    local = stream.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise SourceError("Bad local header of a member", file=path, member=info.filename[:-4],
                          offset=info.header_offset, hint="the archive is corrupt")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _merged_array_spec(headers, path) -> FeatureSpec:
    specs = [_row_spec(ARRAY, h.dtype, h.shape, path) for h in headers]
    out = specs[0]
    for s in specs[1:]:
        out = _loosen(out, s)
    for h in headers:
        if h.dtype.fields is not None:
            raise SchemaError("Structured members are not supported in arrays/files mode", file=path,
                              hint="use rows mode for structured arrays")
    return out


class NpySource(Source):
    """``.npy`` files: rows of one array (memory-mapped when local), or one Example per file."""

    def __init__(self, options: SourceOptions):
        super().__init__(options)
        self.loose = options.npy_mode == "files"

    def _header(self, path: str) -> _NpyHeader:
        _refuse_special_file(path)
        with fileio.open_read(path) as f:
            return _read_npy_header(f, path)

    def index(self, path: str) -> FileIndex:
        """Learns rows and features from the header, checked against the file size.

        Raises:
          SourceError: unreadable header, a header declaring more bytes than the file holds, more rows
            of zero bytes than ``max_empty_rows``.
          SchemaError: object arrays, 0-d arrays in rows mode.
        """
        _refuse_special_file(path)
        with fileio.open_read(path) as f:
            h = _read_npy_header(f, path)
            _check_declared(h, f.seek(0, 2), path)
        if self.loose:
            size = _data_bytes(h)
            specs = (FeatureSpec(KEY, VLEN_BYTES, (), "list"), _merged_array_spec([h], path))
            return FileIndex(path, 1, specs, size, 1, (path,), (size,))
        if not h.shape:
            raise SchemaError("Array is 0-d: rows mode needs a leading axis", file=path,
                              hint="use --npy_mode files (each file -> one Example)")
        _check_empty_rows(h.shape[0], h.dtype.itemsize * math.prod(h.shape[1:]), self.options, path)
        name = ARRAY
        specs = tuple(_leaf_specs(name, h.dtype, h.shape[1:], path))
        return FileIndex(path, h.shape[0], specs, _row_bytes(specs), 1, ())

    def read(self, rr: RowRange) -> Columns:
        if self.loose:
            arrays = []
            for p in rr.items:
                h = self._header(p)
                with fileio.open_read(p) as f:
                    arrays.append(_read_whole(f, h, p))
            return {KEY: [fileio.basename(p)[:-4].encode() for p in rr.items], ARRAY: arrays}
        if fileio.is_local(rr.path):
            _refuse_special_file(rr.path)
            try:
                mm = np.load(rr.path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as e:
                raise SourceError(f"Cannot memory-map the array: {e}", file=rr.path,
                                  rows=f"{rr.start}-{rr.stop - 1}", hint="the file may be truncated") from None
            data = np.array(mm[rr.start:rr.stop], order="C")
            del mm
        else:
            h = self._header(rr.path)
            with fileio.open_read(rr.path) as f:
                data = _read_rows(f, h, rr.start, rr.stop, rr.path)
        return dict(flatten_fields(ARRAY, data))


def make_source(fmt: str, options: SourceOptions) -> Source:
    return {"hdf5": Hdf5Source, "npz": NpzSource, "npy": NpySource}[fmt](options)


def files_mode(source: Source) -> bool:
    """True for ``npy_mode=files``, where all matched files together form one row sequence."""
    return isinstance(source, NpySource) and source.loose
