"""The plan of a conversion from its inputs: the encodings, the shard count (:func:`num_shards`, the only place
that decides it), the shards, the splits, the output file names, and the plan as printed by ``--dry_run``."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms import sources
from tfrecord_etl.transforms.codec import FeatureSpec, check_spec
from tfrecord_etl.transforms.codec.encodings import AUTO, resolve_encoding
from tfrecord_etl.transforms.collections import sharding, splits
from tfrecord_etl.transforms.collections.splits import SplitPlan
from tfrecord_etl.transforms.errors import ConfigError, SchemaError, SourceError
from tfrecord_etl.transforms.output import outdir, schemafile, tfds_info, tfrecord
from tfrecord_etl.transforms.planning.inputs import PROVENANCE, InputPlan, plan_inputs
from tfrecord_etl.transforms.sources import SourceOptions
from tfrecord_etl.transforms.storage import fileio

log = logging.getLogger("tfrecord_etl.transforms.planning")

DEFAULT_TARGET_SHARD_BYTES = 192 * 2**20  # --target_shard_mb 192


def choose_encodings(
    specs: Sequence[FeatureSpec], default: str, per_feature: dict, allow_lossy=(), where: str | None = None
) -> tuple:
    """Sets each feature's encoding (per-feature choice, else ``default``; ``auto``: the rule of
    ``codec.encodings.auto_encoding``; variable-length strings are always ``list``, or ``varlen`` where the source proposes it, varying dtypes always
    ``tensor``) and checks it.

    Raises:
      SchemaError: an encoding that cannot carry the feature (naming ``where``, the input pattern).
      ConfigError: ``per_feature`` names a feature that does not exist.
    """
    unknown = set(per_feature) - {s.name for s in specs}
    if unknown:
        raise ConfigError(
            f"feature_encodings names unknown features {sorted(unknown)}",
            hint=f"features are {[s.name for s in specs]}",
        )
    out, kept_tensor = [], []
    for s in specs:
        enc = per_feature.get(s.name)
        if enc is None:
            enc = "tensor" if s.dtype is None else resolve_encoding(default if s.dtype != "bytes" else AUTO, s)
            if s.dtype is None and default not in ("tensor", AUTO):
                kept_tensor.append(s.name)
        spec = dataclasses.replace(s, encoding=enc)
        try:
            check_spec(spec, allow_lossy)
        except SchemaError as e:
            raise e.with_context(file=where) from None
        out.append(spec)
    if kept_tensor:  # said, not silent: a list/zlib/packbits feature holds one dtype
        log.warning(
            "--encoding %s: feature(s) %s keep the tensor encoding, their dtype varies between examples "
            "(the tensor encoding records each example's dtype)",
            default,
            ", ".join(kept_tensor),
        )
    return tuple(out)


def num_shards(
    num_rows: int,
    num_bytes: int,
    *,
    requested: int | None = None,
    target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES,
) -> int:
    """The shard count of a conversion: the only place that decides it, from the data and the flags alone.

    ``requested`` (``--num_shards``) when given, checked by :func:`sharding.check_num_shards`; else
    ``ceil(num_bytes / target_shard_bytes)`` (``--target_shard_mb``; never one giant file), capped at one shard per
    row and at :data:`sharding.MAX_SHARDS`. ``num_bytes``: the input's array bytes (``InputPlan.num_bytes``).
    Nothing of the runner enters it (threads, ``--parallelism``, workers), so the same command writes the same
    shards, byte for byte, on DirectRunner, Flink, Spark, Prism and Dataflow; ``--num_shards`` a multiple of the
    runner's writers keeps each of them busy to the end.

    Raises:
      ConfigError: ``requested`` above the rows of the input or above sharding.MAX_SHARDS.
    """
    if requested:
        return sharding.check_num_shards(requested, num_rows)
    by_size = max(1, math.ceil(num_bytes / target_shard_bytes))
    return min(by_size, max(1, num_rows), sharding.MAX_SHARDS)


def shard_suffix(compression: str) -> str:
    """``.tfrecord`` plus the compression's suffix (``.gz``, ``.deflate``)."""
    return ".tfrecord" + tfrecord.SUFFIXES[compression]


@dataclasses.dataclass(frozen=True)
class ConvertPlan:
    """A conversion planned once: the inputs, the features with their encodings, the shard count, the planned
    writer's shard plans (None for the ``beam`` writer, whose shards Beam assigns) and the output file names.

    Build it with :func:`plan_convert`; ``transforms.convert.ConvertToTFRecord`` writes it.
    """

    inputs: InputPlan
    specs: tuple[FeatureSpec, ...]
    num_shards: int
    shards: tuple[sharding.ShardPlan, ...] | None
    output_files: tuple[str, ...]
    split_plan: SplitPlan | None = None  # --splits / --split / --tfds_name: one file per split per shard plan
    prefix: str = "data"  # the shard file prefix: --prefix, or the --tfds_name
    tfds_name: str | None = None  # TFDS's files are written: --tfds_name, or --splits' default (tfds_info)
    tfds_refusal: str | None = None  # why a --splits output without --tfds_name gets no TFDS files


