"""PTransforms and DoFns that wire the sources, the codec and the shard writers into Beam.

The convert pipeline reads as::

    ReadFromArrays -> EncodeExamples -> WriteToTFRecord -> CountShardRecords -> WriteMetadata

Planning (matching files, indexing rows and features, splitting row ranges) happens when the
transform is built, in the launcher, like Beam's file sources estimate sizes: a bad input fails
before any output exists, and the shard count and feature specs are known up front.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics import Metrics

from transforms import fileio, metadata, outdir, sharding, sources, tfrecord
from transforms.codec import FeatureSpec, check_spec, encode_columns
from transforms.errors import RecordError, SchemaError
from transforms.outdir import TEMP_PREFIX
from transforms.sources import FileIndex, RowRange, Source, SourceOptions

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
PROVENANCE = (FeatureSpec("_source/file", "bytes", (), "list"), FeatureSpec("_source/row", "<i8", (), "list"))


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """Everything known of the inputs before the pipeline runs."""

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
        return sum(sum(i.sizes) if i.sizes else i.num_rows * i.row_bytes for i in self.indexes)

    def with_range_bytes(self, target_bytes: int) -> "InputPlan":
        """The same inputs split into row ranges of ``target_bytes`` (no file is opened again)."""
        ranges = [r for i in self.indexes for r in sources.plan_row_ranges(i, target_bytes)]
        return dataclasses.replace(self, ranges=tuple(ranges), range_bytes=target_bytes)

    def as_written(self, num_shards: int) -> "InputPlan":
        """The same inputs with the row ranges the planned writer reads for ``num_shards`` shards, in order
        (what its dead letters name)."""
        return dataclasses.replace(self, ranges=tuple(r for s in self.shards(num_shards) for r in s.ranges))

    def shards(self, num_shards: int) -> list[sharding.ShardPlan]:
        """Contiguous shard plans of equal bytes (within a chunk of rows), each a list of row ranges of
        at most ``range_bytes``; see :func:`sharding.plan_balanced_shards`. Files of per-row sizes (npz
        arrays, npy files modes) are grouped by whole ranges, split further when fewer than shards."""
        balanced = sharding.plan_balanced_shards(self.indexes, num_shards, self.range_bytes)
        if balanced is not None:
            return balanced
        plan = self
        if len(plan.ranges) < num_shards:
            plan = plan.with_range_bytes(max(1, plan.num_bytes // num_shards))
        by_path = {i.path: i for i in plan.indexes}
        sizes = [sharding.range_bytes(r, by_path[r.path]) for r in plan.ranges]
        return sharding.plan_shards(plan.ranges, sizes, num_shards)


def plan_inputs(pattern: str, options: SourceOptions) -> InputPlan:
    """Matches ``pattern``, indexes every file and plans row ranges of ``options.target_range_bytes``.

    Raises:
      SourceError, SchemaError: unmatched pattern, unreadable file, unsupported dtype, features that
        differ between files (naming the file and dataset/member).
    """
    files = fileio.match(pattern)
    fmt = sources.format_of(files[0][0], options)
    source = sources.make_source(fmt, options)
    indexes = [source.index(path) for path, _ in files]
    specs = sources.merge_specs(indexes, loose=source.loose)
    if sources.files_mode(source):  # all files together are one sequence of rows
        indexes = [FileIndex(pattern, len(indexes), specs, max(i.row_bytes for i in indexes), 1,
                             tuple(i.path for i in indexes), tuple(i.sizes[0] for i in indexes), item_files=True)]
    ranges = [r for i in indexes for r in sources.plan_row_ranges(i, options.target_range_bytes)]
    return InputPlan(source, tuple(indexes), specs, tuple(ranges), options.target_range_bytes)


def choose_encodings(specs: Sequence[FeatureSpec], default: str, per_feature: dict, allow_lossy=(),
                     where: str | None = None) -> tuple:
    """Sets each feature's encoding (per-feature choice, else ``default``; variable-length strings are
    always ``list``, varying dtypes always ``tensor``) and checks it.

    Raises:
      SchemaError: an encoding that cannot carry the feature (naming ``where``, the input pattern).
      ConfigError: ``per_feature`` names a feature that does not exist.
    """
    unknown = set(per_feature) - {s.name for s in specs}
    if unknown:
        from transforms.errors import ConfigError
        raise ConfigError(f"feature_encodings names unknown features {sorted(unknown)}",
                          hint=f"features are {[s.name for s in specs]}")
    out = []
    for s in specs:
        enc = per_feature.get(s.name)
        if enc is None:
            enc = "list" if s.dtype == "bytes" else ("tensor" if s.dtype is None else default)
        spec = dataclasses.replace(s, encoding=enc)
        try:
            check_spec(spec, allow_lossy)
        except SchemaError as e:
            raise e.with_context(file=where) from None
        out.append(spec)
    return tuple(out)


DEAD_LETTERS = "dead_letters"


def dead_letter(rr: RowRange, error: BaseException) -> dict:
    """The JSON-able record of a row range that could not be read or encoded."""
    ctx = getattr(error, "context", {})
    return {"file": rr.path, "datasets": list(rr.items) if not rr.item_files else [],
            "files": list(rr.items) if rr.item_files else [], "start": rr.start, "stop": rr.stop,
            "rows": rr.num_rows, "error": type(error).__name__,
            "message": getattr(error, "message", str(error)), "context": {k: str(v) for k, v in ctx.items()}}


def write_dead_letters(dead_letter_dir: str, name: str, letters: list[dict]) -> str:
    """Writes ``letters`` as JSON lines to ``dead_letter_dir/name.jsonl`` (temp file + rename)."""
    import json
    import uuid
    final = fileio.join(dead_letter_dir, f"{name}.jsonl")
    temp = fileio.join(dead_letter_dir, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")
    fileio.write_bytes(temp, "".join(json.dumps(d, sort_keys=True) + "\n" for d in letters).encode())
    fileio.rename(temp, final)
    return final


class ReadRowRangesFn(beam.DoFn):
    """Reads one RowRange into a batch of columns: ``(RowRange, {name: array (rows, *shape)})``."""

    def __init__(self, source: Source):
        self._source = source
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_read")

    def process(self, rr: RowRange):
        columns = self._source.read(rr)
        self._rows.inc(rr.num_rows)
        self._bytes.inc(sum(v.nbytes for v in columns.values() if isinstance(v, np.ndarray)))
        yield rr, columns

    def finish_bundle(self):
        self._source.close()  # files stay open between the ranges of a bundle, not after it


class ReadFromArrays(beam.PTransform):
    """Reads HDF5 / .npz / .npy files matching a pattern as batches ``(RowRange, columns)``.

    Row ranges are planned at construction (see :func:`plan_inputs`) and spread across workers with
    a Reshuffle, so one big file is read by many workers, each holding one range at a time.
    """

    def __init__(self, pattern: str, options: SourceOptions = SourceOptions(), plan: InputPlan | None = None):
        super().__init__()
        self.plan = plan or plan_inputs(pattern, options)

    def expand(self, pbegin):
        return (pbegin
                | "CreateRowRanges" >> beam.Create(list(self.plan.ranges))
                | "SpreadRowRanges" >> beam.Reshuffle()
                | "ReadRowRanges" >> beam.ParDo(ReadRowRangesFn(self.plan.source)))


class ReadFromHdf5(ReadFromArrays):
    """ReadFromArrays for HDF5 files (``datasets``: dataset paths, default all)."""

    def __init__(self, pattern: str, datasets=None, target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("hdf5", tuple(datasets) if datasets else None,
                                                target_range_bytes=target_range_bytes))


class ReadFromNpz(ReadFromArrays):
    """ReadFromArrays for .npz archives (``mode``: ``rows`` or ``arrays``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("npz", npz_mode=mode, target_range_bytes=target_range_bytes))


