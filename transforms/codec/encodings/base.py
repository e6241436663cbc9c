"""What every encoding shares: the :class:`Encoding` interface, the Arrow list builders of the tfx_bsl path, and
the conversion of values to bytes (str as UTF-8, refusing code points with no UTF-8 form)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tfrecord_etl.transforms.codec.arrow import pa
from tfrecord_etl.transforms.codec.spec import VLEN_BYTES, FeatureSpec, to_little_endian
from tfrecord_etl.transforms.errors import RecordError, SchemaError


class Encoding:
    """How one feature's rows become Example features, and back; one subclass per encoding.

    An encoding owns every encoding-specific rule of the project: the dtype check, the kind of the Example
    feature it writes (``bytes``, ``int64`` or ``float``, i.e. ``BytesList``, ``Int64List``, ``FloatList``), the
    NumPy encoding of a batch, the NumPy decoding of one record and of a batch, the decoding inside ``tf.data``
    and the value a round trip gives back. The shape and dtype companions (``<name>/shape`` int64_list,
    ``<name>/dtype`` bytes_list) are the same for every encoding and live here. Registered in
    ``transforms.codec.encodings.ENCODINGS``; the model is TFDS's ``features/tensor_feature.py`` (an ``Encoding``
    enum and one feature class owning encode and decode).
    """

    name: str = ""
    #: the Example feature is TensorFlow's native list form (a reader of another writer's Examples may find a
    #: variable-length list without a ``<name>/shape`` companion)
    native = False
    #: can carry a dtype that varies between examples (``<name>/dtype`` companion)
    varying_dtype = False
    #: a record may lack the feature (or hold it with no kind set): it then decodes to an empty 1-D array
    #: (``tf.io.VarLenFeature``); otherwise a missing feature is an error
    optional = False
    #: the ``encoding`` of the TFDS ``Tensor`` feature that reads this encoding's bytes as they are (``"bytes"``,
    #: ``"zlib"``, ``"none"`` for native lists; ``--tfds_name``), or None when TFDS has no such feature
    tfds_encoding: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # -- schema ------------------------------------------------------------------------------------
    def check(self, spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
        """Raises SchemaError when this encoding cannot carry ``spec`` exactly (or as allowed)."""
        if spec.dtype is None and not self.varying_dtype:
            raise SchemaError(
                f"Feature '{spec.name}' has a dtype that varies between examples; only the "
                "'tensor' encoding can carry it",
                hint="set its encoding to tensor",
            )

    def kind(self, dtype: str) -> str:
        """The kind of the main Example feature for ``dtype``: ``'bytes'``, ``'int64'`` or ``'float'``."""
        return "bytes"

    def stored_dtype(self, spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> str | None:
        """The dtype of the values on the wire when it differs from ``spec.dtype`` (an allowed lossy cast), else
        None; ``metadata.json`` records it next to the feature's dtype."""
        return None

    def dense_shape(self, spec: FeatureSpec) -> tuple | None:
        """The dense shape of the main feature's values (``FixedLenFeature``), or None (variable length)."""
        return ()

    def features(self, spec: FeatureSpec) -> list[tuple[str, str, tuple | None]]:
        """The Example features that carry ``spec``: ``(name, kind, dense shape or None)``."""
        kind = "bytes" if spec.dtype is None else self.kind(spec.dtype)
        out = [(spec.name, kind, self.dense_shape(spec))]
        if self.shape_companion(spec):
            out.append((f"{spec.name}/shape", "int64", None))
        if spec.dtype is None:
            out.append((f"{spec.name}/dtype", "bytes", ()))
        return out

    def shape_companion(self, spec: FeatureSpec) -> bool:
        """True when each record carries the row's shape in a ``<name>/shape`` int64_list (the shape varies)."""
        return not spec.is_fixed

    # -- encode (NumPy, vectorized over a batch) ----------------------------------------------------
    def fixed_layout(self, spec: FeatureSpec) -> bool:
        """True when every row of a fixed-shape ``spec`` encodes to the same number of bytes, so the feature
        joins the fixed-layout block (``codec.encode.FixedLayout``)."""
        return False

    def fixed_data(self, spec: FeatureSpec, arr: np.ndarray) -> np.ndarray:
        """``(rows, n)`` uint8: the main feature's payload per row, ``arr`` being ``(rows, *spec.shape)`` of
        ``spec.dtype`` (checked). For kind ``bytes`` the payload is one value; otherwise packed values."""
        raise NotImplementedError

    def varint_values(self, spec: FeatureSpec, arr: np.ndarray) -> np.ndarray | None:
        """``(rows, n)`` uint64 when the main feature's payload is packed varints (an ``int64_list``), whose minimal
        lengths may differ from value to value (the codec then lays the rows out one by one, as protobuf does);
        None when :meth:`fixed_data` gives every row the same bytes count."""
        return None

    def fixed_column(self, spec: FeatureSpec, arr: np.ndarray) -> pa.Array:
        """The main feature of ``(rows, *spec.shape)`` rows as an Arrow list array (the tfx_bsl path)."""
        raise NotImplementedError

    def rows_column(self, spec: FeatureSpec, rows: Sequence[np.ndarray]) -> pa.Array:
        """The main feature of rows whose shape (or dtype) varies, as an Arrow list array."""
        raise NotImplementedError

    # -- decode --------------------------------------------------------------------------------------
    def decode(self, spec: FeatureSpec, values, shape: tuple, dtype: str) -> np.ndarray:
        """One record's main feature -> an array of ``shape`` and ``dtype``.

        ``values``: what ``codec.decode_feature`` returned for the main feature (a list of bytes, or an
        int64/float32 array). Raises RecordError naming the feature when the values do not fit.
        """
        raise NotImplementedError

    def batch_decodable(self, spec: FeatureSpec) -> bool:
        """True when :meth:`decode_flat` can decode a batch of the fixed-shape ``spec``."""
        return spec.is_fixed

    def batch_values(self, spec: FeatureSpec) -> int:
        """Values the main feature holds in every record of a fixed-shape ``spec``."""
        return 1

    def decode_flat(self, spec: FeatureSpec, values: pa.Array, n: int) -> np.ndarray:
        """The flattened values of ``n`` records (``batch_values`` each) -> ``(n, *spec.shape)``."""
        raise NotImplementedError

    def decode_native(self, spec: FeatureSpec, kind: str | None, values) -> np.ndarray:
        """Encodings whose Example feature is TensorFlow's native list form (``native``): a variable-length list of
        another writer's Example -> a 1-D array (see ``ListEncoding.decode_native``)."""
        raise NotImplementedError

    def to_tf(self, tf, spec: FeatureSpec, parsed, shape):
        """The parsed main feature of one example (``tf.io.parse_single_example`` with the spec from
        :meth:`features`) -> a tensor of the original dtype (``tf.string`` for S/U/V) and ``shape`` (an int32
        tensor), inside ``tf.data``. ``tf`` is the tensorflow module (the codec itself never imports it)."""
        raise NotImplementedError

    def to_tf_batch(self, tf, spec: FeatureSpec, parsed):
        """The parsed main feature of a batch of examples of a fixed-shape ``spec`` (``tf.io.parse_example``
        with the spec from :meth:`features`: ``[batch]`` strings, or ``[batch, *shape]`` numbers) -> a tensor
        ``[batch, *spec.shape]`` of the values :meth:`to_tf` gives each example, decoded in one step for the
        whole batch (``tf.io.decode_raw`` of a ``[batch]`` string tensor is one op; TFDS decodes its ``Tensor``
        features the same way). A record whose value has another size fails the batch (as it fails
        :meth:`to_tf`). This default calls :meth:`to_tf` with the batch shape, which is exact for encodings
        whose steps apply element-wise."""
        return self.to_tf(tf, spec, parsed, tf.concat([tf.shape(parsed)[:1], list(spec.shape)], 0))

    # -- verify ----------------------------------------------------------------------------------------
    def stored(self, spec: FeatureSpec, arr: np.ndarray, allow_lossy: Iterable[str] = ()) -> np.ndarray:
        """The value a round trip gives back for the source value ``arr`` (little-endian): ``arr`` itself for
        exact encodings."""
        return arr


