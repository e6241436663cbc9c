"""Writing the examples artifact of ``tfrecord_etl.tfx.ArraysExampleGen`` with the planned writer.

TFX's own ExampleGen executor (``tfx/components/example_gen/base_example_gen_executor.py``, ``Do`` with
``write_split.WriteSplit``) sends every record through a ``Reshuffle`` and Beam's ``WriteToTFRecord`` (Python's zlib
at level 6). Here each input split is planned as ``convert`` plans it (``planning.plan_convert``: shards of
contiguous row ranges of equal bytes) and every shard plan is read, encoded and written by one worker
(``beam.write.WriteShardFn``, gzip through the compression backend, ISA-L at level 3 by default): one file per output
split per shard plan, ``Split-NAME/data_tfrecord-SSSSS-of-NNNNN.gz`` (TFX's folder and file names), no shuffle of
the data. TFX's split semantics are kept: ``input_config`` splits are written one output split each;
``output_config`` hash buckets assign each record by TFX's ``_PartitionFn`` (``splits.SplitPlan`` ``by_record``:
sha256 of the serialized record, or of the serialized ``tf.train.Feature`` of ``partition_feature_name``).

Within a split the records are in input order (TFX's are in the order its shuffle left them); a trainer shuffles
as it reads (``tf.data.Dataset.shuffle``, TFX Trainer's input function).

Counts: every shard plan commits its files only when the records written (over the output splits) plus the rows
dead-lettered equal its rows (``WriteShardFn``); once every shard is in, :func:`write_info` checks each input
split again (all shard files there, records + dead-lettered rows = rows planned) and writes ``tfrecord_etl.json``
last, with the records of every output split and the rows dead-lettered of every input split.

No TFX import: the executor (``transforms.tfx.examplegen``) passes plain values, and the main suite tests this
module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import apache_beam as beam

from tfrecord_etl.transforms import planning
from tfrecord_etl.transforms.beam import encode as beam_encode, write as beam_write
from tfrecord_etl.transforms.codec import encoding_of
from tfrecord_etl.transforms.collections.splits import SplitPlan
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import ConfigError, RecordError
from tfrecord_etl.transforms.output import sink
from tfrecord_etl.transforms.planning import ConvertPlan
from tfrecord_etl.transforms.storage import fileio

FILE_PREFIX = "data_tfrecord"  # TFX's write_split.DEFAULT_TF_RECORD_FILE_NAME
INFO_FILE = "tfrecord_etl.json"


def split_file(split: str, index: int, num_shards: int) -> str:
    """The path of shard ``index`` of ``num_shards`` of output split ``split`` in the examples artifact:
    ``Split-NAME/data_tfrecord-SSSSS-of-NNNNN.gz`` (TFX's folder and file names; ``Split-NAME`` is
    ``artifact_utils.get_split_uri``'s)."""
    return f"Split-{split}/{FILE_PREFIX}-{index:05d}-of-{num_shards:05d}.gz"


@dataclasses.dataclass(frozen=True)
class SplitJob:
    """One input split of the ExampleGen, planned: ``name`` (the input split's), ``pattern`` (its files), ``cfg``
    and ``plan`` (whose ``split_plan`` names the output splits its rows go to)."""

    name: str
    pattern: str
    cfg: ConvertConfig
    plan: ConvertPlan

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.plan.split_plan.names


def plan_job(
    name: str,
    cfg: ConvertConfig,
    output_splits: Sequence[tuple[str, int]] = (),
    partition_feature: str | None = None,
) -> SplitJob:
    """Plans input split ``name`` (``cfg.input`` its files, ``cfg.output_dir`` the examples artifact's URI,
    ``cfg.compression`` gzip): ``output_splits`` ``[(name, hash_buckets)]`` of ``output_config`` (the rows hashed
    as TFX does, on the record or on ``partition_feature``), or none (every row to the output split ``name``).

    Raises:
      SourceError, SchemaError, ConfigError: the input or the options (``planning.plan_convert``).
      ConfigError: ``partition_feature`` is no feature of the records, or a ``float_list`` one (TFX hashes only
        ``bytes_list`` and ``int64_list`` features).
    """
    plan = planning.plan_convert(cfg)
    if output_splits:
        names, weights = zip(*output_splits)
        if partition_feature is not None:
            check_partition_feature(partition_feature, plan, cfg.input)
        split_plan = SplitPlan(tuple(names), tuple(weights), key=partition_feature, by_record=True)
    else:
        split_plan = SplitPlan((name,), (1,))
    files = tuple(split_file(s, shard.index, plan.num_shards) for shard in plan.shards for s in split_plan.names)
    plan = dataclasses.replace(plan, split_plan=split_plan, prefix=FILE_PREFIX, output_files=files)
    return SplitJob(name, cfg.input, cfg, plan)


def check_partition_feature(name: str, plan: ConvertPlan, pattern: str) -> None:
    """Raises ConfigError unless ``name`` is a ``bytes_list`` or ``int64_list`` feature of the records ``plan``
    writes (its features and their companions, e.g. ``x/shape``), naming them."""
    kinds = {feature: kind for spec in plan.specs for feature, kind, _ in encoding_of(spec).features(spec)}
    if name not in kinds:
        raise ConfigError(
            f"output_config partition_feature_name '{name}' is not a feature of the examples",
            file=pattern,
            hint=f"features are {sorted(kinds)}",
        )
    if kinds[name] not in ("bytes", "int64"):
        raise ConfigError(
            f"output_config partition_feature_name '{name}' is a {kinds[name]} feature; TFX "
            f"partitions by bytes_list and int64_list features only",
            file=pattern,
            hint="choose an integer or string feature, or encode this one as tensor",
        )


class WriteSplitShardFn(beam_write.WriteShardFn):
    """``beam_write.WriteShardFn`` writing a shard plan's rows to ``Split-NAME/data_tfrecord-SSSSS-of-NNNNN.gz``, one
    file per output split of its ``split_plan`` (:func:`split_file`)."""

    def file_names(self, shard):
        return [(split, split_file(split, shard.index, shard.num_shards)) for split in self._encode.split_plan.names]


class WriteExampleSplits(beam.PTransform):
    """Writes the examples artifact at ``uri``: every shard plan of every :class:`SplitJob`, then
    ``tfrecord_etl.json`` (:func:`write_info`, with ``info`` the fields known before the run). Returns the
    PCollection of the info written (one element).

    Args:
      uri: the examples artifact's URI. jobs: the input splits, planned (:func:`plan_job`). info: JSON-able
        fields of ``tfrecord_etl.json`` (``inputs`` keyed by input split name). codec: the compression backend
        (``beam.writers.codec_of``).
    """

    def __init__(self, uri: str, jobs: Sequence[SplitJob], info: Mapping, codec: dict | None):
        super().__init__()
        self._uri, self._jobs, self._info, self._codec = uri, tuple(jobs), dict(info), codec

    def expand(self, pbegin):
        written = []
        for job in self._jobs:
            cfg, plan = job.cfg, job.plan
            out = beam_write.ShardOutput(
                self._uri, FILE_PREFIX, "gzip", codec=self._codec, dead_letter_dir=cfg.dead_letter_dir
            )
            fn = WriteSplitShardFn(plan.inputs.source, beam_encode.EncodeSettings.of(plan, cfg), out)
            sequential = [i.path for i in plan.inputs.indexes if i.sequential]
            written.append(
                pbegin
                | f"WriteShards[{job.name}]" >> beam_write.WritePlannedShards(plan.shards, fn, sequential)
                | f"OfInput[{job.name}]" >> beam.Map(lambda entry, name: (name, entry), job.name)
            )
        expected = {
            job.name: {
                "rows": job.plan.inputs.num_rows,
                "files": len(job.plan.output_files),
                "outputs": list(job.outputs),
            }
            for job in self._jobs
        }
        return (
            written
            | "AllShards" >> beam.Flatten()
            | "CollectShards" >> beam.combiners.ToList()
            | "WriteInfo" >> beam.Map(write_info, self._uri, self._info, expected)
        )


def write_info(entries: list[tuple[str, dict]], uri: str, info: Mapping, expected: Mapping[str, dict]) -> dict:
    """Checks the shards written and commits ``tfrecord_etl.json`` in ``uri``: ``info`` with, per input split
    (``inputs``), ``records`` and ``rows_dead_lettered`` / ``dead_letters`` (``beam_deadletters.dead_range`` of each), and
    per output split (``splits``) ``records``, ``bytes`` and its ``files`` (``file``, ``records``, ``bytes``,
    ``crc32c``), in file order. ``entries``: ``(input split, WriteShardFn entry)`` of every file written;
    ``expected``: per input split its ``rows``, the ``files`` planned and its ``outputs`` (output split names).

    Raises:
      RecordError: an input split whose files are not all there, or whose records plus rows dead-lettered differ
        from its rows: nothing is committed and the ExampleGen fails.
    """
    out = {
        **info,
        "inputs": {name: dict(entry) for name, entry in info.get("inputs", {}).items()},
        "splits": {
            split: {"records": 0, "bytes": 0, "files": []} for want in expected.values() for split in want["outputs"]
        },
    }
    for name, want in expected.items():
        mine = [e for n, e in entries if n == name]
        records = sum(e["records"] for e in mine)
        dead = sum(e.get("dead_rows", 0) for e in mine)
        if (
            len(mine) != want["files"]
            or len({e["file"] for e in mine}) != want["files"]
            or records + dead != want["rows"]
        ):
            raise RecordError(
                f"Input split '{name}': {want['rows']} rows planned in {want['files']} files, but "
                f"{len(mine)} files hold {records} records and {dead} rows were dead-lettered",
                file=uri,
                hint="nothing was committed; run the pipeline again",
            )
        letters = [d for e in mine for d in e.get("dead_letters", [])]
        out["inputs"].setdefault(name, {}).update(
            records=records,
            rows_dead_lettered=dead,
            dead_letters=sorted(letters, key=lambda d: (d["file"], d["start"])),
        )
        for e in sorted(mine, key=lambda e: e["file"]):
            split = out["splits"][e["split"]]
            split["records"] += e["records"]
            split["bytes"] += e["bytes"]
            split["files"].append({k: e[k] for k in ("file", "records", "bytes", "crc32c")})
    sink.write_json(fileio.join(uri, INFO_FILE), out)
    return out
