"""What ``schema.pbtxt`` says of each feature and what it should say: the fields of tensorflow_metadata's Schema and
Feature messages, :class:`SchemaFeature` (the parts compared), the features a schema declares (parsed with our
text-format reader) and the ones a list of feature specs implies, and their :class:`Disagreement` s.
:mod:`schemacheck` checks an output's two files with them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Sequence

from tfrecord_etl.transforms.codec import FeatureSpec, encoding_of
from tfrecord_etl.transforms.output import schemafile
from tfrecord_etl.transforms.textproto import TextFormatError, parse_text

# The fields of tensorflow_metadata's Schema and Feature messages (schema.proto, 1.17); a test compares them
# with schema_pb2's descriptors.
SCHEMA_FIELDS = frozenset(
    {
        "feature",
        "sparse_feature",
        "weighted_feature",
        "string_domain",
        "float_domain",
        "int_domain",
        "default_environment",
        "represent_variable_length_as_ragged",
        "annotation",
        "dataset_constraints",
        "tensor_representation_group",
    }
)
FEATURE_FIELDS = frozenset(
    {
        "name",
        "deprecated",
        "presence",
        "group_presence",
        "shape",
        "value_count",
        "value_counts",
        "type",
        "domain",
        "int_domain",
        "float_domain",
        "string_domain",
        "bool_domain",
        "struct_domain",
        "natural_language_domain",
        "image_domain",
        "audio_domain",
        "video_domain",
        "content_chunk_domain",
        "mid_domain",
        "url_domain",
        "time_domain",
        "time_of_day_domain",
        "distribution_constraints",
        "annotation",
        "skew_comparator",
        "drift_comparator",
        "in_environment",
        "not_in_environment",
        "lifecycle_stage",
        "unique_constraints",
        "validation_derived_source",
        "sequence_metadata",
    }
)
TYPES = {"bytes": "BYTES", "int64": "INT", "float": "FLOAT"}
TAG_PREFIX = "tfrecord_etl."


# -- what a feature of the schema says --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SchemaFeature:
    """The fields of one Schema ``feature`` that are compared: ``type`` (``BYTES``, ``INT``, ``FLOAT``), ``shape``
    (dense dimensions, or None), ``value_count`` (``(min, max)``, None for an unset bound; None when absent),
    ``presence`` (``(min_fraction, min_count)``; None when absent), ``bool_domain`` (present), ``tags`` (our
    annotation tags, ``{"dtype": "<f8", ...}``)."""

    type: str
    shape: tuple | None = None
    value_count: tuple | None = None
    presence: tuple | None = None
    bool_domain: bool = False
    tags: tuple = ()
    domain: tuple | None = None  # a categorical feature's ("string", names) or ("int", (min, max))

    def show(self, field: str) -> str:
        value = getattr(self, field)
        if field == "bool_domain":
            return "present" if value else "absent"
        if field == "shape":
            return "absent" if value is None else json.dumps(list(value))
        if field == "domain":
            return "absent" if value is None else f"{value[0]}_domain {json.dumps(list(value[1]))}"
        if value is None:
            return "absent"
        return (
            str(value)
            if not isinstance(value, tuple)
            else "(" + ", ".join("unset" if v is None else str(v) for v in value) + ")"
        )


def expected_features(specs: Sequence[FeatureSpec]) -> list[tuple[str, SchemaFeature]]:
    """``[(Example feature name, what schema.pbtxt says of it)]`` for ``metadata.json``'s features, in the order
    :func:`schemafile.schema_text` writes them."""
    out = []
    for spec in specs:
        for name, kind, shape in schemafile.example_features(spec):
            bool_domain, tags = False, []
            if name == spec.name:
                bool_domain, tags, _ = schemafile.schema_types(spec, kind)
            if shape is not None:
                feature = SchemaFeature(TYPES[kind], tuple(int(d) for d in shape), None, (1.0, 1))
            else:
                optional = encoding_of(spec).optional
                feature = SchemaFeature(TYPES[kind], None, (0, None), (0.0, 0) if optional else None)
            domain = schemafile.categorical_domain(spec) if name == spec.name else None
            feature = dataclasses.replace(feature, bool_domain=bool_domain, tags=tag_items(tags), domain=domain)
            out.append((name, feature))
    return out


def tag_items(tags: Sequence[str]) -> tuple:
    """Our annotation tags as sorted ``(key, value)`` pairs (``tfrecord_etl.dtype:<f8`` -> ``("dtype", "<f8")``);
    a key given twice keeps both."""
    items = []
    for tag in tags:
        if tag.startswith(TAG_PREFIX) and ":" in tag:
            key, _, value = tag[len(TAG_PREFIX) :].partition(":")
            items.append((key, value))
    return tuple(sorted(items))


def number(value, cast, where: str):
    if not (isinstance(value, tuple) and value[0] == "id"):
        raise TextFormatError(f"{where} is not a number")
    text = value[1] if value[1].lower().lstrip("-+").startswith("inf") else value[1].rstrip("fFuUlL")
    try:
        return cast(text)
    except ValueError:
        raise TextFormatError(f"{where} is {value[1]!r}, not a number") from None


def schema_features(text: str) -> list[tuple[str, SchemaFeature]]:
    """``[(name, SchemaFeature)]`` of every ``feature`` of a Schema in text format, in file order.

    Raises:
      ValueError: not text format, a field name that TFMD's Schema or Feature message does not have, a feature
        without a name, or a field of ours with a value of the wrong kind.
    """
    out = []
    for field, value in parse_text(text):
        if field not in SCHEMA_FIELDS:
            raise TextFormatError(f"'{field}' is not a field of a Schema")
        if field != "feature":
            continue
        if not isinstance(value, list):
            raise TextFormatError("a feature that is not a message")
        names = [v for k, v in value if k == "name"]
        if len(names) != 1 or not isinstance(names[0], str):
            raise TextFormatError("a feature without a name (or with two)")
        name = names[0]
        info: dict = {"type": "TYPE_UNKNOWN", "tags": []}
        for key, v in value:
            if key not in FEATURE_FIELDS:
                raise TextFormatError(f"feature '{name}': '{key}' is not a field of a Feature")
            where = f"feature '{name}': {key}"
            if key == "type":
                if not (isinstance(v, tuple) and v[0] == "id"):
                    raise TextFormatError(f"{where} is not an enum value")
                info["type"] = v[1]
            elif key in (
                "shape",
                "value_count",
                "presence",
                "bool_domain",
                "annotation",
                "string_domain",
                "int_domain",
            ):
                if not isinstance(v, list):
                    raise TextFormatError(f"{where} is not a message")
                if key == "shape":
                    dims = []
                    for k, dim in v:
                        if k == "dim" and isinstance(dim, list):
                            sizes = [s for dk, s in dim if dk == "size"]
                            dims.append(number(sizes[-1], int, f"{where}.dim.size") if sizes else 0)
                    info["shape"] = tuple(dims)
                elif key == "value_count":
                    bounds = {k: number(b, int, f"{where}.{k}") for k, b in v if k in ("min", "max")}
                    info["value_count"] = (bounds.get("min"), bounds.get("max"))
                elif key == "presence":
                    fraction = dict(v)
                    info["presence"] = (
                        number(fraction["min_fraction"], float, f"{where}.min_fraction")
                        if "min_fraction" in fraction
                        else None,
                        number(fraction["min_count"], int, f"{where}.min_count") if "min_count" in fraction else None,
                    )
                elif key == "bool_domain":
                    info["bool_domain"] = True
                elif key == "string_domain":
                    info["domain"] = ("string", tuple(t for k, t in v if k == "value" and isinstance(t, str)))
                elif key == "int_domain":
                    bounds = {k: number(b, int, f"{where}.{k}") for k, b in v if k in ("min", "max")}
                    info["domain"] = ("int", (bounds.get("min"), bounds.get("max")))
                else:
                    info["tags"] += [t for k, t in v if k == "tag" and isinstance(t, str)]
        info["tags"] = tag_items(info["tags"])
        out.append((name, SchemaFeature(**info)))
    return out


# -- the comparison ------------------------------------------------------------------------------------------------

FIELDS = (
    ("type", "the type"),
    ("shape", "the shape"),
    ("value_count", "value_count (min, max)"),
    ("presence", "presence (min_fraction, min_count)"),
    ("bool_domain", "bool_domain"),
    ("domain", "the categorical domain"),
)


@dataclasses.dataclass(frozen=True)
class Disagreement:
    """One way ``schema.pbtxt`` and ``metadata.json`` differ: ``feature`` (an Example feature name, None for the
    file as a whole), ``what`` differs, and each file's value (``"absent"`` when it has none)."""

    feature: str | None
    what: str
    in_schema: str
    in_metadata: str

    def message(self) -> str:
        """One sentence: the feature, what differs and both values."""
        return self.detail() if self.feature is None else f"feature '{self.feature}': {self.detail()}"

    def detail(self) -> str:
        """:meth:`message` without the feature's name."""
        if self.feature is None:
            return f"schema.pbtxt {self.what}"
        return f"{self.what} is {self.in_schema} in schema.pbtxt, {self.in_metadata} in metadata.json"


