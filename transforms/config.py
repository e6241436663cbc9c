"""Configuration: one pydantic model validates YAML files, command-line flags and Python callers alike.

Precedence: built-in defaults < ``--config FILE`` (YAML, loaded with ``yaml.safe_load``) < flags.
Custom flags are declared the Beam way (:class:`ConvertOptions`, a ``PipelineOptions`` subclass);
every other flag (``--runner``, ``--direct_num_workers``, ``--temp_location``, Dataflow and Flink
options) passes through to Beam untouched.
"""
from __future__ import annotations

import argparse
import typing
from typing import Any, Literal, Optional

import yaml
from apache_beam.options.pipeline_options import PipelineOptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from transforms.errors import ConfigError


class ConvertConfig(BaseModel):
    """Options of ``python -m pipelines.convert``; YAML keys and flags have these names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str = Field(description="file pattern of the inputs (local, gs://, s3://)")
    output_dir: str = Field(description="output directory of the shards and metadata")
    format: Optional[Literal["hdf5", "npz", "npy"]] = Field(None, description="input format; default: from the suffix")
    datasets: Optional[list[str]] = Field(None, description="HDF5 dataset paths (comma-separated); default: all")
    npz_mode: Literal["rows", "arrays"] = Field("rows", description="npz: row i of each member -> one Example "
                                                "(rows), or each member -> one Example (arrays)")
    npy_mode: Literal["rows", "files"] = Field("rows", description="npy: rows of one array (rows), or each "
                                               "file -> one Example (files)")
    encoding: Literal["tensor", "list"] = Field("tensor", description="default encoding of every feature")
    feature_encodings: dict[str, Literal["tensor", "list"]] = Field(
        default_factory=dict, description="per-feature encodings, NAME=ENCODING,...")
    allow_lossy: list[str] = Field(default_factory=list, description="features whose lossy list cast "
                                   "(float64->float32, uint64->int64) is allowed, comma-separated")
    provenance: bool = Field(False, description="add features _source/file and _source/row")
    compression: Literal["none", "gzip", "zlib"] = Field("none", description="compression of the shards")
    num_shards: Optional[int] = Field(None, ge=1, description="number of shards; default: from the data size")
    target_shard_mb: float = Field(192.0, gt=0, description="target shard size in MB when num_shards is unset")
    target_range_mb: float = Field(8.0, gt=0, description="target size of one read row range in MB")
    max_compression_ratio: float = Field(500.0, gt=0, description="npz: refuse a member (of more than 1 MiB) or "
                                         "an archive whose uncompressed size exceeds this many times its "
                                         "compressed size (zip bombs)")
    max_empty_rows: int = Field(1000000, ge=0, description="npy/npz rows mode: most rows allowed when every row "
                                "holds zero bytes (shape (N, 0)), whose count the file size cannot bound")
    writer: Literal["planned", "beam"] = Field("planned", description="planned: shards planned from the source "
                                               "index, no shuffle, byte-identical reruns; beam: WriteToTFRecord")
    prefix: str = Field("data", pattern=r"^[A-Za-z0-9_.-]+$", description="shard file name prefix")
    dead_letter_dir: Optional[str] = Field(None, description="write row ranges that cannot be read or encoded "
                                           "there as JSON lines and go on; default: stop at the first")
    overwrite: bool = Field(False, description="replace an existing output directory")
    verbose: bool = Field(False, description="show TensorFlow and Beam logs")
    progress: Optional[bool] = Field(None, description="print planned shards done / total on stderr; "
                                     "default: when stderr is a terminal")
    pipeline_options: dict[str, Any] = Field(default_factory=dict, description="Beam pipeline options as a "
                                             "mapping (YAML only), e.g. {runner: DirectRunner}; flags win")

    def beam_argv(self, argv: list[str]) -> list[str]:
        """``pipeline_options`` as Beam flags, followed by ``argv`` (so the command line wins)."""
        out = []
        for key, value in self.pipeline_options.items():
            if isinstance(value, bool):
                out.append(f"--{key}" if value else f"--no{key}")
            elif isinstance(value, list):
                out += [f"--{key}={v}" for v in value]
            else:
                out.append(f"--{key}={value}")
        return out + list(argv)


_LIST_FIELDS = {"datasets", "allow_lossy"}
_DICT_FIELDS = {"feature_encodings"}
_YAML_ONLY = {"pipeline_options"}


def _flag_type(name: str, annotation):
    if name in _LIST_FIELDS:
        return lambda s: [v.strip() for v in s.split(",") if v.strip()]
    if name in _DICT_FIELDS:
        def parse(s):
            try:
                return dict(kv.split("=", 1) for kv in s.split(",") if kv.strip())
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected NAME=VALUE,..., got {s!r}") from None
        return parse
    base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if base[0] in (int, float):
        return base[0]
    return str


class ConvertOptions(PipelineOptions):
    """The convert pipeline's flags, declared the Beam way; defaults are None so the config file can fill them."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_model_flags(parser, ConvertConfig)
        parser.add_argument("--config", default=None, help="YAML config file (keys as the flags)")


