"""Feature encodings, one class each, registered in :data:`ENCODINGS` (the only place that knows their names).

* ``tensor`` (:mod:`.tensor`): one ``bytes_list`` value, the row's raw little-endian bytes.
* ``list`` (:mod:`.lists`): TensorFlow's native ``int64_list`` / ``float_list`` / ``bytes_list``.
* ``zlib`` (:mod:`.zlib`): the ``tensor`` bytes zlib-compressed (TFDS ``Encoding.ZLIB``).
* ``packbits`` (:mod:`.packbits`): bool (or 0/1 uint8) rows at one bit per element.
* ``varlen`` (:mod:`.varlen`): ``tf.io.VarLenFeature``, 1-D native lists of any length that a record may lack
  (the features of foreign collections, e.g. TFX ExampleGen's empty CSV cells).

``auto`` (the default of convert and augment) is not an encoding but the rule :func:`auto_encoding` that picks
``list`` or ``tensor`` per feature.

A new encoding is one :class:`Encoding` subclass in its own module, added to ``ENCODINGS`` below, plus its tests;
the config choices, the metadata, the schema, both readers and verify take it from here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tfrecord_etl.transforms.codec.encodings.base import Encoding, as_bytes, check_unicode
from tfrecord_etl.transforms.codec.encodings.lists import ListEncoding
from tfrecord_etl.transforms.codec.encodings.packbits import PackbitsEncoding
from tfrecord_etl.transforms.codec.encodings.tensor import TensorEncoding
from tfrecord_etl.transforms.codec.encodings.varlen import VarLenEncoding
from tfrecord_etl.transforms.codec.encodings.zlib import ZlibEncoding
from tfrecord_etl.transforms.codec.spec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.errors import SchemaError

ENCODINGS: dict[str, Encoding] = {
    e.name: e for e in (TensorEncoding(), ListEncoding(), ZlibEncoding(), PackbitsEncoding(), VarLenEncoding())
}

__all__ = [
    "AUTO",
    "AUTO_LIST_DTYPES",
    "AUTO_SMALL_VALUES",
    "auto_encoding",
    "collection_style",
    "ENCODINGS",
    "resolve_encoding",
    "Encoding",
    "ListEncoding",
    "PackbitsEncoding",
    "TensorEncoding",
    "VarLenEncoding",
    "ZlibEncoding",
    "as_bytes",
    "check_spec",
    "check_unicode",
    "encoding_of",
]


def encoding_of(spec: FeatureSpec) -> Encoding:
    """The registered encoding of ``spec``. Raises SchemaError for an unknown name."""
    try:
        return ENCODINGS[spec.encoding]
    except KeyError:
        raise SchemaError(
            f"Unknown encoding {spec.encoding!r} for feature '{spec.name}'", hint=f"use one of {tuple(ENCODINGS)}"
        ) from None


def check_spec(spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
    """Raises SchemaError when ``spec`` cannot be encoded as asked (unknown encoding, a dtype or shape its
    encoding cannot carry, a lossy cast not allowed by feature name)."""
    encoding_of(spec).check(spec, allow_lossy)


def spec_from_json(obj) -> FeatureSpec:
    """The :class:`FeatureSpec` of a ``metadata.json`` / ``manifest.json`` feature entry
    (:meth:`FeatureSpec.from_json`), checked against its encoding (:func:`check_spec`; a lossy list cast on record
    was allowed when it was written).

    Raises:
      SchemaError: a malformed entry, an unknown encoding, or a dtype or shape its encoding cannot carry.
    """
    spec = FeatureSpec.from_json(obj)
    check_spec(spec, allow_lossy=(spec.name,))
    return spec


AUTO = "auto"
# dtypes whose list form is exact and at most ~1.4x their raw bytes whatever their size (bench figures in the
# docs/encodings.md: float32 1.04x, bool 1.2x, uint32 1.32x, int64 1.39x; datetimes are int64 counts)
AUTO_LIST_DTYPES = frozenset({"<f4", "|b1", "<u4", "<i8"})
# exact but 1.6-10x larger as varints (uint8/int8 2x/10x, int16 5x, int32 2.6x, uint16 1.6x, float16 2.4x) and
# 8x larger again once TensorFlow parses them as int64: lists only for features of at most this many values
AUTO_SMALL_VALUES = 16


def auto_encoding(spec: FeatureSpec) -> str:
    """The encoding ``--encoding auto`` gives ``spec``: ``list`` (TensorFlow's typed ``int64_list`` /
    ``float_list`` / ``bytes_list``, which TFDV, TFX Transform and ``tf.io.FixedLenFeature`` read as numbers and
    strings) wherever that is exact and not much larger than the raw bytes; else ``tensor``. The rule:

    - strings (``bytes``, ``S``, ``U``): ``list``;
    - float32, bool, uint32, int64, datetime64/timedelta64: ``list`` (exact; <= 1.4x the raw bytes);
    - uint8, int8, uint16, int16, int32, float16: ``list`` for at most :data:`AUTO_SMALL_VALUES` (16) values per
      example (labels, small vectors), ``tensor`` above (images: 2x to 10x larger as varints);
    - float64, uint64 (a list would cast them, lossy), complex (no list form), void, and features whose dtype
      varies: ``tensor``.

    A source may propose ``varlen`` for 1-D rows of any length (``spec.encoding``, e.g. a Parquet list column):
    it is kept wherever it is exact (every dtype the ``list`` encoding keeps exact: not float64, uint64, complex).
    """
    if spec.encoding == "varlen":
        try:
            ENCODINGS["varlen"].check(spec)
            return "varlen"
        except SchemaError:
            pass
    return _auto_rule(spec)


def _auto_rule(spec: FeatureSpec) -> str:
    if spec.dtype is None:
        return "tensor"
    if spec.dtype == VLEN_BYTES:
        return "list"
    dt = np.dtype(spec.dtype)
    if dt.kind in "SU" or dt.kind in "Mm" or dt.str in AUTO_LIST_DTYPES:
        return "list"
    if dt.kind in "biuf" and dt.str not in ("<f8", "<u8") and spec.size is not None and spec.size <= AUTO_SMALL_VALUES:
        return "list"
    return "tensor"


def resolve_encoding(encoding: str, spec: FeatureSpec) -> str:
    """``encoding`` as asked for ``spec``: :func:`auto_encoding` for ``auto``, else itself."""
    return auto_encoding(spec) if encoding == AUTO else encoding


def collection_style(encoding: str, specs: Iterable[FeatureSpec]) -> str:
    """The default encoding of features added to a collection of ``specs`` (augment's new features) for
    ``--encoding encoding``: an explicit encoding as given; ``auto`` follows the collection: ``tensor`` when every
    feature with a fixed dtype is ``tensor``-encoded (an output of convert's ``--encoding tensor``), else ``auto``
    (typed lists where exact and not much larger, as in a collection of lists such as TFX ExampleGen's)."""
    if encoding != AUTO:
        return encoding
    typed = [s for s in specs if s.dtype is not None and s.dtype != VLEN_BYTES]
    return "tensor" if typed and all(s.encoding == "tensor" for s in typed) else AUTO