# -- bytes of values ------------------------------------------------------------------------------------


def as_bytes(v, name: str | None = None, row: int | None = None) -> bytes:
    """``v`` as bytes (str as UTF-8). Raises RecordError for a str with no UTF-8 form (a lone surrogate)."""
    if isinstance(v, str):
        try:
            return v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _not_unicode(name, row, ord(v[e.start])) from None
    return bytes(v)


def _not_unicode(name: str | None, row: int | None, code: int) -> RecordError:
    """The error of a str value with no UTF-8 form; ``row`` is the row's index in its batch (the caller
    adds the batch's file and row range)."""
    what = "a lone surrogate" if 0xD800 <= code <= 0xDFFF else "above U+10FFFF"
    return RecordError(
        f"Feature '{name}' holds code point U+{code:04X} ({what}), which is not valid Unicode and has no UTF-8 form",
        feature=name,
        batch_row=row,
        hint="clean the strings, or store them as bytes (an 'S' dtype)",
    )


def check_unicode(name: str, values: np.ndarray, lengths: np.ndarray | None = None) -> None:
    """Raises RecordError (naming the feature and the batch row) when a ``'U'`` array holds a code point
    that is a lone surrogate or above U+10FFFF (NumPy stores any 32-bit value; UTF-8 cannot).

    ``values``: ``(rows, ...)`` array, or a flat array of all rows' elements with per-row ``lengths``.
    """
    if values.dtype.kind != "U" or values.size == 0:
        return
    codes = to_little_endian(values).view("<u4").reshape(-1)
    bad = np.flatnonzero((codes > 0x10FFFF) | ((codes >= 0xD800) & (codes <= 0xDFFF)))
    if not bad.size:
        return
    chars = values.dtype.itemsize // 4
    element = int(bad[0]) // chars
    if lengths is None:
        row = element // max(1, values.size // max(1, values.shape[0])) if values.ndim > 1 else element
    else:
        row = int(np.searchsorted(np.cumsum(lengths), element, side="right"))
    raise _not_unicode(name, row, int(codes[bad[0]]))


