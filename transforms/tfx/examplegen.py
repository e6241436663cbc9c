"""A TFX ExampleGen for arrays: HDF5 / npz / npy / NetCDF-3 / MATLAB / raw / image folders straight into a TFX pipeline.

    from tfx.proto import example_gen_pb2, range_config_pb2
    from tfrecord_etl.tfx import ArraysExampleGen

    example_gen = ArraysExampleGen(
        input_base="data/",
        input_config=example_gen_pb2.Input(splits=[
            example_gen_pb2.Input.Split(name="train", pattern="span-{SPAN}/*.h5")]),
        output_config=example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(splits=[
            example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=8),
            example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=2)])),
        source_options={"datasets": ["/images", "/labels"], "encoding": "auto"})

TFX's documented way to add an input format (``tfx/components/example_gen/base_example_gen_executor.py``,
"custom executor"): :class:`Executor` is a ``BaseExampleGenExecutor`` and :class:`ArraysExampleGen` a
``FileBasedExampleGen`` that uses it. Each input split pattern (``{SPAN}`` / ``{VERSION}`` / date placeholders already
resolved by TFX's ``FileBasedDriver`` under ``range_config``) is planned as ``tfrecord-etl convert`` plans
it (``planning.plan_convert``: the same sources, encodings and codec, the same bytes), and the executor's ``Do``
writes the examples artifact itself with our planned writer (``transforms.tfx.write``): every shard plan read,
encoded and written by one worker, gzip through the compression backend (ISA-L, level 3 by default), one file per
output split per shard plan, ``Split-NAME/data_tfrecord-SSSSS-of-NNNNN.gz``, with no shuffle of the data (TFX's
base ``Do`` sends every record through a ``Reshuffle`` and Beam's zlib ``WriteToTFRecord``). TFX's semantics are
kept: ``input_config`` splits (one output split each) or ``output_config`` hash buckets with TFX's exact assignment
(``_PartitionFn``: sha256 of the serialized record, or of the serialized ``tf.train.Feature`` of
``partition_feature_name``), and the artifact's ``split_names``, ``payload_format`` and ``file_format`` set as
TFX's ``Do`` sets them (span, version and input fingerprint are the driver's). Within a split the records are in
input order. ``GetInputSourceToExamplePTransform`` still gives the records of one split pattern for TFX's own
``GenerateExamplesByBeam``.

Files are written only under the artifact's URI (and ``dead_letter_dir``); each one under a temporary name,
renamed when complete. A failed ``Do`` leaves nothing TFX reads: TFX's launcher removes the output URI of an
execution whose executor raised (``outputs_utils.remove_output_dirs``) and publishes the artifact (LIVE in ML
Metadata, what downstream components and the cache resolve) only after ``Do`` returned; a killed process leaves an
execution that never completed, whose artifact is never published, and the next run writes a new URI.

``source_options`` are the convert command's options that describe the input and its encoding (``format``,
``datasets``, ``container_mode``, ``npz_mode``, ``encoding``, ``feature_encodings``, ``allow_lossy``, ``provenance``,
``dead_letter_dir``, the ``max_*`` limits, the raw and files options...) and of its shards (``num_shards``,
``target_shard_mb``, ``compression_level``), checked when the component is built (:func:`check_source_options`,
``ConfigError``); the options that TFX decides here (compression: gzip, splits, spans, the output directory, index
files) are refused. A bad input fails the component with our one-line ``SourceError`` / ``SchemaError`` while the
executor plans, before any record is written. With ``dead_letter_dir`` the row ranges that cannot be read or
encoded go to ``DIR/<input split>/`` (JSON lines, one file per shard plan), and ``tfrecord_etl.json`` records the
rows dead-lettered of each input split; records written plus rows dead-lettered equal the rows of the input, or the
component fails.

Beside ``Split-*`` in the examples artifact the executor writes ``schema.pbtxt``, the tensorflow_metadata Schema we
infer (``schemafile.schema_text``: the same file ``convert`` writes, with the dtype / shape annotations of opaque
``tensor`` features), and ``tfrecord_etl.json`` (the features with their encodings, the options, the inputs of each
input split with its rows, records and rows dead-lettered, the records, bytes and files of each output split, the
compression backend); the artifact's custom property ``tfrecord_etl_schema`` names the schema file. TFX reads only
the ``Split-*`` folders, so neither file is in its way. :func:`read_split` reads a split back as NumPy with our
decoder, and ``tfrecord-etl verify 'URI/Split-train/*.gz'`` checks its frames and Examples.

Split assignment: TFX hashes ``sha256(key) % sum(hash_buckets)``. With ``partition_feature_name`` the key is the
serialized ``tf.train.Feature``, exactly what ``convert --splits ... --split_key FEATURE`` hashes
(``transforms.collections.splits``): both put every example in the same split. Without it TFX (and this ExampleGen) hashes the
whole serialized record while ``--splits`` hashes the global row index, so those two assignments differ (both are
deterministic).

Needs TFX (``pip install '.[tfx]'``, tfx 1.21 with our TensorFlow / Beam / tfx-bsl pins). Sources of the
ideas: TFX's ``custom_executors/avro_executor.py`` and ``parquet_executor.py`` (the ptransform_fn shape) and
``example_gen/component.py`` (``FileBasedExampleGen(custom_executor_spec=...)``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import apache_beam as beam
from tfx.components.example_gen import base_example_gen_executor, utils as example_gen_utils, write_split
from tfx.components.example_gen.component import FileBasedExampleGen
from tfx.components.util import examples_utils
from tfx.dsl.components.base import executor_spec
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import proto_utils

from tfrecord_etl.transforms import planning
from tfrecord_etl.transforms.beam import encode as beam_encode, writers as beam_writers
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import ConfigError, SchemaError
from tfrecord_etl.transforms.output import metadata, schemafile, sink
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.tfx import artifacts, write as tfx_write
from tfrecord_etl.transforms.tfx.artifacts import (  # used here; re-exported through tfrecord_etl.tfx
    INFO_FILE,
    INFO_FORMAT,
    OPTIONS_KEY,
    SCHEMA_FILE,
    SCHEMA_PROPERTY,
    check_source_options,
    infer_schema,
    load_info,
    read_split,
    split_files,
)


def _options_from(exec_properties: Mapping[str, Any]) -> dict:
    """The source options stored by :class:`ArraysExampleGen` in ``custom_config`` (a JSON string in a Struct)."""
    text = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    if not text:
        return {}
    from google.protobuf import json_format, struct_pb2

    custom = example_gen_pb2.CustomConfig()
    proto_utils.json_to_proto(text, custom)
    struct = struct_pb2.Struct()
    if not custom.custom_config.Unpack(struct):
        return {}
    return json.loads(json_format.MessageToDict(struct).get(OPTIONS_KEY) or "{}")


def _split_name(exec_properties: Mapping[str, Any], split_pattern: str) -> str:
    config = example_gen_pb2.Input()
    proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], config)
    return next((s.name for s in config.splits if s.pattern == split_pattern), "input")


class Executor(base_example_gen_executor.BaseExampleGenExecutor):
    """The ExampleGen executor. ``Do`` plans every input split (``planning.plan_convert``: every input error raised
    here, before the Beam pipeline is built) and writes the examples artifact with our planned writer
    (``tfx_write.WriteExampleSplits``), then ``schema.pbtxt`` and the artifact's properties.
    ``GetInputSourceToExamplePTransform`` (TFX's extension point, used by TFX's own ``GenerateExamplesByBeam``, not
    by ``Do``): one split pattern read and encoded per row range by ``beam_encode.ReadAndEncodeFn`` into serialized
    ``tf.train.Example`` records (bytes); parsed to ``tf.train.Example`` objects only when ``output_config``
    partitions by ``partition_feature_name`` (TFX's partitioner reads the feature from them).

    Raises (from ``Do``):
      SourceError, SchemaError, ConfigError: the input or the options (our one-line errors); ConfigError also for
        an ``output_data_format`` other than ``FORMAT_TF_EXAMPLE`` or a ``partition_feature_name`` that is not a
        bytes / int64 feature of the records. RecordError: counts that do not add up (nothing published).
    """

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:
        plans = self._plans = {}

        @beam.ptransform_fn
        @beam.typehints.with_input_types(beam.Pipeline)
        def ArraysToExample(pipeline, exec_properties: dict, split_pattern: str):  # noqa: N802 - TFX's style
            name = _split_name(exec_properties, split_pattern)
            pattern = fileio.join(exec_properties[standard_component_specs.INPUT_BASE_KEY], split_pattern)
            cfg = artifacts.config_of(pattern, "<tfx>", _split_options(exec_properties, name))
            plan = planning.plan_convert(cfg)
            plans[name] = (pattern, cfg, plan)
            _agreed_specs(plans)  # input splits of another layout fail here, before the pipeline runs
            records, _ = beam_writers.read_and_encode_ranges(
                pipeline,
                plan,
                cfg,
                beam_encode.ReadAndEncodeFn(plan.inputs.source, beam_encode.EncodeSettings.of(plan, cfg, splits=False)),
            )
            if _partitions_by_feature(exec_properties):
                import tensorflow as tf

                records = records | "ParseForPartition" >> beam.Map(tf.train.Example.FromString)
            return records

        return ArraysToExample

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        self._log_startup(input_dict, output_dict, exec_properties)
        input_config, output_config = example_gen_pb2.Input(), example_gen_pb2.Output()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], input_config)
        proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
        payload = exec_properties.get(standard_component_specs.OUTPUT_DATA_FORMAT_KEY)
        if payload and payload != example_gen_pb2.FORMAT_TF_EXAMPLE:
            raise ConfigError(
                f"ArraysExampleGen writes tf.train.Example records, not output_data_format "
                f"{example_gen_pb2.PayloadFormat.Name(payload)}",
                hint="leave output_data_format at FORMAT_TF_EXAMPLE",
            )
        file_format = exec_properties.get(
            standard_component_specs.OUTPUT_FILE_FORMAT_KEY, example_gen_pb2.FILE_FORMAT_UNSPECIFIED
        )
        file_format_name = write_split.to_file_format_str(file_format)  # TFX's ValueError for another format
        examples = artifact_utils.get_single_instance(output_dict[standard_component_specs.EXAMPLES_KEY])
        examples.split_names = artifact_utils.encode_split_names(
            example_gen_utils.generate_output_split_names(input_config, output_config)
        )
        jobs = self._plan_jobs(exec_properties, input_config, output_config, examples.uri)
        specs = _agreed_specs({job.name: (job.pattern, job.cfg, job.plan) for job in jobs})
        codec = beam_writers.codec_of(jobs[0].cfg)
        info = {
            "format": INFO_FORMAT,
            "tool_version": metadata.VERSION,
            "features": [s.to_json() for s in specs],
            "compression": codec,
            "num_shards": {job.name: job.plan.num_shards for job in jobs},
            "inputs": {
                job.name: {
                    "pattern": job.pattern,
                    "rows": job.plan.inputs.num_rows,
                    "files": [{"path": i.path, "rows": i.num_rows} for i in job.plan.inputs.indexes],
                    "source": job.plan.inputs.source.describe(),
                    "outputs": list(job.outputs),
                }
                for job in jobs
            },
            "options": _options_from(exec_properties),
        }
        with self._make_beam_pipeline() as pipeline:
            _ = pipeline | "WriteExampleSplits" >> tfx_write.WriteExampleSplits(examples.uri, jobs, info, codec)
        sink.write_file(fileio.join(examples.uri, SCHEMA_FILE), schemafile.schema_text(specs).encode())
        for artifact in output_dict[standard_component_specs.EXAMPLES_KEY]:  # as TFX's Do sets them
            if payload:
                examples_utils.set_payload_format(artifact, payload)
            if file_format:
                examples_utils.set_file_format(artifact, file_format_name)
        examples.set_string_custom_property(SCHEMA_PROPERTY, fileio.join(examples.uri, SCHEMA_FILE))

    def _plan_jobs(self, exec_properties, input_config, output_config, uri: str) -> list[tfx_write.SplitJob]:
        """Every input split planned (``tfx_write.plan_job``), with the output splits of ``output_config``."""
        split_config = output_config.split_config
        outputs = [(s.name, s.hash_buckets) for s in split_config.splits]
        feature = split_config.partition_feature_name if split_config.HasField("partition_feature_name") else None
        jobs = []
        for split in input_config.splits:
            pattern = fileio.join(exec_properties[standard_component_specs.INPUT_BASE_KEY], split.pattern)
            cfg = artifacts.config_of(pattern, uri, _split_options(exec_properties, split.name))
            jobs.append(tfx_write.plan_job(split.name, cfg, outputs, feature))
            _agreed_specs({job.name: (job.pattern, job.cfg, job.plan) for job in jobs})  # fail at the first misfit
        return jobs


def _split_options(exec_properties: Mapping[str, Any], name: str) -> dict:
    """The source options of input split ``name``: its dead letters in ``dead_letter_dir/NAME``."""
    options = _options_from(exec_properties)
    if options.get("dead_letter_dir"):
        options["dead_letter_dir"] = fileio.join(options["dead_letter_dir"], name)
    return options


def _partitions_by_feature(exec_properties: Mapping[str, Any]) -> bool:
    config = example_gen_pb2.Output()
    proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], config)
    return bool(config.split_config.splits) and config.split_config.HasField("partition_feature_name")


def _agreed_specs(plans: Mapping[str, tuple]) -> tuple[FeatureSpec, ...]:
    """The features of every input split, which must agree (one Examples artifact has one schema).

    Raises:
      SchemaError: two input splits whose features differ, naming both patterns.
    """
    items = list(plans.items())
    first_name, (first_pattern, _, first) = items[0]
    for name, (pattern, _, plan) in items[1:]:
        if plan.specs != first.specs:
            raise SchemaError(
                f"Input splits '{first_name}' and '{name}' have different features: "
                f"{[s.to_json() for s in first.specs]} vs {[s.to_json() for s in plan.specs]}",
                file=pattern,
                hint=f"the split patterns must match inputs of one layout ('{first_pattern}' and '{pattern}')",
            )
    return first.specs


class ArraysExampleGen(FileBasedExampleGen):
    """A ``FileBasedExampleGen`` reading arrays with tfrecord-etl's sources (:class:`Executor`).

    Args:
      input_base: the folder holding the inputs (local, gs://, s3://).
      input_config: ``example_gen_pb2.Input``; split patterns relative to ``input_base``, with ``{SPAN}``,
        ``{VERSION}`` or ``{YYYY}{MM}{DD}`` placeholders resolved by TFX's driver. Default: every file (``*``).
      output_config: ``example_gen_pb2.Output``; default TFX's train 2 / eval 1 hash buckets.
      range_config: ``range_config_pb2.RangeConfig``: the spans to consider (TFX's).
      source_options: the convert options describing the input (see :func:`check_source_options`).

    Raises:
      ConfigError: bad ``source_options``, or an ``output_data_format`` other than ``FORMAT_TF_EXAMPLE``, when the
        component is built.
    """

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(
        self,
        input_base: str | None = None,
        input_config=None,
        output_config=None,
        range_config=None,
        source_options: Mapping[str, Any] | None = None,
        **kwargs,
    ):
        from google.protobuf import any_pb2, struct_pb2

        options = check_source_options(source_options)
        payload = kwargs.get("output_data_format", example_gen_pb2.FORMAT_TF_EXAMPLE)
        if payload != example_gen_pb2.FORMAT_TF_EXAMPLE:
            raise ConfigError(
                f"ArraysExampleGen writes tf.train.Example records, not output_data_format {payload}",
                hint="leave output_data_format at FORMAT_TF_EXAMPLE",
            )
        struct = struct_pb2.Struct()
        struct.update({OPTIONS_KEY: json.dumps(options, sort_keys=True)})
        packed = any_pb2.Any()
        packed.Pack(struct)
        super().__init__(
            input_base=input_base,
            input_config=input_config,
            output_config=output_config,
            range_config=range_config,
            custom_config=example_gen_pb2.CustomConfig(custom_config=packed),
            **kwargs,
        )


__all__ = [
    "ArraysExampleGen",
    "Executor",
    "check_source_options",
    "infer_schema",
    "load_info",
    "read_split",
    "split_files",
    "SCHEMA_FILE",
    "INFO_FILE",
]
