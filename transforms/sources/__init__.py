"""Array sources: index a file (rows, features), plan row ranges, read one row range.

Sources know files and row ranges; the PTransforms in ``transforms/beam_io.py`` only wire them into
Beam. Files are opened through Beam's ``FileSystems`` (``transforms/fileio.py``), so gs:// and s3://
paths take the same code path as local ones. Input is never unpickled: object arrays are refused.

Formats and modes (one module each, registered in :data:`REGISTRY`):

* ``hdf5`` (``hdf5.py``): row i of every chosen dataset is one Example. Compound dtypes become one feature
  per leaf field (``dataset/field/subfield``); variable-length strings become ``bytes`` features.
  ``datasets`` mode (``--hdf5_mode datasets``): every dataset (every cell of a MATLAB cell array) is one Example
  with features ``key`` (the dataset path) and ``array``. Rows mode without ``--datasets`` reads the largest row
  group (``hdf5layout``), MATLAB v7.3 variables transposed to MATLAB's orientation.
* ``netcdf3`` (``netcdf3.py``): NetCDF-3 variables through SciPy, the same modes and row groups.
* ``npz`` (``npz.py``) ``rows``: row i of every member is one Example; ``arrays``: every member is one
  Example with features ``key`` (the member name) and ``array``.
* ``npy`` (``npy.py``) ``rows``: rows of one array (memory-mapped when local); ``files``: every file is one
  Example with features ``key`` (the file name without ``.npy``) and ``array``.

A new source is one module with a :class:`Source` subclass declaring ``format_name``, ``suffixes`` and
``modes``, added to ``REGISTRY`` below (the suffix lookup and ``FORMATS`` derive from it), plus its tests.
The model is TFDS's ``file_adapters.ADAPTER_FOR_FORMAT``.
"""
from __future__ import annotations

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.base import (ARRAY, DEFAULT_MAX_COMPRESSION_RATIO, DEFAULT_MAX_EMPTY_ROWS,
                                     DEFAULT_RANGE_BYTES, KEY, Columns, FileIndex, RowRange, Source,
                                     SourceOptions, merge_specs, plan_row_ranges)
from tfrecord_etl.transforms.sources.hdf5 import HDF5_CHUNK_CACHE_BYTES, HDF5_SUFFIXES, Hdf5Source
from tfrecord_etl.transforms.sources.npy import NpySource
from tfrecord_etl.transforms.sources.npz import MAX_COLUMN_STREAMS, RATIO_CHECK_MIN_BYTES, NpzSource
from tfrecord_etl.transforms.sources.files import FilesSource
from tfrecord_etl.transforms.sources.raw import RawSource
from tfrecord_etl.transforms.sources.netcdf3 import NetCdf3Source

__all__ = ["ARRAY", "DEFAULT_MAX_COMPRESSION_RATIO", "DEFAULT_MAX_EMPTY_ROWS", "DEFAULT_RANGE_BYTES", "FORMATS",
           "HDF5_CHUNK_CACHE_BYTES", "HDF5_SUFFIXES", "KEY", "MAX_COLUMN_STREAMS", "RATIO_CHECK_MIN_BYTES",
           "REGISTRY", "Columns", "FileIndex", "FilesSource", "Hdf5Source", "NetCdf3Source", "NpySource", "NpzSource", "RawSource", "RowRange", "Source",
           "SourceOptions", "files_mode", "format_of", "make_source", "merge_specs", "plan_row_ranges"]

REGISTRY: dict[str, type[Source]] = {cls.format_name: cls for cls in (Hdf5Source, NetCdf3Source, NpzSource, NpySource,
                                                                           RawSource, FilesSource)}
FORMATS = tuple(REGISTRY)


def format_of(path: str, options: SourceOptions) -> str:
    """``options.format``, else the registered format whose suffix ``path`` ends with; when several share the
    suffix (``.nc``: netCDF-4 is HDF5, NetCDF-3 is not), the one whose ``magic`` starts the file, else the first
    registered (the first 8 bytes are read only then).

    Raises:
      SourceError: no registered suffix matches (naming the file and the suffixes).
    """
    if options.format:
        return options.format
    lower = path.lower()
    candidates = [name for name, cls in REGISTRY.items() if lower.endswith(cls.suffixes)]
    if len(candidates) > 1:
        head = _head(path)
        for name in candidates:
            if head.startswith(REGISTRY[name].magic or (b"\0invalid",)):
                return name
    if candidates:
        return candidates[0]
    suffixes = "/".join(s for cls in REGISTRY.values() for s in cls.suffixes[:1])
    raise SourceError("Cannot tell the input format from the file suffix", file=path,
                      hint=f"name it {suffixes} or pass --format one of {FORMATS}")


def _head(path: str, n: int = 8) -> bytes:
    """The first ``n`` bytes of ``path`` (b"" when it cannot be read: the source's own open reports why)."""
    from tfrecord_etl.transforms import fileio
    from tfrecord_etl.transforms.sources.base import _refuse_special_file
    try:
        _refuse_special_file(path)
        with fileio.open_read(path) as f:
            return f.read(n)
    except (OSError, SourceError):
        return b""


def make_source(fmt: str, options: SourceOptions) -> Source:
    """A new source of the registered format ``fmt``."""
    return REGISTRY[fmt](options)


def files_mode(source: Source) -> bool:
    """True for ``npy_mode=files``, where all matched files together form one row sequence."""
    return isinstance(source, NpySource) and source.loose