def expected_text(specs: Sequence[FeatureSpec]) -> str | None:
    """The text :func:`schemafile.schema_text` writes for ``specs`` (protobuf's ``text_format``: fields in field-number
    order, two-space indents, printable text as UTF-8), made without protobuf; None when a name holds a
    control character, whose escaping is left to the parser. The fast path of :func:`check`: a ``schema.pbtxt`` equal
    to it agrees with ``metadata.json`` without being parsed (a test holds it equal to the writer's)."""
    lines = []

    def quoted(text: str) -> str | None:
        if not text.isprintable():  # control characters: the writer's octal escapes are left to the parser
            return None
        return '"' + text.replace("\\", "\\\\").replace("'", "\\'").replace('"', '\\"') + '"'

    for name, feature in expected_features(specs):
        q = quoted(name)
        if q is None:
            return None
        lines += ["feature {", f"  name: {q}"]
        if feature.value_count is not None:
            lines += ["  value_count {", f"    min: {feature.value_count[0]}", "  }"]
        lines.append(f"  type: {feature.type}")
        if feature.domain is not None and feature.domain[0] == "int":
            low, high = feature.domain[1]
            lines += ["  int_domain {", f"    min: {low}", f"    max: {high}", "    is_categorical: true", "  }"]
        elif feature.domain is not None:
            values = [quoted(v) for v in feature.domain[1]]
            if None in values:
                return None
            lines += ["  string_domain {", *(f"    value: {v}" for v in values), "  }"]
        if feature.bool_domain:
            lines += ["  bool_domain {", "  }"]
        if feature.presence is not None:
            lines += [
                "  presence {",
                f"    min_fraction: {float(feature.presence[0])!r}",
                f"    min_count: {feature.presence[1]}",
                "  }",
            ]
        if feature.tags:
            spec = next(s for s in specs if s.name == name)
            kind = next(k for n, k, _ in schemafile.example_features(spec) if n == name)
            _, tags, comment = schemafile.schema_types(spec, kind)
            comment = quoted(comment)
            if comment is None:
                return None
            lines += ["  annotation {", *(f"    tag: {quoted(t)}" for t in tags), f"    comment: {comment}", "  }"]
        if feature.shape is not None:
            lines += ["  shape {", *(f"    dim {{\n      size: {d}\n    }}" for d in feature.shape), "  }"]
        lines.append("}")
    return "\n".join(lines) + "\n" if lines else ""