def add_model_flags(parser, model: type[BaseModel]) -> None:
    """Adds ``--NAME`` for every field of ``model`` (help text with the default)."""
    for name, field in model.model_fields.items():
        if name in _YAML_ONLY:
            continue
        default = field.get_default(call_default_factory=True)
        help_text = f"{field.description} (default: {default!r})" if not field.is_required() else \
            f"{field.description} (required)"
        choices = None
        if typing.get_origin(field.annotation) is Literal:
            choices = list(typing.get_args(field.annotation))
        elif typing.get_origin(field.annotation) is typing.Union:
            lit = [typing.get_args(a) for a in typing.get_args(field.annotation) if typing.get_origin(a) is Literal]
            choices = list(lit[0]) if lit else None
        if field.annotation is bool or field.annotation == Optional[bool]:
            parser.add_argument(f"--{name}", default=None, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(f"--{name}", default=None, type=_flag_type(name, field.annotation),
                                choices=choices, help=help_text)


def load_yaml(path: str) -> dict:
    """A YAML mapping, loaded safely. Raises ConfigError for a missing file or invalid YAML."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"Cannot read config file: {e.strerror}", file=path) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"Invalid YAML: {str(e).splitlines()[0]}", file=path) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("The config file must hold a mapping of keys to values", file=path)
    return data


def validate(model: type[BaseModel], values: dict, source: str = "config"):
    """``model(**values)``, with a one-line ConfigError per problem (unknown key, wrong type, missing)."""
    try:
        return model(**values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "?"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key '{key}'")
            elif err["type"] == "missing":
                problems.append(f"missing required key '{key}' (--{key})")
            else:
                problems.append(f"'{key}': {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"Invalid {source}: " + "; ".join(problems),
                          hint="see --help for every key, its type and default") from None


def parse_args(argv: list[str], model: type[BaseModel], options_cls: type[PipelineOptions], prog: str,
               description: str):
    """Parses our flags and the config file; returns ``(config, beam_argv)``.

    Raises:
      ConfigError: invalid YAML, unknown key, wrong type or missing input (one line each).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False,
                                     epilog="Every other flag (--runner, --direct_num_workers, --temp_location, "
                                            "Dataflow/Flink options) is passed to Beam untouched.")
    options_cls._add_argparse_args(parser)
    known, beam_argv = parser.parse_known_args(argv)
    values = load_yaml(known.config) if known.config else {}
    for key, value in vars(known).items():
        if key != "config" and value is not None:
            values[key] = value
    cfg = validate(model, values, f"config ({known.config})" if known.config else "flags")
    return cfg, cfg.beam_argv(beam_argv) if hasattr(cfg, "beam_argv") else beam_argv
