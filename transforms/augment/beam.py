"""Beam: the augment DoFns and PTransforms."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from tfrecord_etl.transforms.augment.commit import FinalizeAugment
from tfrecord_etl.transforms.augment.common import NAMESPACE, frame_error
from tfrecord_etl.transforms.augment.config import AugmentConfig
from tfrecord_etl.transforms.augment.join import JoinPlan, key_of, read_source_rows, stack_joined
from tfrecord_etl.transforms.augment.plan import AugmentPlan, BatchAugmenter, observe_batch
from tfrecord_etl.transforms.augment.records import InputShard, batches, iter_shard
from tfrecord_etl.transforms.augment.steps import plan_augment
from tfrecord_etl.transforms.augment.values import decode_inputs, decode_record
from tfrecord_etl.transforms.beam import metrics as beam_metrics
from tfrecord_etl.transforms.codec import FeatureSpec, FeatureStats, check_example_frame
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SourceError
from tfrecord_etl.transforms.output import outdir, sink, tfrecord
from tfrecord_etl.transforms.output.runlock import CarriesRun
from tfrecord_etl.transforms.sources import RowRange
from tfrecord_etl.transforms.storage import fileio


def count_records(shard: InputShard, max_record_bytes: int | None = None) -> tuple[int, int]:
    """``(shard index, record count)``, by walking the shard's frames (CRCs and record sizes checked)."""
    return shard.index, sum(1 for _ in iter_shard(shard, max_record_bytes=max_record_bytes))


def plan_offsets(counts: Sequence[tuple[int, int]], num_rows: int, pattern: str, join_pattern: str) -> dict:
    """Shard index -> index of its first record in the collection; checks records = source rows.

    Raises:
      SourceError: the join source's row count differs from the collection's record count.
    """
    counts = sorted(counts)
    total = sum(n for _, n in counts)
    if total != num_rows:
        raise SourceError(
            f"The join source has {num_rows} rows but the input has {total} records",
            file=join_pattern,
            input=pattern,
            hint="--join_by position needs one source row per record, in shard order",
        )
    offsets = np.concatenate([[0], np.cumsum([n for _, n in counts])])
    return {index: int(o) for (index, _), o in zip(counts, offsets)}


class ExtractKeysFn(CarriesRun, beam.DoFn):
    """Streams one input shard: ``(key, (shard index, record index))`` per record (key join)."""

    def __init__(
        self,
        key_spec: FeatureSpec,
        batch_size: int = 4096,
        max_record_bytes: int | None = None,
        max_features: int | None = None,
    ):
        self._spec, self._batch_size, self._max = key_spec, batch_size, max_record_bytes
        self._max_features = max_features

    def process(self, shard: InputShard):
        specs, name = [self._spec], self._spec.name
        for first, records in batches(iter_shard(shard, max_record_bytes=self._max), self._batch_size):
            for i, record in enumerate(records):  # framing and feature count, before the C++ decoder sees it
                try:
                    check_example_frame(record, self._max_features)
                except RecordError as e:
                    raise frame_error(e, shard.path, first + i) from None
            decoded = decode_inputs(specs, records, shard.path, first)
            values = (
                decoded[name]
                if decoded is not None
                else [decode_record(specs, r, shard.path, first + i)[name] for i, r in enumerate(records)]
            )
            for i, value in enumerate(values):
                where = {"file": shard.path, "record": first + i, "feature": name}
                yield key_of(value, where), (shard.index, first + i)


class ReadJoinRowsFn(CarriesRun, beam.DoFn):
    """Reads one row range of the join source: ``(key, {new name: row value})`` per row (key join)."""

    def __init__(self, join: JoinPlan):
        self._join = join

    def process(self, rr: RowRange):
        join = self._join
        columns = join.source.read_pinned(rr)
        keys = columns[join.join_key]
        for i in range(rr.num_rows):
            where = {"file": rr.path, "row": rr.start + i, "feature": join.join_key}
            values = {}
            for src, new in join.fields:
                v = columns[src][i]
                values[new] = v.copy() if isinstance(v, np.ndarray) else v
            yield key_of(keys[i], where), values

    def finish_bundle(self):
        self._join.source.close()


