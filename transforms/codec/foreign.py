"""Examples written by anyone else (no metadata): inferred features, lenient decoding, key patterns."""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from tfrecord_etl.transforms.errors import RecordError, SchemaError
from tfrecord_etl.transforms.codec.encodings import encoding_of
from tfrecord_etl.transforms.codec.spec import FeatureSpec, MAX_FEATURES, VLEN_BYTES
from tfrecord_etl.transforms.codec.wire import (decode_feature, _decode_spec, _encode_varint, parse_example, split_features,
                                   too_many_features)


_KIND_DTYPES = {"int64": "<i8", "float": "<f4", "bytes": VLEN_BYTES}


def infer_feature_specs(records: Iterable[bytes], max_features: int | None = None) -> tuple[FeatureSpec, ...]:
    """Infers the features of serialized Examples that came without metadata (TFX, TFDS, tf.io writers).

    Each feature becomes a ``list`` spec of its native kind: ``int64_list`` -> ``'<i8'``, ``float_list``
    -> ``'<f4'``, ``bytes_list`` -> ``'bytes'``; shape ``(n,)`` when every sampled record holds exactly
    ``n`` values of it, else ``(None,)`` (a record without the feature, or with a Feature whose kind is
    not set, as some TFX Examples carry, counts as 0 values). A feature whose kind is never set is a
    ``'bytes'`` ``(None,)`` feature. Order: first seen. Time and memory are linear in the entries read.

    Args:
      records: serialized ``tf.train.Example`` byte strings (a sample, e.g. a shard's first 1000).
      max_features: limit on the features of one record and on the distinct names of all records
        (default :data:`MAX_FEATURES`).

    Raises:
      SchemaError: a feature holds different kinds in different records.
      RecordError: a record is not a tf.train.Example (with the record index and byte offset), or more
        than ``max_features`` features (in one record, or distinct names in all).
    """
    limit = MAX_FEATURES if max_features is None else max_features
    kinds: dict[str, set] = {}
    lengths: dict[str, set] = {}
    present: dict[str, int] = {}
    total = 0
    for i, record in enumerate(records):
        try:
            parsed = parse_example(record, limit)
        except RecordError as e:
            raise RecordError(f"Cannot infer the features: {e.message}", hint=e.hint, record=i,
                              payload_offset=e.context.get("offset")) from None
        for name, (kind, values) in parsed.items():
            if name not in kinds:
                if len(kinds) >= limit:
                    raise too_many_features(limit, record=i)
                kinds[name], lengths[name], present[name] = set(), set(), 0
                if total:
                    lengths[name].add(0)  # absent from the earlier records
            if kind is not None:
                kinds[name].add(kind)
            lengths[name].add(len(values))
            present[name] += 1
        total += 1
    specs = []
    for name, found in kinds.items():
        if len(found) > 1:
            raise SchemaError(f"Feature '{name}' holds {' and '.join(sorted(found))} lists in different records",
                              feature=name, hint="one feature must have one kind in every record")
        dtype = _KIND_DTYPES[next(iter(found))] if found else VLEN_BYTES
        counts = lengths[name] | ({0} if present[name] < total else set())
        shape = (counts.pop(),) if len(counts) == 1 and found else (None,)
        specs.append(FeatureSpec(name, dtype, shape, "list"))
    return tuple(specs)


