"""Planning a conversion, before any data moves: match and index the inputs, choose the encodings, count and
plan the shards, name the output files. Plain Python (no Beam pipeline construct; files through
``transforms.storage.fileio``), unit-tested on its own (tests/test_planning.py); ``transforms.convert`` turns a plan into
PTransforms. The split follows xarray-beam's ``rechunker_algorithm.py`` beside ``rechunk.py``: the algorithm pure,
the wiring separate. The shard-count policy is :func:`num_shards`, the only place that decides it.

Planning happens in the launcher, like Beam's file sources estimate sizes: a bad input fails before any output
exists, and the shard count and feature specs are known up front.

This package is the import path of these names (``planning.plan_inputs``, ...); they live in ``inputs`` (the files,
their source, their indexes and row ranges) and ``plan`` (encodings, shards, splits, output names: the plan).
"""

from __future__ import annotations

from tfrecord_etl.transforms.planning.inputs import (
    PLAN_THREADS,
    PROVENANCE,
    InputPlan,
    add_provenance,
    index_concurrently,
    input_format,
    map_concurrently,
    plan_inputs,
    store_input,
)
from tfrecord_etl.transforms.planning.plan import (
    DEFAULT_TARGET_SHARD_BYTES,
    ConvertPlan,
    check_row_size,
    choose_encodings,
    describe_plan,
    format_source_options,
    num_shards,
    output_files,
    plan_convert,
    plan_splits,
    row_bytes,
    shard_suffix,
    source_options,
    with_generation,
)

__all__ = [
    "ConvertPlan",
    "DEFAULT_TARGET_SHARD_BYTES",
    "InputPlan",
    "PLAN_THREADS",
    "PROVENANCE",
    "add_provenance",
    "check_row_size",
    "choose_encodings",
    "describe_plan",
    "index_concurrently",
    "input_format",
    "map_concurrently",
    "num_shards",
    "output_files",
    "plan_convert",
    "plan_inputs",
    "plan_splits",
    "row_bytes",
    "shard_suffix",
    "source_options",
    "format_source_options",
    "store_input",
    "with_generation",
]
