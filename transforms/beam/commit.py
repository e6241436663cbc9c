"""The commit: the per-shard counts checked against the rows planned and ``metadata.json`` written last."""

from __future__ import annotations

import apache_beam as beam

from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import metadata, outdir, resume, tfds_info
from tfrecord_etl.transforms.output.commit import OutputCommit  # its home: the output and its commit
from tfrecord_etl.transforms.output.runlock import CarriesRun


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
        resume.remove_receipts(c.output_dir)  # (listed by the run marker: a crash before this, the next run's)
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
