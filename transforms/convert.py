"""The convert pipeline as one PTransform, ``ConvertToTFRecord``, with its writer chosen from ``beam.writers.WRITERS``.

    import apache_beam as beam
    from tfrecord_etl.transforms.convert import ConvertToTFRecord

    with beam.Pipeline() as p:
        p | ConvertToTFRecord("data/*.h5", "out/", num_shards=8, compression="gzip")

Like Beam's file-based sources, the transform plans at construction (``transforms.planning``: match and index the
inputs, choose encodings, plan the shards), so a bad input fails before the pipeline runs. At construction it
also prepares the output directory as the commands do (``outdir.prepare``: files that are not ours are refused
unless ``overwrite=True``, which deletes only ours; the run marker lists the files this run writes). The commands
hold the directory's lock for their whole run; a pipeline of your own gets the same checks at construction but
no lock while it runs. The result is a PCollection holding the output directory once ``metadata.json``, the commit
point, is written.

A writer is a PTransform from the pipeline's start to per-shard counts ``{"file", "records", "bytes"
[, "dead_rows", "dead_letters"]}``; adding one = a ``PlanWriter`` subclass in ``transforms/beam/writers.py`` and a
line in its ``WRITERS`` (and the name in ``ConvertConfig.writer``).
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np

from tfrecord_etl.transforms import planning
from tfrecord_etl.transforms.beam import (
    commit as beam_commit,
    deadletters as beam_deadletters,
)
from tfrecord_etl.transforms.beam.writers import WRITERS, codec_of, writer_name
from tfrecord_etl.transforms.collections import matching
from tfrecord_etl.transforms.collections.spans import has_placeholders
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import ConfigError, IncompleteOutputError, SchemaError, SourceError
from tfrecord_etl.transforms.output import metadata, outdir, resume
from tfrecord_etl.transforms.planning import ConvertPlan, plan_convert
from tfrecord_etl.transforms.storage import fileio


class ConvertToTFRecord(beam.PTransform):
    """Array files matching ``file_pattern`` (every registered source: HDF5, netCDF-3, .npz, .npy, raw, MATLAB,
    Zarr, file collections) -> sharded TFRecord files of ``tf.train.Example`` in
    ``output_dir``, with ``metadata.json`` and ``schema.pbtxt``; returns the PCollection of the committed output
    directory (one element).

    Args:
      file_pattern: local, gs:// or s3:// pattern of the inputs (``--input``).
      output_dir: the output directory (``--output_dir``).
      **options: any other ``ConvertConfig`` field by name (``num_shards=8``, ``compression="gzip"``,
        ``datasets=["/x"]``, ``feature_encodings={"mask": "packbits"}``, ``overwrite=True``...), with the same
        defaults and checks as the command's flags.

    Raises (at construction):
      ConfigError: bad options, an output directory holding files that are not ours, an input inside it.
      SourceError, SchemaError: unreadable or unsupported inputs.
    """

    def __init__(
        self,
        file_pattern: str | None = None,
        output_dir: str | None = None,
        *,
        config: ConvertConfig | None = None,
        plan: ConvertPlan | None = None,
        prepare_output: bool = True,
        progress: bool = False,
        carried: dict | None = None,
        replaced: outdir.Replacement = outdir.Replacement(),
        resumed: dict | None = None,
        receipt_key: str | None = None,
        **options,
    ):
        super().__init__()
        if config is None:
            try:
                config = ConvertConfig(input=file_pattern, output_dir=output_dir, **options)
            except Exception as e:  # pydantic's ValidationError: one line, as the command's flags
                raise ConfigError(f"Invalid ConvertToTFRecord options: {e}") from None
        elif file_pattern is not None or output_dir is not None or options:
            raise ConfigError("Pass either config= or file_pattern, output_dir and options, not both")

        if config.incremental or has_placeholders(config.input):
            raise ConfigError(
                "Span placeholders and --incremental write a collection of spans, which the convert "
                "command does (transforms.spanrun); ConvertToTFRecord writes one output directory",
                file=config.input,
                hint="resolve the span first (spans.resolve) and pass its files' pattern, or run tfrecord-etl convert",
            )
        self.config = config
        codec_of(config)  # refuse a level or backend we cannot write with before planning
        self.plan = plan or plan_convert(config)
        self._progress = progress
        report_orphan_labels(config, self.plan)
        self.carried = carried  # the splits this run adds to (carried_splits), None for a plain output
        self.replaced = replaced  # what this run's commit replaces (outdir.prepare)
        self.resumed, self.receipt_key = resumed or {}, receipt_key  # (resume: shards kept, receipts' digest)
        if prepare_output:
            prepared = prepare_output_dir(config, self.plan)
            prepared.release()
            self.carried, self.plan, self.replaced = prepared.meta, prepared.plan, prepared.replaced
            self.resumed, self.receipt_key = prepared.resumed, prepared.receipt_key

    def expand(self, pbegin):
        cfg, plan = self.config, self.plan
        writer = WRITERS[writer_name(cfg)](plan, cfg, self._progress)
        writer.resumed, writer.receipt_key = self.resumed, self.receipt_key
        shards = pbegin | type(writer).__name__ >> writer
        commit = beam_commit.OutputCommit(
            output_dir=cfg.output_dir,
            specs=plan.specs,
            compression=cfg.compression,
            expected_rows=plan.inputs.num_rows,
            sources=tuple(source_entry(i) for i in plan.inputs.indexes),
            writer=writer_name(cfg),
            options=recorded_options(cfg),
            described=plan.inputs.source.describe(),
            tfds_name=plan.tfds_name,
            carried=self.carried,
            split_names=plan.split_plan.names if plan.split_plan else (),
            replaced=self.replaced,
            codec=codec_of(cfg),
        )
        return shards | "FinalizeOutput" >> beam_commit.FinalizeOutput(commit, writer.dead_letters)


class PreparedOutput:
    """The held lock of a prepared output directory (:func:`prepare_output_dir`); ``plan``, the plan writing the
    generation of names the lock chose (``planning.with_generation``); ``replaced``, what the run's commit replaces
    (``outdir.Replacement``); ``resumed`` and ``receipt_key`` (see ``resume``); and, when the run adds a split to a TFDS directory, the metadata of the
    splits already there (``meta``, None otherwise)."""

    def __init__(self, lock: outdir.Lock, meta: dict | None, plan: ConvertPlan | None = None):
        self.lock, self.meta, self.plan = lock, meta, plan
        self.replaced = lock.replacement
        self.resumed = lock.resumed  # --resume: {shard plan index: entries} of the shards kept
        self.receipt_key: str | None = None  # the run identity's digest, recorded in each shard's receipt

    def release(self) -> None:
        self.lock.release()

    def __bool__(self) -> bool:
        return self.meta is not None

    def __enter__(self):
        self.lock.__enter__()  # commits in this block check that the run still holds the lock
        return self

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def carried_splits(cfg: ConvertConfig, plan: ConvertPlan) -> tuple[dict | None, set[str]]:
    """When this run adds splits to a complete TFDS output directory of the same ``--tfds_name`` (``--split test``
    after ``--split train``): the metadata of the other splits, with only their shards (kept as they are and
    listed again at commit), and the names ``outdir.prepare`` must keep (their shards and index files, and, when
    no split is replaced, ``metadata.json``, ``schema.pbtxt`` and TFDS's files, so the directory stays loadable
    until the new split commits). ``(None, set())`` otherwise.

    Raises:
      SchemaError: the features differ from those of the splits there. ConfigError: a split that is already
        there, without ``--overwrite`` (with it, that split is replaced and the others kept).
    """
    if (
        cfg.tfds_name is None
        or plan.split_plan is None
        or not fileio.exists(fileio.join(cfg.output_dir, outdir.METADATA_FILE))
    ):
        return None, set()
    try:
        meta = metadata.load(cfg.output_dir)
    except (IncompleteOutputError, SchemaError):
        return None, set()
    if (meta.get("tfds") or {}).get("name") != cfg.tfds_name:
        return None, set()
    names = set(plan.split_plan.names)
    others = [s for s in meta["shards"] if s.get("split") not in names]
    if not others:
        return None, set()
    merged = merge_split_specs(meta["features"], plan.specs)
    if merged is None or meta["compression"] != cfg.compression:
        theirs = ", ".join(f"{s.name} {s.dtype} {list(s.shape or [])} {s.encoding}" for s in meta["features"])
        raise SchemaError(
            f"The features differ from those of the splits already in this TFDS directory "
            f"({theirs}; compression {meta['compression']})",
            file=cfg.output_dir,
            hint="convert with the same inputs and options, or choose another --output_dir",
        )
    replaced = sorted({s["split"] for s in meta["shards"] if s.get("split") in names})
    if replaced and not cfg.overwrite:
        raise ConfigError(
            f"Split {replaced[0]!r} is already in this TFDS directory",
            file=cfg.output_dir,
            hint="pass --overwrite to replace it (the other splits are kept), or choose another --split",
        )
    runs = kept_runs(cfg, meta, names)
    keep = {s[k] for s in others for k in ("file", "index") if k in s}
    if not replaced:
        keep |= {outdir.METADATA_FILE, outdir.SCHEMA_FILE, *meta["tfds"].get("files", [])}
    return {"shards": others, "features": merged, "runs": runs}, keep


def kept_runs(cfg: ConvertConfig, meta: dict, names: set[str]) -> list[dict]:
    """The runs recorded in ``meta`` (an output of one run without ``runs``: that run) that wrote none of the
    splits ``names`` this run writes.

    Raises:
      ConfigError: a run that wrote some of ``names`` together with other splits (replacing part of it would leave
        its counts wrong).
    """
    runs = meta.get("runs") or [
        {
            "splits": sorted(meta.get("splits") or {}),
            "rows_read": meta.get("rows_read", meta["num_records"] + meta.get("rows_dead_lettered", 0)),
            "rows_dead_lettered": meta.get("rows_dead_lettered", 0),
            "sources": meta.get("sources", []),
        }
    ]
    torn = [r for r in runs if set(r["splits"]) & names and not set(r["splits"]) <= names]
    if torn:
        raise ConfigError(
            f"Splits {torn[0]['splits']} were written together by one run (--splits): replacing "
            f"{sorted(set(torn[0]['splits']) & names)} alone would leave its counts wrong",
            file=cfg.output_dir,
            hint="replace them together (--splits), or choose another --split",
        )
    return [r for r in runs if not set(r["splits"]) & names]


def merge_split_specs(theirs, ours) -> tuple | None:
    """The features of a directory whose splits were written with ``theirs`` and ``ours``: equal specs, where a
    fixed-width string (``S``/``U``, ``list``-encoded: one value per string on the wire, whatever the width) may
    differ in width (the wider one is recorded, so no reader truncates); None when they differ otherwise."""
    if [s.name for s in theirs] != [s.name for s in ours]:
        return None
    out = []
    for a, b in zip(theirs, ours):
        if a == b:
            out.append(a)
            continue
        kinds = {np.dtype(d).kind if d not in (None, "bytes") else d for d in (a.dtype, b.dtype)}
        if (
            (a.encoding, a.shape) == (b.encoding, b.shape) == ("list", a.shape)
            and len(kinds) == 1
            and kinds <= {"S", "U"}
        ):
            out.append(dataclasses.replace(a, dtype=max((a.dtype, b.dtype), key=lambda d: np.dtype(d).itemsize)))
        else:
            return None
    return tuple(out)


def prepare_output_dir(cfg: ConvertConfig, plan: ConvertPlan) -> PreparedOutput:
    """Checks the output location and prepares the directory for this run (``outdir.prepare``); returns the held
    lock and the splits this run adds to (:func:`carried_splits`)."""
    check_output(cfg, plan)
    carried, keep = carried_splits(cfg, plan)
    tfds_files = ("dataset_info.json", "features.json") if plan.tfds_name else ()
    planned = plan.shards is not None and writer_name(cfg) == "planned"  # the writer that leaves receipts
    ident = run_identity(cfg, plan) if planned else None
    if cfg.resume and not planned:
        outdir.say(f"resume: the {writer_name(cfg)} writer does not resume at shard level: running in full")
    lock = outdir.prepare(
        cfg.output_dir,
        command="convert",
        options=recorded_options(cfg),
        overwrite=cfg.overwrite,
        files=plan.output_files + tfds_files,
        beam_temp_prefixes=[plan.prefix] if cfg.writer == "beam" else [],
        keep=keep,
        planned_bytes=plan.inputs.num_bytes if cfg.compression == "none" else None,
        identity=ident,
        shard_files=shard_files(cfg, plan) if planned else None,
        resuming=cfg.resume and planned,
    )
    prepared = PreparedOutput(lock, carried, planning.with_generation(plan, cfg, lock.generation))
    prepared.receipt_key = None if ident is None else resume.digest(ident)
    return prepared


def recorded_options(cfg: ConvertConfig) -> dict:
    """The options ``metadata.json`` and the run marker record: the config's, without ``resume`` (a resumed run's
    output is byte-identical to an uninterrupted one's)."""
    return cfg.model_dump(exclude={"resume"})


