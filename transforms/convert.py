"""The convert pipeline as one PTransform, ``ConvertToTFRecord``, and its writers, chosen from :data:`WRITERS`.

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
[, "dead_rows"]}``; adding one = a class here taking ``(plan, cfg)`` and a line in :data:`WRITERS` (and the name in
``ConvertConfig.writer``).
"""
from __future__ import annotations

import apache_beam as beam

from tfrecord_etl.transforms import beam_io, outdir
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.planning import ConvertPlan, plan_convert


class WritePlanned(beam.PTransform):
    """The ``planned`` writer (default): every shard planned before the run (contiguous row ranges of equal
    bytes) and written by one worker (``beam_io.WriteShardFn``) with no shuffle of the data; byte-identical
    output on every rerun."""

    def __init__(self, plan: ConvertPlan, cfg: ConvertConfig, progress: bool = False):
        super().__init__()
        self._plan, self._cfg, self._progress = plan, cfg, progress

    def expand(self, pbegin):
        plan, cfg = self._plan, self._cfg
        fn = beam_io.WriteShardFn(plan.inputs.source, plan.specs, cfg.output_dir, cfg.prefix, cfg.compression,
                                  cfg.allow_lossy, cfg.provenance, cfg.dead_letter_dir, self._progress,
                                  cfg.index)
        return pbegin | "WritePlannedShards" >> beam_io.WritePlannedShards(plan.shards, fn)


def _write_dead_letters(letters: list[dict], dead_letter_dir: str) -> int:
    """Writes the beam writer's dead letters (if any) and returns their row count."""
    if letters:
        beam_io.write_dead_letters(dead_letter_dir, "dead_letters", letters)
    return sum(d["rows"] for d in letters)


class WriteWithBeamSink(beam.PTransform):
    """The ``beam`` writer: row ranges spread with a Reshuffle, read and encoded per range
    (``beam_io.ReadAndEncodeFn``, failing ranges to dead letters), written by Beam's ``WriteToTFRecord``; the
    written shards are counted by walking their frames. ``dead_rows`` (set by expand) is the singleton
    PCollection of rows dead-lettered, or None."""

    def __init__(self, plan: ConvertPlan, cfg: ConvertConfig, progress: bool = False):
        super().__init__()
        self._plan, self._cfg = plan, cfg
        self.dead_rows = None

    def expand(self, pbegin):
        plan, cfg = self._plan, self._cfg
        encoded = (pbegin
                   | "CreateRowRanges" >> beam.Create(list(plan.inputs.ranges))
                   | "SpreadRowRanges" >> beam.Reshuffle()
                   | "ReadAndEncode" >> beam.ParDo(beam_io.ReadAndEncodeFn(
                       plan.inputs.source, plan.specs, cfg.allow_lossy, cfg.provenance,
                       cfg.dead_letter_dir is not None)).with_outputs(beam_io.DEAD_LETTERS, main="records"))
        if cfg.dead_letter_dir is not None:  # one chain, so the pipeline keeps a single leaf (DaskRunner)
            self.dead_rows = (encoded[beam_io.DEAD_LETTERS]
                              | "CollectDeadLetters" >> beam.combiners.ToList()
                              | "WriteDeadLetters" >> beam.Map(_write_dead_letters, cfg.dead_letter_dir))
        return (encoded.records
                | "WriteToShards" >> beam_io.WriteToShards(cfg.output_dir, cfg.prefix, plan.num_shards,
                                                           cfg.compression)
                | "CountShardRecords" >> beam.Map(beam_io.count_shard, cfg.compression, cfg.index))


WRITERS: dict[str, type[beam.PTransform]] = {"planned": WritePlanned, "beam": WriteWithBeamSink}


class ConvertToTFRecord(beam.PTransform):
    """HDF5 / .npz / .npy files matching ``file_pattern`` -> sharded TFRecord files of ``tf.train.Example`` in
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

    def __init__(self, file_pattern: str | None = None, output_dir: str | None = None, *,
                 config: ConvertConfig | None = None, plan: ConvertPlan | None = None, local_workers: int = 1,
                 prepare_output: bool = True, progress: bool = False, **options):
        super().__init__()
        if config is None:
            try:
                config = ConvertConfig(input=file_pattern, output_dir=output_dir, **options)
            except Exception as e:  # pydantic's ValidationError: one line, as the command's flags
                raise ConfigError(f"Invalid ConvertToTFRecord options: {e}") from None
        elif file_pattern is not None or output_dir is not None or options:
            raise ConfigError("Pass either config= or file_pattern, output_dir and options, not both")
        self.config = config
        self.plan = plan or plan_convert(config, local_workers)
        self._progress = progress
        report_orphan_labels(config, self.plan)
        if prepare_output:
            check_output(config, self.plan)
            outdir.prepare(config.output_dir, command="convert", options=config.model_dump(),
                           overwrite=config.overwrite, files=self.plan.output_files,
                           beam_temp_prefixes=[config.prefix] if config.writer == "beam" else []).release()

    def expand(self, pbegin):
        cfg, plan = self.config, self.plan
        writer = WRITERS[cfg.writer](plan, cfg, self._progress)
        shards = pbegin | type(writer).__name__ >> writer
        commit = beam_io.OutputCommit(cfg.output_dir, plan.specs, cfg.compression, plan.inputs.num_rows,
                                      tuple({"path": i.path, "rows": i.num_rows} for i in plan.inputs.indexes),
                                      cfg.writer, cfg.model_dump(), plan.inputs.source.describe())
        return shards | "FinalizeOutput" >> beam_io.FinalizeOutput(commit, getattr(writer, "dead_rows", None))


def report_orphan_labels(cfg: ConvertConfig, plan: ConvertPlan) -> None:
    """``--format files`` with a labels table and ``--dead_letter_dir``: the table's rows that name no matched file
    go to ``labels_without_files.jsonl`` there (without the flag they stopped the planning)."""
    orphans = getattr(plan.inputs.source, "orphans", ())
    if orphans and cfg.dead_letter_dir is not None:
        beam_io.write_dead_letters(cfg.dead_letter_dir, "labels_without_files", [
            {"file": cfg.file_labels, "files": [name], "rows": 0, "error": "SourceError",
             "message": "The labels table names a file that the input pattern does not match"} for name in orphans])


def check_output(cfg: ConvertConfig, plan: ConvertPlan) -> None:
    """The output-location checks of a conversion: no input (or dead-letter dir) inside the output directory,
    and no glob characters in it for the ``beam`` writer (Beam's sink matches it as a pattern).

    Raises:
      ConfigError: naming the path and what to do.
    """
    outdir.check_inputs_outside(cfg.output_dir, [i.path for i in plan.inputs.indexes])
    if cfg.dead_letter_dir is not None:
        outdir.check_inputs_outside(cfg.output_dir, [cfg.dead_letter_dir], "--dead_letter_dir")
    if cfg.writer == "beam" and outdir.escape_glob(cfg.output_dir) != cfg.output_dir:
        raise ConfigError("--writer beam cannot write into a directory whose name holds * ? [ or ] (Beam's file "
                          "sink matches it as a pattern)", file=cfg.output_dir,
                          hint="rename the directory or use --writer planned, which takes paths literally")