def source_options(cfg) -> SourceOptions:
    """The :class:`SourceOptions` of a ``ConvertConfig``: the options every format shares, then each registered
    format's options (:func:`format_source_options`)."""
    return SourceOptions(
        cfg.format,
        target_range_bytes=int(cfg.target_range_mb * 2**20),
        max_empty_rows=cfg.max_empty_rows,
        follow_symlinks=cfg.follow_symlinks,
        files_dead_letters=cfg.dead_letter_dir is not None,
        **format_source_options(cfg),
    )


def format_source_options(cfg, **values) -> dict:
    """The :class:`SourceOptions` keyword arguments of every registered format's options model
    (``sources.option_models``) filled from ``cfg``'s fields of the same names (``values`` win; a field ``cfg``
    lacks keeps the model's default): the ``SourceOptions`` fields it sets (``FormatOptions.source_fields``) or the
    model carried whole (``formats``, read by the source with ``options.of(Model)``). What convert
    (:func:`source_options`) and augment's join source (``augment.join_source_options``) both build theirs from."""
    fields: dict = {}
    carried = []
    for model in sources.option_models():
        given = {
            n: values[n] if n in values else getattr(cfg, n)
            for n in model.model_fields
            if n in values or hasattr(cfg, n)
        }
        filled = model.model_construct(**given)
        named = filled.source_fields()
        if named is None:
            carried.append(filled)
        else:
            fields.update(named)
    return {"formats": tuple(carried), **fields}


def plan_convert(cfg, inputs: InputPlan | None = None) -> ConvertPlan:
    """Plans the conversion described by ``cfg`` (a ``ConvertConfig``): every input error surfaces here. The plan
    depends on ``cfg`` and the data only, never on the runner (see :func:`num_shards`).

    ``inputs``: an :class:`InputPlan` already made for ``cfg`` (else the inputs are matched and indexed here).

    Raises:
      SourceError, SchemaError: unreadable or unsupported inputs, encodings that cannot carry a feature.
      ConfigError: unknown feature names, a shard count that cannot be written, duplicate feature keys.
    """
    inputs = inputs or plan_inputs(cfg.input, source_options(cfg))
    specs = choose_encodings(inputs.specs, cfg.encoding, cfg.feature_encodings, cfg.allow_lossy, cfg.input)
    if cfg.provenance:
        specs += PROVENANCE
    schemafile.check_unique(specs)
    check_row_size(specs, cfg.max_row_mb, cfg.input)
    n = num_shards(
        inputs.num_rows,
        inputs.num_bytes,
        requested=cfg.num_shards,
        target_shard_bytes=int(cfg.target_shard_mb * 2**20),
    )
    split_plan = plan_splits(cfg, inputs, specs)
    if cfg.tfds_name is not None:
        try:
            tfds_info.check_features(specs)
        except SchemaError as e:
            raise e.with_context(file=cfg.input) from None
        tfds_info.require_tfds()
    prefix = cfg.tfds_name or cfg.prefix
    shards = tuple(inputs.shards(n)) if cfg.writer == "planned" else None
    files = output_files(cfg, shards, n, split_plan, prefix)
    tfds_name, refusal = cfg.tfds_name, None
    if cfg.splits and tfds_name is None:  # TFDS-loadable by default when TFDS can read it
        refusal = tfds_info.default_refusal(cfg.compression, specs)
        tfds_name = None if refusal else tfds_info.default_name(cfg.output_dir)
    return ConvertPlan(inputs, tuple(specs), n, shards, files, split_plan, prefix, tfds_name, refusal)


def row_bytes(specs: Sequence[FeatureSpec]) -> int:
    """The bytes of array values of one row: the sum over the features of fixed dtype and shape of elements x
    itemsize (features whose shape or dtype varies per row are not counted: their size is known when read)."""
    total = 0
    for s in specs:
        if s.is_fixed and s.dtype != "bytes":
            total += s.size * np.dtype(s.dtype).itemsize
    return total


def check_row_size(specs: Sequence[FeatureSpec], max_row_mb: float, where: str) -> None:
    """Refuses rows whose array values (:func:`row_bytes`) exceed ``max_row_mb`` MiB (``--max_row_mb``) before any
    is read: a worker holds a row whole while it reads and encodes it (a row of 2 GiB took 4.4 GB of memory before
    protobuf's 2 GB limit refused it).

    Raises:
      SourceError: naming the size, the limit and the flag.
    """
    size, limit = row_bytes(specs), int(max_row_mb * 2**20)
    if size > limit:
        raise SourceError(
            f"One row holds {size:,} bytes ({size / 2**20:,.1f} MiB) of array values, over the limit of "
            f"{max_row_mb:g} MiB per row (--max_row_mb)",
            file=where,
            hint="raise --max_row_mb (a row is held whole in memory, about twice its size at peak; "
            "one Example holds at most 2048 MiB), or split the arrays into smaller rows",
        )


