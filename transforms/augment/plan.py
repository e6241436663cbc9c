"""The augment plan and the batch step (pure: no Beam)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tfrecord_etl.transforms import compression
from tfrecord_etl.transforms.augment.collection import InputCollection, output_name, resolve_input
from tfrecord_etl.transforms.augment.common import (
    BATCH_MB,
    MODES,
    PROBE_RECORDS,
    RESERVED_NAMES,
    amend_error,
    frame_error,
    log,
)
from tfrecord_etl.transforms.augment.join import JoinPlan, plan_join
from tfrecord_etl.transforms.augment.readers import ReaderFiles, file_names, plan_reader_files
from tfrecord_etl.transforms.augment.values import fn_columns, load_function, parse_constant, spec_of, value_bytes
from tfrecord_etl.transforms.codec import (
    MAX_FEATURES,
    FeatureSpec,
    FeatureStats,
    as_varlen,
    check_example_frame,
    check_example_frames,
    check_spec,
    drop_features,
    encode_columns,
    encoding_of,
    feature_key_pattern,
    split_features,
)
from tfrecord_etl.transforms.codec.encodings import collection_style
from tfrecord_etl.transforms.errors import ConfigError, EtlError, RecordError, SchemaError, SourceError
from tfrecord_etl.transforms.output import metadata, outdir, tfrecord
from tfrecord_etl.transforms.storage import fileio


@dataclasses.dataclass(frozen=True)
class AugmentPlan:
    """Everything the workers need, decided in the launcher.

    Attributes:
      collection: the input shards (``output_file`` set) and old features.
      mode: ``rewrite`` (old record bytes + new Example) or ``sidecar`` (new Example only).
      fn, fn_specs, fn_batch: the user function (``module:function``), the old features it gets, batch calls.
      constants: ``(name, value)``; value is a 0-d array or bytes.
      new_specs: the new features, in order: fn outputs, join fields, constants.
      replace: new feature names allowed to replace existing ones; drop_keys: Example keys removed
        from old records first (the replaced features and their ``/shape``, ``/dtype`` companions).
      batch_size: records per batch (one encode call per batch).
      options: the validated config, recorded in the metadata.
      readers: the index files and TFDS files written beside the shards (``readers.plan_reader_files``: those the
        input had, written again for the output's shards when they can be).
    """

    collection: InputCollection
    output_dir: str
    mode: str
    output_compression: str
    new_specs: tuple[FeatureSpec, ...]
    fn: str | None = None
    fn_specs: tuple[FeatureSpec, ...] = ()
    fn_batch: bool = False
    constants: tuple[tuple[str, Any], ...] = ()
    join: JoinPlan | None = None
    replace: tuple[str, ...] = ()
    drop_keys: tuple[str, ...] = ()
    allow_lossy: tuple[str, ...] = ()
    batch_size: int = 4096
    options: dict = dataclasses.field(default_factory=dict)
    max_record_bytes: int = dataclasses.field(default_factory=tfrecord.record_limit)
    max_features: int = MAX_FEATURES
    replaced: outdir.Replacement = outdir.Replacement()  # what the commit replaces (outdir.prepare)
    readers: ReaderFiles = ReaderFiles()
    codec: dict | None = None  # compression.settings(): the output's backend, version and level (gzip/zlib)

    def with_input_specs(self, specs: Sequence[FeatureSpec]) -> AugmentPlan:
        """This plan with the input features replaced (by those learned from every record, at finalize)."""
        return dataclasses.replace(self, collection=dataclasses.replace(self.collection, specs=tuple(specs)))

    def output_files(self) -> list[str]:
        """The names this plan writes in its output directory: the shards, ``manifest.json`` (sidecar), and the
        reader files (index files, TFDS's files: :attr:`readers`)."""
        shard_files = [s.output_file for s in self.collection.shards]
        return (
            shard_files + (["manifest.json"] if self.mode == "sidecar" else []) + file_names(self.readers, shard_files)
        )

    def with_output(self, generation: int, replaced: outdir.Replacement = outdir.Replacement()) -> AugmentPlan:
        """This plan writing output generation ``generation`` (``outdir.generation_name`` of each shard's name),
        its commit replacing ``replaced`` (both from ``outdir.prepare``'s lock)."""
        shards = tuple(
            dataclasses.replace(s, output_file=outdir.generation_name(s.output_file, generation))
            for s in self.collection.shards
        )
        return dataclasses.replace(
            self, collection=dataclasses.replace(self.collection, shards=shards), replaced=replaced
        )

    @property
    def output_specs(self) -> tuple[FeatureSpec, ...]:
        """The features of the output shards: old (minus replaced) + new, or only the new ones (sidecar)."""
        if self.mode == "sidecar":
            return self.new_specs
        return tuple(s for s in self.collection.specs if s.name not in self.replace) + self.new_specs


class BatchAugmenter:
    """Turns one batch of input records into output records; the pure core of AugmentShardFn.

    Per record: refuses a new feature name that the record already holds (SchemaError naming the
    feature, file and record index) unless it is in ``plan.replace``, then removes the replaced
    entries byte for byte (``codec.drop_features``). Per batch: computes the new columns (fn, join,
    constants) and encodes them in one ``codec.encode_columns`` call.
    """

    def __init__(self, plan: AugmentPlan):
        self.plan = plan
        self._fn: Callable[..., Any] | None = None
        self._new_keys = {k for s in plan.new_specs for k, _, _ in metadata.example_features(s)}
        self._allowed = set(plan.drop_keys) | {
            k for s in plan.new_specs if s.name in plan.replace for k, _, _ in metadata.example_features(s)
        }
        self._drop = frozenset(plan.drop_keys)
        self._patterns = tuple(feature_key_pattern(k) for k in sorted(self._new_keys | self._drop))

    def prepare(self, record: bytes, file: str, index: int, framed: bool = False) -> bytes:
        """The old record, checked to be framed as a tf.train.Example (every record, not only the sampled
        ones: ``codec.check_example_frame``, values not decoded; skipped when ``framed``, i.e. the batch was
        checked with ``codec.check_example_frames``) and for name clashes, with the replaced features removed.

        Raises:
          RecordError: not a tf.train.Example, or more than ``plan.max_features`` features (file, record).
          SchemaError: a new feature's name is already in the record.
        """
        if not framed:
            try:
                check_example_frame(record, self.plan.max_features)
            except RecordError as e:
                raise frame_error(e, file, index) from None
        if not any(p in record for p in self._patterns):  # fast path: no parse
            return record
        try:
            present = set(split_features(record))
        except RecordError as e:
            raise e.with_context(file=file, record=index) from None
        clash = sorted((present & self._new_keys) - self._allowed)
        if clash:
            raise SchemaError(
                f"New feature '{clash[0]}' already exists in the record",
                file=file,
                record=index,
                feature=clash[0],
                hint=f"pass --replace_fields {clash[0]} to replace it (rewrite mode), or choose another name",
            )
        return drop_features(record, self._drop) if present & self._drop else record

    def new_columns(self, records: Sequence[bytes], file: str, first: int, join_columns: dict | None = None) -> dict:
        """``{new name: column}`` for a batch: fn outputs, join columns (given), constants."""
        n, plan = len(records), self.plan
        columns = {}
        if plan.fn:
            if self._fn is None:
                self._fn = load_function(plan.fn)
            columns.update(
                fn_columns(self._fn, plan.fn, plan.fn_specs, records, plan.fn_batch, file, first, plan.max_record_bytes)
            )
        columns.update(join_columns or {})
        for name, value in plan.constants:
            if isinstance(value, bytes):
                col = np.empty(n, dtype=object)
                col.fill(value)
            else:
                col = np.full(n, value, dtype=value.dtype)
            columns[name] = col
        return columns

    def augment(self, records: Sequence[bytes], file: str, first: int, join_columns: dict | None = None):
        """Output records of one batch: a list of bytes (rewrite) or a ``codec.EncodedBatch`` (sidecar).

        Raises:
          SchemaError: a name clash, or new values whose dtype/shape differ from ``plan.new_specs``.
          RecordError: a malformed record, or ``--fn`` raised.
        """
        n, plan = len(records), self.plan
        try:  # one framing check for the batch (a check per record cost 14% of a rewrite)
            check_example_frames(records, plan.max_features)
        except RecordError as e:
            i = e.context.pop("record", 0)
            raise frame_error(e, file, first + i) from None
        prepared = [self.prepare(r, file, first + i, framed=True) for i, r in enumerate(records)]
        columns = self.new_columns(records, file, first, join_columns)
        names = [s.name for s in plan.new_specs]
        if sorted(columns) != sorted(names):
            raise SchemaError(
                f"The new features of this batch are {sorted(columns)}, but the first records gave {sorted(names)}",
                file=file,
                record=f"{first}-{first + n - 1}",
                hint="--fn must return the same keys for every record",
            )
        for spec in plan.new_specs:
            col = columns[spec.name]
            if isinstance(col, np.ndarray) and spec.is_fixed and col.shape[1:] != spec.shape:
                raise SchemaError(
                    f"New feature '{spec.name}' has shape {col.shape[1:]} here but {spec.shape} in the first records",
                    file=file,
                    record=f"{first}-{first + n - 1}",
                    feature=spec.name,
                )
        try:
            encoded = encode_columns(columns, plan.new_specs, n, plan.allow_lossy)
        except EtlError as e:
            raise amend_error(
                e,
                "a new feature keeps the dtype and shape of the first records (see the metadata)",
                file=file,
                record=f"{first}-{first + n - 1}",
            ) from None
        self._check_sizes(encoded, prepared, file, first)
        if plan.mode == "sidecar":
            return encoded
        return [old + new for old, new in zip(prepared, encoded.records())]

    def _check_sizes(self, encoded, prepared: Sequence[bytes], file: str, first: int) -> None:
        """Raises RecordError naming the record when an output record is over ``plan.max_record_bytes``."""
        limit = self.plan.max_record_bytes
        old = prepared if self.plan.mode == "rewrite" else [b""] * encoded.num_rows
        for i, (new, rec) in enumerate(zip(encoded.lengths().tolist(), old)):
            size = new + len(rec)
            if size > limit:
                raise RecordError(
                    f"Output record of {size} bytes ({size / 2**20:.1f} MB) is over the record size "
                    f"limit of {limit} bytes (--max_record_mb {limit / 2**20:g})",
                    file=file,
                    record=first + i,
                    size=size,
                    hint="raise --max_record_mb, or add smaller values",
                )


def observe_batch(plan: AugmentPlan, stats: FeatureStats, records: Sequence[bytes], file: str, first: int) -> None:
    """Adds a batch of input records (a collection without metadata.json; framing already checked by
    :meth:`BatchAugmenter.augment`) to its shard's ``stats``; with
    ``--schema``, a batch whose records contradict the schema fails here, before the output is committed.

    Raises:
      SchemaError: a feature of two kinds, or records that contradict ``--schema`` (file, record range).
      RecordError: a record that is not a tf.train.Example, or too many distinct feature names (file, record).
    """
    batch = FeatureStats()
    span = f"{first}-{first + len(records) - 1}"
    try:
        batch.observe_records(records, plan.max_features, framed=True)
    except EtlError as e:
        index = e.context.pop("record", None)
        raise e.with_context(file=file, record=span if index is None else first + index) from None
    if plan.collection.schema_file:
        problems = batch.contradictions(plan.collection.specs)
        if problems:
            raise SchemaError(
                f"The records contradict --schema: {'; '.join(problems[:3])}",
                file=file,
                record=span,
                hint=f"fix {plan.collection.schema_file}, or drop --schema to learn the features from the records",
            )
    stats.merge(batch)


def learned_specs(plan: AugmentPlan, stats: FeatureStats) -> tuple[tuple[FeatureSpec, ...], list[str]]:
    """``(specs, corrections)``: the input features the output's metadata records, and one sentence per feature
    whose sample guess the whole collection corrected (logged as a WARNING, recorded in the metadata, printed in the
    summary). The specs are those every record satisfies (learned from ``stats``, all records) for a collection
    whose features were inferred from a sample; otherwise the plan's."""
    if not plan.collection.inferred:
        return plan.collection.specs, []
    learned = stats.specs()
    guessed = {s.name: s for s in plan.collection.specs}
    corrections = []
    for spec in learned:
        was = guessed.get(spec.name)
        if was == spec:
            continue
        _, present, least, most = stats.features[spec.name]
        if was is not None and was.dtype != spec.dtype:
            what = f"later records hold {encoding_of(spec).kind(spec.dtype)} values"
        elif present < stats.records:
            what = f"missing or empty in {stats.records - present:,} of {stats.records:,} records"
        else:
            what = f"{least}-{most} values per record"
        before = (
            "absent from the first records"
            if was is None
            else f"{was.encoding} {was.dtype} {list(was.shape)} in the first records"
        )
        corrections.append(
            f"'{spec.name}': {before}, but {what}: recorded as {spec.encoding} {spec.dtype} {list(spec.shape)}"
        )
        log.warning("input feature %s", corrections[-1])
    return learned, corrections


def _check_options(cfg) -> None:
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


def plan_augment(cfg) -> AugmentPlan:
    """Plans a run from a validated config (``tfrecord_etl.transforms.augment.config.AugmentConfig`` or any object with its fields).

    Every user error surfaces here, before any output exists: options, inputs, the join source, the
    new fields' dtypes and shapes (``--fn`` is called once on the first records), name clashes with
    the known features, and a position join's row count when the record counts are known.

    Raises:
      ConfigError, SourceError, SchemaError, RecordError.
    """
    _check_options(cfg)
    max_record_bytes = tfrecord.record_limit(getattr(cfg, "max_record_mb", None))
    max_features = getattr(cfg, "max_features", None) or MAX_FEATURES
    collection, sample = resolve_input(
        cfg.input, cfg.compression, None, max_record_bytes, max_features, getattr(cfg, "input_schema", None)
    )
    comps = collection.compressions
    if cfg.output_compression is None and len(comps) > 1:
        raise ConfigError(
            f"The input shards use several compressions {sorted(comps)}",
            hint="choose the output's with --output_compression",
        )
    out_comp = cfg.output_compression or comps.pop()
    codec = _codec(out_comp, getattr(cfg, "compression_level", None))
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
    old = {s.name: s for s in collection.specs}
    where = (
        " (inferred from the first records)"
        if collection.inferred
        else f" (declared by --schema {collection.schema_file})"
        if collection.schema_file
        else ""
    )
    missing = [n for n in cfg.fn_inputs if n not in old]
    if missing:
        raise ConfigError(
            f"--fn_inputs names {missing}, which the input does not have{where}",
            file=cfg.input,
            hint=f"features are {sorted(old)}",
        )
    # a sample's guess is not a promise: --fn gets the features of a collection without metadata or --schema as
    # tf.io.VarLenFeature gives them (1-D, empty where a record has no value)
    fn_specs = tuple(as_varlen(old[n]) if collection.inferred else old[n] for n in cfg.fn_inputs)
    encoding = collection_style(cfg.encoding, collection.specs)
    new_specs: list[FeatureSpec] = []
    if cfg.fn:
        if not sample:
            raise ConfigError("The input holds no record, so --fn cannot be probed for its outputs", file=cfg.input)
        probe = sample[:PROBE_RECORDS]
        for i, record in enumerate(probe):
            try:
                check_example_frame(record, max_features)
            except RecordError as e:
                raise frame_error(e, shards[0].path, i) from None
        columns = fn_columns(
            load_function(cfg.fn), cfg.fn, fn_specs, probe, cfg.fn_batch, shards[0].path, 0, max_record_bytes
        )
        if not columns:
            raise SchemaError(f"--fn {cfg.fn} returned no feature", hint="return {new name: array}")
        new_specs += [spec_of(n, c, encoding, cfg.allow_lossy) for n, c in columns.items()]
    join = None
    if cfg.join_input:
        join = plan_join(
            cfg.join_input,
            cfg.join_by,
            collection.specs,
            key_feature=cfg.key_feature,
            join_key=cfg.join_key,
            fields=cfg.join_fields,
            datasets=cfg.join_datasets,
            missing=cfg.missing,
            defaults=cfg.defaults,
            encoding=encoding,
            allow_lossy=cfg.allow_lossy,
        )
        new_specs += join.specs
    constants = tuple((name, parse_constant(name, text)) for name, text in cfg.constants.items())
    for name, value in constants:
        col = np.empty(1, object) if isinstance(value, bytes) else np.full(1, value, dtype=value.dtype)
        if isinstance(value, bytes):
            col[0] = value
        new_specs.append(spec_of(name, col, encoding, cfg.allow_lossy))
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
    new_specs = [
        _encoded_as(s, cfg.feature_encodings[s.name], cfg.allow_lossy) if s.name in cfg.feature_encodings else s
        for s in new_specs
    ]
    not_new = sorted(set(cfg.replace_fields) - set(seen))
    if not_new:
        raise ConfigError(
            f"--replace_fields names {not_new}, which are not new features",
            hint=f"new features are {sorted(seen)}; --replace_fields lets a new feature replace an existing one",
        )
    clash = sorted(n for n in seen if n in old and n not in cfg.replace_fields)
    if clash:
        raise SchemaError(
            f"New feature '{clash[0]}' already exists in the input{where}",
            file=cfg.input,
            feature=clash[0],
            hint=f"pass --replace_fields {clash[0]} to replace it (rewrite mode), or choose another name",
        )
    drop_keys = sorted(
        {
            k
            for n in cfg.replace_fields
            for k in ([e[0] for e in metadata.example_features(old[n])] if n in old else [n])
        }
    )
    if join is not None and join.by == "position" and collection.num_records is not None:
        if join.num_rows != collection.num_records:
            raise SourceError(
                f"The join source has {join.num_rows} rows but the input has {collection.num_records} records",
                file=cfg.join_input,
                hint="--join_by position needs one source row per record, in shard order",
            )
        offsets = np.concatenate([[0], np.cumsum([s.records for s in shards])])
        shards = tuple(dataclasses.replace(s, offset=int(o)) for s, o in zip(shards, offsets))
    batch_size = cfg.batch_size
    if cfg.fn and columns:  # big new values: fewer records per batch, so a batch's values stay under BATCH_MB
        per_record = max(1, sum(value_bytes(c) for c in columns.values()) // max(1, len(probe)))
        batch_size = max(1, min(batch_size, (BATCH_MB << 20) // per_record))
        if batch_size < cfg.batch_size:
            log.info("--fn returns about %d bytes per record: batches of %d records", per_record, batch_size)
    plan = AugmentPlan(
        dataclasses.replace(collection, shards=shards),
        cfg.output_dir,
        cfg.mode,
        out_comp,
        tuple(new_specs),
        cfg.fn,
        fn_specs,
        cfg.fn_batch,
        constants,
        join,
        tuple(cfg.replace_fields),
        tuple(drop_keys),
        tuple(cfg.allow_lossy),
        batch_size,
        cfg.model_dump(),
        max_record_bytes,
        max_features,
        codec=codec,
    )
    metadata.check_unique(plan.output_specs)
    return dataclasses.replace(plan, readers=plan_reader_files(plan.collection, plan.mode, out_comp, plan.output_specs))


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
    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.sources import SourceOptions

    if planning.store_input(join_input, SourceOptions()):
        return [join_input]
    return [p for p, _ in fileio.match(join_input)]
