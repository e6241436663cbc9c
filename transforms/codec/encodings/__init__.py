"""Feature encodings, one class each, registered in :data:`ENCODINGS` (the only place that knows their names).

* ``tensor`` (:mod:`.tensor`, the default): one ``bytes_list`` value, the row's raw little-endian bytes.
* ``list`` (:mod:`.lists`): TensorFlow's native ``int64_list`` / ``float_list`` / ``bytes_list``.
* ``zlib`` (:mod:`.zlib`): the ``tensor`` bytes zlib-compressed (TFDS ``Encoding.ZLIB``).
* ``packbits`` (:mod:`.packbits`): bool (or 0/1 uint8) rows at one bit per element.
* ``varlen`` (:mod:`.varlen`): ``tf.io.VarLenFeature``, 1-D native lists of any length that a record may lack
  (the features of foreign collections, e.g. TFX ExampleGen's empty CSV cells).

A new encoding is one :class:`Encoding` subclass in its own module, added to ``ENCODINGS`` below, plus its tests;
the config choices, the metadata, the schema, both readers and verify take it from here.
"""
from __future__ import annotations

from typing import Iterable

from tfrecord_etl.transforms.codec.spec import FeatureSpec
from tfrecord_etl.transforms.codec.encodings.base import Encoding, as_bytes, check_unicode
from tfrecord_etl.transforms.codec.encodings.lists import ListEncoding
from tfrecord_etl.transforms.codec.encodings.packbits import PackbitsEncoding
from tfrecord_etl.transforms.codec.encodings.tensor import TensorEncoding
from tfrecord_etl.transforms.codec.encodings.varlen import VarLenEncoding
from tfrecord_etl.transforms.codec.encodings.zlib import ZlibEncoding
from tfrecord_etl.transforms.errors import SchemaError

ENCODINGS: dict[str, Encoding] = {e.name: e for e in (TensorEncoding(), ListEncoding(), ZlibEncoding(),
                                                      PackbitsEncoding(), VarLenEncoding())}

__all__ = ["ENCODINGS", "Encoding", "ListEncoding", "PackbitsEncoding", "TensorEncoding", "VarLenEncoding", "ZlibEncoding",
           "as_bytes", "check_spec", "check_unicode", "encoding_of"]


def encoding_of(spec: FeatureSpec) -> Encoding:
    """The registered encoding of ``spec``. Raises SchemaError for an unknown name."""
    try:
        return ENCODINGS[spec.encoding]
    except KeyError:
        raise SchemaError(f"Unknown encoding {spec.encoding!r} for feature '{spec.name}'",
                          hint=f"use one of {tuple(ENCODINGS)}") from None


def check_spec(spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
    """Raises SchemaError when ``spec`` cannot be encoded as asked (unknown encoding, a dtype or shape its
    encoding cannot carry, a lossy cast not allowed by feature name)."""
    encoding_of(spec).check(spec, allow_lossy)
