"""Where an HDF5 dataset's values come from, and whether they may be read: external raw storage and virtual
datasets confined to the input's own directory, storage never written (read as the fill value) refused, the dataset
opened for reading with its external/virtual prefix, and HDF5's caches (the chunk cache of a file read row range
after row range, the metadata cache of a file walked object by object), and the chunks a row range prefetches.

Sources: the HDF5 User's Guide ("Datasets": external storage, virtual datasets; "Metadata Caching in HDF5"),
h5py's low-level API (``h5p`` dataset access properties, ``DatasetID.get_chunk_info_by_coord``).
"""

from __future__ import annotations

import itertools
import math
import os
import stat

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources import hdf5links as links
from tfrecord_etl.transforms.sources.base import SourceOptions
from tfrecord_etl.transforms.sources.hdf5filters import ensure_filters
from tfrecord_etl.transforms.sources.matsparse import SparseView, is_sparse, too_dense
from tfrecord_etl.transforms.storage import fileio

HDF5_CHUNK_CACHE_BYTES = 64 * 2**20  # per open file: a chunk spanning several row ranges is decompressed once
# HDF5's metadata cache of a file whose objects are all visited (planning's walk, datasets mode): parsed object
# headers take about 12 bytes of memory per byte the cache counts, and the library's default lets it grow to 32 MiB
# (planning 20,000 datasets of two values: +51 MB of memory at its 4 MiB, +10 MB at 1 MiB, +1 MB at 256 KiB)
WALK_METADATA_CACHE_BYTES = 256 * 2**10
MAX_PREFETCH_CHUNKS = 4096  # a row range touching more chunks than this is read chunk by chunk


def chunk_ranges(dset, start: int, stop: int) -> list[tuple[int, int]]:
    """``[(byte offset, stored size)]`` of the chunks of ``dset`` holding rows ``start`` to ``stop`` (h5py's
    ``DatasetID.get_chunk_info_by_coord``; unallocated chunks skipped), or ``[]`` for a contiguous dataset (one
    read already), one with more than :data:`MAX_PREFETCH_CHUNKS` such chunks, or a layout h5py cannot list."""
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


def bound_metadata_cache(f, max_bytes: int = WALK_METADATA_CACHE_BYTES) -> None:
    """Caps the metadata cache of the open h5py file ``f`` at ``max_bytes`` (HDF5's ``H5Fset_mdc_config``: initial
    and maximum size; the HDF5 User's Guide, "Metadata Caching in HDF5"), so memory does not grow with the number
    of objects visited."""
    config = f.id.get_mdc_config()
    config.set_initial_size = True
    config.initial_size = config.max_size = max_bytes
    config.min_size = min(config.min_size, max_bytes)
    f.id.set_mdc_config(config)


def dataset_for_read(f, name: str, path: str):
    """``f[name]``, opened (local files) with the input's directory as the prefix of external and virtual
    source files (HDF5 resolves relative external names against the working directory otherwise). HDF5
    refuses a second prefix for a dataset already open, so readers close their files after each shard."""
    import h5py

    dset = links.resolve(f, name, path, True) if links.has_links(f, name) else f[name]  # (checked at planning)
    if is_sparse(dset):  # a MATLAB v7.3 sparse matrix (its parts checked at planning)
        sparse = SparseView(dset)
        for part in sparse.parts:
            ensure_filters(part)
        return sparse
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


def confined(name: str, path: str, what: str, dataset: str) -> str:
    """The real path of ``name`` (relative names resolve against the input's directory), checked to be a
    regular file inside the input's directory.

    Raises:
      SourceError: outside the directory, missing, or not a regular file (a FIFO or device is never opened).
    """
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


def check_storage(dset, path: str, name: str, options: SourceOptions) -> None:
    """Refuses a dataset whose values would come from outside the named file, or be invented.

    - external raw storage (``create_dataset(external=...)``): refused unless ``allow_external_storage``,
      and then every external file must be a regular file in the input's directory, big enough;
    - virtual datasets: every source file (other than the file itself) must be a regular file in the
      input's directory (a missing source would read as the fill value); remote inputs are refused;
    - storage not allocated (all or some chunks): read as the fill value, refused unless
      ``allow_fill_value``.

    A MATLAB v7.3 sparse matrix (``matsparse.SparseView``): each stored dataset so checked, and its dense size
    against ``--max_mat_variable_mb`` (it converts dense, as in a v4-v7 file).

    Raises:
      SourceError: naming the file, the dataset and, for outside files, their path.
    """
    if isinstance(dset, SparseView):
        # deferred: pydantic (the MATLAB options model), read for a sparse variable only
        from tfrecord_etl.transforms.sources.options_matlab import MatlabOptions

        limit = options.of(MatlabOptions).max_variable_bytes
        error = too_dense(dset.shape[::-1], dset.dtype, limit, path, name)
        if error is not None:
            raise error
        for part in dset.parts:
            if part.id.get_create_plist().get_external_count() or part.is_virtual:
                raise SourceError(
                    "The MATLAB sparse matrix's data is stored outside the file (external or virtual storage): refused",
                    file=path,
                    dataset=name,
                )
            check_storage(part, path, name, options)
        return
    plist = dset.id.get_create_plist()
    if plist.get_external_count():
        _check_external(plist, path, name, options)
    elif dset.is_virtual:
        _check_virtual(dset, path, name)
    else:
        _check_allocated(dset, plist, path, name, options)


def _check_external(plist, path: str, name: str, options: SourceOptions) -> None:
    """External raw storage: refused unless ``allow_external_storage``; then each file confined and big enough."""
    import h5py

    names = [plist.get_external(i)[0].decode(errors="replace") for i in range(plist.get_external_count())]
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
        real = confined(ext, path, "external file", name)
        _, offset, size = plist.get_external(i)
        if size != h5py.h5f.UNLIMITED and offset + size > os.path.getsize(real):
            raise SourceError(
                f"The external file '{ext}' holds {os.path.getsize(real)} bytes, fewer than the "
                f"{offset + size} the dataset declares",
                file=path,
                dataset=name,
            )


def _check_virtual(dset, path: str, name: str) -> None:
    """A virtual dataset: local only, every source file (other than the file itself) confined."""
    if not fileio.is_local(path):
        raise SourceError(
            "Virtual datasets of a remote HDF5 file are not read",
            file=path,
            dataset=name,
            hint="copy the file and its source files to a local directory",
        )
    for vmap in dset.virtual_sources():
        if vmap.file_name != ".":
            confined(vmap.file_name, path, "virtual dataset source file", name)


def _check_allocated(dset, plist, path: str, name: str, options: SourceOptions) -> None:
    """Storage in the file: all of it allocated (contiguous), every chunk of the grid allocated (chunked)."""
    import h5py

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
