"""The augment plan, made in named steps before the pipeline runs: :func:`plan_augment` composes them.

Each step checks one thing a user can get wrong and fails with a one-line error (``ConfigError``, ``SourceError``,
``SchemaError``, ``RecordError``) before any output exists; the order of the steps is the order of those checks.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from tfrecord_etl.transforms import compression, planning
from tfrecord_etl.transforms.augment.collection import InputCollection, output_name, resolve_input
from tfrecord_etl.transforms.augment.common import BATCH_MB, MODES, PROBE_RECORDS, RESERVED_NAMES, frame_error, log
from tfrecord_etl.transforms.augment.constants import parse_constant
from tfrecord_etl.transforms.augment.join import JoinPlan, join_source_options, plan_join
from tfrecord_etl.transforms.augment.plan import AugmentPlan
from tfrecord_etl.transforms.augment.readers import plan_reader_files
from tfrecord_etl.transforms.augment.records import InputShard
from tfrecord_etl.transforms.augment.values import fn_columns, load_function, spec_of, value_bytes
from tfrecord_etl.transforms.codec import MAX_FEATURES, FeatureSpec, as_varlen, check_example_frame, check_spec
from tfrecord_etl.transforms.codec.encodings import collection_style
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError, SourceError
from tfrecord_etl.transforms.output import outdir, schemafile, tfrecord
from tfrecord_etl.transforms.sources import SourceOptions, option_models
from tfrecord_etl.transforms.storage import fileio


class RecordLimits(NamedTuple):
    """The limits every record is checked against: bytes per record (``--max_record_mb``) and features per record
    (``--max_features``)."""

    max_record_bytes: int
    max_features: int


class FnProbe(NamedTuple):
    """What ``--fn`` returned for the first records: its outputs' specs and its values' bytes per record."""

    specs: list[FeatureSpec]
    bytes_per_record: int


def plan_augment(cfg) -> AugmentPlan:
    """Plans a run from a validated config (``tfrecord_etl.transforms.augment.config.AugmentConfig`` or any object
    with its fields).

    Every user error surfaces here, before any output exists: options, inputs, the join source, the
    new fields' dtypes and shapes (``--fn`` is called once on the first records), name clashes with
    the known features, and a position join's row count when the record counts are known.

    Raises:
      ConfigError, SourceError, SchemaError, RecordError.
    """
    check_options(cfg)
    limits = record_limits(cfg)
    collection, sample = resolve_input(cfg.input, cfg.compression, None, *limits, getattr(cfg, "input_schema", None))
    out_comp, codec = choose_output_compression(cfg, collection)
    shards = name_output_shards(cfg, collection, out_comp)
    fn_specs = fn_input_specs(cfg, collection)
    encoding = collection_style(cfg.encoding, collection.specs)
    probe = probe_fn(cfg, sample, shards[0].path if shards else cfg.input, fn_specs, encoding, limits)
    join = plan_join_source(cfg, collection, encoding)
    constants, constant_specs = parse_constants(cfg, encoding)
    new_specs = check_new_features(
        cfg, (probe.specs if probe else []) + (list(join.specs) if join else []) + constant_specs
    )
    drop_keys = replaced_keys(cfg, collection, new_specs)
    shards = join_offsets(cfg, join, collection, shards)
    plan = AugmentPlan(
        collection=dataclasses.replace(collection, shards=shards),
        output_dir=cfg.output_dir,
        mode=cfg.mode,
        output_compression=out_comp,
        new_specs=tuple(new_specs),
        fn=cfg.fn,
        fn_specs=fn_specs,
        fn_batch=cfg.fn_batch,
        constants=constants,
        join=join,
        replace=tuple(cfg.replace_fields),
        drop_keys=tuple(drop_keys),
        allow_lossy=tuple(cfg.allow_lossy),
        batch_size=choose_batch_size(cfg, probe),
        options=cfg.model_dump(),
        max_record_bytes=limits.max_record_bytes,
        max_features=limits.max_features,
        codec=codec,
    )
    schemafile.check_unique(plan.output_specs)
    return dataclasses.replace(plan, readers=plan_reader_files(plan.collection, plan.mode, out_comp, plan.output_specs))


def check_options(cfg) -> None:
    """Step 1: the options that only make sense together (ConfigError naming every problem at once)."""
    problems = []
    if cfg.mode not in MODES:
        problems.append(f"--mode must be one of {MODES}")
    if not (cfg.fn or cfg.join_input or cfg.constants):
        problems.append("nothing to add: give --fn, --join_input or --constants")
    if (cfg.fn_inputs or cfg.fn_batch) and not cfg.fn:
        problems.append("--fn_inputs and --fn_batch need --fn")
    if cfg.join_input and cfg.join_by == "key" and not (cfg.key_feature and cfg.join_key):
        problems.append("--join_by key needs --key_feature (the input's key) and --join_key (the source's)")
    if (cfg.key_feature or cfg.join_key) and not (cfg.join_input and cfg.join_by == "key"):
        problems.append("--key_feature and --join_key need --join_input and --join_by key")
    if (cfg.join_fields or cfg.join_datasets) and not cfg.join_input:
        problems.append("--join_fields and --join_datasets need --join_input")
    source_flags = sorted(
        set(getattr(cfg, "model_fields_set", ())) & {n for m in option_models() for n in m.model_fields}
    )
    if source_flags and not cfg.join_input:
        problems.append(f"{', '.join('--' + n for n in source_flags)} describe the join source: they need --join_input")
    if cfg.missing == "default" and not (cfg.join_input and cfg.join_by == "key"):
        problems.append("--missing default needs --join_by key")
    if cfg.defaults and cfg.missing != "default":
        problems.append("--defaults needs --missing default")
    if cfg.replace_fields and cfg.mode == "sidecar":
        problems.append(
            "--replace_fields needs --mode rewrite: a sidecar cannot remove a value from the original records"
        )
    if problems:
        raise ConfigError("; ".join(problems), hint="see tfrecord-etl augment --help")


def record_limits(cfg) -> RecordLimits:
    """Step 2: the record limits of the run, from ``--max_record_mb`` and ``--max_features`` (or their defaults)."""
    return RecordLimits(
        tfrecord.record_limit(getattr(cfg, "max_record_mb", None)), getattr(cfg, "max_features", None) or MAX_FEATURES
    )


def choose_output_compression(cfg, collection: InputCollection) -> tuple[str, dict | None]:
    """Step 3: the output shards' compression (``--output_compression``, else the input's) and its backend.

    Raises:
      ConfigError: input shards of several compressions and no ``--output_compression``; a bad
        ``--compression_level``.
    """
    comps = collection.compressions
    if cfg.output_compression is None and len(comps) > 1:
        raise ConfigError(
            f"The input shards use several compressions {sorted(comps)}",
            hint="choose the output's with --output_compression",
        )
    out_comp = cfg.output_compression or comps.pop()
    return out_comp, _codec(out_comp, getattr(cfg, "compression_level", None))


def name_output_shards(cfg, collection: InputCollection, out_comp: str) -> tuple[InputShard, ...]:
    """Step 4: each input shard with the name of its output shard (``output_file``), checked: distinct, not a name
    of ours, no input inside the output directory.

    Raises:
      ConfigError: two shards with one output name, a reserved or temporary name, an input in the output directory.
    """
    shards = tuple(
        dataclasses.replace(s, output_file=output_name(s.path, s.compression, out_comp)) for s in collection.shards
    )
    names = [s.output_file for s in shards]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(
            f"Two input shards would write the same output file '{dupes[0]}'",
            file=cfg.input,
            hint="input shards need distinct file names (augment one directory at a time)",
        )
    bad = [n for n in names if n in RESERVED_NAMES or n.startswith(outdir.TEMP_PREFIX)]
    if bad:
        raise ConfigError(
            f"Input file '{bad[0]}' is not a shard name this pipeline can write",
            file=cfg.input,
            hint="narrow the --input pattern to the TFRecord shards",
        )
    outdir.check_inputs_outside(cfg.output_dir, [s.path for s in shards] + _join_paths(cfg.join_input))
    return shards


def _where(collection: InputCollection) -> str:
    """Where the input's features come from, for the messages: the first records, ``--schema`` or its metadata."""
    if collection.inferred:
        return " (inferred from the first records)"
    return f" (declared by --schema {collection.schema_file})" if collection.schema_file else ""