def match_keys(element, join: JoinPlan, shard_paths: Mapping[int, str]):
    """One ``CoGroupByKey`` group -> ``(shard index, (record index, values))`` per record with that key.

    Raises:
      SourceError: a key appears in several source rows; a record's key has no source row and no
        default is configured (naming the shard and record).
    """
    key, grouped = element
    refs, rows = list(grouped["records"]), list(grouped["rows"])
    if not refs:
        return
    if len(rows) > 1:
        raise SourceError(
            f"Key {key!r} appears in {len(rows)} rows of the join source",
            file=join.pattern,
            hint="keys must be unique in the join source",
        )
    if rows:
        values = rows[0]
    elif join.defaults is not None:
        values = join.defaults
    else:
        shard, record = min(refs)
        raise SourceError(
            f"No row of the join source has key {key!r} (held by {len(refs)} record(s))",
            file=join.pattern,
            shard=shard_paths[shard],
            record=record,
            feature=join.key_spec.name,
            hint="add the key to the join source, or pass --missing default --defaults NAME=VALUE,...",
        )
    for shard, record in refs:
        yield shard, (record, values)


class AugmentShardFn(CarriesRun, beam.DoFn):
    """Augments one input shard into one output shard, streamed a batch of records at a time.

    Elements: an :class:`InputShard`, or ``(shard index, {"shard": [InputShard], "values": [(record
    index, {name: value}), ...]})`` after a key join. Side input ``offsets`` (position join without
    known counts): shard index -> first record index in the collection.

    The output is written by ``sink.shard_writer`` to ``.tmp-<32 hex of the attempt>-<8 hex key of the name>``
    in the output directory and renamed to ``<name>`` when complete (a retried attempt writes its own temporary
    file; the last rename wins, so exactly one final file exists); on failure the temporary file is deleted. With ``plan.readers.index`` the shard's
    ``tfrecord2idx`` index file (from the record lengths written) is committed just before it. Yields ``{"index",
    "input", "file", "records_in", "records", "bytes", "crc32c", "input_bytes", "input_crc32c", "compression",
    "index_file"}`` (``crc32c``: the output shard's, computed while it is written; ``input_*``: of the input
    shard's bytes as read; ``index_file``: the index file's name, or None).

    Raises:
      RecordError: records in != records out, or != the count in the input metadata.
      InputChangedError: the input shard is not the one planned (size, modification time, or CRC32C against its
        metadata: ``collection.iter_shard``); the output shard is then not committed.
    """

    def __init__(self, plan: AugmentPlan):
        self._plan = plan
        self._augmenter: BatchAugmenter | None = None
        self._read = Metrics.counter(NAMESPACE, "records_read")
        self._written = Metrics.counter(NAMESPACE, "records_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._clock = beam_metrics.ShardClock()

    def setup(self):
        super().setup()
        self._augmenter = BatchAugmenter(self._plan)

    def process(self, element, offsets=None):
        plan = self._plan
        self._clock.start()
        if isinstance(element, InputShard):
            shard, joined = element, None
        else:
            _, grouped = element
            shard, joined = list(grouped["shard"])[0], dict(grouped["values"])
        offset = shard.offset if shard.offset is not None else (offsets or {}).get(shard.index)
        final = fileio.join(plan.output_dir, shard.output_file)
        tally: dict = {}
        stats = FeatureStats() if plan.collection.observed else None
        try:
            with sink.shard_writer(
                final, plan.output_compression, index=plan.readers.index, codec=plan.codec
            ) as writer:
                count = self._augment_shard(writer, shard, tally, offset, joined, stats)
                _check_counts(shard, count, writer.records, joined)
        finally:
            if plan.join is not None:
                plan.join.source.close()  # the join source's files stay open for one shard
        yield self._result(shard, final, count, writer, tally, stats)

    def _augment_shard(self, writer, shard: InputShard, tally: dict, offset, joined, stats) -> int:
        """Streams the input shard a batch at a time into ``writer``; returns the records read."""
        plan, count = self._plan, 0
        for first, records in batches(iter_shard(shard, tally, plan.max_record_bytes), plan.batch_size):
            join_columns = self._join_columns(shard, first, len(records), offset, joined)
            out = self._augmenter.augment(records, shard.path, first, join_columns)  # checks the framing
            if stats is not None:
                observe_batch(plan, stats, records, shard.path, first)
            if isinstance(out, list):
                writer.write_batch(out)
            else:
                writer.write_encoded(out)
            count += len(records)
        return count

    def _result(self, shard: InputShard, final: str, count: int, writer, tally: dict, stats) -> dict:
        """The shard's result (see the class docstring), its counters and clock updated."""
        plan = self._plan
        size = fileio.size(final)
        self._read.inc(count)
        self._written.inc(writer.records)
        self._shards.inc()
        self._clock.end()
        return {
            "index": shard.index,
            "input": shard.path,
            "file": shard.output_file,
            "records_in": count,
            "records": writer.records,
            "bytes": size,
            "crc32c": writer.crc32c,
            "input_bytes": tally["bytes"],
            "input_crc32c": tally["crc32c"],
            "compression": shard.compression,
            "features": None if stats is None else stats.to_json(),
            "split": shard.split,
            "index_file": tfrecord.index_name(shard.output_file) if plan.readers.index else None,
        }

    def _join_columns(self, shard: InputShard, first: int, n: int, offset, joined):
        join = self._plan.join
        if join is None:
            return None
        if join.by == "position":
            return read_source_rows(join, offset + first, offset + first + n)
        columns = {}
        for spec in join.specs:
            try:
                values = [joined[i][spec.name] for i in range(first, first + n)]
            except KeyError as e:
                raise RecordError(
                    f"Record {e.args[0]} has no joined values", file=shard.path, hint="the input changed during the run"
                ) from None
            columns[spec.name] = stack_joined(spec, values)
        return columns


def _check_counts(shard: InputShard, count: int, written: int, joined: dict | None) -> None:
    """Records read from the shard = records written = its metadata's count = records joined (when known).

    Raises:
      RecordError: naming the shard and the count that differs.
    """
    expected = [
        ("records written", written),
        ("metadata", shard.records),
        ("joined records", None if joined is None else len(joined)),
    ]
    for what, n in expected:
        if n is not None and n != count:
            raise RecordError(
                f"The shard holds {count} records but {what}: {n}",
                file=shard.path,
                hint="the input changed during the run, or its metadata is wrong",
            )


def _keyed_by_index(shard: InputShard):
    return shard.index, shard


class AugmentShards(beam.PTransform):
    """Input shards -> augmented output shards (one work item per shard); yields per-shard results.

    Without a join: ``Create(shards) | Reshuffle | ParDo(AugmentShardFn)``. Position join without
    record counts: a first pass counts each shard's records (side input of first-record offsets). Key
    join: ``ExtractKeys`` (records) and ``ReadJoinRows`` (source) are joined with ``CoGroupByKey``,
    grouped by shard with the shard itself, then each group is augmented.
    """

    def __init__(self, plan: AugmentPlan):
        super().__init__()
        self._plan = plan

    def expand(self, pbegin):
        plan, join = self._plan, self._plan.join
        # Create redistributes its values itself (a Reshuffle inside it when there is more than one): no second one
        shards = pbegin | "CreateShards" >> beam.Create(list(plan.collection.shards), reshuffle=True)
        augment = AugmentShardFn(plan)
        if join is not None and join.by == "key":
            paths = {s.index: s.path for s in plan.collection.shards}
            keys = shards | "ExtractKeys" >> beam.ParDo(
                ExtractKeysFn(join.key_spec, plan.batch_size, plan.max_record_bytes, plan.max_features)
            )
            rows = (
                pbegin
                | "CreateJoinRanges" >> beam.Create(list(join.ranges), reshuffle=True)
                | "ReadJoinRows" >> beam.ParDo(ReadJoinRowsFn(join))
            )
            matched = (
                {"records": keys, "rows": rows}
                | "JoinByKey" >> beam.CoGroupByKey()
                | "MatchKeys" >> beam.FlatMap(match_keys, join, paths)
            )
            return (
                {"shard": shards | "KeyShards" >> beam.Map(_keyed_by_index), "values": matched}
                | "GroupByShard" >> beam.CoGroupByKey()
                | "AugmentShard" >> beam.ParDo(augment)
            )
        spread = shards
        if join is None or all(s.offset is not None for s in plan.collection.shards):
            return spread | "AugmentShard" >> beam.ParDo(augment)
        offsets = (
            spread
            | "CountRecords" >> beam.Map(count_records, plan.max_record_bytes)
            | "CollectCounts" >> beam.combiners.ToList()
            | "PlanOffsets" >> beam.Map(plan_offsets, join.num_rows, plan.collection.pattern, join.pattern)
        )
        return spread | "AugmentShard" >> beam.ParDo(augment, offsets=beam.pvalue.AsSingleton(offsets))


def prepare_output_dir(plan: AugmentPlan) -> tuple[outdir.Lock, AugmentPlan]:
    """Prepares the output directory of ``plan`` (``outdir.prepare``); returns the held lock and the plan writing
    the generation of names the lock chose, replacing the committed files it names at the commit."""
    lock = outdir.prepare(
        plan.output_dir,
        command="augment",
        options=plan.options,
        files=plan.output_files(),
        overwrite=bool(plan.options.get("overwrite")),
    )
    return lock, plan.with_output(lock.generation, lock.replacement)


class AugmentTFRecord(beam.PTransform):
    """Adds features to an existing TFRecord collection of ``tf.train.Example``: ``rewrite`` mode writes each
    record's old bytes plus the new features (a byte-level append), ``sidecar`` mode only the new features,
    aligned record by record with a ``manifest.json``. Returns the PCollection of the committed output directory.

        import apache_beam as beam
        from tfrecord_etl.transforms.augment import AugmentTFRecord

        with beam.Pipeline() as p:
            p | AugmentTFRecord("out/", "out-labelled/", join_input="labels.h5", join_by="position")

    Args:
      input_pattern: TFRecord shards (a file pattern) or a convert output directory (``--input``).
      output_dir: the output directory (``--output_dir``).
      **options: any other ``AugmentConfig`` field by name (``mode="sidecar"``, ``fn="mymod:add"``,
        ``fn_inputs=["x"]``, ``constants={"source": "tfx"}``, ``feature_encodings={"mask": "packbits"}``...).

    Planning (reading a sample of records, probing ``fn``, indexing the join source) happens at construction,
    and so do the output directory's checks (``outdir.prepare``: files that are not ours are refused unless
    ``overwrite=True``); the lock is not held while the pipeline runs (the command holds it).

    Raises (at construction):
      ConfigError, SourceError, SchemaError, RecordError: as the command's flags and inputs.
    """

    def __init__(
        self,
        input_pattern: str | None = None,
        output_dir: str | None = None,
        *,
        config=None,
        plan: AugmentPlan | None = None,
        prepare_output: bool = True,
        **options,
    ):
        super().__init__()

        if plan is None:
            if config is None:
                try:
                    config = AugmentConfig(input=input_pattern, output_dir=output_dir, **options)
                except Exception as e:  # pydantic's ValidationError: one line, as the command's flags
                    raise ConfigError(f"Invalid AugmentTFRecord options: {e}") from None
            plan = plan_augment(config)
        self.plan = plan
        if prepare_output:
            lock, self.plan = prepare_output_dir(plan)
            lock.release()

    def expand(self, pbegin):
        return pbegin | "AugmentShards" >> AugmentShards(self.plan) | "FinalizeAugment" >> FinalizeAugment(self.plan)
