"""Joins with an array source (HDF5 / .npz / .npy / Zarr / raw / ENVI / ..., read with the convert pipeline's sources
and its format options)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from tfrecord_etl.transforms import planning
from tfrecord_etl.transforms.augment.constants import parse_scalar
from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError, SourceError
from tfrecord_etl.transforms.sources import FileIndex, RowRange, Source, SourceOptions


@dataclasses.dataclass(frozen=True)
class JoinPlan:
    """An array source joined to the records, by position (row n -> record n) or by key.

    Attributes:
      fields: ``(source feature, new feature name)`` pairs. specs: the new features' specs.
      key_spec: the collection's key feature (key join). join_key: the source's key feature.
      defaults: new name -> value for a record whose key has no source row; None: that is an error.
    """

    pattern: str
    by: str
    source: Source
    indexes: tuple[FileIndex, ...]
    ranges: tuple[RowRange, ...]
    fields: tuple[tuple[str, str], ...]
    specs: tuple[FeatureSpec, ...]
    key_spec: FeatureSpec | None = None
    join_key: str | None = None
    defaults: dict | None = None

    @property
    def num_rows(self) -> int:
        return sum(i.num_rows for i in self.indexes)


def _key_kind(spec: FeatureSpec) -> str | None:
    if spec.dtype == VLEN_BYTES:
        return "bytes"
    if spec.dtype is None:
        return None
    kind = np.dtype(spec.dtype).kind
    return "int" if kind in "iu" else ("bytes" if kind in "SU" else None)


def key_of(value, where: dict) -> int | bytes:
    """A join key from a decoded value holding one element: a Python int, or bytes (str as UTF-8).

    Raises:
      RecordError: not exactly one element, or not an integer or string.
    """
    arr = np.asarray(value)
    if arr.size != 1:
        raise RecordError(f"The key holds {arr.size} values, expected 1", **where)
    v = arr.reshape(-1)[0]
    if isinstance(v, (bytes, np.bytes_)):
        return bytes(v)
    if isinstance(v, (str, np.str_)):
        return str(v).encode("utf-8")
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    raise RecordError(f"The key {v!r} is a {type(v).__name__}, expected an integer or a string", **where)


def default_value(spec: FeatureSpec, text: str):
    """A ``--defaults`` value for ``spec``: an array of its shape and dtype, or bytes. Raises ConfigError."""
    value = parse_scalar(text, spec.dtype, f"--defaults {spec.name}")
    if spec.dtype == VLEN_BYTES:
        if spec.shape == ():
            return value
        out = np.empty(spec.shape, object)
        out.fill(value)
        return out
    return np.full(spec.shape, value, dtype=spec.dtype)


def join_key_spec(
    pattern: str, old_specs: Sequence[FeatureSpec], by_name: dict, key_feature: str | None, join_key: str | None
) -> FeatureSpec:
    """A key join's input key feature (``--key_feature``), checked against the source's key (``--join_key``):
    both present, of kinds that can match (integers or strings), the source's one value per row.

    Raises:
      ConfigError: a key that is not a feature. SchemaError: key kinds that cannot match, or a source key of
        several values per row.
    """
    old = {s.name: s for s in old_specs}
    if key_feature not in old:
        raise ConfigError(
            f"--key_feature '{key_feature}' is not a feature of the input", hint=f"features are {sorted(old)}"
        )
    if join_key not in by_name:
        raise ConfigError(
            f"--join_key '{join_key}' is not a feature of the join source",
            file=pattern,
            hint=f"source features are {sorted(by_name)}",
        )
    key_spec, src_key = old[key_feature], by_name[join_key]
    kinds = (_key_kind(key_spec), _key_kind(src_key))
    if None in kinds or kinds[0] != kinds[1]:
        raise SchemaError(
            f"Cannot join key feature '{key_feature}' ({key_spec.dtype}) with source key "
            f"'{join_key}' ({src_key.dtype})",
            file=pattern,
            hint="both keys must be integers, or both strings",
        )
    if src_key.size != 1:
        raise SchemaError(
            f"Source key '{join_key}' has shape {src_key.shape}; a key is one value per row", file=pattern
        )
    return key_spec


def parse_defaults(specs: tuple[FeatureSpec, ...], defaults) -> dict:
    """``--missing default``: one parsed ``--defaults`` value per joined feature (``default_value``).

    Raises:
      ConfigError: a joined feature without a default, or a default for no joined feature.
    """
    defaults = dict(defaults or {})
    names = [s.name for s in specs]
    lacking, extra = [n for n in names if n not in defaults], sorted(set(defaults) - set(names))
    if lacking or extra:
        raise ConfigError(
            f"--missing default needs one --defaults value per joined feature: "
            f"{'missing ' + str(lacking) if lacking else 'unknown ' + str(extra)}",
            hint=f"joined features are {names}",
        )
    parsed_defaults = {s.name: default_value(s, defaults[s.name]) for s in specs}
    return parsed_defaults


def plan_join(
    pattern: str,
    by: str,
    old_specs: Sequence[FeatureSpec],
    *,
    key_feature=None,
    join_key=None,
    fields: Mapping[str, str] | None = None,
    datasets=None,
    options: SourceOptions | None = None,
    missing="error",
    defaults=None,
    encoding="tensor",
    allow_lossy=(),
) -> JoinPlan:
    """Indexes the join source (``planning.plan_inputs``) and checks the join options.

    Args:
      pattern: file pattern of HDF5 / .npz / .npy files (rows mode). by: ``position`` or ``key``.
      old_specs: the collection's features (the key feature is looked up there).
      fields: source feature -> new name (default: every source feature but the key, same name).
      datasets: HDF5 dataset paths to read (default all). options: the source's format options
        (:func:`join_source_options`; default: every format's defaults), ``datasets`` replacing theirs when given.
      missing/defaults: see :class:`JoinPlan`.

    Raises:
      ConfigError: unknown features or defaults. SchemaError: key kinds that cannot match.
      SourceError: unreadable source files.
    """
    options = options or SourceOptions()
    if datasets:
        options = dataclasses.replace(options, datasets=tuple(datasets))
    plan = planning.plan_inputs(pattern, options)
    src_specs = planning.choose_encodings(plan.specs, encoding, {}, allow_lossy)
    by_name = {s.name: s for s in src_specs}
    key_spec = join_key_spec(pattern, old_specs, by_name, key_feature, join_key) if by == "key" else None
    fields = dict(fields) if fields else {n: n for n in by_name if n != join_key}
    unknown = sorted(set(fields) - set(by_name))
    if unknown:
        raise ConfigError(
            f"--join_fields names {unknown}, which the join source does not have",
            file=pattern,
            hint=f"source features are {sorted(by_name)}",
        )
    specs = tuple(dataclasses.replace(by_name[src], name=new) for src, new in fields.items())
    parsed_defaults = parse_defaults(specs, defaults) if missing == "default" else None
    return JoinPlan(
        pattern,
        by,
        plan.source,
        plan.indexes,
        plan.ranges,
        tuple(fields.items()),
        specs,
        key_spec,
        join_key,
        parsed_defaults,
    )


def join_source_options(cfg) -> SourceOptions:
    """The :class:`SourceOptions` of augment's join source: the format options of ``cfg`` (an ``AugmentConfig``:
    ``--envi_rows``, ``--dtype``, ``--npz_mode``, ``--container_mode``, ...), built as convert builds its own
    (``planning.format_source_options``), with ``--join_datasets`` as the datasets; the shared options (range size,
    symlinks, empty rows) keep their defaults."""
    return SourceOptions(**planning.format_source_options(cfg, datasets=getattr(cfg, "join_datasets", None)))


def _concat(parts: list):
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
    return [v for p in parts for v in p]


def read_source_rows(join: JoinPlan, start: int, stop: int) -> dict:
    """The join fields of source rows ``[start, stop)`` (rows numbered across the source files in order).

    Returns ``{new name: column}`` (arrays ``(rows, *shape)``, or lists for variable-length strings).

    Raises:
      SourceError: the source has fewer rows than asked (a position join on a collection with more
        records than source rows).
    """
    parts, base = [], 0
    for index in join.indexes:
        lo, hi = max(start, base), min(stop, base + index.num_rows)
        if lo < hi:
            parts.append(join.source.read_pinned(RowRange(index.path, lo - base, hi - base, index.items)))
        base += index.num_rows
    if stop > base:
        raise SourceError(
            f"The join source has {base} rows, but record {stop - 1} needs row {stop - 1}",
            file=join.pattern,
            hint="--join_by position needs one source row per record",
        )
    return {new: _concat([p[src] for p in parts]) for src, new in join.fields}


def stack_joined(spec: FeatureSpec, values: list):
    """The joined ``values`` of one feature as its batch: one ndarray of ``spec``'s dtype, shape ``(len(values),
    *spec.shape)``, for a fixed shape; the list itself for bytes and shapes that vary."""
    if spec.dtype == VLEN_BYTES or not spec.is_fixed:
        return list(values)
    return np.stack([np.asarray(v) for v in values]).astype(np.dtype(spec.dtype), copy=False)
