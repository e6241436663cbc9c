"""Add fields to an existing TFRecord collection of ``tf.train.Example``, one input shard per work item.

The augment pipeline reads as::

    AugmentShards -> FinalizeAugment

* **Plan** (launcher, before any output exists): match the input shards (or read a convert output's
  ``metadata.json``), choose each shard's compression, infer the features of a collection without
  metadata from its first records, call ``--fn`` once on the first records to learn the new fields'
  dtypes and shapes, index the join source. Bad options fail here.
* **AugmentShards**: each worker streams one input shard a batch of records at a time, computes the new
  fields for the whole batch, encodes them in one call, and writes, per record, either the old record's
  bytes followed by the new Example's bytes (``rewrite``; a concatenation of serialized Examples is one
  Example, a protobuf merge) or only the new Example (``sidecar``) into a temporary file, renamed to
  the input shard's name when complete. A key join first extracts each record's key and joins it
  with the source rows (``CoGroupByKey``); a position join of a collection without record counts
  first counts every shard's records.
* **FinalizeAugment**: checks records in = records out, writes ``manifest.json`` (sidecar), TFDS's
  ``features.json`` and ``dataset_info.json`` (when the input had them) and, last, ``metadata.json``, the
  commit point.

The reader files of the input (``--index`` files, TFDS's files) describe its shards, not the new ones: they are
never copied, but written again for the output's shards when they can be (``readers``).

Old features are never decoded and re-encoded, except those named by ``--fn_inputs`` or the key
feature, which are decoded (and only read) to compute the new ones.

Modules (one job each): ``collection`` (input shards, compression, features, record reading),
``values`` (constants, defaults, --fn), ``join`` (array-source joins), ``plan`` (the plan and the batch
step), ``readers`` (index and TFDS files of the output), ``beam`` (DoFns and PTransforms), ``common`` (constants,
error helpers).
"""

from __future__ import annotations

from tfrecord_etl.transforms.augment.beam import (
    AugmentShardFn,
    AugmentShards,
    AugmentTFRecord,
    ExtractKeysFn,
    ReadJoinRowsFn,
    count_records,
    match_keys,
    plan_offsets,
    prepare_output_dir,
)
from tfrecord_etl.transforms.augment.collection import (
    InputCollection,
    output_name,
    resolve_input,
)
from tfrecord_etl.transforms.augment.commit import FinalizeAugment, FinalizeAugmentFn, manifest
from tfrecord_etl.transforms.augment.common import (
    BATCH_MB,
    INFER_RECORDS,
    MODES,
    NAMESPACE,
    PROBE_RECORDS,
    RESERVED_NAMES,
    frame_error,
)
from tfrecord_etl.transforms.augment.config import AugmentConfig, AugmentOptions
from tfrecord_etl.transforms.augment.constants import parse_constant, parse_scalar
from tfrecord_etl.transforms.augment.join import (
    JoinPlan,
    default_value,
    join_source_options,
    key_of,
    plan_join,
    read_source_rows,
)
from tfrecord_etl.transforms.augment.plan import AugmentPlan, BatchAugmenter
from tfrecord_etl.transforms.augment.records import InputShard, batches, iter_shard, read_sample
from tfrecord_etl.transforms.augment.steps import plan_augment
from tfrecord_etl.transforms.augment.values import (
    check_new_size,
    decode_inputs,
    decode_record,
    fn_columns,
    load_function,
    spec_of,
    value_bytes,
)

__all__ = [
    "AugmentConfig",
    "AugmentOptions",
    "AugmentTFRecord",
    "AugmentPlan",
    "AugmentShardFn",
    "AugmentShards",
    "BATCH_MB",
    "BatchAugmenter",
    "batches",
    "check_new_size",
    "count_records",
    "decode_inputs",
    "decode_record",
    "default_value",
    "ExtractKeysFn",
    "FinalizeAugment",
    "FinalizeAugmentFn",
    "fn_columns",
    "frame_error",
    "INFER_RECORDS",
    "InputCollection",
    "InputShard",
    "iter_shard",
    "JoinPlan",
    "key_of",
    "load_function",
    "manifest",
    "match_keys",
    "MODES",
    "NAMESPACE",
    "output_name",
    "parse_constant",
    "parse_scalar",
    "plan_augment",
    "join_source_options",
    "plan_join",
    "plan_offsets",
    "prepare_output_dir",
    "PROBE_RECORDS",
    "read_sample",
    "read_source_rows",
    "ReadJoinRowsFn",
    "RESERVED_NAMES",
    "resolve_input",
    "spec_of",
    "value_bytes",
]