def run_identity(cfg: ConvertConfig, plan: ConvertPlan) -> dict:
    """``resume.identity`` of a conversion: the tool and metadata format versions, the compression backend, the
    options and every input file as the plan pinned it (``Source.pin_files``: size and ``st_mtime_ns`` of a local
    file; a remote object's size)."""
    pins = getattr(plan.inputs.source, "pins", None) or {}
    inputs = [(p, *(pins[p] if p in pins else _pin(p))) for p in plan.inputs.paths]
    versions = {"tool": metadata.VERSION, "format": metadata.FORMAT, "codec": codec_of(cfg)}
    return resume.identity(cfg.model_dump(), inputs, versions)


def _pin(path: str) -> tuple[int | None, int | None]:
    """:func:`fileio.pin` of an input, ``(None, None)`` for one that is no single file (a Zarr store on ``s3://`` or
    ``gs://`` is a prefix of objects, not an object): its path alone is its identity."""
    try:
        return fileio.pin(path)
    except SourceError:
        return None, None


def shard_files(cfg: ConvertConfig, plan: ConvertPlan) -> dict[int, tuple[str, ...]]:
    """``{shard plan index: the names of its files}`` (its split files and index files; generation 0)."""
    return {
        s.index: planning.output_files(cfg, [s], plan.num_shards, plan.split_plan, plan.prefix) for s in plan.shards
    }


