"""``schema.pbtxt``: the features of an output as a tensorflow_metadata Schema, written beside ``metadata.json``
(:mod:`metadata`) and read back (:func:`specs_from_schema`).

``schema.pbtxt`` is a tensorflow_metadata Schema with one feature per Example feature (dense shapes
for fixed ``list`` features; a single bytes value for ``tensor`` features; ``varlen`` features optional,
``presence.min_fraction`` 0), so TFX tools (TFXIO, TFDV, Transform) read the data. Two typed additions, where
TFMD's ``schema.proto`` has a place for them: a bool feature carried as ``int64_list`` (``list``/``varlen``) gets
``bool_domain {}`` (``Feature.bool_domain``: the INT values are 0 and 1); a feature carried as opaque bytes
(``tensor``, ``zlib``, ``packbits``) gets an ``annotation`` (``Feature.annotation``, ``Annotation.tag`` and
``Annotation.comment``) with tags ``tfrecord_etl.encoding:tensor``, ``tfrecord_etl.dtype:<f8`` (absent when the
dtype varies) and ``tfrecord_etl.shape:[64, 64, 3]`` (``null`` for a varying dimension) and a comment saying how
to decode it. Features carried as native lists (``list``, ``varlen``) get the same tags (``tfrecord_etl.dtype:<f2``
on a FLOAT feature), so the two files pin every field of each other's features; their schema of an earlier
version has no annotation and is read as before (:mod:`transforms.collections.schemacheck`). Readers of the schema
(TFXIO, TFDV, :func:`specs_from_schema`) ignore both: TFXIO's tensors and TFDV's statistics stay INT and BYTES.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec, encoding_of
from tfrecord_etl.transforms.errors import SchemaError


def example_features(spec: FeatureSpec) -> list[tuple[str, str, tuple | None]]:
    """The Example features that carry ``spec``: ``(name, kind, dense shape or None)``.

    ``kind`` is ``'bytes'``, ``'int64'`` or ``'float'``; a None shape means variable length.
    """
    return encoding_of(spec).features(spec)


def check_unique(specs: Sequence[FeatureSpec]) -> None:
    """Raises SchemaError when two features (or their shape/dtype companions) share an Example key."""
    seen: dict[str, str] = {}
    for spec in specs:
        for name, _, _ in example_features(spec):
            if name in seen:
                raise SchemaError(
                    f"Duplicate feature name '{name}' (from '{seen[name]}' and '{spec.name}')",
                    hint="rename one of them",
                )
            seen[name] = spec.name


def schema_text(specs: Sequence[FeatureSpec], native_tags: bool = True) -> str:
    """The tensorflow_metadata Schema of ``specs`` in text format. ``native_tags=False``: without the annotation
    of the native list features, the text earlier versions wrote (a collection's span written before them has
    that schema's fingerprint: ``collection.same_schema``)."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = schema_pb2.Schema()
    types = {"bytes": schema_pb2.BYTES, "int64": schema_pb2.INT, "float": schema_pb2.FLOAT}
    for spec in specs:
        for name, kind, shape in example_features(spec):
            f = schema.feature.add(name=name, type=types[kind])
            if shape is not None:
                f.shape.SetInParent()
                for d in shape:
                    f.shape.dim.add(size=int(d))
                f.presence.min_fraction = 1.0
                f.presence.min_count = 1
            else:
                f.value_count.min = 0
                if encoding_of(spec).optional:  # varlen: records may lack it (TFMD presence)
                    f.presence.min_fraction = 0.0
                    f.presence.min_count = 0
            if name == spec.name:
                domain = categorical_domain(spec)
                if domain is not None and domain[0] == "string":
                    f.string_domain.value.extend(domain[1])
                elif domain is not None:
                    f.int_domain.min, f.int_domain.max = domain[1]
                    f.int_domain.is_categorical = True
                _add_types(f, spec, kind, native_tags)
    return text_format.MessageToString(schema)


MAX_DOMAIN_VALUES = 10_000  # names of a StringDomain: a column of more (cell ids) has none, metadata.json lists them


def categorical_domain(spec: FeatureSpec) -> tuple[str, tuple] | None:
    """The domain ``schema.pbtxt`` gives a categorical feature (tensorflow_metadata's ``StringDomain`` and
    ``IntDomain``): ``("string", names)`` when it is written as its names (at most :data:`MAX_DOMAIN_VALUES`
    of them, else None), ``("int", (least code, greatest code))`` (``is_categorical``, the missing code included)
    when written as codes; None for other features."""
    cats = spec.categories
    if cats is None:
        return None
    if cats.written == "strings":
        if len(cats.values) > MAX_DOMAIN_VALUES:
            return None
        return "string", tuple(cats.values)
    codes = cats.code_list() + ([cats.missing] if cats.missing is not None else [])
    return "int", (min(codes), max(codes)) if codes else (0, 0)


def _add_types(f, spec: FeatureSpec, kind: str, native_tags: bool = True) -> None:
    """``bool_domain`` for a bool carried as int64, an ``annotation`` with the encoding, dtype and shape of the
    feature (see the module docstring)."""
    bool_domain, tags, comment = schema_types(spec, kind)
    if bool_domain:
        f.bool_domain.SetInParent()
    if tags and (native_tags or not encoding_of(spec).native):
        f.annotation.tag.extend(tags)
        f.annotation.comment.append(comment)


def schema_types(spec: FeatureSpec, kind: str) -> tuple[bool, list[str], str | None]:
    """What ``schema.pbtxt`` adds to the Example feature ``spec.name`` of kind ``kind`` (see the module docstring):
    ``(bool_domain, annotation tags, annotation comment)``: every feature gets its tags (encoding, dtype unless it
    varies, shape), so ``schema.pbtxt`` pins every field of ``metadata.json``'s feature, the dtype of a ``list``
    feature too (``<f4`` and ``<f2`` are both FLOAT). The one source of both the writer (:func:`schema_text`) and
    the check that a schema agrees with its metadata (:mod:`transforms.collections.schemacheck`)."""
    encoding = encoding_of(spec)
    bool_domain = kind == "int64" and spec.dtype == "|b1"
    shape = json.dumps(list(spec.shape)) if spec.shape is not None else "null"
    tags = [f"tfrecord_etl.encoding:{spec.encoding}"]
    if spec.dtype is not None:
        tags.append(f"tfrecord_etl.dtype:{spec.dtype}")
    tags.append(f"tfrecord_etl.shape:{shape}")
    if spec.categories is not None:
        tags.append(f"tfrecord_etl.categorical:{spec.categories.written}")
    what = f"a {spec.dtype} array" if spec.dtype is not None else f"an array (dtype in '{spec.name}/dtype')"
    varies = f" (null: varies, see '{spec.name}/shape')" if not spec.is_fixed else ""
    if encoding.native:
        comment = (
            f"{spec.encoding} encoding: {what} of shape {shape}{varies} as the {kind}_list of its values in C order "
            f"(tf.io.parse_example reads it); tfrecord_etl's readers cast it to {spec.dtype}"
        )
        if spec.categories is not None:
            comment += (
                "; a categorical column written as its category names (the empty string: a missing value)"
                if spec.categories.written == "strings"
                else "; a categorical column written as its codes: metadata.json's categories maps them to names"
            )
        return bool_domain, tags, comment
    comment = (
        f"{spec.encoding} encoding: one bytes value holding {what} of shape {shape}{varies}, "
        f"{_HOW.get(spec.encoding, 'see metadata.json')}; tfrecord_etl's reader.to_tf_dataset decodes it"
    )
    return bool_domain, tags, comment


_HOW = {
    "tensor": "its raw little-endian bytes (tf.io.decode_raw, then reshape)",
    "zlib": "its raw little-endian bytes zlib-compressed (tf.io.decode_compressed(x, 'ZLIB'), then decode_raw)",
    "packbits": "np.packbits of each row of the last axis (np.unpackbits)",
}


def specs_from_schema(text: str, path: str = "") -> tuple[FeatureSpec, ...]:
    """The features a tensorflow_metadata Schema in text format declares (``schema.pbtxt``, e.g. from TFX SchemaGen),
    as TensorFlow's ``schema_as_feature_spec`` reads them: a feature with a ``shape``, or required in every record
    (``presence.min_fraction`` 1) with ``value_count`` min = max = n, is a fixed ``list`` (``FixedLenFeature``);
    every other feature is ``varlen`` (``VarLenFeature``). ``INT`` -> ``'<i8'``, ``FLOAT`` -> ``'<f4'``, ``BYTES`` ->
    ``'bytes'``. Features marked deprecated (``lifecycle_stage`` DEPRECATED) are left out, as TFX does.

    Raises:
      SchemaError: not a Schema in text format, or a feature of another type (``STRUCT``: sequence examples),
        naming the file and the feature.
    """
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = schema_pb2.Schema()
    try:
        text_format.Parse(text, schema)
    except text_format.ParseError as e:
        raise SchemaError(
            f"Not a tensorflow_metadata Schema in text format: {e}",
            file=path or None,
            hint="pass a schema.pbtxt such as TFX SchemaGen writes",
        ) from None
    dtypes = {schema_pb2.INT: "<i8", schema_pb2.FLOAT: "<f4", schema_pb2.BYTES: VLEN_BYTES}
    specs = []
    for f in schema.feature:
        if f.lifecycle_stage == schema_pb2.DEPRECATED:
            continue
        if f.type not in dtypes:
            raise SchemaError(
                f"Feature '{f.name}' has type {schema_pb2.FeatureType.Name(f.type)}: only INT, FLOAT "
                "and BYTES features of tf.train.Example are supported",
                file=path or None,
                feature=f.name,
                hint="SequenceExample collections are not supported",
            )
        if f.HasField("shape"):
            specs.append(FeatureSpec(f.name, dtypes[f.type], tuple(int(d.size) for d in f.shape.dim), "list"))
        elif (
            f.HasField("value_count")
            and f.value_count.min == f.value_count.max
            and f.value_count.min > 0
            and f.presence.min_fraction == 1.0
        ):
            specs.append(FeatureSpec(f.name, dtypes[f.type], (int(f.value_count.min),), "list"))
        else:
            specs.append(FeatureSpec(f.name, dtypes[f.type], (None,), "varlen"))
    if not specs:
        raise SchemaError("The schema declares no feature", file=path or None)
    return tuple(specs)
