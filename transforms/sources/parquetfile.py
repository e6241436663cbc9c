"""One Parquet or Arrow IPC (Feather v2) file as the Parquet source reads it, through pyarrow: its schema, its row
groups (Parquet row groups, IPC record batches: the units read), which columns hold nulls, the bytes its rows
declare, and one row group read. Local files are opened by path (an IPC file memory-mapped); gs:// and s3:// ones
through ``fileio.open_read``'s bounded ranged reads, a Parquet row group's column chunks fetched together first
(``fileio.prefetch``), so the server sends the footer and the chunks read, not the whole file per range.

References: the Apache Parquet format (``FileMetaData``, ``RowGroup``, ``ColumnChunk``), the Arrow IPC file
format (``ARROW1``, footer, record batches), ``pyarrow.parquet.ParquetFile`` and ``pyarrow.ipc.open_file``.
"""

from __future__ import annotations

import dataclasses
import os

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.base import refuse_special_file
from tfrecord_etl.transforms.storage import fileio

PARQUET, IPC = "parquet", "ipc"
# bytes a Parquet leaf value may take in memory beyond its encoded size (an int64, an offset of a string): the
# declared size of a column chunk is at most its uncompressed bytes plus this per value
VALUE_BYTES = 8
# remote IPC files' layouts ((path, size) -> (rows per record batch, feature -> null rows)), learned once per process:
# IPC declares no row counts before its batches, so learning them reads every batch (planning, then each worker
# process once, instead of once per opening)
IPC_LAYOUTS: dict[tuple[str, int], tuple[list[int], dict]] = {}


@dataclasses.dataclass
class TableFile:
    """An open Parquet or IPC file: ``kind`` (:data:`PARQUET`, :data:`IPC`), ``schema`` (``pyarrow.Schema``),
    ``groups`` (rows of each row group / record batch, in order), ``size`` (bytes of the file), ``reader`` and the
    remote ``stream`` (None when local). ``ipc_nulls`` (IPC): feature path -> null rows, counted at open."""

    path: str
    kind: str
    schema: object
    groups: list[int]
    size: int
    reader: object
    stream: object = None
    ipc_nulls: dict = dataclasses.field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return sum(self.groups)

    def has_nulls(self, name: str) -> bool:
        """True when the scalar column ``name`` (``a/b`` for a struct's field) holds a null in some row: by the
        Parquet column chunks' statistics, read from the column itself when a chunk has none."""
        if self.kind == IPC:
            return bool(self.ipc_nulls.get(name))
        meta, dotted = self.reader.metadata, name.replace("/", ".")
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            for c in range(rg.num_columns):
                col = rg.column(c)
                if col.path_in_schema != dotted:
                    continue
                stats = col.statistics
                if stats is None or not stats.has_null_count:
                    return self._read_nulls(name)
                if stats.null_count:
                    return True
        return False

    def _read_nulls(self, name: str) -> bool:
        top, *fields = name.split("/")
        column = self.reader.read(columns=[top]).column(0)
        for field in fields:
            column = column.combine_chunks().field(field)  # (a struct's nulls are in its fields' validity)
        return column.null_count > 0

    def declared_bytes(self, columns: list[str]) -> int:
        """What reading ``columns`` of every row group may take in memory, from the file's own metadata (before
        any data is read): per Parquet column chunk its uncompressed bytes plus :data:`VALUE_BYTES` per value;
        for an IPC file the record batches' bytes (read at open: IPC declares no sizes before its data)."""
        if self.kind == IPC:
            return 0
        meta, total = self.reader.metadata, 0
        wanted = set(columns)
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            for c in range(rg.num_columns):
                col = rg.column(c)
                if col.path_in_schema.split(".")[0] in wanted:
                    total += col.total_uncompressed_size + VALUE_BYTES * col.num_values
        return total

    def chunk_ranges(self, group: int, columns: list[str]) -> list[tuple[int, int]]:
        """The byte ranges ``[(offset, length)]`` of ``columns``' chunks in Parquet row group ``group``."""
        rg, out, wanted = self.reader.metadata.row_group(group), [], set(columns)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if col.path_in_schema.split(".")[0] in wanted:
                starts = [o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None and o > 0]
                if starts:
                    out.append((min(starts), col.total_compressed_size))
        return out

    def read_group(self, group: int, columns: list[str]):
        """Row group ``group``'s ``columns`` as a ``pyarrow.Table`` (a Parquet row group, an IPC record batch)."""
        import pyarrow as pa

        if self.kind == IPC:
            batch = self.reader.get_batch(group)
            return pa.Table.from_batches([batch]).select(columns)
        if self.stream is not None:
            fileio.prefetch(self.stream, self.chunk_ranges(group, columns))
        return self.reader.read_row_group(group, columns=columns)

    def close(self) -> None:
        for handle in (self.reader, self.stream):
            try:
                if handle is not None and hasattr(handle, "close"):
                    handle.close()
            except Exception:  # noqa: BLE001 - closing a broken file is not an error of its own
                pass


def open_table(path: str, magic: bytes) -> TableFile:
    """``path`` opened by pyarrow as Parquet (``magic`` ``PAR1``) or Arrow IPC (``ARROW1``), its metadata read.

    Raises:
      SourceError: pyarrow cannot read the file (a truncated file, a footer longer than the file, a corrupt
        schema: pyarrow's reason in one line, naming the file).
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    refuse_special_file(path)
    local = fileio.is_local(path)
    stream = None if local else fileio.open_read(path)
    kind = PARQUET if magic.startswith(b"PAR1") else IPC
    try:
        if kind == PARQUET:
            reader = pq.ParquetFile(path if local else stream, pre_buffer=False)
            meta = reader.metadata
            groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            schema = reader.schema_arrow
            size = _local_size(path) if local else stream.seek(0, 2)
            return TableFile(path, kind, schema, groups, size, reader, stream)
        source = pa.memory_map(path) if local else stream
        reader = ipc.open_file(source)
        size = _local_size(path) if local else stream.seek(0, 2)
        layout = IPC_LAYOUTS.get((path, size)) if not local else None
        if layout is None:
            groups, nulls = [], {}
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                groups.append(batch.num_rows)
                for field, column in zip(batch.schema, batch.columns):
                    _count_nulls(pa, field.name, column, nulls)
            layout = groups, nulls
            if not local:
                IPC_LAYOUTS[(path, size)] = layout
        return TableFile(path, kind, reader.schema, layout[0], size, reader, stream, layout[1])
    except SourceError:
        raise
    except Exception as e:  # pyarrow's ArrowInvalid / OSError / ValueError on a broken file
        if stream is not None:
            stream.close()
        what = "Parquet" if kind == PARQUET else "Arrow IPC (Feather)"
        reason = " ".join(str(e).split())[:300]
        raise SourceError(
            f"Not a readable {what} file: {reason}",
            file=path,
            hint="check that the file is complete and well-formed (a copy cut short loses the footer, which "
            "Parquet and Arrow IPC files keep at their end)",
        ) from None


def _local_size(path: str) -> int:
    return os.path.getsize(path)


def _count_nulls(pa, name: str, column, out: dict) -> None:
    """Null rows of each scalar feature of an IPC column (a struct's fields as ``name/field``), added to ``out``."""
    if pa.types.is_struct(column.type):
        for field, child in zip(column.type, column.flatten()):
            _count_nulls(pa, f"{name}/{field.name}", child, out)
        return
    out[name] = out.get(name, 0) + column.null_count
