"""The DoFns and PTransforms that wire the sources, the codec and the shard writers into Beam.

Reading: ``ReadFromArrays`` (and ``ReadFromHdf5`` / ``ReadFromNpz`` / ``ReadFromNpy``) -> ``(RowRange, columns)``
batches; ``EncodeExamples`` -> serialized records. Writing: ``WriteShardFn`` (the planned writer: one shard plan
read, encoded and written per element, committed through ``transforms.output.sink``), ``WriteToShards`` (Beam's
``WriteToTFRecord``) and ``WriteMetadataFn`` (the count check and ``metadata.json``, the commit point). Planning
lives in ``transforms.planning``; ``transforms.convert`` composes these into ``ConvertToTFRecord``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics import Metrics

from tfrecord_etl.transforms import sources
from tfrecord_etl.transforms.codec import EncodedBatch, FeatureSpec, encode_columns
from tfrecord_etl.transforms.collections import sharding, splits
from tfrecord_etl.transforms.collections.splits import SplitPlan
from tfrecord_etl.transforms.errors import InputChangedError, RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata, outdir, sink, tfds_info, tfrecord
from tfrecord_etl.transforms.output.commit import OutputCommit  # its home: the output and its commit
from tfrecord_etl.transforms.output.runlock import CarriesRun
from tfrecord_etl.transforms.planning import InputPlan, add_provenance, plan_inputs, shard_suffix
from tfrecord_etl.transforms.sources import RowRange, Source, SourceOptions
from tfrecord_etl.transforms.storage import fileio

log = logging.getLogger(__name__)
NAMESPACE = "tfrecord_etl"
# Distributions of wall-clock times (ms since the epoch) at which shard writers start and finish: their
# span (last finish - first start) is the run's work time without start-up and tear-down.
SHARD_START_MS, SHARD_END_MS = "shard_start_ms", "shard_end_ms"


class ShardClock:
    """Records a shard writer's start and end times in the SHARD_START_MS/SHARD_END_MS distributions."""

    def __init__(self):
        self._start = Metrics.distribution(NAMESPACE, SHARD_START_MS)
        self._end = Metrics.distribution(NAMESPACE, SHARD_END_MS)

    def start(self) -> None:
        self._start.update(int(time.time() * 1000))

    def end(self) -> None:
        self._end.update(int(time.time() * 1000))


DEAD_LETTERS = "dead_letters"


def dead_letter(rr: RowRange, error: BaseException) -> dict:
    """The JSON-able record of a row range that could not be read or encoded."""
    ctx = getattr(error, "context", {})
    return {
        "file": rr.path,
        "datasets": list(rr.items) if not rr.item_files else [],
        "files": list(rr.items) if rr.item_files else [],
        "start": rr.start,
        "stop": rr.stop,
        "rows": rr.num_rows,
        "error": type(error).__name__,
        "message": getattr(error, "message", str(error)),
        "context": {k: str(v) for k, v in ctx.items()},
    }


def dead_range(letter: dict) -> dict:
    """What ``metadata.json`` keeps of one dead letter (its ``dead_letters`` list): the rows that have no record,
    ``{"file", "start", "stop", "rows", "error"[, "files"]}`` (rows ``[start, stop)`` of the input ``file``, its
    index path; ``files``: the files of those rows in files / npy files modes). verify --source expects exactly
    these rows to be absent."""
    out = {k: letter[k] for k in ("file", "start", "stop", "rows", "error")}
    if letter.get("files"):
        out["files"] = list(letter["files"])
    return out


def write_dead_letters(dead_letter_dir: str, name: str, letters: list[dict]) -> str:
    """Writes ``letters`` as JSON lines to ``dead_letter_dir/name.jsonl`` (through ``sink``); returns its path."""
    return sink.write_json_lines(fileio.join(dead_letter_dir, f"{name}.jsonl"), letters)


class ReadRowRangesFn(CarriesRun, beam.DoFn):
    """Reads one RowRange into a batch of columns: ``(RowRange, {name: array (rows, *shape)})``."""

    def __init__(self, source: Source):
        self._source = source
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_read")

    def process(self, rr: RowRange):
        columns = self._source.read_pinned(rr)
        self._rows.inc(rr.num_rows)
        self._bytes.inc(sum(v.nbytes for v in columns.values() if isinstance(v, np.ndarray)))
        yield rr, columns

    def finish_bundle(self):
        self._source.close()  # files stay open between the ranges of a bundle, not after it


