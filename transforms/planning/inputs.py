"""The inputs of a conversion: the files a pattern matches, their format and source, each file indexed (several at
once), the row ranges, and the provenance features of a row."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms import sources
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.collections import matching, sharding
from tfrecord_etl.transforms.errors import ConfigError, SourceError, UnreadFormatError
from tfrecord_etl.transforms.sources import FileIndex, RowRange, Source, SourceOptions
from tfrecord_etl.transforms.storage import fileio

log = logging.getLogger("tfrecord_etl.transforms.planning")

PROVENANCE = (FeatureSpec("_source/file", "bytes", (), "list"), FeatureSpec("_source/row", "<i8", (), "list"))


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """Everything known of the inputs before the pipeline runs.

    Attributes:
      source: the registered source that reads the files. indexes: one :class:`FileIndex` per file (in
        ``files`` modes one for all files). specs: the features, encoding not yet chosen.
      ranges: row ranges of about ``range_bytes`` bytes each, in file and row order.
    """

    source: Source
    indexes: tuple[FileIndex, ...]
    specs: tuple[FeatureSpec, ...]
    ranges: tuple[RowRange, ...]
    range_bytes: int = sources.DEFAULT_RANGE_BYTES  # the target size of one row range

    @property
    def num_rows(self) -> int:
        return sum(i.num_rows for i in self.indexes)

    @property
    def num_bytes(self) -> int:
        """Array bytes of all rows (before encoding)."""
        return sum(sum(i.sizes) if i.sizes else i.num_rows * i.row_bytes for i in self.indexes)

    @property
    def paths(self) -> tuple[str, ...]:
        """Every input file read (in ``files`` modes the matched files, not the pattern)."""
        return tuple(p for i in self.indexes for p in (i.items if i.item_files else (i.path,)))

    def with_range_bytes(self, target_bytes: int) -> InputPlan:
        """The same inputs split into row ranges of ``target_bytes`` (no file is opened again)."""
        ranges = [r for i in self.indexes for r in sources.plan_row_ranges(i, target_bytes)]
        return dataclasses.replace(self, ranges=tuple(ranges), range_bytes=target_bytes)

    def as_written(self, num_shards: int) -> InputPlan:
        """The same inputs with the row ranges the planned writer reads for ``num_shards`` shards, in order
        (what its dead letters name)."""
        return dataclasses.replace(self, ranges=tuple(r for s in self.shards(num_shards) for r in s.ranges))

    def shards(self, num_shards: int) -> list[sharding.ShardPlan]:
        """Contiguous shard plans of equal bytes (within a chunk of rows), each a list of row ranges of at most
        ``range_bytes``; see :func:`sharding.plan_balanced_shards`. Files of per-row sizes (npz arrays, npy
        files modes) are grouped by whole ranges (:func:`sharding.plan_shards`), cut finer first when there are
        fewer ranges than shards."""
        balanced = sharding.plan_balanced_shards(self.indexes, num_shards, self.range_bytes)
        if balanced is not None:
            return balanced
        ranges = self.ranges
        if len(ranges) < num_shards:
            ranges = self.with_range_bytes(max(1, self.num_bytes // num_shards)).ranges
        by_path = {i.path: i for i in self.indexes}
        return sharding.plan_shards(ranges, [sharding.range_bytes(r, by_path[r.path]) for r in ranges], num_shards)


PLAN_THREADS = 8  # concurrent indexing of remote inputs: requests in flight, under botocore's pool of 10 connections


def index_concurrently(source: Source, paths: Sequence[str], threads: int | None = None) -> list[FileIndex]:
    """``source.index(path)`` of every path, in order. Remote paths (gs://, s3://) are indexed by a bounded pool of
    ``threads`` threads (default :data:`PLAN_THREADS`), so N files cost about N / threads round trips instead of N (measured: 500 small HDF5 files
    on an S3 API took 139 s one after another); local files one after another (no latency to hide). The first
    failing file in path order raises its own error, as the sequential loop did.

    Raises:
      SourceError, SchemaError: from the first file (in order) that cannot be indexed.
    """
    return map_concurrently(source.index, paths, threads)


def map_concurrently(fn, paths: Sequence[str], threads: int | None = None) -> list:
    """``[fn(path) for path in paths]``, remote paths by a bounded pool (see :func:`index_concurrently`)."""
    if len(paths) < 2 or all(fileio.is_local(p) for p in paths):
        return [fn(p) for p in paths]

    with concurrent.futures.ThreadPoolExecutor(min(threads or PLAN_THREADS, len(paths)), "plan-index") as pool:
        futures = [pool.submit(fn, p) for p in paths]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()


def _check_exclusion(fmt: str, options: SourceOptions, pattern: str) -> None:
    """Refuses ``--datasets`` for a format whose files hold one array (``Source.takes_datasets``) and
    ``--exclude_datasets`` for a format other than npz: either would be ignored.

    Raises:
      ConfigError: naming the format and the pattern.
    """
    if options.datasets and not sources.REGISTRY[fmt].takes_datasets:
        raise ConfigError(
            f"--datasets names the arrays inside a container (HDF5, netCDF, MATLAB, Zarr, npz); the "
            f"input is {fmt}, whose files hold no named arrays",
            file=pattern,
            hint="drop --datasets (narrow --input to choose files)",
        )
    if fmt != "npz" and any(getattr(m, "exclude_datasets", None) for m in options.formats):  # NumpyOptions
        raise ConfigError(
            f"--exclude_datasets leaves out members of .npz archives; the input is {fmt}",
            file=pattern,
            hint="drop --exclude_datasets (name what to convert with --datasets)",
        )


def input_format(pattern: str, files: Sequence[tuple[str, int]], options: SourceOptions) -> tuple[str, Source]:
    """The format of the ``(path, size)`` files matching ``pattern`` and a source for it: ``--format``, else each
    file's own (:func:`sources.format_of`: its first bytes, then its suffix; remote files sniffed concurrently). A
    file whose format cannot be told is allowed only as a sidecar of the others' source (a raw layout ``.json``).

    Raises:
      UnreadFormatError: a file of a format tfrecord-etl recognises but does not read (WAV...: naming it).
      SourceError: files of several formats (listing each with an example file), or a file whose format cannot be
        told (naming it).
    """
    if options.format:
        _check_exclusion(options.format, options, pattern)
        return options.format, sources.make_source(options.format, options)

    def sniffed(path):
        try:
            return sources.format_of(path, options)
        except UnreadFormatError:
            raise  # what it is and the way out, rather than "cannot tell"
        except SourceError:
            return None

    paths = [path for path, _ in files]
    found = dict(zip(paths, map_concurrently(sniffed, paths)))
    by_format: dict[str, list[str]] = {}
    for path, fmt in found.items():
        if fmt is not None:
            by_format.setdefault(fmt, []).append(path)
    if not by_format:
        sources.format_of(paths[0], options)  # raises its error, naming the first file
    if len(by_format) > 1:
        listing = "; ".join(f"{fmt}: {len(ps)} file(s), e.g. '{ps[0]}'" for fmt, ps in sorted(by_format.items()))
        raise SourceError(
            f"The pattern matches files of {len(by_format)} formats ({listing})",
            file=pattern,
            hint="convert each format in its own run (a narrower --input), or pass --format to "
            "read every file as one format",
        )
    fmt = next(iter(by_format))
    _check_exclusion(fmt, options, pattern)
    source = sources.make_source(fmt, options)
    for path, got in found.items():
        if got is None and not source.is_sidecar(path):
            raise SourceError(
                f"Cannot tell the input format from the file's first bytes or its suffix (the other files are {fmt})",
                file=path,
                hint=f"pass --format {fmt} to read it as {fmt} too, or leave it out of --input",
            )
    return fmt, source


def plan_inputs(pattern: str, options: SourceOptions, files: Sequence[tuple[str, int]] | None = None) -> InputPlan:
    """Matches ``pattern``, pins (size, modification time) and indexes every file and plans row ranges of
    ``options.target_range_bytes``. ``files``: the ``(path, size)`` to read instead of every match of ``pattern``
    (the files of one span, or an incremental run's new files: ``transforms.spanrun``).

    Raises:
      SourceError, SchemaError: unmatched pattern, unreadable file, unsupported dtype, features that
        differ between files (naming the file and dataset/member); symbolic links leading outside the pattern's
        base directory, one file matched under two names (``matching.match_inputs``).
    """
    if files is None and store_input(pattern, options):  # a Zarr store: one input, its root
        files = [(pattern, 0)]
    files = list(files) if files is not None else matching.match_inputs(pattern, options.follow_symlinks)
    fmt, source = input_format(pattern, files, options)
    data = [(path, size) for path, size in files if not source.is_sidecar(path)]
    if not data:
        raise SourceError(f"Every file matching the pattern is a {fmt} sidecar, none holds data", file=pattern)
    source.pin_files([path for path, _ in data])  # checked when each row range is read (Source.read_pinned)
    indexes = source.index_files(pattern, data) or index_concurrently(source, [path for path, _ in data])
    specs = sources.merge_specs(indexes, loose=source.loose)
    if sources.files_mode(source):  # all files together are one sequence of rows
        indexes = [
            FileIndex(
                pattern,
                len(indexes),
                specs,
                max(i.row_bytes for i in indexes),
                1,
                tuple(i.path for i in indexes),
                tuple(i.sizes[0] for i in indexes),
                item_files=True,
            )
        ]
    range_bytes = source.range_bytes(options.target_range_bytes)
    ranges = [r for i in indexes for r in sources.plan_row_ranges(i, range_bytes)]
    return InputPlan(source, tuple(indexes), specs, tuple(ranges), range_bytes)


def store_input(pattern: str, options: SourceOptions) -> bool:
    """True when ``pattern`` (no glob character) names a Zarr store rather than files: read as one input, its root
    (``sources.zarr_store_format``; ``--format zarr`` for a remote prefix of another name)."""
    if matching.has_glob(pattern) or options.format not in (None, "zarr"):
        return False
    return options.format == "zarr" or sources.zarr_store_format(pattern) is not None


def add_provenance(rr: RowRange, columns: dict) -> dict:
    """Adds ``_source/file`` (bytes) and ``_source/row`` (int64) columns for the rows of ``rr``."""
    out = dict(columns)
    if rr.item_files:  # files mode: one file per row
        out["_source/file"] = [p.encode() for p in rr.items]
    else:
        out["_source/file"] = [rr.path.encode()] * rr.num_rows
    out["_source/row"] = np.arange(rr.start, rr.stop, dtype=np.int64)
    return out