def output_files(cfg, shards, num_shards: int, split_plan: SplitPlan | None, prefix: str) -> tuple[str, ...]:
    """The names of the shard (and ``--index``) files a conversion writes with shard ``prefix``, in file order."""
    suffix = shard_suffix(cfg.compression)
    if shards is None:
        files = tuple(f"{prefix}-{i:05d}-of-{num_shards:05d}{suffix}" for i in range(num_shards))
    elif split_plan is None:
        files = tuple(s.file_name(prefix, suffix) for s in shards)
    else:
        files = tuple(
            splits.shard_name(prefix, name, s.index, num_shards, tfrecord.SUFFIXES[cfg.compression])
            for s in shards
            for name in split_plan.names
        )
    if cfg.index:
        files += tuple(tfrecord.index_name(f) for f in files)
    return files


def with_generation(plan: ConvertPlan, cfg, generation: int) -> ConvertPlan:
    """``plan`` writing output generation ``generation`` (``outdir.generation_prefix`` of its prefix): the names a
    run that replaces an output writes beside the committed files (``outdir.prepare``)."""
    if not generation:
        return plan
    prefix = outdir.generation_prefix(plan.prefix, generation)
    return dataclasses.replace(
        plan, prefix=prefix, output_files=output_files(cfg, plan.shards, plan.num_shards, plan.split_plan, prefix)
    )


def plan_splits(cfg, inputs: InputPlan, specs: Sequence[FeatureSpec]) -> SplitPlan | None:
    """The :class:`SplitPlan` of ``--splits`` (hash buckets, keyed by ``--split_key`` or the global row index),
    ``--split NAME`` (every row in one split) or ``--tfds_name`` alone (split ``train``); None without them.

    Raises:
      ConfigError: bad split names or weights. SchemaError: a ``--split_key`` that is not a feature of one integer
        or string per example.
    """
    if cfg.splits:
        names, weights = splits.parse_splits(cfg.splits)
        if cfg.split_key is not None:
            by_name = {s.name: s for s in specs}
            key = by_name.get(cfg.split_key)
            if key is None:
                raise ConfigError(
                    f"--split_key {cfg.split_key}: no such feature",
                    file=cfg.input,
                    hint=f"features are {sorted(by_name)}",
                )
            if (
                key.shape != ()
                or key.dtype is None
                or (key.dtype != "bytes" and np.dtype(key.dtype).kind not in "biuSU")
            ):
                raise SchemaError(
                    f"--split_key {cfg.split_key}: the key must be one integer or string per example, "
                    f"not {key.dtype} {list(key.shape) if key.shape is not None else '*'}",
                    file=cfg.input,
                    feature=cfg.split_key,
                )
        plan = SplitPlan(names, weights, cfg.split_key)
        return plan.with_offsets([(i.path, i.num_rows) for i in inputs.indexes])
    if cfg.split is not None or cfg.tfds_name is not None:
        return SplitPlan((splits.check_split_name(cfg.split or "train", "--split"),), (1,))
    return None


def describe_plan(plan: ConvertPlan, cfg) -> list[str]:
    """The lines ``convert --dry_run`` prints: inputs (files, rows, array bytes), row ranges, shards and the files
    they become, splits, features with their encodings, and the reads the run would make: one open per row range
    plus one ranged read per dataset and HDF5 chunk run (``fileio``'s remote reader: one bounded GET each), and
    about the array bytes (less where HDF5 chunks are compressed). Nothing is opened beyond what planning read."""
    inputs = plan.inputs
    by_path = {i.path: i for i in inputs.indexes}
    requests = 0
    for rr in (r for s in plan.shards for r in s.ranges) if plan.shards is not None else inputs.ranges:
        index = by_path[rr.path]
        datasets = max(1, len(rr.items) if not rr.item_files else 1)
        per_dataset = -(-rr.num_rows // index.chunk_rows) + 1 if index.chunk_rows > 1 else 1
        requests += 1 + (rr.num_rows if rr.item_files else datasets * per_dataset)
    remote = not all(fileio.is_local(i.path) for i in inputs.indexes if not i.item_files)
    lines = [
        f"dry run: nothing written to {cfg.output_dir}",
        f"inputs: {len(inputs.indexes) if not any(i.item_files for i in inputs.indexes) else inputs.num_rows} "
        f"files ({inputs.source.format_name}), {inputs.num_rows:,} rows, {inputs.num_bytes:,} bytes of arrays",
        f"row ranges: {len(inputs.ranges):,} of about {inputs.range_bytes:,} bytes",
        f"shards: {plan.num_shards:,} ({len(plan.output_files):,} files, e.g. {plan.output_files[0]})",
        f"reads: about {requests:,} {'ranged requests (remote inputs: one bounded GET each)' if remote else 'reads'}"
        f" of about {inputs.num_bytes:,} bytes",
    ]
    if plan.split_plan is not None:
        lines.append(
            "splits: "
            + ", ".join(f"{n} (weight {w})" for n, w in zip(plan.split_plan.names, plan.split_plan.weights))
            + (f", by --split_key {plan.split_plan.key}" if plan.split_plan.key else "")
        )
    lines.append(
        "features: "
        + ", ".join(
            f"{s.name} {s.dtype} {list(s.shape) if s.shape is not None else '*'} {s.encoding}" for s in plan.specs
        )
    )
    return lines
