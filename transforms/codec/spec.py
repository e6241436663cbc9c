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
    """

    name: str
    dtype: str | None
    shape: tuple[int | None, ...] | None
    encoding: str = "tensor"

    @property
    def is_fixed(self) -> bool:
        """True when dtype and every dimension are known, so no per-example shape/dtype features exist."""
        return self.dtype is not None and self.shape is not None and all(d is not None for d in self.shape)

    @property
    def size(self) -> int | None:
        """Number of elements per example, or None when the shape varies."""
        return math.prod(self.shape) if self.shape is not None and None not in self.shape else None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "encoding": self.encoding,
        }

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
            )
        except (KeyError, TypeError) as e:
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
