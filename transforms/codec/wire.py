"""The protobuf wire format of tf.train.Example: field writers and a small reader (no TensorFlow)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tfrecord_etl.transforms.codec.encodings import encoding_of
from tfrecord_etl.transforms.codec.spec import MAX_FEATURES, FeatureSpec, normalize_dtype
from tfrecord_etl.transforms.errors import RecordError


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise RecordError("Truncated varint in serialized Example", offset=pos)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise RecordError("Varint longer than 10 bytes in serialized Example", offset=pos)


def iter_fields(buf: bytes, pos: int, end: int):
    """Yields (field number, wire type, value) over a message; LEN values are (start, stop) slices."""
    value: Any  # a varint's int, or the (start, stop) slice of the other wire types
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 1:
            value, pos = (pos, pos + 8), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            value, pos = (pos, pos + n), pos + n
        elif wire == 5:
            value, pos = (pos, pos + 4), pos + 4
        else:
            raise RecordError(f"Unsupported protobuf wire type {wire}: not a tf.train.Example", offset=pos)
        if pos > end or field == 0:
            raise RecordError("Field runs past the end of the message: not a tf.train.Example", offset=pos)
        yield field, wire, value


def split_features(record: bytes, max_features: int | None = None) -> dict[str, tuple[int, int]]:
    """Maps each feature name of a serialized Example to the (start, stop) byte slice of its Feature.

    Later entries win, as in protobuf's map merge (so concatenated Examples behave like TensorFlow's
    parser, which keeps the last value of a repeated key).

    Raises:
      RecordError: the bytes are not a tf.train.Example (with the byte offset), or it holds more than
        ``max_features`` (default :data:`MAX_FEATURES`) feature entries.
    """
    out: dict[str, tuple[int, int]] = {}
    for _, entry in split_feature_entries(record, max_features):
        key, value = None, (0, 0)
        for field, wire, val in iter_fields(record, entry[0], entry[1]):
            if field == 1 and wire == 2:
                try:
                    key = bytes(record[val[0] : val[1]]).decode("utf-8")
                except UnicodeDecodeError:
                    raise RecordError("Feature name is not UTF-8: not a tf.train.Example", offset=val[0]) from None
            elif field == 2 and wire == 2:
                value = val
        if key is None:
            raise RecordError("Feature map entry without a name: not a tf.train.Example", offset=entry[0])
        out[key] = value
    return out


def split_feature_entries(record: bytes, max_features: int | None = None) -> list[tuple[str | None, tuple[int, int]]]:
    """The (name placeholder, byte slice) of every ``Features.feature`` map entry, in order.

    Checks the Example's and the Features' framing (field numbers, wire types, lengths), not the values.

    Raises:
      RecordError: not a tf.train.Example, or more than ``max_features`` (default :data:`MAX_FEATURES`)
        entries, counted while parsing (the error comes before the rest of the record is walked).
    """
    limit = MAX_FEATURES if max_features is None else max_features
    entries: list[tuple[str | None, tuple[int, int]]] = []
    for field, wire, val in iter_fields(record, 0, len(record)):
        if field != 1 or wire != 2:
            raise RecordError(f"Unexpected field {field} (wire type {wire}) in a tf.train.Example", offset=0)
        for f2, w2, v2 in iter_fields(record, val[0], val[1]):
            if f2 != 1 or w2 != 2:
                raise RecordError(f"Unexpected field {f2} in tf.train.Features", offset=val[0])
            entries.append((None, v2))
            if len(entries) > limit:
                raise too_many_features(limit, offset=v2[0])
    return entries


def too_many_features(limit: int, **context) -> RecordError:
    """The RecordError of an Example (or a collection) with more than ``limit`` features."""
    return RecordError(
        f"More than {limit} features (the feature limit, --max_features {limit})",
        hint="raise --max_features if the data is trusted",
        **context,
    )


def check_example_frame(record: bytes, max_features: int | None = None) -> int:
    """Checks that ``record`` is framed as a tf.train.Example (see :func:`split_feature_entries`) and
    returns its number of feature entries; cheap (no value is decoded: about 1 us per feature). Raises
    RecordError (from split_feature_entries, which any irregularity falls back to)."""
    limit = MAX_FEATURES if max_features is None else max_features
    n, pos, count = len(record), 0, 0
    while pos < n:
        if record[pos] != 0x0A:  # Example.features: field 1, LEN (other tags: the exact walk below decides)
            return len(split_feature_entries(record, max_features))
        b = record[pos + 1] if pos + 1 < n else 0x80
        if b < 0x80:
            length, pos = b, pos + 2
        else:
            length, pos = _varint(record, pos + 1, n)
        end = pos + length
        if end > n:
            return len(split_feature_entries(record, max_features))
        while pos < end:  # Features.feature entries: field 1, LEN
            if record[pos] != 0x0A:
                return len(split_feature_entries(record, max_features))
            b = record[pos + 1] if pos + 1 < end else 0x80
            if b < 0x80:
                pos += 2 + b
            else:
                length, pos = _varint(record, pos + 1, end)
                pos += length
            count += 1
            if count > limit:
                return len(split_feature_entries(record, max_features))
        if pos != end:
            return len(split_feature_entries(record, max_features))
    return count


def check_example_frames(records: Sequence[bytes], max_features: int | None = None) -> None:
    """:func:`check_example_frame` for a batch, about 10x cheaper on the uniform batches a collection's records
    make: the first record is walked once, noting the positions of the bytes the walk reads (tags and length
    varints); every record of the same length whose bytes at those positions are equal (one NumPy comparison
    over the batch) would walk identically, so it is framed identically. Other records are walked one by one.

    Raises:
      RecordError: the first record, in batch order, that is not framed as a tf.train.Example; its
        ``context['record']`` is the index within ``records``.
    """
    if not records:
        return
    _checked_count(records, 0, max_features)
    walked = {0}
    positions = _frame_positions(records[0])
    n0 = len(records[0])
    same = [i for i in range(1, len(records)) if len(records[i]) == n0] if positions is not None else []
    if same:
        block = np.frombuffer(b"".join([records[0]] + [records[i] for i in same]), np.uint8).reshape(len(same) + 1, n0)
        index = np.asarray(positions, dtype=np.intp)
        equal = (block[1:, index] == block[0, index]).all(axis=1)
        walked.update(i for i, ok in zip(same, equal.tolist()) if ok)
    for i in range(1, len(records)):
        if i not in walked:
            _checked_count(records, i, max_features)


def _checked_count(records, i: int, max_features):
    try:
        return check_example_frame(records[i], max_features)
    except RecordError as e:
        raise e.with_context(record=i) from None


def _frame_positions(record: bytes) -> list[int] | None:
    """The byte positions :func:`check_example_frame`'s fast walk reads in ``record`` (tag bytes and length
    varints), or None when the record leaves the fast walk (the exact walk decides then)."""
    try:
        return _walk_positions(record)
    except RecordError:
        return None


def _walk_positions(record: bytes) -> list[int] | None:
    n, pos, out = len(record), 0, list[int]()
    while pos < n:
        end = _len_header(record, pos, n, out)  # Example.features, then its Features.feature entries
        if end is None:
            return None
        pos = out[-1] + 1
        while pos < end:
            entry_end = _len_header(record, pos, end, out)
            if entry_end is None:
                return None
            pos = entry_end
        if pos != end:
            return None
    return out


def _len_header(record: bytes, pos: int, limit: int, out: list[int]) -> int | None:
    """Reads a field-1 LEN header (tag 0x0A and its length varint) at ``pos``, appending the positions of its
    bytes to ``out``; returns where the field's payload ends, or None when it is not such a header or overruns
    ``limit``."""
    if record[pos] != 0x0A or pos + 1 >= limit:
        return None
    length, payload = _varint(record, pos + 1, limit)
    out.extend(range(pos, payload))
    return payload + length if payload + length <= limit else None


def entry_name(record: bytes, entry: tuple[int, int]) -> str:
    """The feature name of one map entry slice (see split_feature_entries)."""
    for field, wire, val in iter_fields(record, entry[0], entry[1]):
        if field == 1 and wire == 2:
            return bytes(record[val[0] : val[1]]).decode("utf-8", errors="replace")
    raise RecordError("Feature map entry without a name", offset=entry[0])


def drop_features(record: bytes, names: Iterable[str]) -> bytes:
    """The Example without the features in ``names``: other entries are copied byte for byte, not decoded."""
    names = set(names)
    kept = [record[s:e] for _, (s, e) in split_feature_entries(record) if entry_name(record, (s, e)) not in names]
    features = b"".join(length_delimited_field(1, bytes(e)) for e in kept)
    return length_delimited_field(1, features) if kept else b""


def length_delimited_field(field: int, payload: bytes) -> bytes:
    """The wire bytes of field number ``field`` of wire type 2 (LEN) holding ``payload``: key, length, payload
    (protocol buffers encoding guide)."""
    return encode_varint(field << 3 | 2) + encode_varint(len(payload)) + payload


def encode_varint(value: int) -> bytes:
    """``value`` (an int >= 0) as a protocol-buffers base-128 varint, least significant group first."""
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_feature(record: bytes, span: tuple[int, int]):
    """Decodes one Feature slice to ``(kind, values)``.

    ``kind`` is ``'bytes'`` (values: list of bytes), ``'float'`` (float32 array), ``'int64'`` (int64
    array), or None for a Feature with no kind set (values: empty list).
    """
    kind, values = None, []
    for field, wire, val in iter_fields(record, span[0], span[1]):
        if wire != 2 or field not in (1, 2, 3):
            raise RecordError(f"Unexpected field {field} in tf.train.Feature", offset=span[0])
        kind = {1: "bytes", 2: "float", 3: "int64"}[field]
        values = _decode_list(record, kind, val)
    return kind, values


def _decode_list(buf: bytes, kind: str, span: tuple[int, int]):
    if kind == "bytes":
        return [bytes(buf[v[0] : v[1]]) for f, w, v in iter_fields(buf, span[0], span[1]) if f == 1 and w == 2]
    parts = []
    for f, w, v in iter_fields(buf, span[0], span[1]):
        if f != 1:
            continue
        if kind == "float":
            if w not in (2, 5) or (v[1] - v[0]) % 4:
                raise RecordError(f"FloatList value with wire type {w} or a length not a multiple of 4", offset=span[0])
            parts.append(np.frombuffer(bytes(buf[v[0] : v[1]]), dtype="<f4"))
        elif w == 2:
            parts.append(_decode_varints(bytes(buf[v[0] : v[1]]), v[0]))
        elif w == 0:
            parts.append(np.array([v & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64).view(np.int64))  # 64 bits, as protobuf
        else:
            raise RecordError(f"Int64List value with wire type {w}", offset=span[0])
    if kind == "float":
        return np.concatenate(parts) if parts else np.zeros(0, "<f4")
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _decode_varints(data: bytes, offset: int = 0) -> np.ndarray:
    """Vectorized decode of packed varints to int64 (two's complement, as protobuf int64)."""
    b = np.frombuffer(data, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64)
    if b[-1] >= 0x80:
        raise RecordError("Truncated packed varint list", offset=offset + len(data))
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if np.any(ends - starts >= 10):
        raise RecordError("Varint longer than 10 bytes", offset=offset)
    pos = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
    parts = (b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)


def parse_example(record: bytes, max_features: int | None = None) -> dict[str, tuple[str | None, object]]:
    """Decodes a whole serialized Example to ``{name: (kind, values)}`` (see decode_feature).

    Raises RecordError: not an Example, or more than ``max_features`` features (see split_features)."""
    return {name: decode_feature(record, span) for name, span in split_features(record, max_features).items()}


def decode_example(
    record: bytes, specs: Sequence[FeatureSpec], max_features: int | None = None
) -> dict[str, np.ndarray]:
    """Decodes the features in ``specs`` to NumPy arrays with their recorded dtype and shape.

    Little-endian arrays come back for every dtype (values equal to the source's, whatever its byte
    order); ``'bytes'`` features come back as object arrays of bytes. Features not in ``specs`` are
    not decoded.

    Raises:
      RecordError: a feature is missing, has the wrong kind, or its size does not match the shape; more
        than ``max_features`` (default :data:`MAX_FEATURES`) features in the record.
    """
    spans = split_features(record, max_features)
    return {spec.name: decode_spec(record, spans, spec) for spec in specs}


def _get(record, spans, name, kind):
    if name not in spans:
        raise RecordError(f"Feature '{name}' is missing from the Example", feature=name)
    got, values = decode_feature(record, spans[name])
    if got != kind:
        raise RecordError(f"Feature '{name}' holds a {got} list, expected {kind}", feature=name)
    return values


def decode_spec(record: bytes, spans, spec: FeatureSpec) -> np.ndarray:
    """The array of feature ``spec`` in the serialized Example ``record`` (``spans``: each feature's
    ``(start, stop)`` in it, from :func:`split_features`), decoded as its encoding wrote it.

    Raises:
      RecordError: a ``/shape`` or ``/dtype`` companion that does not fit ``spec``, or values its encoding
        cannot decode (naming the feature).
    """
    encoding = encoding_of(spec)
    if encoding.optional:  # tf.io.VarLenFeature: any length; absent or no kind set = empty
        kind, values = decode_feature(record, spans[spec.name]) if spec.name in spans else (None, [])
        want = encoding.kind(spec.dtype)
        if kind is not None and kind != want:
            raise RecordError(f"Feature '{spec.name}' holds a {kind} list, expected {want}", feature=spec.name)
        if kind is None and want != "bytes":
            values = np.zeros(0, "<f4" if want == "float" else np.int64)
        return encoding.decode(spec, values, (len(values),), spec.dtype)
    shape = spec.shape
    if encoding.shape_companion(spec):
        shape = tuple(int(v) for v in _get(record, spans, f"{spec.name}/shape", "int64"))
        if any(d < 0 for d in shape) or (
            spec.shape is not None
            and (len(shape) != len(spec.shape) or any(d is not None and d != n for d, n in zip(spec.shape, shape)))
        ):
            raise RecordError(
                f"Feature '{spec.name}/shape' holds {list(shape)}, which is not a shape of {spec.shape}",
                feature=spec.name,
            )
    dtype = spec.dtype
    if dtype is None:
        values = _get(record, spans, f"{spec.name}/dtype", "bytes")
        dtype = values[0].decode("ascii", errors="replace") if len(values) == 1 else ""
        try:
            normalize_dtype(np.dtype(dtype), spec.name)
        except (TypeError, ValueError, OverflowError):
            raise RecordError(
                f"Feature '{spec.name}/dtype' holds {values!r}, not one NumPy dtype", feature=spec.name
            ) from None
    return encoding.decode(spec, _get(record, spans, spec.name, encoding.kind(dtype)), shape, dtype)