def report_orphan_labels(cfg: ConvertConfig, plan: ConvertPlan) -> None:
    """``--format files`` with a labels table and ``--dead_letter_dir``: the table's rows that name no matched file
    go to ``labels_without_files.jsonl`` there (without the flag they stopped the planning)."""
    orphans = getattr(plan.inputs.source, "orphans", ())
    if orphans and cfg.dead_letter_dir is not None:
        beam_deadletters.write_dead_letters(
            cfg.dead_letter_dir,
            "labels_without_files",
            [
                {
                    "file": cfg.file_labels,
                    "files": [name],
                    "rows": 0,
                    "error": "SourceError",
                    "message": "The labels table names a file that the input pattern does not match",
                }
                for name in orphans
            ],
        )


def check_output(cfg: ConvertConfig, plan: ConvertPlan) -> None:
    """The output-location checks of a conversion: no input (every matched file, in ``files`` modes too, and a
    labels table) or dead-letter dir inside the output directory, no output the input pattern would match
    (``matching.check_output_unmatched``), and no glob characters in it for the ``beam`` writer (Beam's sink
    matches it as a pattern).

    Raises:
      ConfigError: naming the path and what to do.
    """
    labels = [cfg.file_labels] if cfg.format == "files" and cfg.file_labels not in ("dir", "none") else []
    outdir.check_inputs_outside(cfg.output_dir, outdir.one_per_directory(plan.inputs.paths) + labels)
    first = plan.output_files[0]  # the files a run writes there, and one of its temporaries
    written = [*plan.output_files, outdir.METADATA_FILE, outdir.MARKER_FILE, outdir.LOCK_FILE, f".tmp-{first}-{0:032x}"]
    matching.check_output_unmatched(cfg.input, cfg.output_dir, written)
    if cfg.dead_letter_dir is not None:
        outdir.check_inputs_outside(cfg.output_dir, [cfg.dead_letter_dir], "--dead_letter_dir")
        matching.check_output_unmatched(cfg.input, cfg.dead_letter_dir, [f"{first}.jsonl"], "--dead_letter_dir")
    if cfg.writer == "beam" and fileio.escape_glob(cfg.output_dir) != cfg.output_dir:
        raise ConfigError(
            "--writer beam cannot write into a directory whose name holds * ? [ or ] (Beam's file "
            "sink matches it as a pattern)",
            file=cfg.output_dir,
            hint="rename the directory or use --writer planned, which takes paths literally",
        )


def source_entry(index) -> dict:
    """``metadata.json``'s ``sources`` entry of one input (a :class:`~tfrecord_etl.transforms.sources.FileIndex`):
    ``{"path", "rows"}``, and ``"attributes"`` when its format's conventions say what the converted datasets mean
    (an NWB series' ``unit``, ``conversion``, ``starting_time`` and ``rate``: ``docs/converting/nwb.md``)."""
    entry = {"path": index.path, "rows": index.num_rows}
    if index.attributes:
        entry["attributes"] = index.attributes
    return entry
