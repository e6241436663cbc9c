"""What the container sources share (HDF5, NetCDF-3, MATLAB v4-v7, Zarr): a file (or store) holding many named
arrays, of which those sharing a leading length form a row group.

- the two modes, ``rows`` (row i of the chosen arrays -> one Example) and ``datasets`` (each array -> one
  Example), and ``auto`` (rows, or datasets for a file with no array with rows): :class:`ContainerSource`;
- which row group is converted (``--row_group N``, else the default of :mod:`conventions`): :func:`choose_group`;
- the leading-length rule (the chosen arrays must have equal leading lengths): :func:`check_leading_lengths`;
- the file each worker thread keeps open between the row ranges of a shard: :meth:`ContainerSource.opened`.

The flags are named for what they choose, not for one format: ``--row_group`` and ``--container_mode``
(``--hdf5_group`` and ``--hdf5_mode`` are their old names, still accepted: :mod:`transforms.config`).
"""

from __future__ import annotations

from collections.abc import Callable

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec, flatten_fields
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import conventions, hdf5layout
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    KEY,
    Columns,
    FileIndex,
    RowRange,
    Source,
    SourceOptions,
    log,
    loosen_all,
)

GROUP_FLAG = "--row_group"  # the flag choosing a row group, as messages name it
MODE_FLAG = "--container_mode"  # the flag choosing rows / datasets / auto


def choose_group(
    entries, number: int | None, path: str, roles: conventions.Roles | None = None, note: str = ""
) -> list[str]:
    """The datasets of row group ``number`` (1-based) of :func:`conventions.ranked_groups`, or of the default group
    (:func:`conventions.default_choice`; ``roles`` None: the largest in bytes). ``entries``: ``[(path, rows,
    dimension or None, nbytes)]`` (:func:`hdf5layout.group_rows`). A file with several groups logs one WARNING line
    naming the others with the flag that selects each (``note`` appended).

    Raises:
      SchemaError: no group at all; ``number`` beyond the groups of the file; no number, and the best groups lie
        under different top-level groups (one line listing them with the ``--row_group`` flag of each).
    """
    groups = conventions.ranked_groups(entries, roles)
    if not groups:
        raise SchemaError(
            "The file holds no row group (no array with a leading axis)",
            file=path,
            hint=f"use {MODE_FLAG} datasets to convert each array as one Example",
        )
    if number is None:
        number, why = conventions.default_choice(groups, roles)
        if number is None:
            best = [(i, g) for i, g in enumerate(groups, 1) if g.rank == groups[0].rank]
            listing = "; ".join(f"{g.describe(i)} -> {GROUP_FLAG} {i}" for i, g in best[:6]) + (
                f"; and {len(best) - 6} more" if len(best) > 6 else ""
            )
            raise SchemaError(
                f"Which data to convert is not clear: {why}: {listing}",
                file=path,
                hint=f"choose one with {GROUP_FLAG} N or --datasets (tfrecord-etl inspect FILE "
                "lists the groups with their --datasets flags)",
            )
    else:
        why = GROUP_FLAG
    if number > len(groups):
        raise SchemaError(
            f"{GROUP_FLAG} {number} asked, but the file holds {len(groups)} row group(s)",
            file=path,
            hint="tfrecord-etl inspect FILE lists them",
        )
    if len(groups) > 1:
        others = "; ".join(f"{g.describe(i)} -> {GROUP_FLAG} {i}" for i, g in enumerate(groups[:4], 1) if i != number)
        more = f"; and {len(groups) - 4} more" if len(groups) > 4 else ""
        reason = f" ({why})" if roles is not None else ""
        log.warning(
            "'%s' holds %d row groups: converting %s%s. Others: %s%s (tfrecord-etl inspect FILE "
            "lists them with their --datasets flags).%s",
            path,
            len(groups),
            groups[number - 1].describe(number),
            reason,
            others,
            more,
            note,
        )
    return list(groups[number - 1].datasets)


def check_leading_lengths(lengths: dict[str, int], path: str, what: str = "datasets", target: str = "FILE") -> int:
    """The common leading length (rows) of the arrays ``{name: leading length}`` chosen in rows mode.

    Args:
      what: what the format calls its arrays (``datasets``, ``variables``, ``arrays``), for the message.
      target: what ``tfrecord-etl inspect`` is given (``FILE``, ``STORE``), for the hint.

    Raises:
      SchemaError: the lengths differ (one line listing the first six, the flags that choose others).
    """
    if len(set(lengths.values())) > 1:
        items = list(lengths.items())
        listing = ", ".join(f"'{n}': {v}" for n, v in items[:6]) + (
            f" and {len(items) - 6} more" if len(items) > 6 else ""
        )  # one short line, not 1,200 characters
        raise SchemaError(
            f"{what.capitalize()} have different leading lengths ({listing})",
            file=path,
            hint=f"choose {what} of equal length with --datasets (or a row group with {GROUP_FLAG} N); "
            f"tfrecord-etl inspect {target} lists the row groups",
        )
    return next(iter(lengths.values()))


