"""``--format parquet``: Parquet, Feather (v2) and Arrow IPC files, read with pyarrow. Each row of the table is one
Example, each column a feature (``parquetcolumns`` says which Arrow types become which features); row groups
(Parquet) and record batches (IPC) are the units read, so a row range reads the row groups it overlaps, and a worker
thread keeps the last one it decoded for the next range of the same file.

By default every column is converted except pandas' unnamed index (``__index_level_N__``, which
``pandas.read_parquet`` turns back into the frame's index, not a column); ``--datasets`` names the columns to
convert (an index column too). gs:// and s3:// inputs are read with the project's bounded ranged reads
(``parquetfile``).
"""

from __future__ import annotations

import json
import logging
import re

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources.base import (
    Columns,
    FileIndex,
    RowRange,
    Source,
    check_names,
    refuse_special_file,
    row_bytes,
)
from tfrecord_etl.transforms.sources.parquetcolumns import column_values, field_specs
from tfrecord_etl.transforms.sources.parquetfile import TableFile, open_table
from tfrecord_etl.transforms.sources.signatures import read_head

log = logging.getLogger("tfrecord_etl.transforms.sources")

PANDAS_INDEX = re.compile(r"__index_level_\d+__")
MIN_DECLARED_BYTES = 2**20  # a file may always declare this much in memory, whatever its size


