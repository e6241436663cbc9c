"""Arrow columns as features: which feature(s) an Arrow field of a Parquet, Feather or Arrow IPC file becomes
(:func:`field_specs`) and the NumPy column of rows read for each (:func:`column_values`).

The mapping (Arrow's type -> the feature's dtype and per-row shape):

* numbers and bools (``int8``-``uint64``, ``float16``-``float64``, ``bool``): their dtype, shape ``()``;
  timestamps, dates and durations: ``datetime64``/``timedelta64`` of their unit (a timestamp's time zone is
  dropped: the values are UTC instants, as Arrow stores them);
* ``string``, ``large_string``, ``binary``, ``large_binary``, ``fixed_size_binary``: variable-length bytes
  (strings as UTF-8), shape ``()``;
* a ``dictionary`` column (pandas' categoricals): its values (strings for a dictionary of strings);
* ``fixed_size_list`` (nested: one dimension per level) and Arrow's fixed-shape tensor extension type
  (``arrow.fixed_shape_tensor``, its logical shape): N-D rows of their value type;
* ``list`` / ``large_list`` of numbers, bools or strings: 1-D rows of any length, the ``varlen`` feature
  (``tf.io.VarLenFeature``);
* ``struct``: one feature per field, ``NAME/FIELD`` (a Hugging Face ``Image`` column is ``image/bytes`` and
  ``image/path``);
* a scalar column holding nulls: 1-D rows of 0 or 1 values (``varlen``, where the ``list`` form is exact): the null
  row is the feature with no value, as TFX's ``ParquetExecutor`` writes it (``dict_to_example``).

Anything else (decimals, maps, unions, lists of lists, nulls inside a list or a fixed-size row) is refused in one
line naming the file, the column and what to do. pyarrow only; imported inside the functions.
"""

from __future__ import annotations

import numpy as np

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.errors import SchemaError, SourceError

TENSOR_EXTENSION = "arrow.fixed_shape_tensor"
MAX_RANK = 32  # NumPy's limit on dimensions


def _leaf(pa, typ):
    """``(value type, row shape, kind)`` of a column's type: kind ``scalar``, ``fixed``, ``list`` or ``bytes``;
    None for a type no feature carries."""
    if isinstance(typ, pa.BaseExtensionType):
        if typ.extension_name == TENSOR_EXTENSION:
            value, shape, _ = _leaf(pa, typ.value_type)
            return (value, tuple(int(d) for d in typ.shape), "fixed") if shape == () else None
        return _leaf(pa, typ.storage_type)
    t = pa.types
    if t.is_dictionary(typ):
        return _leaf(pa, typ.value_type)
    if t.is_fixed_size_list(typ):
        inner = _leaf(pa, typ.value_type)
        if inner is None or inner[2] == "list":
            return None
        return inner[0], (typ.list_size, *inner[1]), "fixed"
    if t.is_list(typ) or t.is_large_list(typ):
        inner = _leaf(pa, typ.value_type)
        return (inner[0], (None,), "list") if inner is not None and inner[1] == () else None
    if t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ):
        return typ, (), "bytes"
    if t.is_fixed_size_binary(typ) and not t.is_decimal(typ):
        return typ, (), "bytes"
    if t.is_integer(typ) or t.is_floating(typ) or t.is_boolean(typ) or t.is_temporal(typ):
        return (typ, (), "scalar") if _dtype(pa, typ) is not None else None
    return None


def _dtype(pa, typ) -> str | None:
    """The NumPy dtype string of a scalar Arrow type, VLEN_BYTES for strings and binaries, None when none fits."""
    t = pa.types
    if t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ) or t.is_large_binary(typ):
        return VLEN_BYTES
    if t.is_fixed_size_binary(typ):
        return VLEN_BYTES
    if t.is_timestamp(typ) or t.is_duration(typ):
        return f"<{'M' if t.is_timestamp(typ) else 'm'}8[{typ.unit}]"
    if t.is_date32(typ):
        return "<M8[D]"
    if t.is_date64(typ):
        return "<M8[ms]"
    if t.is_boolean(typ):
        return "|b1"
    if t.is_integer(typ) or t.is_floating(typ):  # (not to_pandas_dtype: it imports pandas, 0.8 s)
        kind = "f" if t.is_floating(typ) else "i" if t.is_signed_integer(typ) else "u"
        return np.dtype(f"{kind}{typ.bit_width // 8}").newbyteorder("<").str
    return None  # time32/time64, intervals