def datasets_index(
    path: str, items: list[str], specs: list[FeatureSpec], sizes: list[int], what: str, holder: str = "file", **extra
) -> FileIndex:
    """Datasets mode's :class:`FileIndex` of ``path``: one row per item (its name in ``items``), features ``key``
    (the name, bytes) and ``array`` (``specs`` merged: what differs between items becomes None); ``sizes`` the
    items' bytes; ``extra`` more FileIndex fields (``sequential``).

    Raises:
      SchemaError: no item (``The {holder} holds no {what} to convert``).
    """
    if not items:
        raise SchemaError(f"The {holder} holds no {what} to convert", file=path)
    return FileIndex(
        path,
        len(items),
        (FeatureSpec(KEY, VLEN_BYTES, (), "list"), loosen_all(specs)),
        max(sizes),
        1,
        tuple(items),
        tuple(sizes),
        **extra,
    )


class ContainerSource(Source):
    """Base of the container sources: the modes, ``auto``'s switch to datasets mode, and the file (or loaded
    state) each worker thread keeps open between row ranges.

    A subclass implements :meth:`open_for_read` (``path`` -> a handle: an open file, a store, a cache) and, when
    the handle holds resources, :meth:`close_handle`; :meth:`opened` returns this thread's handle of ``path``,
    closing the previous file's first, and :meth:`close` closes it (reading again reopens it).
    """

    modes = ("rows", "datasets")

    def __init__(self, options: SourceOptions):
        super().__init__(options)
        self.loose = options.container_mode == "datasets"  # (auto may switch it: switch_to_datasets)

    def switch_to_datasets(self, path: str) -> bool:
        """``container_mode=auto``: ``path`` holds no dataset with rows, so this source converts each dataset as one
        Example from now on; False when the mode was set explicitly.

        Raises:
          SchemaError: an earlier file was indexed in rows mode (the files cannot share features then).
        """
        if self.options.container_mode != "auto":
            return False
        if getattr(self, "_rows_indexed", False):
            raise SchemaError(
                "The file holds no dataset with rows, but earlier files were converted row by row",
                file=path,
                hint=f"convert it in a separate run, or pass {MODE_FLAG} datasets for all",
            )
        log.warning(
            "'%s' holds no dataset with rows (or is a Keras weights file): converting each dataset (and each "
            "MATLAB cell) as one Example, as %s datasets does",
            path,
            MODE_FLAG,
        )
        self.loose = True
        return True

    def columns(self, rr: RowRange, whole: Callable, rows: Callable) -> Columns:
        """The columns of the row range ``rr``: datasets mode, ``{key: [name as bytes], array: [whole(name)]}`` for
        each name of ``rr.items``; rows mode, the fields of ``rows(name)`` (its rows ``rr.start:rr.stop``, a NumPy
        array) of each, by the name without its leading ``/``."""
        if self.loose:
            return {KEY: [n.encode() for n in rr.items], ARRAY: [whole(n) for n in rr.items]}
        out = {}
        for name in rr.items:
            out.update(flatten_fields(name.strip("/"), rows(name)))
        return out

    def open_for_read(self, path: str):
        """A new handle of ``path`` for :meth:`opened`."""
        raise NotImplementedError

    def close_handle(self, handle) -> None:
        """Releases what ``handle`` holds (default: nothing)."""

    def opened(self, path: str):
        """This worker thread's handle of ``path`` (the previous file's is closed when another is asked for)."""
        current = getattr(self._local, "open", None)
        if current is not None and current[0] == path:
            return current[1]
        self.close()
        handle = self.open_for_read(path)
        self._local.open = (path, handle)
        return handle

    def close(self) -> None:
        """Closes this worker thread's open file (reading again reopens it)."""
        current = getattr(self._local, "open", None)
        self._local.open = None
        if current is not None:
            self.close_handle(current[1])


def log_skipped(skipped: dict, path: str, mode: str) -> None:
    """One WARNING line per file for the datasets skipped, by reason (a NetCDF file has dozens)."""
    parts = [f"{len(v)} {k} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})" for k, v in skipped.items() if v]
    if parts:
        hint = (
            f"; {MODE_FLAG} datasets converts each scalar and each cell as one Example"
            if mode == "rows mode" and (skipped.get(hdf5layout.CELL) or skipped.get(hdf5layout.SCALAR))
            else ""
        )
        log.warning("Skipping %s datasets in '%s' (%s)%s", " and ".join(parts), path, mode, hint)


def check_dataset_count(count: int, path: str, options: SourceOptions) -> None:
    """Raises SourceError when ``count`` datasets (or datasets-mode items) exceed ``options.max_datasets``."""
    if count > options.max_datasets:
        raise SourceError(
            f"The file holds more than {options.max_datasets:,} datasets (--max_datasets)",
            file=path,
            hint="raise the limit with --max_datasets N if the file is what you meant (each dataset "
            "is walked at planning, and in datasets mode becomes one Example), or name the "
            "datasets to convert with --datasets",
        )
