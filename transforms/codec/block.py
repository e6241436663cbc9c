"""Decoding a block of serialized Examples at once with NumPy: the fast path of the NumPy readers.

Our records have a known layout: the writer lays every row of a batch out with the same protobuf headers (tags,
lengths, feature names; :class:`codec.encode.FixedLayout`), so among records of one length only the values differ.
(:mod:`codec.blocklayout`) :class:`BlockDecoder` walks the first record of a block once, noting the *structural* bytes the walk reads (every
tag, length and name) and where each feature's values lie; every record of the block whose structural bytes equal
the first one's (one NumPy comparison per byte range over the whole block) would walk identically, so its values
sit at the same offsets and are gathered for all such records at once (``np.frombuffer`` of the block, a strided
slice per feature, a ``view`` to the dtype). Records that differ (another writer's layout, varint lengths that vary,
concatenated Examples, a feature missing) are decoded one by one by :func:`codec.decode_example_lenient`, so the
result always equals stacking that decoder's arrays, value for value, dtype for dtype.

Vectorized per feature: ``tensor`` (raw little-endian bytes of a fixed dtype and shape), ``packbits``, and ``list``
features of numbers (``float_list``: float32 views; ``int64_list``: packed varints of one width per record, decoded
as columns of bytes). Every other feature of a record that matches the layout (strings of a ``list``, ``zlib``,
shapes or dtypes that vary, ``varlen``) is decoded per record from the same offsets with the per-record decoder's
own functions. No Beam, TensorFlow or pyarrow import: NumPy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from tfrecord_etl.transforms.codec.blocklayout import Layout, layout_of, vector_kind
from tfrecord_etl.transforms.codec.encodings import encoding_of
from tfrecord_etl.transforms.codec.encodings.packbits import PackbitsEncoding, packed_shape
from tfrecord_etl.transforms.codec.foreign import decode_example_lenient
from tfrecord_etl.transforms.codec.spec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.codec.wire import decode_feature, decode_spec
from tfrecord_etl.transforms.errors import RecordError

MIN_BLOCK = 4  # fewer records than this are decoded one by one (the layout walk would cost more than it saves)


def ragged(spec: FeatureSpec) -> bool:
    """True when rows of ``spec`` cannot be stacked into one array (shape or dtype varies between examples): a
    batch then holds them in a 1-D object array, one array per row."""
    return not spec.is_fixed


def _gather(block: np.ndarray, start: int, nbytes: int) -> np.ndarray:
    """``(rows, nbytes)`` uint8, C-contiguous, a copy (never a view of the block's buffer)."""
    return np.array(block[:, start : start + nbytes], order="C", copy=True)


def _varints(cols: np.ndarray, width: int) -> np.ndarray:
    """``(rows, n*width)`` uint8 of varints of ``width`` bytes each -> ``(rows, n)`` int64 (two's complement)."""
    rows = cols.shape[0]
    cols = cols.reshape(rows, -1, width)
    out = (cols[:, :, 0] & 0x7F).astype(np.uint64)
    for j in range(1, width):
        out |= (cols[:, :, j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return out.view(np.int64)


class BlockDecoder:
    """Decodes blocks of serialized Examples to ``{name: array of rows}``, equal to stacking
    :func:`codec.decode_example_lenient` over the records (see the module).

    Args:
      specs: the features to decode.
      max_features: limit on one record's feature count (default :data:`MAX_FEATURES`).

    Output arrays: ``(rows, *spec.shape)`` of ``spec.dtype`` for fixed features (object arrays for ``bytes``);
    1-D object arrays of one array per row for features whose shape or dtype varies (:func:`ragged`).
    """

    def __init__(self, specs: Sequence[FeatureSpec], max_features: int | None = None):
        self.specs = list(specs)
        self.max_features = max_features
        self._layouts: dict[int, Layout | None] = {}
        self._encodings = {s.name: encoding_of(s) for s in self.specs}
        # per feature: (how its values are gathered, its dtype), looked up once
        self._how = {
            s.name: (vector_kind(s), None if s.dtype in (None, VLEN_BYTES) else np.dtype(s.dtype)) for s in self.specs
        }

    # -- one record ------------------------------------------------------------------------------------
    def decode_one(self, record: bytes) -> dict[str, np.ndarray]:
        """One record, as :func:`codec.decode_example_lenient` decodes it; faster when it shares the layout of a
        record of its length seen before. Raises RecordError as that function does."""
        if len(record) not in self._layouts:
            self._layouts[len(record)] = layout_of(record, self.specs, self.max_features)
        layout = self._layouts[len(record)]
        if layout is None or not layout.matches_one(record):
            return decode_example_lenient(record, self.specs, self.max_features)
        out = {}
        for spec in self.specs:
            where = layout.vector.get(spec.name)
            if where is None:
                out[spec.name] = self._per_record(record, layout.spans, spec)
                continue
            value = self._vector_one(spec, record, where)
            if value is None:  # out of range for the dtype: the per-record decoder says so
                return decode_example_lenient(record, self.specs, self.max_features)
            out[spec.name] = value
        return out

    def _vector_one(self, spec: FeatureSpec, record: bytes, where) -> np.ndarray | None:
        """:meth:`_vector` for one record, with as few NumPy calls as it takes (one record is all Python overhead)."""
        start, nbytes, width = where
        how, dt = self._how[spec.name]
        if how == "tensor":
            if not nbytes:
                return np.zeros(spec.shape, dt)
            return np.frombuffer(record, dt, spec.size, start).reshape(spec.shape)
        if how == "packbits":
            packed = np.frombuffer(record, np.uint8, nbytes, start).reshape(packed_shape(spec.shape))
            return cast(PackbitsEncoding, self._encodings[spec.name])._unpack(packed, spec.shape, spec.dtype)
        if how == "float":
            values = np.frombuffer(record, "<f4", spec.size, start)
            return values.astype(dt).reshape(spec.shape)
        if nbytes <= 64:
            ints, shift, value = [], 0, 0
            for b in record[start : start + nbytes]:
                value |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    ints.append(value & 0xFFFFFFFFFFFFFFFF)
                    shift = value = 0
            values = np.array(ints, np.uint64).view(np.int64)
        else:
            values = _varints(np.frombuffer(record, np.uint8, nbytes, start)[None], width)[0]
        if dt.kind in "Mm":
            return values.view(dt).reshape(spec.shape)
        if dt == values.dtype:
            return values.reshape(spec.shape)
        out = values.astype(dt)
        if dt.kind != "f" and not np.array_equal(out.astype(values.dtype), values):
            return None
        return out.reshape(spec.shape)

    # -- a block ---------------------------------------------------------------------------------------
    def decode(self, block: np.ndarray, records: Sequence[bytes] | None = None) -> dict[str, np.ndarray]:
        """Decodes ``block``, a ``(rows, length)`` uint8 array (a view: rows may be strided) of records of one
        length. ``records``: the same records as bytes when the caller has them (else rows are copied out when
        a record is decoded one by one).

        Raises:
          RecordError: from the per-record decoder, with ``context['record']`` the row within the block.
        """
        rows, length = block.shape
        layout = None
        if rows >= MIN_BLOCK or length in self._layouts:
            cached = self._layouts.get(length)
            if cached is None or not cached.matches(block[:1]).all():
                self._layouts[length] = layout_of(block[0].tobytes(), self.specs, self.max_features)
            layout = self._layouts[length]
        ok = layout.matches(block) if layout is not None else np.zeros(rows, bool)
        good = np.flatnonzero(ok)
        sub = block if len(good) == rows else block[good]
        vec: dict[str, np.ndarray] = {}
        pending = [s for s in self.specs if layout is not None and s.name in layout.vector]
        while pending and len(good):
            spec = pending[0]
            value = self._vector(spec, sub, layout.vector[spec.name])
            if value is None:  # some rows hold integers out of range for the dtype: those go one by one
                bad = self._out_of_range(spec, sub, layout.vector[spec.name])
                ok[good[bad]] = False
                good, sub = good[~bad], sub[~bad]
                vec, pending = {}, [s for s in self.specs if s.name in layout.vector]
                continue
            vec[spec.name] = value
            pending.pop(0)
        return self._finish(block, records, layout, ok, good, vec)

    def _finish(self, block, records, layout, ok, good, vec):
        """Every feature: vector features of the ``good`` rows from ``vec``, per-record features of the ``good`` rows
        from the layout's spans, and whole records of the other rows, merged in row order."""
        rows = block.shape[0]
        per_spec = [s for s in self.specs if s.name not in vec]
        bad_list = np.flatnonzero(~ok).tolist() if len(good) < rows else []
        if not per_spec and not bad_list:
            return vec
        good_list = good.tolist()
        per_row: dict[str, list] = {s.name: [] for s in per_spec}
        if per_spec and good_list:
            for i in good_list:
                record = records[i] if records is not None else block[i].tobytes()
                for spec in per_spec:
                    try:
                        per_row[spec.name].append(self._per_record(record, layout.spans, spec))
                    except RecordError as e:
                        raise e.with_context(record=i) from None
        whole = []
        for i in bad_list:
            record = records[i] if records is not None else block[i].tobytes()
            try:
                whole.append(decode_example_lenient(record, self.specs, self.max_features))
            except RecordError as e:
                raise e.with_context(record=i) from None
        out = {}
        for spec in self.specs:
            name = spec.name
            part = (vec[name] if name in vec else stack(spec, per_row[name])) if good_list else None
            if not bad_list:
                out[name] = part
                continue
            rest = stack(spec, [w[name] for w in whole])
            if part is None:
                out[name] = rest
                continue
            merged = np.empty((rows, *part.shape[1:]), dtype=_common(part, rest))
            merged[good] = part
            merged[np.asarray(bad_list)] = rest
            out[name] = merged
        return out

    def _per_record(self, record: bytes, spans, spec: FeatureSpec) -> np.ndarray:
        """One feature of one record, exactly as :func:`codec.decode_example_lenient` decodes it."""
        encoding = self._encodings[spec.name]
        if encoding.native and not encoding.optional and spec.shape == (None,) and f"{spec.name}/shape" not in spans:
            kind, values = decode_feature(record, spans[spec.name]) if spec.name in spans else (None, [])
            return encoding.decode_native(spec, kind, values)
        return decode_spec(record, spans, spec)

    def _vector(self, spec: FeatureSpec, block: np.ndarray, where) -> np.ndarray | None:
        """The values of a vector feature for every row of ``block`` (rows sharing the layout); None when some row
        holds an integer out of range for the dtype (the caller decodes those rows one by one). One-byte ``tensor``
        values are a view of ``block``'s buffer (rows strided by the frame; the buffer must not be reused), every other
        feature a new C-contiguous array."""
        start, nbytes, width = where
        rows = block.shape[0]
        how, dt = self._how[spec.name]
        if how == "tensor":
            if not nbytes:
                return np.zeros((rows, *spec.shape), dt)
            if dt.itemsize == 1:  # bytes-wide values (images): a view of the block's buffer, no copy (rows strided)
                return block[:, start : start + nbytes].view(dt).reshape(rows, *spec.shape)
            return _gather(block, start, nbytes).view(dt).reshape(rows, *spec.shape)
        if how == "packbits":
            packed = _gather(block, start, nbytes).reshape(rows, *packed_shape(spec.shape))
            return cast(PackbitsEncoding, self._encodings[spec.name])._unpack(packed, spec.shape, spec.dtype)
        if how == "float":
            values = _gather(block, start, nbytes).view("<f4") if nbytes else np.zeros((rows, 0), "<f4")
            return (values if dt == values.dtype else values.astype(dt)).reshape(rows, *spec.shape)
        values = _varints(_gather(block, start, nbytes), width) if nbytes else np.zeros((rows, 0), np.int64)
        if dt.kind in "Mm":
            return values.view(dt).reshape(rows, *spec.shape)
        if dt == values.dtype:
            return values.reshape(rows, *spec.shape)
        out = values.astype(dt)
        if dt.kind != "f" and not np.array_equal(out.astype(values.dtype), values):
            return None
        return out.reshape(rows, *spec.shape)

    def _out_of_range(self, spec, block, where) -> np.ndarray:
        """bool ``(rows,)``: rows of ``block`` whose integer values do not fit the dtype."""
        start, nbytes, width = where
        values = _varints(_gather(block, start, nbytes), width)
        return (values.astype(spec.dtype).astype(values.dtype) != values).any(axis=1)


def _common(a: np.ndarray, b: np.ndarray) -> np.dtype:
    return a.dtype if a.dtype == b.dtype else np.result_type(a, b)


def stack(spec: FeatureSpec, rows: list) -> np.ndarray:
    """Per-record arrays of ``spec`` -> one array of rows: ``(n, *shape)`` of ``spec.dtype`` for a fixed feature,
    else a 1-D object array holding each row's array (:func:`ragged`)."""
    if ragged(spec):
        out = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            out[i] = row
        return out
    if not rows:
        return np.zeros((0, *spec.shape), dtype=object if spec.dtype == VLEN_BYTES else np.dtype(spec.dtype))
    return np.stack(rows)