class ReadFromNpy(ReadFromArrays):
    """ReadFromArrays for .npy files (``mode``: ``rows`` or ``files``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("npy", npy_mode=mode, target_range_bytes=target_range_bytes))


def add_provenance(rr: RowRange, columns: dict) -> dict:
    """Adds ``_source/file`` (bytes) and ``_source/row`` (int64) columns for the rows of ``rr``."""
    out = dict(columns)
    if rr.item_files:  # files mode: one file per row
        out["_source/file"] = [p.encode() for p in rr.items]
    else:
        out["_source/file"] = [rr.path.encode()] * rr.num_rows
    out["_source/row"] = np.arange(rr.start, rr.stop, dtype=np.int64)
    return out


class EncodeExamplesFn(beam.DoFn):
    """Encodes a batch of columns into serialized Examples, one vectorized call per batch.

    With ``batched`` it yields one ``codec.EncodedBatch`` per batch, else one record (bytes) per element.
    """

    def __init__(self, specs: Sequence[FeatureSpec], allow_lossy=(), provenance=False, batched=False):
        self._specs, self._lossy, self._prov, self._batched = tuple(specs), tuple(allow_lossy), provenance, batched
        self._examples = Metrics.counter(NAMESPACE, "examples_encoded")

    def process(self, element):
        rr, columns = element
        if self._prov:
            columns = add_provenance(rr, columns)
        try:
            batch = encode_columns(columns, self._specs, rr.num_rows, self._lossy)
        except RecordError as e:
            raise e.with_context(file=rr.path, rows=f"{rr.start}-{rr.stop - 1}") from None
        self._examples.inc(rr.num_rows)
        if self._batched:
            yield batch
        else:
            yield from batch.records()


class EncodeExamples(beam.PTransform):
    """``(RowRange, columns)`` batches -> serialized ``tf.train.Example`` records (bytes)."""

    def __init__(self, specs, allow_lossy=(), provenance=False):
        super().__init__()
        self._fn = EncodeExamplesFn(specs, allow_lossy, provenance)

    def expand(self, batches):
        return batches | "EncodeBatches" >> beam.ParDo(self._fn)


class ReadAndEncodeFn(beam.DoFn):
    """Reads and encodes one RowRange, yielding serialized records (one per element, for
    WriteToTFRecord); a failing range goes to the ``dead_letters`` output when ``dead_letters``."""

    def __init__(self, source: Source, specs, allow_lossy=(), provenance=False, dead_letters=False):
        self._read = ReadRowRangesFn(source)
        self._encode = EncodeExamplesFn(specs, allow_lossy, provenance)
        self._dead_letters = dead_letters
        self._dead = Metrics.counter(NAMESPACE, "rows_dead_lettered")

    def process(self, rr: RowRange):
        try:
            records = [r for batch in self._read.process(rr) for r in self._encode.process(batch)]
        except Exception as e:  # noqa: BLE001 - any failure of one range is its dead letter
            if not self._dead_letters:
                raise
            self._dead.inc(rr.num_rows)
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, dead_letter(rr, e))
            return
        yield from records

    def finish_bundle(self):
        self._read.finish_bundle()


_BEAM_COMPRESSION = {"none": CompressionTypes.UNCOMPRESSED, "gzip": CompressionTypes.GZIP,
                     "zlib": CompressionTypes.DEFLATE}  # Beam's DEFLATE is a zlib stream with header: TF's ZLIB


def shard_suffix(compression: str) -> str:
    return ".tfrecord" + tfrecord.SUFFIXES[compression]


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
            self._prefix, file_name_suffix=shard_suffix(self._compression), num_shards=self._num_shards,
            shard_name_template="-SSSSS-of-NNNNN", compression_type=_BEAM_COMPRESSION[self._compression])




class WriteShardFn(beam.DoFn):
    """Writes one planned shard: reads its row ranges in order, encodes each in one call, frames the
    batch (google-crc32c) into a temporary file, and renames it to its final name when complete.

    A retried or duplicated attempt writes its own temporary file; the last rename wins and the bytes
    are the same, so exactly one final file exists. Yields ``{"file", "records", "bytes"}``.
    """

    def __init__(self, source: Source, specs, output_dir: str, prefix: str, compression: str,
                 allow_lossy=(), provenance=False, dead_letter_dir: str | None = None, progress=False):
        self._source, self._output_dir, self._prefix, self._compression = source, output_dir, prefix, compression
        self._dead_letter_dir, self._progress = dead_letter_dir, progress
        self._encode = EncodeExamplesFn(specs, allow_lossy, provenance, batched=True)
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._written = Metrics.counter(NAMESPACE, "examples_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._dead = Metrics.counter(NAMESPACE, "rows_dead_lettered")
        self._clock = ShardClock()

    def _encoded(self, rr: RowRange, letters: list):
        """The encoded batches of one range; with a dead-letter dir, a failing range becomes a letter."""
        try:
            columns = self._source.read(rr)
            return list(self._encode.process((rr, columns)))
        except Exception as e:  # noqa: BLE001 - any failure of one range is its dead letter
            if self._dead_letter_dir is None:
                raise
            logging.getLogger(__name__).warning("Dead-lettering %s: %s", rr.describe(), e)
            letters.append(dead_letter(rr, e))
            return []
        finally:
            self._rows.inc(rr.num_rows)

    def process(self, shard: sharding.ShardPlan):
        import uuid
        self._clock.start()
        name = shard.file_name(self._prefix, shard_suffix(self._compression))
        final = fileio.join(self._output_dir, name)
        temp = fileio.join(self._output_dir, f"{TEMP_PREFIX}{name}-{uuid.uuid4().hex}")
        letters: list[dict] = []
        try:
            with fileio.open_write(temp) as raw:
                writer = tfrecord.ShardWriter(raw, self._compression)
                for rr in shard.ranges:
                    for batch in self._encoded(rr, letters):
                        writer.write_encoded(batch)
                writer.close()
            dead_rows = sum(d["rows"] for d in letters)
            if writer.records + dead_rows != shard.num_rows:
                raise RecordError(f"Shard {name}: {shard.num_rows} rows planned but {writer.records} records "
                                  f"written and {dead_rows} rows dead-lettered", file=final)
            if letters:
                write_dead_letters(self._dead_letter_dir, name, letters)
            fileio.rename(temp, final)
        except BaseException:
            fileio.delete([temp])
            raise
        finally:
            self._source.close()  # files stay open between the ranges of a shard, not after it
        size = fileio.size(final)
        self._written.inc(writer.records)
        self._bytes.inc(size)
        self._shards.inc()
        self._dead.inc(dead_rows)
        self._clock.end()
        if self._progress:
            import sys
            print(f"[tfrecord-etl] shard {shard.index + 1}/{shard.num_shards} done: {name}, "
                  f"{writer.records} records, {size} bytes", file=sys.stderr, flush=True)
        yield {"file": name, "records": writer.records, "bytes": size, "dead_rows": dead_rows}


class WritePlannedShards(beam.PTransform):
    """Planned shards -> TFRecord files, with no shuffle of the data; yields per-shard counts."""

    def __init__(self, shards, write_fn: WriteShardFn):
        super().__init__()
        self._shards, self._fn = list(shards), write_fn

    def expand(self, pbegin):
        return (pbegin
                | "CreateShardPlans" >> beam.Create(self._shards)
                | "SpreadShards" >> beam.Reshuffle()
                | "WriteShards" >> beam.ParDo(self._fn))


def count_shard(path: str, compression: str) -> dict:
    """``{"file", "records", "bytes"}`` of one written shard, by walking its frames (CRCs checked)."""
    with fileio.open_read(path) as raw:
        stream = tfrecord.open_decompressed(raw, compression)
        n = sum(1 for _ in tfrecord.iter_records(stream, path))
    size = fileio.size(path)
    return {"file": fileio.basename(path), "records": n, "bytes": size}


class WriteMetadataFn(beam.DoFn):
    """Checks rows in = records out and writes ``metadata.json`` last (the commit point)."""

    def __init__(self, output_dir, specs, compression, expected_rows, sources_info, writer, options):
        self._args = (output_dir, tuple(specs), compression, expected_rows, sources_info, writer, options)

    def process(self, shards, extra_dead_rows=0):
        output_dir, specs, compression, expected, sources_info, writer, options = self._args
        shards = sorted(shards, key=lambda s: s["file"])
        written = sum(s["records"] for s in shards)
        dead = sum(s.pop("dead_rows", 0) for s in shards) + extra_dead_rows
        if written + dead != expected:
            raise RecordError(f"Rows read ({expected}) != examples written ({written}) + rows dead-lettered "
                              f"({dead}): records were lost or duplicated", file=output_dir,
                              hint="re-run; report it if it happens again")
        meta = metadata.build(specs, shards, compression, sources_info, writer, options)
        meta["rows_read"], meta["rows_dead_lettered"] = expected, dead
        metadata.write(output_dir, meta, specs)
        outdir.remove_temporaries(output_dir, [s["file"] for s in shards])  # of killed or duplicate attempts
        yield output_dir


class FinalizeOutput(beam.PTransform):
    """Shard paths (or, with ``counted``, per-shard counts) -> ``metadata.json``, written after every
    shard is final."""

    def __init__(self, output_dir, specs, compression, expected_rows, sources_info, writer, options,
                 counted=False, dead_rows=None):
        super().__init__()
        self._compression, self._counted, self._dead_rows = compression, counted, dead_rows
        self._fn = WriteMetadataFn(output_dir, specs, compression, expected_rows, sources_info, writer, options)

    def expand(self, shards):
        if not self._counted:
            shards = shards | "CountShardRecords" >> beam.Map(count_shard, self._compression)
        extra = () if self._dead_rows is None else (beam.pvalue.AsSingleton(self._dead_rows),)
        return (shards
                | "CollectShards" >> beam.combiners.ToList()
                | "WriteMetadata" >> beam.ParDo(self._fn, *extra))
