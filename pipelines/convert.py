"""Convert NumPy arrays in HDF5 / .npz / .npy files to sharded TFRecord files of tf.train.Example.

    python -m pipelines.convert --input 'data/*.h5' --output_dir out/ [--config configs/local.yaml] \\
        [--datasets /images,/labels] [--compression gzip] [--runner DirectRunner ...]

With ``--writer planned`` (default): WritePlannedShards -> FinalizeOutput, where each planned shard
(a contiguous list of row ranges) is read, encoded and written by one worker with no shuffle.
With ``--writer beam``: ReadFromArrays -> EncodeExamples -> WriteToShards (WriteToTFRecord) -> FinalizeOutput.
"""
from __future__ import annotations

import functools
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import common
from transforms import beam_io, metadata, outdir, sharding, tfrecord
from transforms.config import ConvertConfig, ConvertOptions, parse_args
from transforms.errors import ConfigError, printable
from transforms.sources import SourceOptions


def build_plan(cfg: ConvertConfig):
    """Plans the inputs and chooses the features' encodings; every input error surfaces here."""
    plan = beam_io.plan_inputs(cfg.input, SourceOptions(
        cfg.format, tuple(cfg.datasets) if cfg.datasets else None, cfg.npz_mode, cfg.npy_mode,
        int(cfg.target_range_mb * 2**20), max_compression_ratio=cfg.max_compression_ratio,
        max_empty_rows=cfg.max_empty_rows, allow_external_storage=cfg.allow_external_storage,
        allow_fill_value=cfg.allow_fill_value))
    specs = beam_io.choose_encodings(plan.specs, cfg.encoding, cfg.feature_encodings, cfg.allow_lossy, cfg.input)
    if cfg.provenance:
        specs += beam_io.PROVENANCE
    metadata.check_unique(specs)
    return plan, specs


def local_workers(options: PipelineOptions) -> int:
    """DirectRunner's worker count (1 elsewhere): the default shard count is at least this, so every
    local worker has a shard to write."""
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    if "Direct" not in str(runner):
        return 1
    return max(1, options.view_as(DirectOptions).direct_num_workers or 1)


def _write_dead_letters(letters: list[dict], dead_letter_dir: str) -> int:
    """Writes the beam writer's dead letters (if any) and returns their row count."""
    if letters:
        beam_io.write_dead_letters(dead_letter_dir, "dead_letters", letters)
    return sum(d["rows"] for d in letters)


def num_shards_for(cfg: ConvertConfig, plan, options: PipelineOptions) -> int:
    """``--num_shards``, else ``ceil(bytes / --target_shard_mb)`` and at least one shard per local worker
    (the default capped at one shard per row and at the file-name maximum).

    Raises:
      ConfigError: ``--num_shards`` above the rows of the input or above sharding.MAX_SHARDS.
    """
    if cfg.num_shards:
        return sharding.check_num_shards(cfg.num_shards, plan.num_rows)
    default = max(local_workers(options), metadata.default_num_shards(plan.num_bytes, int(cfg.target_shard_mb * 2**20)))
    return min(default, max(1, plan.num_rows), sharding.MAX_SHARDS)


def output_files(cfg: ConvertConfig, plan, num_shards: int, shards=None) -> list[str]:
    """The names of the shard files this run writes (``shards``: the planned writer's shard plans)."""
    suffix = beam_io.shard_suffix(cfg.compression)
    if cfg.writer == "planned":
        return [s.file_name(cfg.prefix, suffix) for s in (shards if shards is not None else plan.shards(num_shards))]
    return [f"{cfg.prefix}-{i:05d}-of-{num_shards:05d}{suffix}" for i in range(num_shards)]


