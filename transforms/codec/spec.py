"""Feature specs (the per-feature record of dtype, shape and encoding) and the dtype rules shared by every encoding."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError

VLEN_BYTES = "bytes"  # dtype marker of variable-length byte strings (h5py vlen strings, file keys)


MAX_RECORD_BYTES = 2**31 - 1  # protobuf's hard limit on one message


MAX_FEATURES = (
    10_000  # default limit on the features of one Example, and on the distinct names inferred (--max_features)
)


@dataclasses.dataclass(frozen=True)
class Categories:
    """The categories of a categorical column (an AnnData or pandas categorical, a CF ``flag_values`` variable).

    Attributes:
      values: the category names, in the source's order.
      codes: the code of each name, as stored (CF ``flag_values``); None for pandas' codes ``0 .. len(values) - 1``.
      ordered: pandas' ``ordered`` flag (CF flags and pandas ``HDFStore`` tables, where it is pickled: False).
      written: ``'strings'`` (the feature holds each row's category name, UTF-8 bytes; a missing value, code -1 or
        the CF ``_FillValue``, is the empty string) or ``'codes'`` (the feature holds the codes as stored).
      missing: the code of a missing value (AnnData and pandas: -1; CF: the ``_FillValue``), or None.
      origin: where the names come from, e.g. ``/uns/louvain_categories`` or ``flag_meanings``.
    """

    values: tuple[str, ...]
    codes: tuple[int, ...] | None = None
    ordered: bool = False
    written: str = "strings"
    missing: int | None = -1
    origin: str = ""

    def code_list(self) -> list[int]:
        """The code of each of :attr:`values`."""
        return list(self.codes) if self.codes is not None else list(range(len(self.values)))

    def to_json(self) -> dict:
        return {
            "values": list(self.values),
            "codes": self.code_list(),
            "ordered": self.ordered,
            "written": self.written,
            "missing": self.missing,
            "origin": self.origin,
        }

    @classmethod
    def from_json(cls, obj: Mapping) -> Categories:
        """Raises: SchemaError: a missing key or a value of the wrong type."""
        try:
            values = tuple(str(v) for v in obj["values"])
            codes = tuple(int(c) for c in obj["codes"])
            written = str(obj["written"])
            if len(codes) != len(values) or written not in ("strings", "codes"):
                raise ValueError("codes and values differ in length, or 'written' is neither strings nor codes")
            missing = obj.get("missing")
            return cls(
                values,
                None if codes == tuple(range(len(values))) else codes,
                bool(obj.get("ordered", False)),
                written,
                None if missing is None else int(missing),
                str(obj.get("origin", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SchemaError(f"Malformed categories entry: {e}") from None


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One feature of an Example.

    Attributes:
      name: feature key in the Example.
      dtype: NumPy dtype string in little-endian form (``'<f8'``, ``'|u1'``, ``'|S6'``, ``'<U4'``,
        ``'<M8[D]'``; values exact, dtype and shape kept, byte order normalised to little-endian: a ``>f8`` source is ``'<f8'``), ``'bytes'`` for variable-length byte strings, or None when it varies per example
        (tensor encoding only).
      shape: per-example shape; None for a dimension that varies between examples, or None for the
        whole shape when even the rank varies (the ``np.savez(**arrays)`` case).
      encoding: a name registered in ``transforms.codec.encodings.ENCODINGS`` (``tensor``, ``list``, ``zlib``,
        ``packbits``).
      categories: a categorical column's :class:`Categories` (written as strings or as codes), else None.
    """

    name: str
    dtype: str | None
    shape: tuple[int | None, ...] | None
    encoding: str = "tensor"
    categories: Categories | None = None

    @property
    def is_fixed(self) -> bool:
        """True when dtype and every dimension are known, so no per-example shape/dtype features exist."""
        return self.dtype is not None and self.shape is not None and all(d is not None for d in self.shape)

    @property
    def size(self) -> int | None:
        """Number of elements per example, or None when the shape varies."""
        return math.prod(self.shape) if self.shape is not None and None not in self.shape else None

    def to_json(self) -> dict:
        out: dict = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "encoding": self.encoding,
        }
        if self.categories is not None:
            out["categories"] = self.categories.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Mapping) -> FeatureSpec:
        """The spec of a feature entry as :meth:`to_json` writes it, parsed only; ``codec.spec_from_json`` also
        checks it against its encoding (what reading a ``metadata.json`` does).

        Raises:
          SchemaError: a missing key or a value of the wrong type.
        """
        try:
            spec = cls(
                str(obj["name"]),
                obj["dtype"],
                None if obj["shape"] is None else tuple(obj["shape"]),
                str(obj.get("encoding", "tensor")),
                None if obj.get("categories") is None else Categories.from_json(obj["categories"]),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise SchemaError(f"Malformed feature entry {obj!r}: {e}") from None
        return spec


def normalize_dtype(dt: np.dtype, where: str = "") -> str:
    """The little-endian dtype string of a supported non-structured dtype.

    Raises:
      SchemaError: object, float128, structured (flatten it first) and other unsupported dtypes.
    """
    dt = np.dtype(dt)
    at = f" ({where})" if where else ""
    if dt.fields is not None:
        raise SchemaError(f"Structured dtype {dt} must be flattened into fields first{at}")
    if dt.subdtype is not None:
        raise SchemaError(f"Subarray dtype {dt} must be expanded first{at}")
    kind, size = dt.kind, dt.itemsize
    ok = (
        (kind in "biu" and size in (1, 2, 4, 8))
        or (kind == "f" and size in (2, 4, 8))
        or (kind == "c" and size in (8, 16))
        or (kind in "SUV" and size > 0)
        or kind in "Mm"
    )
    if not ok:
        what = {
            "O": "object (Python objects; refused: input is never unpickled)",
            "f": f"float{size * 8} (no portable form)",
        }.get(kind, str(dt))
        raise SchemaError(
            f"Unsupported dtype {what}{at}",
            hint="convert the array to a supported dtype (bool, ints, floats up to 64 bits, "
            "complex64/128, fixed-width bytes/str) before converting",
        )
    return dt.newbyteorder("<").str if size > 1 or kind in "Mm" else dt.str


def flatten_fields(name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Splits a structured array of shape ``(rows, *s)`` into one ``(name/field, array)`` per leaf field.

    Nested compounds recurse (``name/outer/inner``); subarray fields add their dimensions to the end,
    as NumPy does: a field ``('<f4', (3,))`` becomes an array of shape ``(rows, *s, 3)``.
    """
    if array.dtype.fields is None:
        return [(name, array)]
    out = []
    for field in array.dtype.names:
        out.extend(flatten_fields(f"{name}/{field}", array[field]))
    return out


def to_little_endian(array: np.ndarray) -> np.ndarray:
    """A C-contiguous little-endian array with the same values (no copy when it already is one)."""
    dt = array.dtype
    if dt.byteorder == ">" or (dt.byteorder == "=" and not _NATIVE_LE):
        array = array.astype(dt.newbyteorder("<"))
    return np.ascontiguousarray(array)


_NATIVE_LE = np.little_endian
