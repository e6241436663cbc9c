"""The writers of a conversion, chosen from :data:`WRITERS` by :func:`writer_name`: each a PTransform from the
pipeline's start to per-shard counts ``{"file", "records", "bytes"[, "dead_rows", "dead_letters"]}``, built from the
plan and the config (``planned``: :class:`WritePlanned`; ``beam``: :class:`WriteWithBeamSink`; ``shuffled``:
:class:`WriteShuffled`, chosen by ``--shuffle_seed``). Adding one = a :class:`PlanWriter` subclass here, a line in
:data:`WRITERS` and its name in ``ConvertConfig.writer``; ``convert.ConvertToTFRecord`` applies it.
"""

from __future__ import annotations

import apache_beam as beam

from tfrecord_etl.transforms import compression
from tfrecord_etl.transforms.beam import deadletters as beam_deadletters, encode as beam_encode, write as beam_write
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.planning import ConvertPlan


class PlanWriter(beam.PTransform):
    """The base of the writers: built from the plan and the config; ``dead_letters`` is set by ``expand`` when
    the writer dead-letters rows outside its shard counts (a singleton PCollection of the list of
    ``beam_deadletters.dead_range`` entries), else None."""

    def __init__(self, plan: ConvertPlan, cfg: ConvertConfig, progress: bool = False):
        super().__init__()
        self._plan, self._cfg, self._progress = plan, cfg, progress
        self.dead_letters = None
        self.resumed: dict = {}  # --resume (planned writer): {shard plan index: entries} of the shards kept
        self.receipt_key: str | None = None  # the planned writer's receipts' run digest (resume.write_receipt)


class WritePlanned(PlanWriter):
    """The ``planned`` writer (default): every shard planned before the run (contiguous row ranges of equal
    bytes) and written by one worker (``beam_write.WriteShardFn``) with no shuffle of the data; byte-identical
    output on every rerun."""

    def expand(self, pbegin):
        plan, cfg = self._plan, self._cfg
        out = beam_write.ShardOutput(
            cfg.output_dir,
            plan.prefix,
            cfg.compression,
            index=cfg.index,
            codec=codec_of(cfg),
            dead_letter_dir=cfg.dead_letter_dir,
            progress=self._progress,
            receipt_key=self.receipt_key,
        )
        fn = beam_write.WriteShardFn(plan.inputs.source, beam_encode.EncodeSettings.of(plan, cfg), out)
        sequential = [i.path for i in plan.inputs.indexes if i.sequential]
        missing = [s for s in plan.shards if s.index not in self.resumed]
        written = pbegin | "WritePlannedShards" >> beam_write.WritePlannedShards(missing, fn, sequential)
        if not self.resumed:
            return written
        kept = pbegin | "KeptShards" >> beam.Create([e for i in sorted(self.resumed) for e in self.resumed[i]])
        return (written, kept) | "WithKeptShards" >> beam.Flatten()


def _write_dead_letters(letters: list[dict], dead_letter_dir: str) -> list[dict]:
    """Writes the beam writer's dead letters (if any) and returns what metadata.json keeps of them
    (``beam_deadletters.dead_range``)."""
    if letters:
        beam_deadletters.write_dead_letters(dead_letter_dir, "dead_letters", letters)
    return [beam_deadletters.dead_range(d) for d in letters]


def read_and_encode_ranges(pbegin, plan: ConvertPlan, cfg: ConvertConfig, fn: beam.DoFn):
    """The row ranges spread with a Reshuffle and read and encoded by ``fn`` (whose failing ranges go to the
    ``dead_letters`` output): ``(records, dead_letters)``, ``dead_letters`` the singleton PCollection of the
    list of row ranges dead-lettered (written to ``--dead_letter_dir``), or None without it."""
    encoded = (
        pbegin
        | "CreateRowRanges" >> beam.Create(list(plan.inputs.ranges), reshuffle=True)
        | "ReadAndEncode" >> beam.ParDo(fn).with_outputs(beam_deadletters.DEAD_LETTERS, main="records")
    )
    dead_letters = None
    if cfg.dead_letter_dir is not None:  # one chain, so the pipeline keeps a single leaf (DaskRunner)
        dead_letters = (
            encoded[beam_deadletters.DEAD_LETTERS]
            | "CollectDeadLetters" >> beam.combiners.ToList()
            | "WriteDeadLetters" >> beam.Map(_write_dead_letters, cfg.dead_letter_dir)
        )
    return encoded.records, dead_letters


