"""The source registry: every format's :class:`Source` class by its ``format_name``, in the order ``format_of`` tries
them, and what is built from it (the options models, the format of a file, a new source).

Importing this module imports every format's module (NumPy only at import); ``sources/__init__.py``
loads it on the first use of one of its names (``sources.REGISTRY``, ``sources.format_of``, a format's class), so
the reader and the commands that only need ``RowRange`` or ``SourceOptions`` do not pay for it. The model is
TFDS's ``file_adapters.ADAPTER_FOR_FORMAT``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources import zarrstore
from tfrecord_etl.transforms.sources.base import Source, SourceOptions
from tfrecord_etl.transforms.sources.envi import EnviSource
from tfrecord_etl.transforms.sources.files import FilesSource
from tfrecord_etl.transforms.sources.fits import FitsSource
from tfrecord_etl.transforms.sources.hdf5 import Hdf5Source
from tfrecord_etl.transforms.sources.matlab import MatlabSource
from tfrecord_etl.transforms.sources.netcdf3 import NetCdf3Source
from tfrecord_etl.transforms.sources.nifti import NiftiSource
from tfrecord_etl.transforms.sources.npy import NpySource
from tfrecord_etl.transforms.sources.npz import NpzSource
from tfrecord_etl.transforms.sources.parquet import ParquetSource
from tfrecord_etl.transforms.sources.raw import RawSource
from tfrecord_etl.transforms.sources.signatures import (
    content_format,
    deep_signature,
    read_head,
    register,
    unread_error,
    unread_format,
)
from tfrecord_etl.transforms.sources.zarrsrc import ZarrSource
from tfrecord_etl.transforms.storage import fileio

if TYPE_CHECKING:
    from tfrecord_etl.transforms.sources.options import FormatOptions

REGISTRY: dict[str, type[Source]] = {
    cls.format_name: cls
    for cls in (
        Hdf5Source,
        NetCdf3Source,
        NpzSource,
        NpySource,
        RawSource,
        FilesSource,
        MatlabSource,
        ZarrSource,
        EnviSource,
        NiftiSource,
        ParquetSource,
        FitsSource,
    )
}
FORMATS = tuple(REGISTRY)
register(REGISTRY)  # the formats a file's first bytes tell (sources/signatures.py)


def models_of(cls: type[Source]) -> tuple[type[FormatOptions], ...]:
    """The options models ``cls`` names in ``options_models`` (``"MODULE.CLASS"`` under this package), imported
    now: they need pydantic, which the light reader's commands (verify, inspect) do without, though they read the
    registry."""
    out = []
    for ref in cls.options_models:
        module, name = ref.rsplit(".", 1)
        out.append(getattr(importlib.import_module(f"{__package__}.{module}"), name))
    return tuple(out)


def option_models() -> tuple[type[FormatOptions], ...]:
    """Every registered source's options models (:func:`models_of`), once each, in registry order: what the
    convert command's config model, its flags and ``--help`` groups, and ``planning.source_options`` are built
    from."""
    out: dict[type[FormatOptions], None] = {}
    for cls in REGISTRY.values():
        out.update(dict.fromkeys(models_of(cls)))
    return tuple(out)


def join_option_models() -> tuple[type[FormatOptions], ...]:
    """The options models of the registered sources that augment's join source (``--join_input``) can be: those
    told by a file's content or suffix (``magic``, ``suffixes``), since the join takes no ``--format``; a source
    chosen only by ``--format`` (file collections) is not among them."""
    out: dict[type[FormatOptions], None] = {}
    for cls in REGISTRY.values():
        if cls.magic or cls.suffixes:
            out.update(dict.fromkeys(models_of(cls)))
    return tuple(out)


def join_refused_options() -> dict[str, str]:
    """The format options augment's join source refuses, each with the reason its error gives: ``datasets`` (the
    join names its datasets with ``--join_datasets``) and the options of formats it cannot be (those of no model of
    :func:`join_option_models`: file collections)."""
    joinable = {name for model in join_option_models() for name in model.model_fields}
    out = {"datasets": "the join source's datasets are --join_datasets"}
    for model in option_models():
        for name in model.model_fields:
            if name not in joinable:
                out[name] = (
                    f"an option of a format that a join source cannot be ({model.__name__}: chosen only by "
                    f"convert's --format, while the join source's format is told by each file's content or suffix)"
                )
    return out


def format_of(path: str, options: SourceOptions) -> str:
    """The source format of ``path``: ``options.format`` (``--format`` always wins); else the file's content, as
    each source's ``magic`` tells it from the first :data:`SNIFF_BYTES` bytes (a netCDF-4 ``.cdf``, a MINC2 ``.mnc``
    and a MATLAB v7.3 ``.mat`` are HDF5, a MINC1 ``.mnc`` NetCDF-3, a MATLAB v5 ``.mat`` matlab), so the content
    wins over a suffix that disagrees; else the first registered format whose suffix ``path`` ends with (a
    MATLAB v4 ``.mat`` has no magic); else an HDF5 signature after a user block of 4096 bytes or more (the HDF5
    spec's 512 * 2**n offsets, read one by one up to the file's end). A file whose content (else suffix) shows a
    format no source reads (``signatures.UNREAD``) is refused with the way out.

    Raises:
      UnreadFormatError: a format tfrecord-etl recognises but does not read (naming the file, what it is and how
        to turn it into arrays it reads).
      SourceError: neither the content nor the suffix tells a format (naming the file and the suffixes).
    """
    if options.format:
        return options.format
    store = zarr_store_format(path)
    if store:
        return store
    lower = path.lower()
    candidates = [name for name, cls in REGISTRY.items() if lower.endswith(cls.suffixes)]
    head = read_head(path)
    found = content_format(head)
    unread = None if found else unread_format(path, head, by_suffix=not candidates)
    if unread:
        raise unread_error(path, unread)
    if found or candidates:
        return found or candidates[0]
    found = deep_signature(path)
    if found:
        return found
    suffixes = "/".join(s for cls in REGISTRY.values() for s in cls.suffixes[:1])
    raise SourceError(
        "Cannot tell the input format from the file's first bytes or its suffix",
        file=path,
        hint=f"name it {suffixes} or pass --format one of {FORMATS}",
    )


def zarr_store_format(path: str) -> str | None:
    """``"zarr"`` when ``path`` is a Zarr store by its content (a local directory or zip file holding ``zarr.json``
    or ``.zgroup``/``.zarray``/``.zmetadata`` at its root: ``zarrstore.store_kind``) or, remote, by its name (a
    gs:// / s3:// prefix ending in ``.zarr`` or ``/``: probing every remote input for a store would cost requests);
    else None."""
    if fileio.is_local(path):
        return "zarr" if zarrstore.store_kind(path) else None
    return "zarr" if path.lower().rstrip("/").endswith(".zarr") or path.endswith("/") else None


def make_source(fmt: str, options: SourceOptions) -> Source:
    """A new source of the registered format ``fmt``."""
    return REGISTRY[fmt](options)


def files_mode(source: Source) -> bool:
    """True for ``npy_mode=files``, where all matched files together form one row sequence."""
    return isinstance(source, NpySource) and source.loose
