"""Configuration: one pydantic model validates YAML files, command-line flags and Python callers alike.

Precedence: built-in defaults < ``--config FILE`` (YAML, loaded with ``yaml.safe_load``) < flags.
Custom flags are declared the Beam way (:class:`ConvertOptions`, a ``PipelineOptions`` subclass);
every other flag (``--runner``, ``--direct_num_workers``, ``--temp_location``, Dataflow and Flink
options) passes through to Beam untouched.

This package is the public import path of these names; they live in ``model`` (the pydantic model and its
limits), ``flags`` (the command line: flags from a model, the parser, :func:`parse_args`), ``yamlfile`` (the
YAML ``--config`` file and validation errors) and ``beamflags`` (Beam's own flags: checked, split, refused).
"""

from __future__ import annotations

from tfrecord_etl.transforms.config.beamflags import (
    beam_flag_parser,
    check_beam_flags,
    check_local_workers,
    check_not_a_template,
    split_beam_flags,
)
from tfrecord_etl.transforms.config.flags import (
    BEAM_CLASHES,
    ConvertOptions,
    add_model_flags,
    build_parser,
    flag_help,
    flag_type,
    parse_args,
)
from tfrecord_etl.transforms.config.model import (
    DEFAULT_MAX_LOCAL_WORKERS,
    MAX_CONFIG_BYTES,
    MAX_SHARDS,
    MAX_TARGET_RANGE_MB,
    MAX_TARGET_SHARD_MB,
    ConvertConfig,
    DefaultEncodingName,
    EncodingName,
    FormatName,
    command_field,
    non_blank,
)
from tfrecord_etl.transforms.config.yamlfile import load_yaml, validate

__all__ = [
    "BEAM_CLASHES",
    "DEFAULT_MAX_LOCAL_WORKERS",
    "MAX_CONFIG_BYTES",
    "MAX_SHARDS",
    "MAX_TARGET_RANGE_MB",
    "MAX_TARGET_SHARD_MB",
    "ConvertConfig",
    "ConvertOptions",
    "DefaultEncodingName",
    "EncodingName",
    "FormatName",
    "add_model_flags",
    "beam_flag_parser",
    "build_parser",
    "check_beam_flags",
    "check_local_workers",
    "check_not_a_template",
    "flag_help",
    "flag_type",
    "command_field",
    "load_yaml",
    "non_blank",
    "parse_args",
    "split_beam_flags",
    "validate",
]
