"""The ``varlen`` encoding: TensorFlow's ``tf.io.VarLenFeature``, a native list of any length that a record may lack.

The form of the features other writers leave variable: TFX ExampleGen writes a ``Feature`` with no kind set for an
empty CSV cell and leaves optional features out, and ``tf.io.parse_example`` reads such features as
``VarLenFeature`` (a ``SparseTensor``; ragged when batched). A ``varlen`` feature is one 1-D list per record (shape
``(None,)``), with no ``<name>/shape`` companion; a record without the feature, or with a ``Feature`` whose kind is
not set, holds the empty list. TFMD marks it optional (``presence.min_fraction`` 0, ``value_count.min`` 0).

Values are encoded and decoded as the ``list`` encoding does (``int64_list`` for bool/ints, ``float_list`` for
float16/32, ``bytes_list`` for strings); only the shape rule differs.
"""

from __future__ import annotations

from collections.abc import Iterable

from tfrecord_etl.transforms.codec.encodings.lists import ListEncoding
from tfrecord_etl.transforms.codec.spec import FeatureSpec
from tfrecord_etl.transforms.errors import SchemaError


class VarLenEncoding(ListEncoding):
    """Row (1-D, any length) -> ``Feature{int64_list | float_list | bytes_list}``; absent or kind-less = empty."""

    name = "varlen"
    optional = True
    tfds_encoding = None  # TFDS requires every feature in every record

    def check(self, spec: FeatureSpec, allow_lossy: Iterable[str] = ()) -> None:
        super().check(spec, allow_lossy)
        if spec.shape != (None,):
            raise SchemaError(
                f"Feature '{spec.name}' has shape {spec.shape}: the varlen encoding carries 1-D rows "
                "of varying length (shape (None,))",
                feature=spec.name,
                hint="use the list encoding for fixed or multi-dimensional shapes",
            )

    def shape_companion(self, spec: FeatureSpec) -> bool:
        return False

    def batch_decodable(self, spec: FeatureSpec) -> bool:
        return False
