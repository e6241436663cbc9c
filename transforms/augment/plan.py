"""The augment plan and the batch step (pure: no Beam); the plan is made by ``steps.plan_augment``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tfrecord_etl.transforms.augment.collection import InputCollection
from tfrecord_etl.transforms.augment.common import (
    MODES,
    amend_error,
    frame_error,
    log,
)
from tfrecord_etl.transforms.augment.join import JoinPlan
from tfrecord_etl.transforms.augment.readers import ReaderFiles, file_names
from tfrecord_etl.transforms.augment.values import fn_columns, load_function
from tfrecord_etl.transforms.codec import (
    MAX_FEATURES,
    FeatureSpec,
    FeatureStats,
    check_example_frame,
    check_example_frames,
    drop_features,
    encode_columns,
    encoding_of,
    feature_key_pattern,
    split_features,
)
from tfrecord_etl.transforms.errors import EtlError, RecordError, SchemaError
from tfrecord_etl.transforms.output import outdir, schemafile, tfrecord


@dataclasses.dataclass(frozen=True, kw_only=True)
class AugmentPlan:
    """Everything the workers need, decided in the launcher (``steps.plan_augment``); built by keyword only, and
    checked at construction, so a plan built by hand (``AugmentTFRecord(plan=...)``) fails in the launcher, not on a
    worker. Pickled with the DoFns that use it.

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

    Raises:
      ValueError: an unknown ``mode`` or ``output_compression``, ``batch_size`` < 1, ``fn_specs`` or ``fn_batch``
        without ``fn``, ``replace`` naming a feature that is not new, or ``drop_keys`` in ``sidecar`` mode.
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

    def __post_init__(self):
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode {self.mode!r} is not one of {MODES}")
        if self.output_compression not in tfrecord.COMPRESSIONS:
            problems.append(f"output_compression {self.output_compression!r} is not one of {tfrecord.COMPRESSIONS}")
        if self.batch_size < 1:
            problems.append(f"batch_size {self.batch_size} is not a positive number of records")
        if (self.fn_specs or self.fn_batch) and not self.fn:
            problems.append("fn_specs and fn_batch need fn")
        not_new = sorted(set(self.replace) - {s.name for s in self.new_specs})
        if not_new:
            problems.append(f"replace names {not_new}, which are not new features")
        if self.drop_keys and self.mode == "sidecar":
            problems.append("drop_keys need mode 'rewrite': a sidecar cannot remove a value from the records")
        if problems:
            raise ValueError(f"Invalid AugmentPlan: {'; '.join(problems)}")

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
        self._new_keys = {k for s in plan.new_specs for k, _, _ in schemafile.example_features(s)}
        self._allowed = set(plan.drop_keys) | {
            k for s in plan.new_specs if s.name in plan.replace for k, _, _ in schemafile.example_features(s)
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