class ReadFromArrays(beam.PTransform):
    """Reads the array files matching a pattern (any registered source) as batches ``(RowRange, columns)``.

    Row ranges are planned at construction (see :func:`plan_inputs`) and spread across workers with
    a Reshuffle, so one big file is read by many workers, each holding one range at a time.
    """

    def __init__(self, pattern: str, options: SourceOptions = SourceOptions(), plan: InputPlan | None = None):
        super().__init__()
        self.plan = plan or plan_inputs(pattern, options)

    def expand(self, pbegin):
        return (
            pbegin
            | "CreateRowRanges" >> beam.Create(list(self.plan.ranges), reshuffle=True)
            | "ReadRowRanges" >> beam.ParDo(ReadRowRangesFn(self.plan.source))
        )


class ReadFromHdf5(ReadFromArrays):
    """ReadFromArrays for HDF5 files (``datasets``: dataset paths, default all)."""

    def __init__(self, pattern: str, datasets=None, target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(
            pattern, SourceOptions("hdf5", tuple(datasets) if datasets else None, target_range_bytes=target_range_bytes)
        )


class ReadFromNpz(ReadFromArrays):
    """ReadFromArrays for .npz archives (``mode``: ``rows`` or ``arrays``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("npz", npz_mode=mode, target_range_bytes=target_range_bytes))


class ReadFromNpy(ReadFromArrays):
    """ReadFromArrays for .npy files (``mode``: ``rows`` or ``files``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("npy", npy_mode=mode, target_range_bytes=target_range_bytes))


class ReadFromRaw(ReadFromArrays):
    """ReadFromArrays for raw binary files of fixed-size rows (``dtype``, ``shape`` with -1 first for rows from the
    file size, ``offset`` bytes of header, ``order`` C or F, ``count`` rows after the offset (None: to the end of
    the file); any of them may come from a sidecar instead)."""

    def __init__(
        self,
        pattern: str,
        dtype=None,
        shape=None,
        offset=0,
        order="C",
        count=None,
        target_range_bytes=sources.DEFAULT_RANGE_BYTES,
    ):
        super().__init__(
            pattern,
            SourceOptions(
                "raw",
                target_range_bytes=target_range_bytes,
                raw_dtype=dtype,
                raw_shape=tuple(shape) if shape else None,
                raw_offset=offset,
                raw_order=order,
                raw_count=count,
            ),
        )


def encode_range(
    rr: RowRange, columns: dict, specs: Sequence[FeatureSpec], allow_lossy=(), provenance=False
) -> EncodedBatch:
    """Encodes the columns of one row range (``{name: (rows, *shape)}``) in one vectorized call; a RecordError
    gets the range's file and rows. With ``provenance`` the ``_source/file`` / ``_source/row`` columns are added."""
    if provenance:
        columns = add_provenance(rr, columns)
    try:
        return encode_columns(columns, specs, rr.num_rows, allow_lossy)
    except RecordError as e:
        raise e.with_context(file=rr.path, rows=f"{rr.start}-{rr.stop - 1}") from None


class EncodeExamplesFn(CarriesRun, beam.DoFn):
    """Encodes a batch of columns into serialized Examples, one vectorized call per batch; yields one record
    (bytes) per row."""

    def __init__(self, specs: Sequence[FeatureSpec], allow_lossy=(), provenance=False):
        self._specs, self._lossy, self._prov = tuple(specs), tuple(allow_lossy), provenance
        self._examples = Metrics.counter(NAMESPACE, "examples_encoded")

    def process(self, element):
        rr, columns = element
        batch = encode_range(rr, columns, self._specs, self._lossy, self._prov)
        self._examples.inc(rr.num_rows)
        yield from batch.records()


class EncodeExamples(beam.PTransform):
    """``(RowRange, columns)`` batches -> serialized ``tf.train.Example`` records (bytes)."""

    def __init__(self, specs, allow_lossy=(), provenance=False):
        super().__init__()
        self._fn = EncodeExamplesFn(specs, allow_lossy, provenance)

    def expand(self, batches):
        return batches | "EncodeBatches" >> beam.ParDo(self._fn)


def encode_splits(
    rr: RowRange,
    columns: dict,
    specs: Sequence[FeatureSpec],
    allow_lossy=(),
    provenance=False,
    split_plan: SplitPlan | None = None,
) -> list[tuple[int, np.ndarray | None, EncodedBatch]]:
    """Encodes the columns of one row range as ``[(split number, rows, batch)]``: one batch (split 0, ``rows``
    None: all of them) without ``split_plan``, else one per split that holds rows of the range
    (``SplitPlan.assign``), ``rows`` their positions in the range (int64), each in row order and encoded in one
    call; a ``by_record`` plan encodes the range once and splits the encoded records (``SplitPlan.split_batch``)."""
    if split_plan is None or not split_plan.hashed:
        return [(0, None, encode_range(rr, columns, specs, allow_lossy, provenance))]
    if split_plan.by_record:
        try:
            return split_plan.split_batch(encode_range(rr, columns, specs, allow_lossy, provenance))
        except RecordError as e:
            raise e.with_context(file=rr.path, rows=f"{rr.start}-{rr.stop - 1}") from None
    if provenance:
        columns = add_provenance(rr, columns)
    try:
        ids = split_plan.assign(rr.path, rr.start, rr.num_rows, columns)
        out = []
        for k in range(len(split_plan.names)):
            rows = np.flatnonzero(ids == k)
            if rows.size:
                part = (
                    columns
                    if rows.size == rr.num_rows
                    else {
                        name: col[rows] if isinstance(col, np.ndarray) else [col[i] for i in rows]
                        for name, col in columns.items()
                    }
                )
                out.append(
                    (
                        k,
                        None if rows.size == rr.num_rows else rows,
                        encode_columns(part, specs, int(rows.size), allow_lossy),
                    )
                )
        return out
    except (RecordError, SchemaError) as e:
        raise e.with_context(file=rr.path, rows=f"{rr.start}-{rr.stop - 1}") from None


def read_and_encode(
    source: Source,
    rr: RowRange,
    specs,
    allow_lossy=(),
    provenance=False,
    dead_letters=False,
    split_plan: SplitPlan | None = None,
) -> tuple[list[tuple[int, np.ndarray | None, EncodedBatch]], list[dict]]:
    """Reads and encodes one row range: ``([(split, rows, batch)...], [])`` (:func:`encode_splits`); with
    ``dead_letters`` a range that fails becomes ``([], [letter])``, except that a range of several files
    (``files`` / npy ``files`` modes: one file per row) is retried file by file, so only the files that fail
    become letters and the others are written.

    Raises:
      Exception: whatever reading or encoding raised, when not ``dead_letters``. InputChangedError: a file changed
        since planning (``Source.read_pinned``), dead letters or not.
    """
    try:
        return encode_splits(rr, source.read_pinned(rr), specs, allow_lossy, provenance, split_plan), []
    except Exception as e:  # noqa: BLE001 - any failure of one range is its dead letter
        if not dead_letters or isinstance(e, InputChangedError):  # a changed input stops the run
            raise
        if not (rr.item_files and rr.num_rows > 1):
            log.warning("Dead-lettering %s: %s", rr.describe(), e)
            return [], [dead_letter(rr, e)]
    batches, letters = [], []
    for i in range(rr.num_rows):
        one = RowRange(rr.path, rr.start + i, rr.start + i + 1, rr.items[i : i + 1], True)
        b, d = read_and_encode(source, one, specs, allow_lossy, provenance, dead_letters, split_plan)
        batches += [(k, i + (np.arange(batch.num_rows) if rows is None else rows), batch) for k, rows, batch in b]
        letters += d
    return batches, letters


class ReadAndEncodeFn(CarriesRun, beam.DoFn):
    """Reads and encodes one RowRange, yielding serialized records (one per element, for
    WriteToTFRecord); a failing range goes to the ``dead_letters`` output when ``dead_letters``."""

    def __init__(self, source: Source, specs, allow_lossy=(), provenance=False, dead_letters=False):
        self._source, self._specs, self._lossy, self._prov = source, tuple(specs), tuple(allow_lossy), provenance
        self._dead_letters = dead_letters
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_read")
        self._examples = Metrics.counter(NAMESPACE, "examples_encoded")
        self._dead = Metrics.counter(NAMESPACE, "rows_dead_lettered")

    def process(self, rr: RowRange):
        batches, letters = read_and_encode(self._source, rr, self._specs, self._lossy, self._prov, self._dead_letters)
        self._rows.inc(rr.num_rows)
        for letter in letters:
            self._dead.inc(letter["rows"])
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, letter)
        for _, _, batch in batches:
            self._examples.inc(batch.num_rows)
            yield from batch.records()

    def finish_bundle(self):
        self._source.close()  # files stay open between the ranges of a bundle, not after it


