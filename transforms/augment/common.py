"""Shared by the augment modules: constants, the error helpers."""

from __future__ import annotations

import logging

from tfrecord_etl.transforms.beam import metrics as beam_metrics
from tfrecord_etl.transforms.errors import EtlError, RecordError
from tfrecord_etl.transforms.output import metadata
from tfrecord_etl.transforms.reading.reader import MANIFEST_FILE

log = logging.getLogger(__name__)

NAMESPACE = beam_metrics.NAMESPACE

MODES = ("rewrite", "sidecar")

INFER_RECORDS = 1000  # records sampled to infer the features of a collection without metadata

PROBE_RECORDS = 8  # records --fn is called on in the launcher to learn its outputs' dtypes and shapes

BATCH_MB = 256  # new values of one batch are kept under this many MB: --batch_size shrinks for big new records

RESERVED_NAMES = (metadata.METADATA_FILE, metadata.SCHEMA_FILE, MANIFEST_FILE)

SCALAR_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bytes",
    "str",
)


def frame_error(e: RecordError, file: str, record: int) -> RecordError:
    """The RecordError of an input record that ``codec.check_example_frame`` refused, naming file and record."""
    limit = e.message.startswith("More than")  # the feature limit, not a malformed record
    return RecordError(
        e.message if limit else f"Input record is not a tf.train.Example: {e.message}",
        file=file,
        record=record,
        payload_offset=e.context.get("offset"),
        hint=e.hint or "augment reads tf.train.Example records only; remove or fix this record",
    )


def amend_error(error: EtlError, hint: str | None = None, **context) -> EtlError:
    """``error`` with more context (its own keys win) and, when it has none, ``hint``."""
    return type(error)(error.message, hint=error.hint or hint, **{**context, **error.context})
