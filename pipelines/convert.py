"""Convert array files and folders to TFRecords of tf.train.Example.

    tfrecord-etl convert --input 'data/*.h5' --output_dir out/ [--config configs/local.yaml] \\
        [--datasets /images,/labels] [--compression gzip] [--runner DirectRunner ...]
    tfrecord-etl convert --input 'raw/{YYYY}-{MM}-{DD}/*.h5' --output_dir coll/ [--span latest|N|YYYY-MM-DD]
    tfrecord-etl convert --input 'raw/*.h5' --output_dir coll/ --incremental [--reconvert_changed]

The pipeline is one PTransform, ``transforms.convert.ConvertToTFRecord`` (planned once by
``transforms.planning.plan_convert``); this command adds the flags, the output directory's lock and run marker
(``outdir.prepare``), the summary and the metrics.
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m: hand over to tfrecord_etl.pipelines.convert, the module's one name
    from tfrecord_etl.pipelines.cli import run_command

    run_command("convert")

import sys
import textwrap
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from tfrecord_etl.pipelines import common, flaghelp, jobcontrol, jobserver, progress
from tfrecord_etl.transforms import localmode, planning, spanrun
from tfrecord_etl.transforms.config import ConvertConfig, ConvertOptions, build_parser as build_flags, parse_args
from tfrecord_etl.transforms.convert import ConvertToTFRecord, check_output, prepare_output_dir
from tfrecord_etl.transforms.errors import printable
from tfrecord_etl.transforms.output import metadata, resume, tfrecord

ZLIB_WARNING = (
    "warning: --compression zlib: TensorFlow (tf.data) and Beam (ReadFromTFRecord) read these .deflate "
    "shards, but TFXIO's TensorFlowDataset, Ray's read_tfrecords and the `tfrecord` package (PyTorch) "
    "do not: use --compression gzip (read by all of them) or none"
)


def build_plan(cfg: ConvertConfig, inputs: planning.InputPlan | None = None) -> planning.ConvertPlan:
    """Plans the conversion once (inputs, encodings, shard count, shard plans, file names); every input error
    surfaces here. The plan is the same on every runner (``planning.num_shards``). ``inputs``: the inputs already
    planned (the local mode is chosen from them)."""
    return planning.plan_convert(cfg, inputs=inputs)


def build_pipeline(
    p: beam.Pipeline,
    cfg: ConvertConfig,
    plan: planning.ConvertPlan,
    carried: dict | None = None,
    replaced=None,
    prepared=None,
):
    """Composes the convert pipeline on ``p`` (``carried``: the splits this run adds to, see
    ``convert.carried_splits``; ``replaced``: the committed files its commit replaces, see ``outdir.prepare``;
    ``prepared``: the ``convert.PreparedOutput``, whose shards kept by ``--resume`` are not written again);
    returns the PCollection holding the committed output dir."""
    # a terminal gets the launcher's bar instead (main), unless --verbose shows the runner's logs there
    lines = progress.mode(cfg.progress) == "lines" or (cfg.verbose and progress.mode(cfg.progress) == "bar")
    return p | "ConvertToTFRecord" >> ConvertToTFRecord(
        config=cfg,
        plan=plan,
        prepare_output=False,
        progress=lines,
        carried=carried,
        **({"replaced": replaced} if replaced else {}),
        **({"resumed": prepared.resumed, "receipt_key": prepared.receipt_key} if prepared is not None else {}),
    )


PROG = "tfrecord-etl convert"


def description() -> str:
    """``--help``'s description: this module's docstring, the registered input formats after its first line
    (``flaghelp.input_formats``: a new source is named there without a change here)."""
    first, _, rest = (__doc__ or "").partition("\n")
    formats = textwrap.fill(f"Input formats: {flaghelp.input_formats()}.", 100)
    return f"{first}\n{formats}\n{rest}"


def build_parser():
    """The command's argument parser, its flags in the argument groups of ``flaghelp.GROUPS`` (``--help``, the
    docs' flag reference)."""
    parser = build_flags(ConvertConfig, ConvertOptions, PROG, description())
    # the usage line names the two required flags; the groups of --help list every flag
    parser.usage = f"{PROG} --input PATTERN --output_dir DIR [flags] [Beam flags]"
    return flaghelp.group_flags(parser, "convert")