_BEAM_COMPRESSION = {
    "none": CompressionTypes.UNCOMPRESSED,
    "gzip": CompressionTypes.GZIP,
    "zlib": CompressionTypes.DEFLATE,
}  # Beam's DEFLATE is a zlib stream with header: TF's ZLIB


class WriteToShards(beam.PTransform):
    """Writes records with Beam's ``WriteToTFRecord`` as ``<prefix>-SSSSS-of-NNNNN.tfrecord[.gz]``.

    Returns the PCollection of final shard paths.
    """

    def __init__(self, output_dir: str, prefix: str, num_shards: int, compression: str):
        super().__init__()
        self._prefix = fileio.join(output_dir, prefix)
        self._num_shards, self._compression = num_shards, compression

    def expand(self, records):
        return records | "WriteToTFRecord" >> beam.io.WriteToTFRecord(
            self._prefix,
            file_name_suffix=shard_suffix(self._compression),
            num_shards=self._num_shards,
            shard_name_template="-SSSSS-of-NNNNN",
            compression_type=_BEAM_COMPRESSION[self._compression],
        )


class WriteShardFn(CarriesRun, beam.DoFn):
    """Writes one planned shard: reads its row ranges in order, encodes each in one call, frames the batch
    (google-crc32c) into a temporary file, and commits it under its final name when the records written plus
    the rows dead-lettered equal the rows planned (``sink.shard_writer``). Yields ``{"file", "records", "bytes",
    "crc32c", "dead_rows", "dead_letters"[, "index"]}`` (``crc32c``: of the file's bytes, computed while they are
    written; ``dead_letters``: :func:`dead_range` of each letter); with
    ``index`` the shard's ``tfrecord2idx`` index file is written with it.

    With ``split_plan`` the shard's rows go to one file per split, written side by side by the same worker
    (``<prefix>-<split>.tfrecord-SSSSS-of-NNNNN``, ``splits.shard_name``), all committed only when their records
    together plus the rows dead-lettered equal the rows planned; one dict per file, with ``"split"``.
    """

    def __init__(
        self,
        source: Source,
        specs,
        output_dir: str,
        prefix: str,
        compression: str,
        allow_lossy=(),
        provenance=False,
        dead_letter_dir: str | None = None,
        progress=False,
        index=False,
        split_plan: SplitPlan | None = None,
        codec: dict | None = None,
    ):
        self._source, self._output_dir, self._prefix, self._compression = source, output_dir, prefix, compression
        self._index, self._split_plan, self._codec = index, split_plan, codec
        self._specs, self._lossy, self._prov = tuple(specs), tuple(allow_lossy), provenance
        self._dead_letter_dir, self._progress = dead_letter_dir, progress
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._written = Metrics.counter(NAMESPACE, "examples_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._dead = Metrics.counter(NAMESPACE, "rows_dead_lettered")
        self._clock = ShardClock()

    def _encoded(self, rr: RowRange, letters: list) -> list[tuple[int, np.ndarray | None, EncodedBatch]]:
        """The encoded rows of one range, by split; with a dead-letter dir, what fails becomes letters."""
        try:
            batches, dead = read_and_encode(
                self._source,
                rr,
                self._specs,
                self._lossy,
                self._prov,
                self._dead_letter_dir is not None,
                self._split_plan,
            )
        finally:
            self._rows.inc(rr.num_rows)
        letters += dead
        return batches

    def file_names(self, shard: sharding.ShardPlan) -> list[tuple[str | None, str]]:
        """``[(split or None, file name)]`` of the files one shard plan writes."""
        if self._split_plan is None:
            return [(None, shard.file_name(self._prefix, shard_suffix(self._compression)))]
        suffix = tfrecord.SUFFIXES[self._compression]
        return [
            (split, splits.shard_name(self._prefix, split, shard.index, shard.num_shards, suffix))
            for split in self._split_plan.names
        ]

    def process(self, shards: sharding.ShardPlan | tuple[sharding.ShardPlan, ...]):
        """Writes one shard plan, or a group of them in order (``sharding.group_sequential``: the source's files
        stay open from one shard of the group to the next, so a deflated member is streamed once)."""
        try:
            for shard in (shards,) if isinstance(shards, sharding.ShardPlan) else shards:
                yield from self._write(shard)
        finally:
            self._source.close()  # files stay open between the ranges of a shard (group), not after it

    def _write(self, shard: sharding.ShardPlan) -> list[dict]:
        self._clock.start()
        files = self.file_names(shard)
        name = shard.file_name(self._prefix, shard_suffix(self._compression))  # the shard plan's own name
        letters: list[dict] = []
        with contextlib.ExitStack() as stack:
            writers = [
                stack.enter_context(
                    sink.shard_writer(fileio.join(self._output_dir, f), self._compression, self._index, self._codec)
                )
                for _, f in files
            ]
            for rr in shard.ranges:
                for split, _, batch in self._encoded(rr, letters):
                    writers[split].write_encoded(batch)
            dead_rows = sum(d["rows"] for d in letters)
            records = sum(w.records for w in writers)
            if records + dead_rows != shard.num_rows:
                raise RecordError(
                    f"Shard {name}: {shard.num_rows} rows planned but {records} records "
                    f"written and {dead_rows} rows dead-lettered",
                    file=fileio.join(self._output_dir, files[0][1]),
                )
            if letters:
                write_dead_letters(self._dead_letter_dir, name, letters)
        out: list[dict[str, Any]] = []
        for (split_name, f), writer in zip(files, writers):
            entry: dict[str, Any] = {
                "file": f,
                "records": writer.records,
                "bytes": fileio.size(fileio.join(self._output_dir, f)),
                "crc32c": writer.crc32c,
                "dead_rows": 0,
            }
            if split_name is not None:
                entry["split"] = split_name
            if self._index:
                entry["index"] = tfrecord.index_name(f)
            out.append(entry)
        out[0]["dead_rows"] = dead_rows
        out[0]["dead_letters"] = [dead_range(d) for d in letters]
        size = sum(e["bytes"] for e in out)
        self._written.inc(records)
        self._bytes.inc(size)
        self._shards.inc(len(out))
        self._dead.inc(dead_rows)
        self._clock.end()
        if self._progress:
            print(
                f"[tfrecord-etl] shard {shard.index + 1}/{shard.num_shards} done: "
                f"{', '.join(f for _, f in files)}, {records} records, {size} bytes",
                file=sys.stderr,
                flush=True,
            )
        return out


class KeyShuffledRecordsFn(CarriesRun, beam.DoFn):
    """``--shuffle_seed``: reads and encodes one row range and yields each record as ``((split, shard), (key,
    record))``, ``key`` = ``sharding.shuffle_keys(seed, global row)`` and ``shard = key % num_shards``; a failing
    range goes to the ``dead_letters`` output when ``dead_letters``."""

    def __init__(
        self,
        source: Source,
        specs,
        row_offsets: dict,
        num_shards: int,
        seed: int,
        allow_lossy=(),
        provenance=False,
        dead_letters=False,
        split_plan: SplitPlan | None = None,
    ):
        self._source, self._specs, self._lossy, self._prov = source, tuple(specs), tuple(allow_lossy), provenance
        self._offsets, self._n, self._seed = dict(row_offsets), num_shards, seed
        self._dead_letters, self._split_plan = dead_letters, split_plan
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._examples = Metrics.counter(NAMESPACE, "examples_encoded")
        self._dead = Metrics.counter(NAMESPACE, "rows_dead_lettered")

    def process(self, rr: RowRange):
        batches, letters = read_and_encode(
            self._source, rr, self._specs, self._lossy, self._prov, self._dead_letters, self._split_plan
        )
        self._rows.inc(rr.num_rows)
        for letter in letters:
            self._dead.inc(letter["rows"])
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, letter)
        start = self._offsets[rr.path] + rr.start
        for split, rows, batch in batches:
            self._examples.inc(batch.num_rows)
            rows = np.arange(batch.num_rows) if rows is None else rows
            keys = sharding.shuffle_keys(self._seed, start + rows)
            shards = sharding.shuffled_shards(keys, self._n)
            for key, shard, record in zip(keys.tolist(), shards.tolist(), batch.records()):
                yield (split, shard), (key, record)

    def finish_bundle(self):
        self._source.close()


