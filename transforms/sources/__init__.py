"""Array sources: index a file (rows, features), plan row ranges, read one row range.

Sources know files and row ranges; the PTransforms in ``transforms/beam_io.py`` only wire them into
Beam. Files are opened through Beam's ``FileSystems`` (``transforms/storage/fileio.py``), so gs:// and s3://
paths take the same code path as local ones. Input is never unpickled: object arrays are refused.

Formats and modes (one module each, registered in :data:`REGISTRY`):

* ``hdf5`` (``hdf5.py``): row i of every chosen dataset is one Example. Compound dtypes become one feature
  per leaf field (``dataset/field/subfield``); variable-length strings become ``bytes`` features.
  ``datasets`` mode (``--container_mode datasets``): every dataset (every cell of a MATLAB cell array) is one Example
  with features ``key`` (the dataset path) and ``array``. Rows mode without ``--datasets`` reads the largest row
  group (``hdf5layout``), MATLAB v7.3 variables transposed to MATLAB's orientation.
* ``netcdf3`` (``netcdf3.py``): NetCDF-3 variables through SciPy, the same modes and row groups.
* ``matlab`` (``matlab.py``): MATLAB v4-v7 ``.mat`` variables through SciPy, converted as their v7.3 (HDF5) twin.
* ``npz`` (``npz.py``) ``rows``: row i of every member is one Example; ``arrays``: every member is one
  Example with features ``key`` (the member name) and ``array``.
* ``zarr`` (``zarrsrc.py``): the arrays of a Zarr store (v2/v3; directory, zip, gs:// / s3:// prefix) through the
  ``zarr`` package, read through ``zarrstore.BoundedStore``; the HDF5 containers' row groups and modes.
* ``npy`` (``npy.py``) ``rows``: rows of one array (memory-mapped when local); ``files``: every file is one
  Example with features ``key`` (the file name without ``.npy``) and ``array``.

A new source is one module with a :class:`Source` subclass declaring ``format_name``, ``help_label`` (what
``--help`` calls its inputs), ``suffixes``, ``modes``, the ``magic`` its files start with and its ``options_models`` (its flags, ``sources/options.py``), added to
``REGISTRY`` in ``registry.py`` (``format_of``, which tells a file's format by its
content, then its suffix, and ``FORMATS`` derive from it), plus its tests.
The model is TFDS's ``file_adapters.ADAPTER_FOR_FORMAT``.

This package's names load lazily (PEP 562's module ``__getattr__``): ``RowRange``, ``SourceOptions`` and the other
names of ``base.py`` at import; the registry (``registry.py``, which imports every format's module) and a format's
class on their first use, so ``import tfrecord_etl.transforms.sources`` (and any ``sources.X`` import) costs
``base.py`` only, and the reader, verify and inspect import it at the top of their modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    DEFAULT_MAX_COMPRESSION_RATIO,
    DEFAULT_MAX_EMPTY_ROWS,
    DEFAULT_RANGE_BYTES,
    KEY,
    Columns,
    FileIndex,
    RowRange,
    Source,
    SourceOptions,
    merge_specs,
    plan_row_ranges,
)
from tfrecord_etl.transforms.sources.signatures import (
    SNIFF_BYTES,
    content_format,
    other_format_hint,
    read_head,
    unread_format,
)

if TYPE_CHECKING:
    from tfrecord_etl.transforms.sources.envi import EnviSource
    from tfrecord_etl.transforms.sources.files import FilesSource
    from tfrecord_etl.transforms.sources.hdf5 import HDF5_CHUNK_CACHE_BYTES, HDF5_SUFFIXES, Hdf5Source
    from tfrecord_etl.transforms.sources.matlab import MatlabSource
    from tfrecord_etl.transforms.sources.netcdf3 import NetCdf3Source
    from tfrecord_etl.transforms.sources.npy import NpySource
    from tfrecord_etl.transforms.sources.npz import MAX_COLUMN_STREAMS, RATIO_CHECK_MIN_BYTES, NpzSource
    from tfrecord_etl.transforms.sources.raw import RawSource
    from tfrecord_etl.transforms.sources.registry import (
        FORMATS,
        REGISTRY,
        files_mode,
        format_of,
        join_option_models,
        join_refused_options,
        make_source,
        models_of,
        option_models,
        zarr_store_format,
    )
    from tfrecord_etl.transforms.sources.zarrsrc import ZarrSource

__all__ = [
    "ARRAY",
    "DEFAULT_MAX_COMPRESSION_RATIO",
    "DEFAULT_MAX_EMPTY_ROWS",
    "DEFAULT_RANGE_BYTES",
    "FORMATS",
    "HDF5_CHUNK_CACHE_BYTES",
    "HDF5_SUFFIXES",
    "KEY",
    "MAX_COLUMN_STREAMS",
    "MatlabSource",
    "RATIO_CHECK_MIN_BYTES",
    "REGISTRY",
    "Columns",
    "EnviSource",
    "FileIndex",
    "FilesSource",
    "Hdf5Source",
    "NetCdf3Source",
    "NpySource",
    "NpzSource",
    "RawSource",
    "RowRange",
    "Source",
    "ZarrSource",
    "SNIFF_BYTES",
    "SourceOptions",
    "content_format",
    "files_mode",
    "format_of",
    "make_source",
    "merge_specs",
    "models_of",
    "join_option_models",
    "join_refused_options",
    "option_models",
    "other_format_hint",
    "plan_row_ranges",
    "read_head",
    "unread_format",
    "zarr_store_format",
]

# name -> the module of this package that defines it, imported on the name's first use (see the docstring)
_LAZY = {
    **dict.fromkeys(
        (
            "FORMATS",
            "REGISTRY",
            "files_mode",
            "format_of",
            "join_option_models",
            "join_refused_options",
            "make_source",
            "models_of",
            "option_models",
            "zarr_store_format",
        ),
        "registry",
    ),
    "EnviSource": "envi",
    "FilesSource": "files",
    "HDF5_CHUNK_CACHE_BYTES": "hdf5",
    "HDF5_SUFFIXES": "hdf5",
    "Hdf5Source": "hdf5",
    "MatlabSource": "matlab",
    "NetCdf3Source": "netcdf3",
    "NpySource": "npy",
    "MAX_COLUMN_STREAMS": "npz",
    "RATIO_CHECK_MIN_BYTES": "npz",
    "NpzSource": "npz",
    "RawSource": "raw",
    "ZarrSource": "zarrsrc",
}


def __getattr__(name: str) -> Any:
    """The registry's names and the formats' classes and constants, imported on first use (PEP 562); later uses
    find them in this module's namespace. Any other unknown name raises AttributeError, so ``from
    tfrecord_etl.transforms.sources import SUBMODULE`` still imports the submodule."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
