"""Examples written by anyone else (no metadata): inferred features, lenient decoding, key patterns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tfrecord_etl.transforms.codec.encodings import encoding_of
from tfrecord_etl.transforms.codec.spec import MAX_FEATURES, VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.codec.wire import (
    check_example_frames,
    decode_feature,
    decode_spec,
    encode_varint,
    parse_example,
    split_features,
    too_many_features,
)
from tfrecord_etl.transforms.errors import RecordError, SchemaError

_KIND_DTYPES = {"int64": "<i8", "float": "<f4", "bytes": VLEN_BYTES}


class FeatureStats:
    """What a stream of Examples written by anyone else holds, per feature: its kinds, the records that hold a value
    list of it, and the least and most values such a record holds. Mergeable, so each shard learns its part and the
    collection's features follow from the sum (:meth:`specs`), never from a sample alone.

    A record "holds" a feature when it has the key with a kind set (``int64_list``, ``float_list``, ``bytes_list``);
    a missing key and a ``Feature`` with no kind (TFX ExampleGen's empty CSV cell) count alike: no value list.

    Attributes:
      records: records observed.
      features: ``{name: [kinds (set of 'int64'/'float'/'bytes'), records holding it, least values, most values]}``,
        in the order first seen.
    """

    def __init__(self):
        self.records = 0
        self.features: dict[str, list] = {}

    def _entry(self, name: str, limit: int, record: int | None = None) -> list:
        entry = self.features.get(name)
        if entry is None:
            if len(self.features) >= limit:
                raise too_many_features(limit, record=record)
            entry = self.features[name] = [set(), 0, None, None]
        return entry

    def _add(self, entry: list, kind: str, present: int, least: int, most: int) -> None:
        entry[0].add(kind)
        entry[1] += present
        entry[2] = least if entry[2] is None else min(entry[2], least)
        entry[3] = most if entry[3] is None else max(entry[3], most)

    def observe(self, parsed: dict, max_features: int | None = None, record: int | None = None) -> None:
        """Adds one record, as :func:`codec.parse_example` returns it (``{name: (kind, values)}``)."""
        limit = MAX_FEATURES if max_features is None else max_features
        for name, (kind, values) in parsed.items():
            entry = self._entry(name, limit, record)
            if kind is not None:
                self._add(entry, kind, 1, len(values), len(values))
        self.records += 1

    def observe_records(self, records: Sequence[bytes], max_features: int | None = None, framed: bool = False) -> None:
        """Adds a batch of serialized Examples in one C++ call (tfx_bsl's ``ExamplesToRecordBatchDecoder`` without
        a schema: about 4.5 us per record of TFX's 18-feature taxi Examples in batches of 4,096, against ~230 us for
        the Python parse). A batch tfx_bsl refuses (a feature
        of two kinds, more distinct names than ``max_features``) is walked record by record, so the error names the
        record. tfx_bsl skips unknown fields (a ``SequenceExample`` decodes as an empty Example), so the records'
        framing is checked first (:func:`codec.check_example_frames`) unless ``framed`` says it was.

        Raises:
          SchemaError: a feature of two kinds (the batch's record index). RecordError: not an Example, or more than
            ``max_features`` distinct names.
        """
        import pyarrow as pa
        import pyarrow.compute as pc
        from tfx_bsl.coders import example_coder

        if not records:
            return
        limit = MAX_FEATURES if max_features is None else max_features
        if not framed:
            try:
                check_example_frames(records, limit)
            except RecordError as e:
                raise e.with_context(record=self.records + e.context.pop("record", 0)) from None
        try:
            batch = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(list(records))
            if len(set(batch.schema.names) | set(self.features)) > limit:
                raise ValueError("too many names")  # the walk below names the record that brings one too many
        except Exception:  # noqa: BLE001 - tfx_bsl's RuntimeError/ValueError: find the record in Python
            first = self.records
            for i, record in enumerate(records):
                try:
                    parsed = parse_example(record, limit)
                except RecordError as e:
                    raise e.with_context(record=first + i) from None
                self.observe(parsed, limit, first + i)
                self.check_kinds(first + i)
            return
        columns = dict(zip(batch.schema.names, batch.columns))  # tfx_bsl sorts them: first-seen order instead
        order = [n for n in split_features(records[0], limit) if n in columns]
        order += sorted(set(columns) - set(order))
        for name in order:
            column = columns[name]
            entry = self._entry(name, limit)
            if pa.types.is_null(column.type):
                continue
            value_type = column.type.value_type
            kind = (
                "int64" if pa.types.is_integer(value_type) else "float" if pa.types.is_floating(value_type) else "bytes"
            )
            present = len(column) - column.null_count
            if present:
                lengths = pc.list_value_length(column)
                self._add(entry, kind, present, pc.min(lengths).as_py(), pc.max(lengths).as_py())
        self.records += len(records)
        self.check_kinds()

    def check_kinds(self, record: int | None = None) -> None:
        """Raises SchemaError when a feature was seen with two kinds (naming ``record`` when given)."""
        for name, (kinds, _, _, _) in self.features.items():
            if len(kinds) > 1:
                raise SchemaError(
                    f"Feature '{name}' holds {' and '.join(sorted(kinds))} lists in different records",
                    feature=name,
                    record=record,
                    hint="one feature must have one kind in every record",
                )

    def merge(self, other: FeatureStats) -> FeatureStats:
        """Adds ``other`` (the stats of later records, e.g. the next shard); returns self."""
        for name, (kinds, present, least, most) in other.features.items():
            entry = self.features.setdefault(name, [set(), 0, None, None])
            for kind in kinds:
                self._add(entry, kind, 0, least, most)
            entry[1] += present
        self.records += other.records
        self.check_kinds()
        return self

    def to_json(self) -> dict:
        return {
            "records": self.records,
            "features": [[n, sorted(k), p, lo, hi] for n, (k, p, lo, hi) in self.features.items()],
        }

    @classmethod
    def from_json(cls, obj: dict) -> FeatureStats:
        out = cls()
        out.records = int(obj["records"])
        out.features = {n: [set(k), int(p), lo, hi] for n, k, p, lo, hi in obj["features"]}
        return out

    def specs(self) -> tuple[FeatureSpec, ...]:
        """The features every observed record satisfies, in the order first seen.

        ``list`` of shape ``(n,)`` (``tf.io.FixedLenFeature([n])``) when every record holds exactly ``n`` values of
        the feature; else ``varlen`` (``tf.io.VarLenFeature``): the feature is missing or has no kind in some records,
        or its length varies. Dtypes: ``int64_list`` -> ``'<i8'``, ``float_list`` -> ``'<f4'``, ``bytes_list`` ->
        ``'bytes'``; a feature whose kind is never set is ``'bytes'`` ``varlen``.
        """
        out = []
        for name, (kinds, present, least, most) in self.features.items():
            dtype = _KIND_DTYPES[next(iter(kinds))] if kinds else VLEN_BYTES
            if kinds and present == self.records and least == most:
                out.append(FeatureSpec(name, dtype, (least,), "list"))
            else:
                out.append(FeatureSpec(name, dtype, (None,), "varlen"))
        return tuple(out)

    def contradictions(self, specs: Sequence[FeatureSpec]) -> list[str]:
        """What the observed records hold that ``specs`` (e.g. a ``--schema``) deny, one sentence per feature."""
        problems = []
        for spec in specs:
            kinds, present, least, most = self.features.get(spec.name, [set(), 0, None, None])
            encoding = encoding_of(spec)
            want = encoding.kind(spec.dtype) if spec.dtype is not None else None
            if want and kinds - {want}:
                problems.append(f"'{spec.name}' holds {'/'.join(sorted(kinds))} values, the schema says {want}")
            elif not encoding.optional and present < self.records:
                problems.append(
                    f"'{spec.name}' is missing or empty in {self.records - present:,} of "
                    f"{self.records:,} records, the schema requires it"
                )
            elif spec.is_fixed and present and not (least == most == spec.size):
                problems.append(f"'{spec.name}' holds {least}-{most} values per record, the schema says {spec.size}")
        return problems


def as_varlen(spec: FeatureSpec) -> FeatureSpec:
    """``spec`` read as ``tf.io.VarLenFeature``: a 1-D native ``list`` spec becomes ``varlen`` (any length, possibly
    absent); every other spec is returned as it is."""
    encoding = encoding_of(spec)
    if encoding.native and not encoding.optional and spec.shape is not None and len(spec.shape) == 1:
        return FeatureSpec(spec.name, spec.dtype, (None,), "varlen")
    return spec


def infer_feature_specs(records: Iterable[bytes], max_features: int | None = None) -> tuple[FeatureSpec, ...]:
    """Infers the features of serialized Examples that came without metadata (TFX, TFDS, tf.io writers).

    The features every record given satisfies (:meth:`FeatureStats.specs`): ``list`` ``(n,)`` when each record
    holds exactly ``n`` values of the feature, else ``varlen`` (absent, kind not set, or varying length in some
    record). Given a sample, this is a guess about the rest: pipelines that read every record (augment, verify,
    inspect) learn the features from all of them with :class:`FeatureStats`. Time and memory are linear in the
    entries read.

    Args:
      records: serialized ``tf.train.Example`` byte strings.
      max_features: limit on the features of one record and on the distinct names of all records
        (default :data:`MAX_FEATURES`).

    Raises:
      SchemaError: a feature holds different kinds in different records.
      RecordError: a record is not a tf.train.Example (with the record index and byte offset), or more
        than ``max_features`` features (in one record, or distinct names in all).
    """
    limit = MAX_FEATURES if max_features is None else max_features
    stats = FeatureStats()
    for i, record in enumerate(records):
        try:
            parsed = parse_example(record, limit)
        except RecordError as e:
            raise RecordError(
                f"Cannot infer the features: {e.message}", hint=e.hint, record=i, payload_offset=e.context.get("offset")
            ) from None
        stats.observe(parsed, limit, i)
    stats.check_kinds()
    return stats.specs()


def decode_example_lenient(
    record: bytes, specs: Sequence[FeatureSpec], max_features: int | None = None
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
        if encoding.native and not encoding.optional and spec.shape == (None,) and f"{spec.name}/shape" not in spans:
            kind, values = decode_feature(record, spans[spec.name]) if spec.name in spans else (None, [])
            out[spec.name] = encoding.decode_native(spec, kind, values)
        else:
            out[spec.name] = decode_spec(record, spans, spec)
    return out


def feature_key_pattern(name: str) -> bytes:
    """The bytes every serialized Example holding feature ``name`` contains: its map entry's key field.

    A cheap ``pattern in record`` test rules a feature out without parsing (a hit may be a false
    positive inside a value; confirm with :func:`split_features`).
    """
    key = name.encode("utf-8")
    return encode_varint(1 << 3 | 2) + encode_varint(len(key)) + key


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
            raise SchemaError(
                f"Feature '{spec.name}' ({spec.dtype} {spec.shape} {spec.encoding}) cannot be decoded as a batch",
                feature=spec.name,
                hint="decode it with decode_example",
            )
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
            raise RecordError(
                f"Feature '{spec.name}' holds {sorted(set(lengths.tolist()))} values in some Examples, expected {want}",
                feature=spec.name,
            )
        out[spec.name] = encoding.decode_flat(spec, values, n)
    return out