def fn_input_specs(cfg, collection: InputCollection) -> tuple[FeatureSpec, ...]:
    """Step 5: the specs of the features ``--fn`` gets (``--fn_inputs``); for a collection whose features were
    inferred from a sample, as ``tf.io.VarLenFeature`` gives them (1-D, empty where a record has no value): a
    sample's guess is not a promise.

    Raises:
      ConfigError: an ``--fn_inputs`` name the input does not have.
    """
    old = {s.name: s for s in collection.specs}
    missing = [n for n in cfg.fn_inputs if n not in old]
    if missing:
        raise ConfigError(
            f"--fn_inputs names {missing}, which the input does not have{_where(collection)}",
            file=cfg.input,
            hint=f"features are {sorted(old)}",
        )
    return tuple(as_varlen(old[n]) if collection.inferred else old[n] for n in cfg.fn_inputs)


def probe_fn(
    cfg, sample: list[bytes], first_file: str, fn_specs: tuple[FeatureSpec, ...], encoding: str, limits: RecordLimits
) -> FnProbe | None:
    """Step 6: ``--fn`` called once on the first records (at most ``PROBE_RECORDS``), each checked to be an Example
    first: its outputs' specs and bytes per record; None without ``--fn``.

    Raises:
      ConfigError: no record to probe. RecordError: a sampled record that is not an Example, or ``--fn`` raised.
      SchemaError: ``--fn`` returned no feature, or a value no encoding takes.
    """
    if not cfg.fn:
        return None
    if not sample:
        raise ConfigError("The input holds no record, so --fn cannot be probed for its outputs", file=cfg.input)
    probe = sample[:PROBE_RECORDS]
    for i, record in enumerate(probe):
        try:
            check_example_frame(record, limits.max_features)
        except RecordError as e:
            raise frame_error(e, first_file, i) from None
    columns = fn_columns(
        load_function(cfg.fn), cfg.fn, fn_specs, probe, cfg.fn_batch, first_file, 0, limits.max_record_bytes
    )
    if not columns:
        raise SchemaError(f"--fn {cfg.fn} returned no feature", hint="return {new name: array}")
    specs = [spec_of(n, c, encoding, cfg.allow_lossy) for n, c in columns.items()]
    return FnProbe(specs, max(1, sum(value_bytes(c) for c in columns.values()) // max(1, len(probe))))


def plan_join_source(cfg, collection: InputCollection, encoding: str) -> JoinPlan | None:
    """Step 7: the join source (``--join_input``) indexed and its fields' specs (``join.plan_join``), or None."""
    if not cfg.join_input:
        return None
    return plan_join(
        cfg.join_input,
        cfg.join_by,
        collection.specs,
        key_feature=cfg.key_feature,
        join_key=cfg.join_key,
        fields=cfg.join_fields,
        options=join_source_options(cfg),
        missing=cfg.missing,
        defaults=cfg.defaults,
        encoding=encoding,
        allow_lossy=cfg.allow_lossy,
    )


def parse_constants(cfg, encoding: str) -> tuple[tuple[tuple[str, object], ...], list[FeatureSpec]]:
    """Step 8: ``--constants`` parsed (``constants.parse_constant``) and the spec of each."""
    constants = tuple((name, parse_constant(name, text)) for name, text in cfg.constants.items())
    specs = []
    for name, value in constants:
        col = np.empty(1, object) if isinstance(value, bytes) else np.full(1, value, dtype=value.dtype)
        if isinstance(value, bytes):
            col[0] = value
        specs.append(spec_of(name, col, encoding, cfg.allow_lossy))
    return constants, specs


def check_new_features(cfg, new_specs: list[FeatureSpec]) -> list[FeatureSpec]:
    """Step 9: the new features (fn outputs, join fields, constants, in that order), each named once, with the
    encodings ``--feature_encodings`` asks for.

    Raises:
      ConfigError: a name from two places, or ``--feature_encodings`` naming a feature that is not new.
      SchemaError: an encoding that cannot carry its feature.
    """
    seen: dict[str, int] = {}
    for s in new_specs:
        seen[s.name] = seen.get(s.name, 0) + 1
    twice = sorted(n for n, c in seen.items() if c > 1)
    if twice:
        raise ConfigError(
            f"New feature '{twice[0]}' comes from two places (--fn, --join_fields, --constants)",
            hint="rename one of them",
        )
    not_new = sorted(set(cfg.feature_encodings) - set(seen))
    if not_new:
        raise ConfigError(
            f"--feature_encodings names {not_new}, which are not new features", hint=f"new features are {sorted(seen)}"
        )
    return [
        _encoded_as(s, cfg.feature_encodings[s.name], cfg.allow_lossy) if s.name in cfg.feature_encodings else s
        for s in new_specs
    ]


def replaced_keys(cfg, collection: InputCollection, new_specs: list[FeatureSpec]) -> list[str]:
    """Step 10: the Example keys removed from the old records first (the features ``--replace_fields`` replaces and
    their ``/shape``, ``/dtype`` companions), sorted.

    Raises:
      ConfigError: ``--replace_fields`` naming a feature that is not new.
      SchemaError: a new feature already in the input and not in ``--replace_fields``.
    """
    old = {s.name: s for s in collection.specs}
    seen = [s.name for s in new_specs]
    not_new = sorted(set(cfg.replace_fields) - set(seen))
    if not_new:
        raise ConfigError(
            f"--replace_fields names {not_new}, which are not new features",
            hint=f"new features are {sorted(seen)}; --replace_fields lets a new feature replace an existing one",
        )
    clash = sorted(n for n in seen if n in old and n not in cfg.replace_fields)
    if clash:
        raise SchemaError(
            f"New feature '{clash[0]}' already exists in the input{_where(collection)}",
            file=cfg.input,
            feature=clash[0],
            hint=f"pass --replace_fields {clash[0]} to replace it (rewrite mode), or choose another name",
        )
    return sorted(
        {
            k
            for n in cfg.replace_fields
            for k in ([e[0] for e in schemafile.example_features(old[n])] if n in old else [n])
        }
    )


def join_offsets(
    cfg, join: JoinPlan | None, collection: InputCollection, shards: tuple[InputShard, ...]
) -> tuple[InputShard, ...]:
    """Step 11: for a position join over an input whose record counts are known, the source's row count checked
    and each shard's first row (``offset``) set; otherwise the shards as they are.

    Raises:
      SourceError: the join source's rows differ from the input's records.
    """
    if join is None or join.by != "position" or collection.num_records is None:
        return shards
    if join.num_rows != collection.num_records:
        raise SourceError(
            f"The join source has {join.num_rows} rows but the input has {collection.num_records} records",
            file=cfg.join_input,
            hint="--join_by position needs one source row per record, in shard order",
        )
    offsets = np.concatenate([[0], np.cumsum([s.records for s in shards])])
    return tuple(dataclasses.replace(s, offset=int(o)) for s, o in zip(shards, offsets))


def choose_batch_size(cfg, probe: FnProbe | None) -> int:
    """Step 12: records per batch: ``--batch_size``, fewer when ``--fn`` returns big values, so that a batch's new
    values stay under ``BATCH_MB``."""
    batch_size = cfg.batch_size
    if probe is not None:
        batch_size = max(1, min(batch_size, (BATCH_MB << 20) // probe.bytes_per_record))
        if batch_size < cfg.batch_size:
            log.info(
                "--fn returns about %d bytes per record: batches of %d records", probe.bytes_per_record, batch_size
            )
    return batch_size


def _codec(out_comp: str, level: int | None) -> dict | None:
    """The output's compression backend (``compression.settings``), chosen here once for every worker.
    Raises ConfigError for a level without compression or out of the backend's range."""
    if level is not None and out_comp == "none":
        raise ConfigError(
            "--compression_level sets the level of gzip or zlib output shards, but the output is uncompressed",
            hint="pass --output_compression gzip (or zlib), or leave the level out",
        )
    try:
        return compression.settings(out_comp, level)
    except (ValueError, compression.BackendUnavailable) as e:
        raise ConfigError(str(e), hint="see the compression backends in the docs' output page") from None


def _encoded_as(spec: FeatureSpec, encoding: str, allow_lossy) -> FeatureSpec:
    """``spec`` with the encoding asked by ``--feature_encodings``, checked (SchemaError when it cannot carry it)."""
    spec = dataclasses.replace(spec, encoding=encoding)
    check_spec(spec, allow_lossy)
    return spec


def _join_paths(join_input: str | None) -> list[str]:
    """The paths ``--join_input`` reads: its matched files, or a Zarr store's root (``planning.store_input``)."""
    if not join_input:
        return []

    if planning.store_input(join_input, SourceOptions()):
        return [join_input]
    return [p for p, _ in fileio.match(join_input)]