class WriteShuffledShardFn(CarriesRun, beam.DoFn):
    """``--shuffle_seed``: one shard's grouped ``(key, record)`` values (and a ``None`` per shard, so an empty shard
    is written too) -> the shard file, records in key order, committed through ``sink.shard_writer``. Holds the
    shard's records in memory (about ``--target_shard_mb``). Yields ``{"file", "records", "bytes", "crc32c"[,
    "split", "index"]}``."""

    def __init__(
        self,
        output_dir: str,
        prefix: str,
        compression: str,
        num_shards: int,
        split_names: Sequence[str] = (),
        index=False,
        codec: dict | None = None,
    ):
        self._output_dir, self._prefix, self._compression = output_dir, prefix, compression
        self._n, self._names, self._index, self._codec = num_shards, tuple(split_names), index, codec
        self._written = Metrics.counter(NAMESPACE, "examples_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._clock = ShardClock()

    def process(self, element):
        (split, shard), values = element
        self._clock.start()
        records = sorted((v for v in values if v is not None), key=lambda kv: kv[0])
        name = splits.shard_name(
            self._prefix,
            self._names[split] if self._names else None,
            shard,
            self._n,
            tfrecord.SUFFIXES[self._compression],
        )
        final = fileio.join(self._output_dir, name)
        with sink.shard_writer(final, self._compression, self._index, self._codec) as writer:
            for i in range(0, len(records), 4096):
                writer.write_batch([r for _, r in records[i : i + 4096]])
        out = {
            "file": name,
            "records": writer.records,
            "bytes": fileio.size(final),
            "crc32c": writer.crc32c,
            "dead_rows": 0,
        }
        if self._names:
            out["split"] = self._names[split]
        if self._index:
            out["index"] = tfrecord.index_name(name)
        self._written.inc(writer.records)
        self._bytes.inc(out["bytes"])
        self._shards.inc()
        self._clock.end()
        yield out


class WritePlannedShards(beam.PTransform):
    """Planned shards -> TFRecord files, with no shuffle of the data; yields per-shard counts. Shards that
    continue a file of ``sequential`` paths (``FileIndex.sequential``) go to the worker of the shard before them
    (``sharding.group_sequential``)."""

    def __init__(self, shards, write_fn: WriteShardFn, sequential=()):
        super().__init__()
        self._groups, self._fn = sharding.group_sequential(list(shards), sequential), write_fn

    def expand(self, pbegin):
        return (
            pbegin
            # Create spreads its values itself (a Reshuffle inside it): a second one only cost start-up
            | "CreateShardPlans" >> beam.Create(self._groups, reshuffle=True)
            | "WriteShards" >> beam.ParDo(self._fn)
        )


def count_shard(path: str, compression: str, index: bool = False) -> dict:
    """``{"file", "records", "bytes", "crc32c"[, "index"]}`` of one shard written by Beam's ``WriteToTFRecord``, by
    walking its frames (CRCs checked) once: the file's CRC32C is computed in the same pass (Beam's sink gives no
    hook on the bytes it writes); with ``index`` its ``tfrecord2idx`` index file is written from the same walk."""
    tfrecord.check_regular(path)
    with fileio.open_read(path) as raw:
        stream = tfrecord.ChecksumReader(raw)
        lengths = [
            len(record) for _, _, record in tfrecord.iter_records(tfrecord.open_decompressed(stream, compression), path)
        ]
        stream.drain()
    out = {"file": fileio.basename(path), "records": len(lengths), "bytes": stream.bytes, "crc32c": stream.crc32c}
    if index:
        out["index"] = fileio.basename(sink.write_index(path, tfrecord.index_text(np.array(lengths, np.int64))))
    return out


class WriteMetadataFn(CarriesRun, beam.DoFn):
    """Checks rows in = records out + rows dead-lettered and writes ``metadata.json`` last (the commit point),
    with the row ranges dead-lettered (``dead_letters``, :func:`dead_range`, sorted by file and row; those of the
    runs before it kept); then deletes the files of the output it replaced and the temporaries of killed or
    duplicate attempts.

    Raises:
      RecordError: records lost or duplicated.
    """

    def __init__(self, commit: OutputCommit):
        self._commit = commit

    def process(self, shards, extra_dead_letters=()):
        """``shards``: per-shard counts (a planned shard's own dead letters in ``dead_letters``);
        ``extra_dead_letters``: :func:`dead_range` of the rows dead-lettered outside the shard counts."""
        outdir.failpoint("before-commit")
        c = self._commit
        order = {name: i for i, name in enumerate(c.split_names)}
        shards = new = sorted(shards, key=lambda s: (order.get(s.get("split"), 0), s["file"]))
        written = sum(s["records"] for s in shards)
        letters = [d for s in shards for d in s.pop("dead_letters", ())] + list(extra_dead_letters)
        letters.sort(key=lambda d: (d["file"], d["start"]))
        dead = sum(s.pop("dead_rows", 0) for s in shards) + sum(d["rows"] for d in extra_dead_letters)
        if written + dead != c.expected_rows:
            raise RecordError(
                f"Rows read ({c.expected_rows}) != examples written ({written}) + rows dead-lettered "
                f"({dead}): records were lost or duplicated",
                file=c.output_dir,
                hint="re-run; report it if it happens again",
            )
        # each run's splits, rows read, rows dead-lettered and inputs; a split added to a directory of others
        # (--tfds_name --split) lists theirs first, as they were
        run = {
            "splits": list(dict.fromkeys(s["split"] for s in new if "split" in s)),
            "rows_read": c.expected_rows,
            "rows_dead_lettered": dead,
            "sources": list(c.sources),
        }
        specs, runs = (c.carried["features"], list(c.carried["runs"]) + [run]) if c.carried else (c.specs, [run])
        if c.carried:
            shards = list(c.carried["shards"]) + shards
        meta = metadata.build(
            specs, shards, c.compression, [x for r in runs for x in r["sources"]], c.writer, c.options
        )
        if c.codec:
            meta["compression_backend"] = dict(c.codec)
        meta["rows_read"] = sum(r["rows_read"] for r in runs)
        meta["rows_dead_lettered"] = sum(r["rows_dead_lettered"] for r in runs)
        if letters or (c.carried or {}).get("dead_letters"):
            meta["dead_letters"] = list((c.carried or {}).get("dead_letters") or ()) + letters
        if run["splits"]:
            meta["runs"] = runs
        meta.update(c.described)
        if c.tfds_name:
            meta["tfds"] = {
                "name": c.tfds_name,
                "version": tfds_info.VERSION,
                "files": tfds_info.write(c.output_dir, c.tfds_name, specs, shards),
            }
        metadata.write(c.output_dir, meta, specs, c.replaced.metadata_version)
        outdir.finish_replacement(c.output_dir, c.replaced)
        outdir.remove_temporaries(c.output_dir, [s["file"] for s in shards])
        yield c.output_dir


class FinalizeOutput(beam.PTransform):
    """Per-shard counts (``{"file", "records", "bytes"[, "dead_rows", "dead_letters"]}``) -> ``metadata.json``,
    written after every shard is final. ``dead_letters``: an optional singleton PCollection of the list of rows
    dead-lettered elsewhere (:func:`dead_range` of each letter)."""

    def __init__(self, commit: OutputCommit, dead_letters=None):
        super().__init__()
        self._fn, self._dead_letters = WriteMetadataFn(commit), dead_letters

    def expand(self, shards):
        extra = () if self._dead_letters is None else (beam.pvalue.AsSingleton(self._dead_letters),)
        return shards | "CollectShards" >> beam.combiners.ToList() | "WriteMetadata" >> beam.ParDo(self._fn, *extra)