def decode_example_lenient(record: bytes, specs: Sequence[FeatureSpec], max_features: int | None = None
                           ) -> dict[str, np.ndarray]:
    """Like :func:`decode_example`, but also decodes variable-length native lists of foreign Examples.

    A ``list`` spec of shape ``(None,)`` whose ``<name>/shape`` companion is absent (an Example written
    by anyone else, whose features were inferred by :func:`infer_feature_specs`) decodes to a 1-D array
    of its values (``'<i8'``, ``'<f4'``, or an object array of bytes); a missing feature or a Feature
    with no kind set decodes to an empty array. Every other spec decodes exactly as decode_example.

    Raises:
      RecordError: a feature is missing, has the wrong kind, or its size does not match the shape; more
        than ``max_features`` (default :data:`MAX_FEATURES`) features in the record.
    """
    spans = split_features(record, max_features)
    out = {}
    for spec in specs:
        encoding = encoding_of(spec)
        if encoding.native and spec.shape == (None,) and f"{spec.name}/shape" not in spans:
            kind, values = decode_feature(record, spans[spec.name]) if spec.name in spans else (None, [])
            out[spec.name] = encoding.decode_native(spec, kind, values)
        else:
            out[spec.name] = _decode_spec(record, spans, spec)
    return out


def feature_key_pattern(name: str) -> bytes:
    """The bytes every serialized Example holding feature ``name`` contains: its map entry's key field.

    A cheap ``pattern in record`` test rules a feature out without parsing (a hit may be a false
    positive inside a value; confirm with :func:`split_features`).
    """
    key = name.encode("utf-8")
    return _encode_varint(1 << 3 | 2) + _encode_varint(len(key)) + key


def batch_decodable(spec: FeatureSpec) -> bool:
    """True when :func:`decode_batch` can decode ``spec``: a fixed shape, and not a ``list`` of fixed-width
    bytes/str/void (those decode per record with decode_example)."""
    return encoding_of(spec).batch_decodable(spec)


def decode_batch(records: Sequence[bytes], specs: Sequence[FeatureSpec]) -> dict[str, np.ndarray]:
    """Decodes the features in ``specs`` of a batch of serialized Examples in one C++ call.

    The result equals stacking :func:`decode_example` over the records: ``{name: (len(records),
    *spec.shape)}`` arrays of the recorded dtype (object arrays of bytes for ``bytes`` features). Only
    the features in ``specs`` are decoded (tfx_bsl's ``ExamplesToRecordBatchDecoder`` with a schema
    of just those). Every spec must be :func:`batch_decodable`.

    Raises:
      RecordError: a feature missing from a record, of the wrong kind, or of the wrong size (the record
        is not named: decode record by record to find it).
    """
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders import example_coder

    n = len(records)
    schema, kinds = schema_pb2.Schema(), {}
    types = {"bytes": schema_pb2.BYTES, "int64": schema_pb2.INT, "float": schema_pb2.FLOAT}
    for spec in specs:
        if not batch_decodable(spec):
            raise SchemaError(f"Feature '{spec.name}' ({spec.dtype} {spec.shape} {spec.encoding}) cannot be "
                              "decoded as a batch", feature=spec.name, hint="decode it with decode_example")
        kinds[spec.name] = encoding_of(spec).kind(spec.dtype)
        schema.feature.add(name=spec.name, type=types[kinds[spec.name]])
    try:
        batch = example_coder.ExamplesToRecordBatchDecoder(schema.SerializeToString()).DecodeBatch(list(records))
    except Exception as e:  # tfx_bsl raises RuntimeError/ValueError for a wrong kind or bad bytes
        raise RecordError(f"Cannot decode the batch: {e}") from None
    out = {}
    for spec in specs:
        if spec.name not in batch.schema.names:
            raise RecordError(f"Feature '{spec.name}' is missing from every Example", feature=spec.name)
        col = batch.column(spec.name)
        if col.null_count:
            raise RecordError(f"Feature '{spec.name}' is missing from an Example", feature=spec.name)
        lengths = np.diff(col.offsets.to_numpy())
        values = col.flatten()
        encoding = encoding_of(spec)
        want = encoding.batch_values(spec)
        if n and not (lengths == want).all():
            raise RecordError(f"Feature '{spec.name}' holds {sorted(set(lengths.tolist()))} values in some "
                              f"Examples, expected {want}", feature=spec.name)
        out[spec.name] = encoding.decode_flat(spec, values, n)
    return out


