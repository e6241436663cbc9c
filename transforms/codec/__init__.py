"""The example codec: columns of NumPy rows <-> serialized ``tf.train.Example`` records.

Pure functions over numpy, pyarrow and tfx_bsl's C++ encoder; no Beam and no TensorFlow import.

Encodings (chosen per feature; the default is ``tensor``) are classes registered in
``transforms.codec.encodings.ENCODINGS``: ``tensor`` (the row's raw little-endian bytes in one ``bytes_list``
value; dtype and shape in the metadata; exact for every supported dtype), ``list`` (TensorFlow's native
``int64_list`` / ``float_list`` / ``bytes_list``, read directly by ``tf.io.FixedLenFeature``), ``zlib`` (the
``tensor`` bytes zlib-compressed, as TFDS's ``Encoding.ZLIB``) and ``packbits`` (bool masks at one bit per
element). When the shape (or the dtype) varies between examples, the features ``<name>/shape`` (int64_list) and
``<name>/dtype`` (bytes_list, a NumPy dtype string) travel with each example.

Wire format: ``Example{1: Features{1: repeated MapEntry{1: key, 2: Feature}}}``, where
``Feature`` is a oneof of ``BytesList`` (1), ``FloatList`` (2) and ``Int64List`` (3), each with one
repeated field 1 (tensorflow/core/example/feature.proto). Concatenated Examples are one valid Example
(protobuf merge), the basis of the byte-level field append.
"""

from __future__ import annotations

from tfrecord_etl.transforms.codec.encode import EncodedBatch, FixedLayout, encode_batch, encode_columns

# used by verify and the tests: the wire-format primitives and the bytes conversion of a value
from tfrecord_etl.transforms.codec.encodings import (
    ENCODINGS,
    Encoding,
    as_bytes,  # noqa: F401
    check_spec,
    check_unicode,
    encoding_of,
    spec_from_json,
)
from tfrecord_etl.transforms.codec.foreign import (
    FeatureStats,
    as_varlen,
    batch_decodable,
    decode_batch,
    decode_example_lenient,
    feature_key_pattern,
    infer_feature_specs,
)
from tfrecord_etl.transforms.codec.spec import (
    MAX_FEATURES,
    MAX_RECORD_BYTES,
    VLEN_BYTES,
    Categories,
    FeatureSpec,
    flatten_fields,
    normalize_dtype,
    to_little_endian,
)
from tfrecord_etl.transforms.codec.wire import (  # noqa: F401
    check_example_frame,
    check_example_frames,
    decode_example,
    decode_feature,
    drop_features,
    encode_varint,
    entry_name,
    iter_fields,
    length_delimited_field,
    parse_example,
    split_feature_entries,
    split_features,
    too_many_features,
)

__all__ = [
    "as_varlen",
    "batch_decodable",
    "Categories",
    "check_example_frame",
    "check_example_frames",
    "check_spec",
    "check_unicode",
    "decode_batch",
    "decode_example",
    "decode_example_lenient",
    "decode_feature",
    "drop_features",
    "encode_batch",
    "encode_columns",
    "EncodedBatch",
    "Encoding",
    "ENCODINGS",
    "encoding_of",
    "entry_name",
    "feature_key_pattern",
    "FeatureSpec",
    "FeatureStats",
    "FixedLayout",
    "flatten_fields",
    "infer_feature_specs",
    "MAX_FEATURES",
    "MAX_RECORD_BYTES",
    "normalize_dtype",
    "parse_example",
    "spec_from_json",
    "split_feature_entries",
    "split_features",
    "to_little_endian",
    "too_many_features",
    "VLEN_BYTES",
]