def build_pipeline(p: beam.Pipeline, cfg: ConvertConfig, plan, specs, shards=None):
    """Composes the convert pipeline on ``p``; returns the PCollection holding the committed output dir.
    ``shards``: the planned writer's shard plans when already computed."""
    num_shards = num_shards_for(cfg, plan, p.options)
    finalize = functools.partial(beam_io.FinalizeOutput, cfg.output_dir, specs, cfg.compression, plan.num_rows,
                                 [{"path": i.path, "rows": i.num_rows} for i in plan.indexes], cfg.writer,
                                 cfg.model_dump())
    if cfg.writer == "planned":
        write_fn = beam_io.WriteShardFn(plan.source, specs, cfg.output_dir, cfg.prefix, cfg.compression,
                                        cfg.allow_lossy, cfg.provenance, cfg.dead_letter_dir,
                                        common.show_progress(cfg.progress))
        return (p
                | "WritePlannedShards" >> beam_io.WritePlannedShards(
                    shards if shards is not None else plan.shards(num_shards), write_fn)
                | "FinalizeOutput" >> finalize(counted=True))
    encoded = (p
               | "CreateRowRanges" >> beam.Create(list(plan.ranges))
               | "SpreadRowRanges" >> beam.Reshuffle()
               | "ReadAndEncode" >> beam.ParDo(beam_io.ReadAndEncodeFn(
                   plan.source, specs, cfg.allow_lossy, cfg.provenance, cfg.dead_letter_dir is not None)
               ).with_outputs(beam_io.DEAD_LETTERS, main="records"))
    dead_rows = None
    if cfg.dead_letter_dir is not None:  # one chain, so the pipeline keeps a single leaf (DaskRunner)
        dead_rows = (encoded[beam_io.DEAD_LETTERS]
                     | "CollectDeadLetters" >> beam.combiners.ToList()
                     | "WriteDeadLetters" >> beam.Map(_write_dead_letters, cfg.dead_letter_dir))
    return (encoded.records
            | "WriteToShards" >> beam_io.WriteToShards(cfg.output_dir, cfg.prefix, num_shards, cfg.compression)
            | "FinalizeOutput" >> finalize(dead_rows=dead_rows))


def main(argv: list[str]) -> int:
    cfg, beam_argv = parse_args(argv, ConvertConfig, ConvertOptions, "python -m pipelines.convert", __doc__)
    common.configure_filesystems(beam_argv)  # pipeline_options from the YAML config too
    tfrecord.require_fast_crc32c()
    started = time.time()
    plan, specs = build_plan(cfg)
    outdir.check_inputs_outside(cfg.output_dir, [i.path for i in plan.indexes])
    if cfg.dead_letter_dir is not None:
        outdir.check_inputs_outside(cfg.output_dir, [cfg.dead_letter_dir], "--dead_letter_dir")
    if cfg.writer == "beam" and outdir.escape_glob(cfg.output_dir) != cfg.output_dir:
        raise ConfigError("--writer beam cannot write into a directory whose name holds * ? [ or ] (Beam's file "
                          "sink matches it as a pattern)", file=cfg.output_dir,
                          hint="rename the directory or use --writer planned, which takes paths literally")
    options = PipelineOptions(beam_argv)
    num_shards = num_shards_for(cfg, plan, options)
    shards = plan.shards(num_shards) if cfg.writer == "planned" else None
    with outdir.prepare(cfg.output_dir, command="convert", options=cfg.model_dump(), overwrite=cfg.overwrite,
                        files=output_files(cfg, plan, num_shards, shards),
                        beam_temp_prefixes=[cfg.prefix] if cfg.writer == "beam" else []):
        p = beam.Pipeline(options=options)
        build_pipeline(p, cfg, plan, specs, shards)
        counters = common.run_pipeline(p)
    meta = metadata.load(cfg.output_dir)
    common.print_summary(cfg.output_dir, meta, time.time() - started,
                         {"rows read": plan.num_rows, "rows dead-lettered": meta["rows_dead_lettered"],
                          "row ranges": len(plan.ranges) if cfg.writer == "beam" else sum(len(s.ranges) for s in shards),
                          "features": ", ".join(f"{printable(s.name)} {s.dtype} {list(s.shape) if s.shape is not None else '*'}"
                                                f" {s.encoding}" for s in specs)})
    common.print_metrics(counters, meta["num_records"])
    return 0


if __name__ == "__main__":
    raise SystemExit(common.run_main(main))
