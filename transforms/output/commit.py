"""The settings of an output's commit: :class:`OutputCommit`, what the step that writes ``metadata.json`` last (the
commit point) needs to know about the run, built once by the writing PTransform and pickled with the commit's DoFn."""

from __future__ import annotations

import dataclasses

from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.output import outdir


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputCommit:
    """The settings of the commit of an output directory (``beam.commit.WriteMetadataFn``, ``FinalizeOutput``), given by
    keyword: where, the features, the shard compression, the rows planned (``expected_rows``), the inputs
    (``sources``: ``[{"path", "rows"}]``), the writer's name and the run's options (recorded in ``metadata.json``);
    the rest as commented below."""

    output_dir: str
    specs: tuple[FeatureSpec, ...]
    compression: str
    expected_rows: int
    sources: tuple[dict, ...]
    writer: str
    options: dict
    described: dict = dataclasses.field(default_factory=dict)  # Source.describe(): e.g. the label names
    tfds_name: str | None = None  # write TFDS's dataset_info.json + features.json too (--tfds_name)
    carried: dict | None = None  # the metadata.json of the splits this run adds a split to (kept as they are)
    split_names: tuple[str, ...] = ()  # this run's splits, in the order given (the order of metadata's shards)
    replaced: outdir.Replacement = outdir.Replacement()  # what this commit replaces (outdir.prepare)
    codec: dict | None = None  # compression.settings(): the backend, its version and level (gzip/zlib shards)