class WriteWithBeamSink(PlanWriter):
    """The ``beam`` writer: row ranges spread with a Reshuffle, read and encoded per range
    (``beam_encode.ReadAndEncodeFn``, failing ranges to dead letters), written by Beam's ``WriteToTFRecord``; the
    written shards are counted by walking their frames. ``dead_letters`` (set by expand) is the singleton
    PCollection of the row ranges dead-lettered, or None."""

    def expand(self, pbegin):
        plan, cfg = self._plan, self._cfg
        records, self.dead_letters = read_and_encode_ranges(
            pbegin,
            plan,
            cfg,
            beam_encode.ReadAndEncodeFn(plan.inputs.source, beam_encode.EncodeSettings.of(plan, cfg, splits=False)),
        )
        return (
            records
            | "WriteToShards" >> beam_write.WriteToShards(cfg.output_dir, plan.prefix, plan.num_shards, cfg.compression)
            | "CountShardRecords" >> beam.Map(beam_write.count_shard, cfg.compression, cfg.index)
        )


class WriteShuffled(PlanWriter):
    """The writer of ``--shuffle_seed``: a seeded shuffle of record order within each split (or the whole
    output). Row ranges are read and encoded in parallel; each record is keyed by ``sharding.shuffle_keys(seed,
    global row)`` (distinct per row), goes to shard ``key % num_shards`` of its split through a Beam shuffle
    (GroupByKey), and each shard is written in key order (``beam_write.WriteShuffledShardFn``), so every record may
    land anywhere in its split and the same seed gives byte-identical shards on any runner. The data moves
    through the shuffle (the cost is in docs/performance.md); a worker holds one shard in memory."""

    def expand(self, pbegin):
        plan, cfg = self._plan, self._cfg
        names = plan.split_plan.names if plan.split_plan else ()
        offsets, acc = {}, 0
        for index in plan.inputs.indexes:
            offsets[index.path], acc = acc, acc + index.num_rows
        keyed, self.dead_letters = read_and_encode_ranges(
            pbegin,
            plan,
            cfg,
            beam_encode.KeyShuffledRecordsFn(
                plan.inputs.source, beam_encode.EncodeSettings.of(plan, cfg), offsets, plan.num_shards, cfg.shuffle_seed
            ),
        )
        every_shard = pbegin | "CreateShardKeys" >> beam.Create(
            [((s, k), None) for s in range(max(1, len(names))) for k in range(plan.num_shards)]
        )
        return (
            (keyed, every_shard)
            | "AddEmptyShards" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShuffledShards"
            >> beam.ParDo(
                beam_write.WriteShuffledShardFn(
                    beam_write.ShardOutput(cfg.output_dir, plan.prefix, cfg.compression, cfg.index, codec_of(cfg)),
                    plan.num_shards,
                    names,
                )
            )
        )


WRITERS: dict[str, type[beam.PTransform]] = {
    "planned": WritePlanned,
    "beam": WriteWithBeamSink,
    "shuffled": WriteShuffled,
}


def writer_name(cfg: ConvertConfig) -> str:
    """The :data:`WRITERS` entry of a run: ``shuffled`` with ``--shuffle_seed``, else ``--writer``."""
    return "shuffled" if cfg.shuffle_seed is not None else cfg.writer


def codec_of(cfg: ConvertConfig) -> dict | None:
    """The compression backend of a run's shards (``compression.settings``: name, version, level), resolved on
    the launcher; the ``beam`` writer's is Beam's own (zlib, level 6). None for ``--compression none``.

    Raises:
      ConfigError: ``--compression_level`` out of the backend's range, or a backend forced by
        ``TFRECORD_ETL_COMPRESSION_BACKEND`` that is not installed.
    """
    if cfg.compression == "none":
        return None
    if writer_name(cfg) == "beam":
        return dict(compression.BEAM_WRITER)
    try:
        return compression.settings(cfg.compression, cfg.compression_level)
    except (ValueError, compression.BackendUnavailable) as e:
        raise ConfigError(str(e), hint="see the compression backends in the docs' output page") from None