def le_bytes(arr: np.ndarray) -> np.ndarray:
    """``(rows, n)`` uint8: each row's little-endian C-order bytes (``arr`` is ``(rows, ...)``)."""
    rows = arr.shape[0]
    if not arr.size:
        return np.zeros((rows, 0), np.uint8)
    return to_little_endian(arr).reshape(rows, -1).view(np.uint8).reshape(rows, -1)


# -- Arrow list arrays (the input of tfx_bsl's RecordBatchToExamplesEncoder) -------------------------------


def _offsets(lengths: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] < 2**31:
        return pa.array(offsets.astype(np.int32))
    return pa.array(offsets)


def list_of(values: pa.Array, lengths: np.ndarray) -> pa.Array:
    """A list array whose row i holds the next ``lengths[i]`` of ``values`` (large offsets past 2**31)."""
    offsets = _offsets(lengths)
    cls = pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray
    return cls.from_arrays(offsets, values)


def one_value_per_row(data: np.ndarray) -> pa.Array:
    """``(rows, n)`` uint8 -> a list array of one bytes value per row (the row's ``n`` bytes); zero-copy."""
    num_rows, row_bytes = data.shape
    buf = pa.py_buffer(np.ascontiguousarray(data).reshape(-1)) if data.size else pa.py_buffer(b"")
    offsets = np.arange(num_rows + 1, dtype=np.int64) * row_bytes
    if offsets[-1] < 2**31:
        binary = pa.Array.from_buffers(pa.binary(), num_rows, [None, pa.py_buffer(offsets.astype(np.int32)), buf])
    else:
        binary = pa.Array.from_buffers(pa.large_binary(), num_rows, [None, pa.py_buffer(offsets), buf])
    return list_of(binary, np.ones(num_rows, dtype=np.int64))


def bytes_lists(rows: list[list[bytes]]) -> pa.Array:
    """A list array of bytes values, one Python list of bytes per row."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return list_of(pa.array([v for r in rows for v in r], pa.binary()), lengths)


def int_lists(rows: list[Sequence[int]]) -> pa.Array:
    """A list array of int64 values, one sequence of ints per row (the ``<name>/shape`` companion)."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    return list_of(pa.array([int(v) for r in rows for v in r], pa.int64()), lengths)


def one_bytes_value(spec: FeatureSpec, values, nbytes: int | None, shape: tuple, dtype: str) -> bytes:
    """The single bytes value of a ``bytes`` main feature holding a whole row, checked to be ``nbytes`` long
    (None: any length). Raises RecordError naming the feature."""
    raw = values[0] if len(values) == 1 else None
    if raw is None or (nbytes is not None and len(raw) != nbytes):
        got = f"{len(raw)} bytes" if raw is not None else f"{len(values)} values (0 bytes)"
        raise RecordError(
            f"Feature '{spec.name}' holds {got}, expected {nbytes} for {dtype} {shape}", feature=spec.name
        )
    return raw


def check_vlen(spec: FeatureSpec, encoding: Encoding) -> None:
    if spec.dtype == VLEN_BYTES:
        raise SchemaError(
            f"Feature '{spec.name}' holds variable-length strings: only the list encoding "
            f"can carry them, not '{encoding.name}'",
            hint="set its encoding to list",
        )
