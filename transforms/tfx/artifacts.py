"""What ArraysExampleGen writes and takes, without TFX: the examples artifact's files (``tfrecord_etl.json``, the
record files of a split) read back (:func:`read_split`), the source options the component accepts
(:func:`check_source_options`) and the schema it will infer (:func:`infer_schema`). Public through
``tfrecord_etl.tfx``; :mod:`examplegen` is the component and its executor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tfrecord_etl.transforms import planning
from tfrecord_etl.transforms.codec import decode_example_lenient, spec_from_json
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError
from tfrecord_etl.transforms.output import schemafile, sink
from tfrecord_etl.transforms.reading.reader import iter_records
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.tfx import write as tfx_write

SCHEMA_FILE = "schema.pbtxt"  # our inferred Schema, beside Split-* in the examples artifact
INFO_FILE = tfx_write.INFO_FILE
INFO_FORMAT = "tfrecord-etl-tfx/1"
SCHEMA_PROPERTY = "tfrecord_etl_schema"  # the examples artifact's custom property: the schema file's URI
OPTIONS_KEY = "tfrecord_etl_source_options"  # the JSON of the source options, in custom_config's Struct

# ConvertConfig fields that TFX decides inside an ExampleGen (output URI, gzip, splits, spans, file names): refused.
TFX_OWNED = frozenset(
    {
        "input",
        "output_dir",
        "compression",
        "index",
        "splits",
        "split_key",
        "split",
        "shuffle_seed",
        "tfds_name",
        "writer",
        "prefix",
        "span",
        "version",
        "incremental",
        "reconvert_changed",
        "allow_schema_change",
        "overwrite",
        "dry_run",
        "pipeline_options",
        "max_local_workers",
        "progress",
        "verbose",
    }
)


def check_source_options(options: Mapping[str, Any] | None) -> dict:
    """The source options of an :class:`ArraysExampleGen` checked as the convert command checks its flags: a dict
    of ``ConvertConfig`` fields (the input's format and reading options, encodings, limits, dead letters).

    Raises:
      ConfigError: an unknown option, a bad value (pydantic's message, one line), or an option TFX owns here
        (:data:`TFX_OWNED`: compression, splits, spans, the output directory, index files), naming it.
    """
    options = dict(options or {})
    owned = sorted(set(options) & TFX_OWNED)
    if owned:
        raise ConfigError(
            f"ArraysExampleGen source_options {owned}: TFX decides these inside an ExampleGen",
            hint="splits: output_config hash buckets or input_config patterns; spans: {SPAN} in the "
            "split pattern and range_config; files: Split-NAME/data_tfrecord-*.gz, gzip (the "
            "shards: num_shards, target_shard_mb, compression_level)",
        )
    config_of("<check>", "<check>", options)
    return options


def config_of(pattern: str, output_dir: str, options: Mapping[str, Any]) -> ConvertConfig:
    try:
        return ConvertConfig(input=pattern, output_dir=output_dir, writer="planned", compression="gzip", **options)
    except Exception as e:  # pydantic's ValidationError, made one line as the command's flags
        text = " ".join(str(e).split())
        raise ConfigError(f"Invalid ArraysExampleGen source_options: {text}") from None


def load_info(examples_uri: str) -> dict:
    """``tfrecord_etl.json`` of an examples artifact written by :class:`Executor`, features as FeatureSpecs.

    Raises:
      SchemaError: no such file (not an ArraysExampleGen output) or not ours.
    """
    path = fileio.join(examples_uri, INFO_FILE)
    if not fileio.exists(path):
        raise SchemaError("No tfrecord_etl.json: these examples were not written by ArraysExampleGen", file=path)
    info = json.loads(fileio.read_bytes(path))
    if info.get("format") != INFO_FORMAT:
        raise SchemaError(f"Not an ArraysExampleGen info file (format {info.get('format')!r})", file=path)
    info["features"] = [spec_from_json(f) for f in info["features"]]
    return info


def split_files(examples_uri: str, split: str) -> list[str]:
    """The record files of one split of an examples artifact (``Split-NAME/data_tfrecord-*.gz``), sorted.

    Raises:
      SchemaError: no file in that split.
    """
    files = sorted(path for path, _ in fileio.match(fileio.join(examples_uri, f"Split-{split}", "*.gz")))
    if not files:
        raise SchemaError(f"No record files in split {split!r}", file=fileio.join(examples_uri, f"Split-{split}"))
    return files


def read_split(examples_uri: str, split: str) -> Iterator[dict[str, np.ndarray]]:
    """Yields each Example of one split of an ArraysExampleGen output as ``{name: np.ndarray}`` (recorded dtypes and
    shapes, as ``reader.iter_numpy``), file by file in name order; the order within the split is TFX's (shuffled).

    Raises:
      SchemaError: not an ArraysExampleGen output or an empty split. RecordError: a corrupt record (file, index,
        byte offset).
    """
    specs = load_info(examples_uri)["features"]
    for path in split_files(examples_uri, split):
        for index, offset, record in iter_records(path, "gzip"):
            try:
                example = decode_example_lenient(record, specs)
            except RecordError as e:
                raise RecordError(
                    f"Cannot decode example: {e.message}", hint=e.hint, file=path, record=index, offset=offset
                ) from None
            yield example


def infer_schema(input_pattern: str, source_options: Mapping[str, Any] | None = None, path: str | None = None) -> str:
    """The tensorflow_metadata Schema (text) that :class:`ArraysExampleGen` will infer for ``input_pattern``, planned
    now (inputs indexed, encodings chosen, nothing read); written to ``path`` when given, e.g. for TFX's
    ``ImportSchemaGen(schema_file=path)`` in place of SchemaGen's guess.

    Raises:
      SourceError, SchemaError, ConfigError: as the component would, at planning.
    """
    options = check_source_options(source_options)
    cfg = config_of(input_pattern, "<schema>", options)
    text = schemafile.schema_text(planning.plan_convert(cfg).specs)
    if path is not None:
        sink.write_file(path, text.encode())
    return text
