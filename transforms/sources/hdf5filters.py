"""HDF5 filter plugins: hdf5plugin's filters registered before any HDF5 file is opened, in every process that
opens one, and errors that name a missing filter by its id with where to get it.

hdf5plugin (the HDF5 community's package of filter plugins: Blosc, Blosc2, BZip2, LZ4, Zstd, Bitshuffle, SZ, SZ3,
ZFP, ...) registers its filters with the HDF5 library that h5py uses when it is imported (hdf5plugin's documented
usage: ``import hdf5plugin`` before reading). The import lives here, called by the one function that opens HDF5
files' datasets (:meth:`Hdf5Source`'s dataset opening and its reads), not in a command: a Beam worker process (DirectRunner's ``multi_processing``
workers, a Dataflow or Dask worker) never runs the command's code, only unpickles the source and reads, so an
import in the launcher alone leaves the workers without the filters (HDF5 then fails with "can't open directory
(/usr/local/hdf5/lib/plugin)", its default plugin directory). Filters that HDF5 finds through ``HDF5_PLUGIN_PATH``
keep working. The import (about 15-20 ms per process) happens only in a process that meets a dataset whose
filter pipeline names a filter HDF5 cannot apply yet (:func:`ensure_filters`), or whose read fails before the
filters were registered (a virtual dataset's sources, an object reference's target: the reader registers them and
reads once more): gzip, shuffle, szip and unfiltered files never pay it.
"""

from __future__ import annotations

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.matsparse import parts

REGISTERED_FILTERS_URL = "https://github.com/HDFGroup/hdf5_plugins/blob/master/docs/RegisteredFilterPlugins.md"
PRIVATE_FILTER_IDS = 32768  # ids from here to 65535 are never registered (The HDF Group's filter id policy)
_PLUGINS: dict | None = None  # hdf5plugin's {name: filter id} once imported in this process ({} if not installed)


def load_filter_plugins() -> dict:
    """Registers hdf5plugin's filters with this process's HDF5 library (the first call imports hdf5plugin, about
    15-20 ms; later calls return at once). Called by :func:`ensure_filters` and after a failed read.

    Returns:
      hdf5plugin's ``FILTERS`` (``{name: filter id}``), or ``{}`` when hdf5plugin is not installed: files whose
      filters HDF5 has built in (gzip, shuffle, fletcher32, szip, scale-offset, n-bit) and h5py's lzf still read;
      the others are refused by :func:`missing_filter_error`, which names ``pip install hdf5plugin``.
    """
    global _PLUGINS
    if _PLUGINS is None:
        try:
            import hdf5plugin

            _PLUGINS = dict(hdf5plugin.FILTERS)
        except ImportError:
            _PLUGINS = {}
    return _PLUGINS


def plugins_loaded() -> bool:
    """Whether this process has tried to register hdf5plugin's filters (:func:`load_filter_plugins`)."""
    return _PLUGINS is not None


def ensure_filters(dset) -> None:
    """Registers hdf5plugin's filters (:func:`load_filter_plugins`) when ``dset``'s filter pipeline names a filter
    this process's HDF5 cannot apply yet; a no-op for built-in filters and once registered."""
    if _PLUGINS is None and missing_filters(dset):
        load_filter_plugins()


def missing_filters(dset) -> list[tuple[int, str]]:
    """``[(filter id, name stored in the file)]`` of the filters of ``dset``'s pipeline that this process's HDF5
    cannot apply (``H5Zfilter_avail``, which also searches ``HDF5_PLUGIN_PATH``); ``[]`` when all are available
    or the dataset's creation properties cannot be read."""
    import h5py

    try:
        plist = dset.id.get_create_plist()
        filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
    except Exception:  # noqa: BLE001 - no pipeline to inspect: nothing is known to be missing
        return []
    out = []
    for code, _, _, name in filters:
        if not h5py.h5z.filter_avail(code):
            out.append((int(code), name.decode(errors="replace") if isinstance(name, bytes) else str(name)))
    return out


def missing_filter_error(code: int, name: str, path: str, dataset: str, message: str = "") -> SourceError:
    """The SourceError for filter ``code`` (``name`` as stored in the file) that this process lacks: the message
    names the filter (``message`` goes before it, e.g. the rows being read), the hint where to get it:
    ``pip install hdf5plugin`` when hdf5plugin is not installed; for an id hdf5plugin does not provide, The HDF
    Group's list of registered filters (which names each id's plugin; ids from 32768 are private, never listed)
    and ``HDF5_PLUGIN_PATH``."""
    plugins = load_filter_plugins()
    label = name or "no name stored in the file"
    text = f"{message}HDF5 filter {code} ({label}) is not available in this process"
    if not plugins:
        hint = (
            "install hdf5plugin, which registers Blosc, Blosc2, BZip2, LZ4, Zstd, Bitshuffle, SZ, ZFP and more "
            "when the file is opened: pip install hdf5plugin (on every worker too; it is a dependency of "
            "tfrecord-etl)"
        )
    elif code in plugins.values():
        provider = next(k for k, v in plugins.items() if v == code)
        hint = (
            f"hdf5plugin provides it ('{provider}') but could not register it in this process: reinstall it "
            "(pip install --force-reinstall hdf5plugin)"
        )
    elif code >= PRIVATE_FILTER_IDS:
        hint = (
            f"no installed plugin provides it, and ids {PRIVATE_FILTER_IDS}-65535 are for private use (The HDF "
            "Group registers none): ask whoever wrote the file which plugin it used, install it and set "
            "HDF5_PLUGIN_PATH to its directory, or have the file rewritten where that plugin is installed "
            "(h5repack -f GZIP=4 IN OUT)"
        )
    else:
        hint = (
            f"no installed plugin provides it (hdf5plugin does not): The HDF Group's list of registered filters "
            f"names the plugin for id {code} ({REGISTERED_FILTERS_URL}); install it and set HDF5_PLUGIN_PATH "
            "to its directory, or have the file rewritten where that plugin is installed (h5repack -f GZIP=4 "
            "IN OUT)"
        )
    return SourceError(text, file=path, dataset=dataset, hint=hint)


def check_filters(dset, path: str, name: str) -> None:
    """Refuses a dataset whose filter pipeline holds a filter this process cannot apply (each stored dataset of a
    MATLAB v7.3 sparse matrix: ``matsparse.parts``).

    Raises:
      SourceError: naming the file, the dataset and the filter (id and stored name), with where to get it.
    """
    for part in parts(dset):
        ensure_filters(part)
        missing = missing_filters(part)
        if missing:
            raise missing_filter_error(*missing[0], path, name)


def read_error(e: Exception, dset, path: str, name: str, what: str) -> SourceError:
    """The SourceError of a read of ``dset`` (None if it could not be opened) that raised ``e``; ``what`` says
    what was read (``Cannot read rows 0-99``). The hint names a cause only where it is known: a filter of the
    dataset this process lacks (by its id: which one, and where to get it), or a filter that failed to decode a
    chunk (HDF5's "filter returned failure": a checksum or decompression error, so the stored bytes are damaged).
    Any other error is reported as HDF5 or NumPy said it, without a guess."""
    missing = missing_filters(dset) if dset is not None else []
    if missing:
        return missing_filter_error(*missing[0], path, name, f"{what}: ")
    hint = None
    if "filter returned failure" in str(e):
        hint = (
            "a filter of the dataset failed to decode a chunk (a checksum or decompression error): the stored "
            "data is corrupt or truncated; --dead_letter_dir sets such row ranges aside and converts the rest"
        )
    return SourceError(f"{what}: {e}", file=path, dataset=name, hint=hint)
