"""Named splits of one conversion (train / validation / test): which rows go where, and the shard file names.

This module is the documented import path; the implementation is ``tfrecord_etl.transforms.collections.splits``
(the collections-and-spans layer), whose docstring says how rows are assigned (TFX ExampleGen's hash buckets).
"""

from tfrecord_etl.transforms.collections.splits import (
    MAX_SPLITS,
    SPLIT_NAME,
    SplitPlan,
    check_split_name,
    feature_key,
    key_bytes,
    parse_splits,
    record_feature_key,
    record_feature_span,
    shard_name,
)

__all__ = [
    "MAX_SPLITS",
    "SPLIT_NAME",
    "SplitPlan",
    "check_split_name",
    "feature_key",
    "key_bytes",
    "parse_splits",
    "record_feature_key",
    "record_feature_span",
    "shard_name",
]
