"""The commit of an augment run: the per-shard results checked, ``manifest.json`` (sidecar), TFDS's files, then
``schema.pbtxt`` and ``metadata.json`` (the commit point)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

import apache_beam as beam

from tfrecord_etl.transforms.augment.collection import check_collection
from tfrecord_etl.transforms.augment.plan import AugmentPlan, learned_specs
from tfrecord_etl.transforms.augment.readers import write_tfds
from tfrecord_etl.transforms.codec import FeatureStats
from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import metadata, outdir, sink
from tfrecord_etl.transforms.output.outdir import MANIFEST_FILE, SIDECAR_FORMAT
from tfrecord_etl.transforms.output.runlock import CarriesRun
from tfrecord_etl.transforms.storage import fileio


def manifest(plan: AugmentPlan, results: Sequence[dict]) -> dict:
    """The ``manifest.json`` of a sidecar collection: each input shard's path, compression, record
    count, size in bytes and CRC32C (of the stored bytes), with its sidecar shard, and the original
    features (``inferred`` when they were inferred from a collection without metadata)."""
    return {
        "format": SIDECAR_FORMAT,
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "input": plan.collection.pattern,
        "inferred": plan.collection.inferred,
        "features": [s.to_json() for s in plan.collection.specs],
        "shards": [
            {
                "input": _absolute(r["input"]),
                "compression": r["compression"],
                "records": r["records_in"],
                "bytes": r["input_bytes"],
                "crc32c": r["input_crc32c"],
                "sidecar": r["file"],
            }
            for r in results
        ],
        "num_records": sum(r["records_in"] for r in results),
    }


def _absolute(path: str) -> str:
    return os.path.abspath(path) if fileio.is_local(path) else path


class FinalizeAugmentFn(CarriesRun, beam.DoFn):
    """Checks records in = records out (per shard and in total) and that the input is still the collection planned
    (``collection.check_collection``: its metadata.json unchanged), writes ``manifest.json`` (sidecar), TFDS's
    ``features.json`` + ``dataset_info.json`` (``plan.readers``) and, last, ``schema.pbtxt`` + ``metadata.json``;
    removes temporaries of killed attempts.

    Raises:
      RecordError: a shard missing or duplicated, or records lost.
      InputChangedError: the input collection changed while it was read; nothing is committed.
    """

    def __init__(self, plan: AugmentPlan):
        self._plan = plan

    def process(self, results):
        outdir.failpoint("before-commit")
        plan = self._plan
        results = sorted(results, key=lambda r: r["index"])
        total_in = check_results(plan, results)
        check_collection(plan.collection)
        corrections: list = []
        if plan.collection.observed:  # the features every record satisfies, not the sample's guess
            stats = FeatureStats()
            for r in results:
                stats.merge(FeatureStats.from_json(r["features"]))
            specs, corrections = learned_specs(plan, stats)
            plan = plan.with_input_specs(specs)
        outdir.remove_temporaries(plan.output_dir, [r["file"] for r in results])
        if plan.mode == "sidecar":
            sink.write_json(fileio.join(plan.output_dir, MANIFEST_FILE), manifest(plan, results))
        specs = plan.output_specs
        meta, shards = augment_metadata(plan, results, total_in, corrections)
        tfds = write_tfds(plan.readers, plan.output_dir, plan.mode, plan.collection.pattern, specs, shards)
        if tfds is not None:
            meta["tfds"] = tfds
        metadata.write(plan.output_dir, meta, specs, plan.replaced.metadata_version)
        outdir.finish_replacement(plan.output_dir, plan.replaced)
        yield plan.output_dir


def check_results(plan: AugmentPlan, results: list[dict]) -> int:
    """One result per input shard (``results`` sorted by shard index), records in = records out per shard and in
    total, and = the input's recorded count; returns the records in.

    Raises:
      RecordError: a shard missing or duplicated, or records lost.
    """
    if [r["index"] for r in results] != list(range(len(plan.collection.shards))):
        raise RecordError(
            f"{len(results)} shard results for {len(plan.collection.shards)} input shards",
            file=plan.output_dir,
            hint="re-run; report it if it happens again",
        )
    total_in, total_out = sum(r["records_in"] for r in results), sum(r["records"] for r in results)
    bad = [r["input"] for r in results if r["records_in"] != r["records"]]
    expected = plan.collection.num_records
    if bad or total_in != total_out or (expected is not None and expected != total_in):
        raise RecordError(
            f"Records in ({total_in}) != records out ({total_out}) (metadata: {expected})",
            file=bad[0] if bad else plan.output_dir,
            hint="re-run; report it if it happens again",
        )
    return total_in


def augment_metadata(
    plan: AugmentPlan, results: list[dict], total_in: int, corrections: list
) -> tuple[dict, list[dict]]:
    """``(metadata, shards)``: the output's ``metadata.json`` (without its TFDS entry) and its shard entries."""
    specs = plan.output_specs
    shards = [
        {
            "file": r["file"],
            "records": r["records"],
            "bytes": r["bytes"],
            "crc32c": r["crc32c"],
            **({"index": r["index_file"]} if r.get("index_file") else {}),
            **({"split": r["split"]} if r.get("split") else {}),
        }
        for r in results
    ]
    sources = [{"path": r["input"], "records": r["records_in"]} for r in results]
    meta = metadata.build(specs, shards, plan.output_compression, sources, "augment", plan.options)
    if plan.codec:
        meta["compression_backend"] = dict(plan.codec)
    meta["augment"] = {
        "mode": plan.mode,
        "input": plan.collection.pattern,
        "input_features_inferred": plan.collection.inferred,
        "input_schema": plan.collection.schema_file,
        "input_features_corrected": corrections,
        "records_in": total_in,
        "new_features": [s.name for s in plan.new_specs],
        "replaced": list(plan.replace),
        "join": None
        if plan.join is None
        else {"input": plan.join.pattern, "by": plan.join.by, "files": [i.path for i in plan.join.indexes]},
    }
    return meta, shards


class FinalizeAugment(beam.PTransform):
    """Per-shard results -> ``manifest.json`` (sidecar) and ``metadata.json``, after every shard is final."""

    def __init__(self, plan: AugmentPlan):
        super().__init__()
        self._plan = plan

    def expand(self, results):
        return (
            results
            | "CollectShards" >> beam.combiners.ToList()
            | "WriteMetadata" >> beam.ParDo(FinalizeAugmentFn(self._plan))
        )