def field_specs(field, where: str, has_nulls, prefix: str = "") -> list[FeatureSpec]:
    """The features of the Arrow ``field`` (a ``pyarrow.Field``) of the file ``where``: one, or one per field of a
    struct (``NAME/FIELD``). ``has_nulls(name)``: the feature's column holds null rows (then a scalar column's
    rows are 1-D, 0 or 1 values, encoding ``varlen``).

    Raises:
      SchemaError: a type no feature carries (naming the column, its type and the way out), more than 32
        dimensions. (A tensor extension type whose shape is not its storage's size is refused by pyarrow when
        the file is opened.)
    """
    import pyarrow as pa

    name = prefix + field.name
    if pa.types.is_struct(field.type):
        return [s for child in field.type for s in field_specs(child, where, has_nulls, f"{name}/")]
    leaf = _leaf(pa, field.type)
    if leaf is None:
        raise SchemaError(
            f"Column '{name}' is of Arrow type {field.type}, which no feature carries (numbers, bools, times, "
            "strings, binaries, dictionaries of them, fixed-size lists, fixed-shape tensors, lists of numbers or "
            "strings, structs of these)",
            file=where,
            column=name,
            hint="leave it out with --datasets naming the other columns, or cast it with pyarrow (Table.cast) "
            "and write the file again",
        )
    value, shape, kind = leaf
    if len(shape) > MAX_RANK or any(d is not None and d < 0 for d in shape):
        raise SchemaError(f"Column '{name}' declares rows of shape {shape}", file=where, column=name)
    dtype = _dtype(pa, value)
    if kind == "list" or (shape == () and has_nulls(name)):
        return [FeatureSpec(name, dtype, (None,), "varlen")]
    return [FeatureSpec(name, dtype, shape, "list" if dtype == VLEN_BYTES else "tensor")]


def null_error(name: str, where: str, row: int, what: str) -> SourceError:
    return SourceError(
        f"Column '{name}' holds {what} at row {row}: no feature carries it",
        file=where,
        column=name,
        rows=row,
        hint="fill the nulls with pyarrow.compute.fill_null (or pandas' fillna) and write the file again, or "
        "leave the column out with --datasets",
    )


def column_values(spec: FeatureSpec, array, where: str, start: int):
    """The rows of ``array`` (a ``pyarrow.Array``, the column of ``spec`` for rows ``start`` ...) as ``spec``
    describes them: an array ``(rows, *shape)`` of ``spec.dtype``; for strings a list of ``bytes`` per row (a list
    of lists of ``bytes`` when 1-D); for ``(None,)`` rows a list of 1-D arrays (empty for a null row).

    Raises:
      SourceError: a null inside a fixed-size row or a list, or a null row of a fixed-size column, naming the
        column and the row.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array.type, pa.BaseExtensionType):
        if array.type.extension_name == TENSOR_EXTENSION:
            return _tensor_rows(spec, array, where, start)
        array = array.storage
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if spec.shape == (None,):
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
            values = array.flatten()
        else:  # a nullable scalar column: null -> no value, else one value
            lengths = array.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
            values = array.drop_null()
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        if values.null_count:
            row = start + int(np.searchsorted(np.cumsum(lengths), _first_null(values), side="right"))
            raise null_error(spec.name, where, row, "a null value inside a list")
        flat = _flat(values, spec.dtype)
        ends = np.cumsum(lengths)
        if isinstance(flat, list):  # strings: a list of bytes per row
            return [flat[e - n : e] for e, n in zip(ends.tolist(), lengths.tolist())]
        return np.split(flat, ends[:-1]) if len(lengths) else []
    if array.null_count:
        raise null_error(spec.name, where, start + _first_null(array), "a null row")
    rows = len(array)
    for _ in spec.shape:  # fixed-size lists, one level per dimension
        array = array.flatten()
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        if array.null_count:
            row = start + _first_null(array) * rows // max(1, len(array))
            raise null_error(spec.name, where, row, "a null value inside a fixed-size row")
    flat = _flat(array, spec.dtype)
    if spec.dtype == VLEN_BYTES:
        return flat if spec.shape == () else np.array(flat, dtype=object).reshape(rows, *spec.shape)
    return flat.reshape(rows, *spec.shape)


def _tensor_rows(spec: FeatureSpec, array, where: str, start: int) -> np.ndarray:
    """A fixed-shape tensor column's rows in their logical shape (pyarrow applies the type's permutation)."""
    if array.null_count:
        raise null_error(spec.name, where, start + _first_null(array), "a null row")
    values = array.storage.flatten()
    if values.null_count:
        row = start + _first_null(values) // max(1, array.type.storage_type.list_size)
        raise null_error(spec.name, where, row, "a null value inside a fixed-size row")
    out = array.to_numpy_ndarray().reshape(len(array), *spec.shape)
    return out.astype(np.dtype(spec.dtype).newbyteorder("="), copy=False)


def _first_null(array) -> int:
    return int(np.argmin(array.is_valid().to_numpy(zero_copy_only=False)))


def _flat(values, dtype: str):
    """A flat Arrow array (no nulls) as NumPy values of ``dtype``; strings and binaries as a list of ``bytes``."""
    if dtype == VLEN_BYTES:
        return [v if isinstance(v, bytes) else v.encode("utf-8") for v in values.to_pylist()]
    out = values.to_numpy(zero_copy_only=False)
    return out.astype(np.dtype(dtype).newbyteorder("="), copy=False)