class ParquetSource(Source):
    """Parquet (``PAR1``), Feather v2 and Arrow IPC (``ARROW1``) files: one Example per table row, one feature per
    column (per field of a struct column), read with pyarrow."""

    options_models = ("options_numpy.NumpyOptions",)  # --max_compression_ratio (the compressed-bomb limit)

    format_name = "parquet"
    help_label = "Parquet, Feather and Arrow IPC tables"
    suffixes = (".parquet", ".pq", ".feather", ".arrow", ".ipc")
    magic = (b"PAR1", b"ARROW1")  # Parquet's magic (at both ends); the Arrow IPC file format's (Feather v2)
    content_label = "a Parquet or Arrow IPC (Feather) file"

    def _open(self, path: str) -> TableFile:
        """``path`` opened by this worker thread (kept for its next row range; :meth:`close` closes it)."""
        files = self._local.__dict__.setdefault("files", {})
        if path not in files:
            refuse_special_file(path)
            head = read_head(path, 8)
            if not head.startswith((b"PAR1", b"ARROW1")):
                raise SourceError(
                    f"Not a Parquet or Arrow IPC file: its first bytes are {head[:8]!r}, not PAR1 or ARROW1",
                    file=path,
                    hint="Feather v1 files (FEA1, pyarrow < 0.17) are not read: write them again with "
                    "pyarrow.feather.write_feather(pyarrow.feather.read_table(FILE), NEW)",
                )
            files[path] = open_table(path, head)
        return files[path]

    def columns(self, table: TableFile) -> list[str]:
        """The top-level columns converted: ``--datasets`` (each checked to exist), else every column but
        pandas' unnamed index columns.

        Raises:
          SchemaError: a name of ``--datasets`` that is no column (listing the columns).
        """
        names = list(table.schema.names)
        if self.options.datasets:
            missing = [n for n in self.options.datasets if n not in names]
            if missing:
                raise SchemaError(
                    f"No column {missing[0]!r} in the table (its columns: {', '.join(names)})",
                    file=table.path,
                    hint="--datasets names the columns to convert, comma-separated",
                )
            return list(self.options.datasets)
        index = pandas_index(table.schema)
        skipped = [n for n in names if n in index and PANDAS_INDEX.fullmatch(n)]
        if skipped:
            log.info("%s: pandas' unnamed index column(s) %s left out (--datasets takes them)", table.path, skipped)
        return [n for n in names if n not in skipped]

    def index(self, path: str) -> FileIndex:
        """Rows and features of ``path`` from its footer (Parquet: the schema, row groups and column statistics;
        IPC: the schema and record batches).

        Raises:
          SourceError: not readable by pyarrow (one line: truncated, footer larger than the file), or its declared
            sizes exceed ``--max_compression_ratio`` times the file (a compressed bomb), before any data is read.
          SchemaError: a column of a type no feature carries; ``--datasets`` naming no column; no column left.
        """
        table = self._open(path)
        names = self.columns(table)
        if not names:
            raise SchemaError("The table has no column to convert", file=path, hint="--datasets names columns")
        specs = [s for n in names for s in field_specs(table.schema.field(n), path, table.has_nulls)]
        check_names(specs, path)
        self._check_declared(table, names, specs)
        groups = table.groups
        uniform = groups[0] if groups and all(g == groups[0] for g in groups[:-1]) else 1
        return FileIndex(path, table.num_rows, tuple(specs), row_bytes(specs), max(1, uniform), tuple(names))

    def _check_declared(self, table: TableFile, names: list[str], specs) -> None:
        """Refuses a file whose rows declare more bytes than ``--max_compression_ratio`` times its size (at least
        :data:`MIN_DECLARED_BYTES`): fixed-size rows by their shape, Parquet column chunks by their metadata."""
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions

        ratio = self.options.of(NumpyOptions).max_compression_ratio
        fixed = sum(int(np.dtype(s.dtype).itemsize) * int(np.prod(s.shape)) for s in specs if s.is_fixed and _num(s))
        declared = max(fixed * table.num_rows, table.declared_bytes(names))
        limit = max(MIN_DECLARED_BYTES, ratio * table.size)
        if declared > limit:
            raise SourceError(
                f"The file declares {declared:,} bytes of values ({table.num_rows:,} rows) in {table.size:,} bytes: "
                f"more than --max_compression_ratio {ratio:g} times its size (a compressed bomb, or absurd "
                f"dimensions?)",
                file=table.path,
                hint="if the data is genuine (e.g. long runs of one value), raise --max_compression_ratio",
            )

    def read(self, rr: RowRange) -> Columns:
        """Rows ``rr.start``..``rr.stop`` of the columns ``rr.items``: ``{feature: rows}`` (see
        ``parquetcolumns.column_values`` for each kind of column).

        Raises:
          SourceError: the file cannot be read (naming the row group), a null where no feature carries it.
        """
        table = self._open(rr.path)
        names = list(rr.items) or self.columns(table)
        specs = [s for n in names for s in field_specs(table.schema.field(n), rr.path, table.has_nulls)]
        parts: dict[str, list] = {s.name: [] for s in specs}
        first = 0
        for g, rows in enumerate(table.groups):
            lo, hi = max(rr.start, first), min(rr.stop, first + rows)
            if lo < hi:
                data = self._group(table, g, names).slice(lo - first, hi - lo)
                for s in specs:
                    parts[s.name].append(column_values(s, _feature_array(data, s.name), rr.path, lo))
            first += rows
            if first >= rr.stop:
                break
        return {name: _join(chunks) for name, chunks in parts.items()}

    def _group(self, table: TableFile, group: int, names: list[str]):
        """Row group ``group`` of ``table`` (its columns ``names``), the last one read by this thread kept."""
        key = (table.path, group, tuple(names))
        kept = getattr(self._local, "group", None)
        if kept is not None and kept[0] == key:
            return kept[1]
        self._local.group = None
        try:
            data = table.read_group(group, names)
        except Exception as e:  # pyarrow's errors on a corrupt or truncated page
            reason = " ".join(str(e).split())[:300]
            raise SourceError(
                f"Cannot read row group {group} ({table.groups[group]:,} rows): {reason}",
                file=table.path,
                hint="check that the file is complete and not corrupt (pyarrow.parquet.read_table reads it too?)",
            ) from None
        self._local.group = (key, data)
        return data

    def close(self) -> None:
        for table in getattr(self._local, "files", {}).values():
            table.close()
        self._local.files, self._local.group = {}, None


def _num(spec) -> bool:
    return spec.dtype not in (None, "bytes")


def pandas_index(schema) -> set[str]:
    """The columns pandas stored its index in (the ``pandas`` schema metadata's ``index_columns``: names; a
    ``RangeIndex`` is stored as metadata only)."""
    meta = (schema.metadata or {}).get(b"pandas")
    if not meta:
        return set()
    try:
        return {c for c in json.loads(meta).get("index_columns", []) if isinstance(c, str)}
    except (ValueError, AttributeError):
        return set()


def _feature_array(data, name: str):
    """The combined ``pyarrow.Array`` of feature ``name`` (``a/b``: field ``b`` of struct column ``a``)."""
    top, *fields = name.split("/")
    array = data.column(top).combine_chunks()
    for field in fields:
        array = dict(zip([f.name for f in array.type], array.flatten()))[field]
    return array


def _join(chunks: list):
    """One column from the row groups' parts: arrays concatenated, per-row lists joined."""
    if len(chunks) == 1:
        return chunks[0]
    if chunks and isinstance(chunks[0], np.ndarray) and chunks[0].dtype != object:
        return np.concatenate(chunks)
    return [row for chunk in chunks for row in chunk]
