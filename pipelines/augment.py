"""Add fields to an existing TFRecord collection of tf.train.Example, without touching the originals.

    tfrecord-etl augment --input 'in/*.tfrecord.gz' --output_dir out/ [--mode rewrite|sidecar] \\
        [--fn mymodule:add_fields --fn_inputs a,b [--fn_batch]] [--constants NAME=VALUE[:DTYPE],...] \\
        [--join_input labels.h5 [--join_by key --key_feature id --join_key id]] [--runner DirectRunner ...]

The pipeline is one PTransform, ``transforms.augment.AugmentTFRecord`` (AugmentShards -> FinalizeAugment).
A collection --input (collection.json + span-N/) is augmented span by span (--spans: which; ``new``: those not
augmented yet), each span committed in OUTPUT_DIR/collection.json (``transforms.augment.spans``).
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m: hand over to tfrecord_etl.pipelines.augment, the module's one name
    from tfrecord_etl.pipelines.cli import run_command

    run_command("augment")

import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from tfrecord_etl.pipelines import common, flaghelp, jobcontrol, jobserver, progress
from tfrecord_etl.transforms import augment, localmode
from tfrecord_etl.transforms.augment import readers, spans
from tfrecord_etl.transforms.augment.config import AugmentConfig, AugmentOptions
from tfrecord_etl.transforms.config import build_parser as build_flags, parse_args
from tfrecord_etl.transforms.errors import printable
from tfrecord_etl.transforms.output import metadata, tfrecord
from tfrecord_etl.transforms.storage import fileio

__all__ = ["AugmentConfig", "AugmentOptions", "build_parser", "build_pipeline", "main"]


def build_pipeline(p: beam.Pipeline, plan: augment.AugmentPlan):
    """Composes the augment pipeline on ``p``; returns the PCollection holding the committed output dir."""
    return p | "AugmentTFRecord" >> augment.AugmentTFRecord(plan=plan, prepare_output=False)


def augment_size(plan) -> tuple[int, int]:
    """``(records, bytes)`` of the input collection for the local mode: the recorded count, else the file bytes
    over ~100-byte records (a guess that errs to fewer records, i.e. to staying in-process)."""
    for s in plan.collection.shards:  # the shards planned, still as planned (a replaced collection fails here)
        if s.pin is not None:
            fileio.check_pin(s.path, s.pin, "Input shard")
    num_bytes = sum(s.pin[0] if s.pin is not None else fileio.size(s.path) for s in plan.collection.shards)
    records = plan.collection.num_records
    return (records if records is not None else num_bytes // 100), num_bytes


PROG = "tfrecord-etl augment"


def build_parser():
    """The command's argument parser, its flags in the argument groups of ``flaghelp.GROUPS`` (``--help``, the
    docs' flag reference)."""
    parser = build_flags(AugmentConfig, AugmentOptions, PROG, __doc__)
    # the usage line names the two required flags; the groups of --help list every flag
    parser.usage = f"{PROG} --input PATTERN_OR_DIR --output_dir DIR [flags] [Beam flags]"
    return flaghelp.group_flags(parser, "augment")


def main(argv: list[str]) -> int:
    cfg, beam_argv = parse_args(argv, AugmentConfig, AugmentOptions, PROG, __doc__, build_parser())
    # pipeline_options from the YAML config too; its gs:// paths reachable
    common.configure_filesystems(beam_argv, [cfg.input, cfg.output_dir, cfg.join_input])
    jobserver.check(beam_argv)  # a portable runner's job server answers, before anything is read or written
    jobcontrol.check(beam_argv)  # --max_wait_for_slots_s usable
    tfrecord.require_fast_crc32c()
    if spans.is_collection_input(cfg):
        spans.augment_collection(cfg, lambda span_cfg: augment_output(span_cfg, beam_argv))
    else:
        augment_output(cfg, beam_argv)
    return 0


def augment_output(cfg: AugmentConfig, beam_argv: list[str]) -> str | None:
    """Augments one input (an output directory or shards) into ``cfg.output_dir`` and prints the summary;
    returns the digest of the input's metadata.json the run planned from (None without one)."""
    started = time.time()
    plan = augment.plan_augment(cfg)
    lock, plan = augment.prepare_output_dir(plan)
    with lock:
        beam_argv, mode = localmode.choose_local_mode(beam_argv, *augment_size(plan), len(plan.collection.shards))
        options = PipelineOptions(beam_argv)
        p = beam.Pipeline(runner=common.local_runner(options), options=options)
        build_pipeline(p, plan)
        with progress.watch(
            cfg.output_dir,
            progress.augment_planned(plan, *augment_size(plan)),
            "augment",
            progress.mode(cfg.progress) == "bar" and not cfg.verbose,
        ):
            counters = common.run_pipeline(p)
    meta = metadata.load(cfg.output_dir)
    info = meta["augment"]
    common.print_summary(
        cfg.output_dir,
        meta,
        time.time() - started,
        {
            "mode": cfg.mode,
            "records in / out": f"{info['records_in']} / {meta['num_records']} (checked per shard)",
            "new features": ", ".join(
                f"{printable(s.name)} {s.dtype} {list(s.shape)} {s.encoding}" for s in plan.new_specs
            ),
            **({"replaced": ", ".join(map(printable, plan.replace))} if plan.replace else {}),
            **(
                {
                    "input features": "learned from every record"
                    + (
                        f"; the first records' guess was wrong for {len(info['input_features_corrected'])}: "
                        + "; ".join(map(printable, info["input_features_corrected"]))
                        if info["input_features_corrected"]
                        else " (the first records' guess held)"
                    )
                }
                if info.get("input_features_inferred")
                else {}
            ),
            **(
                {"input schema": f"{printable(info['input_schema'])} (every record checked)"}
                if info.get("input_schema")
                else {}
            ),
            **({"manifest": f"{cfg.output_dir}/manifest.json"} if cfg.mode == "sidecar" else {}),
            **readers.summary(plan.readers, cfg.output_dir, cfg.mode, len(meta["shards"])),
            **({"local runner": mode.describe()} if mode else {}),
        },
    )
    common.print_metrics(counters, meta["num_records"])
    return plan.collection.metadata_digest