def disagreements(schema_text: str, specs: Sequence[FeatureSpec]) -> list[Disagreement]:
    """What differs between ``schema.pbtxt``'s text and ``metadata.json``'s features ``specs`` (see the module
    docstring); ``[]`` when they agree. A text that is not a Schema is one disagreement (``feature`` None)."""
    try:
        found = schema_features(schema_text)
    except (ValueError, RecursionError) as e:
        return [Disagreement(None, f"is not a TensorFlow Metadata Schema in text format: {str(e)[:300]}", "", "")]
    want = expected_features(specs)
    have = dict(found)
    untagged = {s.name for s in specs if encoding_of(s).native}  # tagged since: none in earlier versions' schemas
    out = []
    if len(have) != len(found):
        twice = next(n for i, (n, _) in enumerate(found) if n in dict(found[:i]))
        out.append(Disagreement(twice, "the number of features of this name", "2 or more", "1"))
    for name, expected in want:
        got = have.pop(name, None)
        if got is None:
            out.append(Disagreement(name, "the feature", "absent", f"a feature of type {expected.type}"))
            continue
        if not got.tags and name in untagged:
            expected = dataclasses.replace(expected, tags=())  # an output written before list features had tags
        for field, label in FIELDS:
            if getattr(got, field) != getattr(expected, field):
                out.append(Disagreement(name, label, got.show(field), expected.show(field)))
        for key in sorted({k for k, _ in got.tags + expected.tags}):
            theirs, ours = ([v for k, v in f.tags if k == key] for f in (got, expected))
            if theirs != ours:
                out.append(
                    Disagreement(
                        name, f"its tfrecord_etl.{key} tag", ", ".join(theirs) or "absent", ", ".join(ours) or "absent"
                    )
                )
    for name, got in have.items():
        out.append(Disagreement(name, "the feature", f"a feature of type {got.type}", "absent"))
    if not out and [n for n, _ in found] != [n for n, _ in want]:
        out.append(Disagreement(None, "lists the features in another order than metadata.json", "", ""))
    return out


def proto_error(schema_text: str) -> str | None:
    """When protobuf and tensorflow_metadata are installed: why ``schema_text`` is not a ``schema_pb2.Schema`` in
    text format (``text_format.Parse``'s message), or None when it is. None too when they are not installed."""
    try:
        from google.protobuf import text_format
        from tensorflow_metadata.proto.v0 import schema_pb2
    except ImportError:
        return None
    try:
        text_format.Parse(schema_text, schema_pb2.Schema())
    except (text_format.ParseError, ValueError, RecursionError) as e:
        return str(e)[:300]
    return None


def proto_available() -> bool:
    try:
        return (
            importlib.util.find_spec("tensorflow_metadata") is not None
            and importlib.util.find_spec("google.protobuf") is not None
        )
    except (ImportError, ValueError):
        return False


# -- the readers' check --------------------------------------------------------------------------------------------