def _split_lines(cfg: ConvertConfig, plan, meta: dict) -> tuple[dict, dict]:
    """``(meta, lines)``: the metadata counted for this run's splits only (the headline counts this run's files),
    and the summary's lines of every split there and of the TFDS files."""
    splits_line = {}
    if plan.split_plan is not None:  # the headline counts this run's files; the line gives every split there
        mine = set(plan.split_plan.names)
        splits_line = {
            "splits": ", ".join(
                f"{name} {info['num_records']:,} records in {info['num_shards']} shards"
                + ("" if name in mine else " (kept)")
                for name, info in meta["splits"].items()
            )
            + (
                f" (hash buckets {dict(cfg.splits)} of "
                f"{'--split_key ' + cfg.split_key if cfg.split_key else 'the global row index'})"
                if cfg.splits
                else ""
            )
        }
        meta = {**meta, "shards": [s for s in meta["shards"] if s.get("split") in mine]}
        meta["num_records"] = sum(s["records"] for s in meta["shards"])
    if plan.tfds_name or plan.tfds_refusal:
        splits_line["tfds"] = (
            f"tfds.builder_from_directory({printable(cfg.output_dir)!r}) loads {plan.tfds_name} "
            f"(dataset_info.json, features.json)"
            if plan.tfds_name
            else f"no dataset_info.json: {plan.tfds_refusal}"
        )
    return meta, splits_line


def _print_summary(cfg: ConvertConfig, plan, meta: dict, splits_line: dict, run, coll, mode, started: float) -> None:
    """The summary of a finished conversion (``common.print_summary``): the output, the rows read, the local runner,
    the splits, the span of a collection, the index files and the features."""
    inputs = plan.inputs
    common.print_summary(
        cfg.output_dir,
        meta,
        time.time() - started,
        {
            "rows read": inputs.num_rows,
            "rows dead-lettered": meta["rows_dead_lettered"],
            "row ranges": len(inputs.ranges) if plan.shards is None else sum(len(s.ranges) for s in plan.shards),
            **({"local runner": mode.describe()} if mode else {}),
            **splits_line,
            **(spanrun.summary(run, coll) if run is not None else {}),
            **(
                {
                    "index files": f"{len(meta['shards'])} (tfrecord2idx: byte offset and length of "
                    f"every record, beside each shard)"
                }
                if cfg.index
                else {}
            ),
            "features": ", ".join(
                f"{printable(s.name)} {s.dtype} {list(s.shape) if s.shape is not None else '*'} {s.encoding}"
                for s in plan.specs
            ),
        },
    )


def main(argv: list[str]) -> int:
    cfg, beam_argv = parse_args(argv, ConvertConfig, ConvertOptions, PROG, description(), build_parser())
    if cfg.compression == "zlib":
        print(ZLIB_WARNING, file=sys.stderr)
    # pipeline_options from the YAML config too; its gs:// paths reachable
    common.configure_filesystems(beam_argv, [cfg.input, cfg.output_dir, cfg.dead_letter_dir])
    jobserver.check(beam_argv)  # a portable runner's job server answers, before anything is read or written
    jobcontrol.check(beam_argv)  # --max_wait_for_slots_s usable
    tfrecord.require_fast_crc32c()
    started = time.time()
    run = spanrun.plan_run(cfg)  # a span of a collection (placeholders, --incremental), or None
    if run is not None and run.nothing_new:
        print(run.nothing_new)
        return 0
    cfg = run.cfg if run is not None else cfg
    inputs = planning.plan_inputs(cfg.input, planning.source_options(cfg), run.files if run is not None else None)
    beam_argv, mode = localmode.choose_local_mode(beam_argv, inputs.num_rows, inputs.num_bytes, inputs.num_rows)
    options = PipelineOptions(beam_argv)
    plan = build_plan(cfg, inputs)
    if run is not None:
        spanrun.check_before_writing(run, plan)
    if cfg.dry_run:
        check_output(cfg, plan)
        print(
            "\n".join(
                printable(line)
                for line in planning.describe_plan(plan, cfg) + (spanrun.describe(run) if run is not None else [])
            )
        )
        return 0
    try:
        prepared = prepare_output_dir(cfg, plan)
    except resume.NothingToResume as done:
        if run is None:
            print(done)
            return 0
        # a span committed but perhaps not listed in collection.json: run it in full, then list it (as a re-run does)
        prepared = prepare_output_dir(cfg.model_copy(update={"resume": False}), plan)
    with prepared:
        plan = prepared.plan
        p = beam.Pipeline(runner=common.local_runner(options), options=options)
        build_pipeline(p, cfg, plan, prepared.meta, prepared.replaced, prepared)
        with progress.watch(
            cfg.output_dir,
            progress.convert_planned(plan),
            "convert",
            progress.mode(cfg.progress) == "bar" and not cfg.verbose,
        ):
            counters = common.run_pipeline(p)
        coll = spanrun.commit(run, plan, prepared.lock.run_id) if run is not None else None
    meta, splits_line = _split_lines(cfg, plan, metadata.load(cfg.output_dir))
    _print_summary(cfg, plan, meta, splits_line, run, coll, mode, started)
    common.print_metrics(counters, meta["num_records"])
    return 0
