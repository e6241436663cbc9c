"""Verification of TFRecord data: framing, CRCs, record counts, decoding, and exact comparison with the source.

The logic behind ``tfrecord-etl verify`` (no argument parsing, no printing). Three kinds of target:

* an **output directory** of tfrecord-etl (``metadata.json`` required, else IncompleteOutputError): every
  shard listed in the metadata is read; every frame's length and data masked CRC32C is checked; every
  record is decoded with the recorded features (:func:`transforms.codec.decode_example`); the record
  counts and file sizes are compared with the metadata. With ``sources``, every array is compared with
  the source exactly (see :class:`SequentialComparer` and :class:`ProvenanceComparer`).
* a **sidecar collection** (an output directory that also holds ``manifest.json``, written by
  ``tfrecord-etl augment --mode sidecar``): as an output directory, plus each sidecar shard's record count
  against the manifest and, when the user names the original collection (``originals``, the ``--original``
  flag), each original shard's record count, size and CRC32C. The paths written in ``manifest.json`` are
  never opened: originals are found by file name among the files the user named, so a manifest cannot
  make verify read a file it was not given.
* a **file pattern** (or one file) of plain TFRecord files without metadata: framing and CRCs, and that
  every record parses as a ``tf.train.Example`` whose features keep one kind; the features are learned
  from every record (:class:`transforms.codec.FeatureStats`).
* a **collection directory** (``collection.json`` + ``span-N/``): every selected span as an output directory, plus
  each span's directory against its ``collection.json`` entry (:func:`verify_collection`).

Findings are :class:`Problem` entries of a :class:`Report` (file, record index, byte offset, feature):
the function returns normally. It raises only when the target cannot be verified at all.

Byte offsets are those of a record's frame in the uncompressed stream (as TensorFlow counts them).
"""

from __future__ import annotations

from tfrecord_etl.transforms.verify.compare import make_comparer, plan_sources
from tfrecord_etl.transforms.verify.files import verify_files
from tfrecord_etl.transforms.verify.provenance import ProvenanceComparer
from tfrecord_etl.transforms.verify.records import (
    check_example,
    file_compression,
    file_size,
    infer_specs,
    list_record_files,
    not_example_reason,
)
from tfrecord_etl.transforms.verify.report import (
    MANIFEST_FILE,
    PROVENANCE_FILE,
    PROVENANCE_ROW,
    FileReport,
    Problem,
    Progress,
    Report,
)
from tfrecord_etl.transforms.verify.sequential import SequentialComparer
from tfrecord_etl.transforms.verify.spans import CollectionReport, SpanReport, verify_collection
from tfrecord_etl.transforms.verify.targets import verify, verify_output
from tfrecord_etl.transforms.verify.values import compare_value, expected_value

__all__ = [
    "check_example",
    "compare_value",
    "expected_value",
    "file_compression",
    "file_size",
    "FileReport",
    "infer_specs",
    "list_record_files",
    "make_comparer",
    "MANIFEST_FILE",
    "not_example_reason",
    "plan_sources",
    "Problem",
    "Progress",
    "PROVENANCE_FILE",
    "PROVENANCE_ROW",
    "ProvenanceComparer",
    "Report",
    "SequentialComparer",
    "verify",
    "verify_files",
    "verify_output",
    "CollectionReport",
    "SpanReport",
    "verify_collection",
]
