"""Configuration: one pydantic model validates YAML files, command-line flags and Python callers alike.

Precedence: built-in defaults < ``--config FILE`` (YAML, loaded with ``yaml.safe_load``) < flags.
Custom flags are declared the Beam way (:class:`ConvertOptions`, a ``PipelineOptions`` subclass);
every other flag (``--runner``, ``--direct_num_workers``, ``--temp_location``, Dataflow and Flink
options) passes through to Beam untouched.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import types
import typing
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import yaml
from apache_beam.options.pipeline_options import PipelineOptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tfrecord_etl.transforms.codec.encodings import AUTO, ENCODINGS
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.renamed_flags import add_renamed_flags, renamed_keys
from tfrecord_etl.transforms.sources import REGISTRY as SOURCE_REGISTRY
from tfrecord_etl.transforms.sources.base import DEFAULT_MAX_DATASETS, DEFAULT_MAX_MAT_NESTING

if TYPE_CHECKING:  # the choices are the registries' keys, known when they are imported: strings to a type checker
    EncodingName: TypeAlias = str
    DefaultEncodingName: TypeAlias = str
    FormatName: TypeAlias = str
else:
    EncodingName = Literal[tuple(ENCODINGS)]  # the registered encodings: tensor, list, zlib, packbits, varlen
    DefaultEncodingName = Literal[(AUTO,) + tuple(ENCODINGS)]  # --encoding: the auto rule or one encoding for all
    FormatName = Literal[tuple(SOURCE_REGISTRY)]  # the registered sources: hdf5, npz, npy, raw


MAX_SHARDS = 99999  # shard file names are PREFIX-NNNNN-of-NNNNN (sharding.ShardPlan.file_name)
MAX_TARGET_SHARD_MB = 1024 * 1024.0  # 1 TiB
MAX_TARGET_RANGE_MB = 64 * 1024.0  # 64 GiB: a row range is held in memory by one worker
DEFAULT_MAX_LOCAL_WORKERS = max(16, 4 * (os.cpu_count() or 1))
MAX_CONFIG_BYTES = 1 << 20  # a config file larger than 1 MiB is refused before parsing


def non_blank(value: str) -> str:
    """``value`` unless empty or only whitespace (an empty --output_dir would mean the current directory).

    Raises:
      ValueError: (a pydantic validation error) for an empty or blank path.
    """
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty or blank")
    return value


class ConvertConfig(BaseModel):
    """Options of ``tfrecord-etl convert``; YAML keys and flags have these names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str = Field(min_length=1, description="file pattern of the inputs (local, gs://, s3://)")
    output_dir: str = Field(min_length=1, description="output directory of the shards and metadata")
    format: FormatName | None = Field(
        None,
        description="input format; default: told by each file's "
        "content (its first bytes, a Zarr store by its metadata), else by its suffix; files "
        "only when named",
    )
    datasets: list[str] | None = Field(
        None,
        description="HDF5 dataset paths or npz members (comma-separated); "
        "default: the largest row group (datasets sharing their leading "
        "dimension), every npz member",
    )
    exclude_datasets: list[str] | None = Field(
        None, description="npz: members to leave out (comma-separated); they are never read"
    )
    row_group: int | None = Field(
        None,
        ge=1,
        description="hdf5/netcdf3/matlab/zarr rows mode: convert row "
        "group N (datasets sharing their leading length; 1 = the default, inspect FILE "
        "lists them) instead of the default; old name --hdf5_group",
    )
    container_mode: Literal["auto", "rows", "datasets"] = Field(
        "auto",
        description="hdf5/netcdf3/matlab/zarr: row i of the datasets -> one Example (rows), each dataset / "
        "MATLAB cell -> one Example (datasets), or auto: rows, and datasets for a file with no dataset with rows; "
        "old name --hdf5_mode",
    )
    npz_mode: Literal["rows", "arrays"] = Field(
        "rows", description="npz: row i of each member -> one Example (rows), or each member -> one Example (arrays)"
    )
    npy_mode: Literal["rows", "files"] = Field(
        "rows", description="npy: rows of one array (rows), or each file -> one Example (files)"
    )
    dtype: str | None = Field(
        None, description="raw: the array's NumPy dtype, any byte order (e.g. '>f4'); default: from a sidecar"
    )
    shape: list[int] | None = Field(
        None,
        description="raw: the array's shape, comma-separated; the first "
        "dimension may be -1 (rows from the file size), e.g. -1,28,28",
    )
    offset: int = Field(0, ge=0, description="raw: bytes before the array data (a header to skip)")
    order: Literal["C", "F"] = Field("C", description="raw: C (row-major) or F (Fortran, column-major) order")
    count: int | None = Field(
        None,
        ge=0,
        description="raw: read this many rows after --offset and leave the "
        "bytes after them (e.g. a second array); default: to the end of the file",
    )
    file_labels: str = Field(
        "dir",
        min_length=1,
        description="files: dir (label = the class folder under the "
        "pattern's base), none, or the path of a CSV table file,label[,more columns]",
    )
    file_feature: str = Field(
        "image", pattern=r"^[A-Za-z0-9_.-]+$", description="files: the feature holding each file's bytes"
    )
    image_header: bool | None = Field(
        None,
        description="files: record <feature>/format, /height, /width, "
        "/channels from the image header (Pillow), a file that is not an image "
        "failing at planning; default: when any file is an image (a folder of "
        "other files converts as bytes and names)",
    )
    decode_check: bool = Field(
        False, description="files: decode every image fully; corrupt ones fail (or are dead-lettered)"
    )
    encoding: DefaultEncodingName = Field(
        AUTO,
        description="default encoding of every feature: auto = typed "
        "lists where exact and not much larger (float32, int64, strings, small "
        "integer vectors), tensor elsewhere (float64, uint64, complex, images); "
        "or one of the encodings for all",
    )
    feature_encodings: dict[str, EncodingName] = Field(
        default_factory=dict, description="per-feature encodings, NAME=ENCODING,..."
    )
    allow_lossy: list[str] = Field(
        default_factory=list,
        description="features whose lossy list cast (float64->float32, uint64->int64) is allowed, comma-separated",
    )
    provenance: bool = Field(False, description="add features _source/file and _source/row")
    compression: Literal["none", "gzip", "zlib"] = Field("none", description="compression of the shards")
    compression_level: int | None = Field(
        None,
        ge=0,
        le=9,
        description="gzip/zlib level of the compression "
        "backend: isal 0-3 (default 3), zlib-ng 0-9 (default 3), zlib 0-9 "
        "(default 6); default: the backend's",
    )
    index: bool = Field(
        False,
        description="write a tfrecord2idx index file (byte offset and length of every "
        "record) beside each shard, for PyTorch/DALI readers and reader.get; uncompressed shards only",
    )
    splits: dict[str, int] = Field(
        default_factory=dict,
        description="named splits by hash buckets, "
        "NAME=WEIGHT,... (e.g. train=8,validation=1,test=1): each row goes to one split "
        "by a hash of --split_key (or of its global row index), as TFX's hash_buckets",
    )
    split_key: str | None = Field(
        None,
        min_length=1,
        description="--splits: the feature (one integer or string "
        "per example) whose value decides the split; default: the global row index",
    )
    split: str | None = Field(
        None,
        description="put every row in this one named split (a TFDS directory gets a "
        "split per run: --tfds_name NAME --split test adds test)",
    )
    shuffle_seed: int | None = Field(
        None,
        ge=0,
        lt=2**64,
        description="shuffle the record order within each "
        "split (or the output) with this seed: every record may land anywhere, "
        "byte-identical for a seed; moves the data through a Beam shuffle",
    )
    tfds_name: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="write a TFDS-loadable "
        "directory: shards NAME-SPLIT.tfrecord-XXXXX-of-YYYYY, dataset_info.json and "
        "features.json (tfds.builder_from_directory); uncompressed; split default train",
    )
    num_shards: int | None = Field(
        None,
        ge=1,
        le=MAX_SHARDS,
        description="number of shards (at most the number of rows); default: from the data size",
    )
    target_shard_mb: float = Field(
        192.0,
        gt=0,
        le=MAX_TARGET_SHARD_MB,
        allow_inf_nan=False,
        description="target shard size in MiB (2**20 bytes) when num_shards is unset",
    )
    target_range_mb: float = Field(
        8.0,
        gt=0,
        le=MAX_TARGET_RANGE_MB,
        allow_inf_nan=False,
        description="target size of one read row range in MiB (2**20 bytes)",
    )
    max_compression_ratio: float = Field(
        500.0,
        gt=0,
        allow_inf_nan=False,
        description="npz: refuse a member (of more than 1 MiB) or an archive whose "
        "uncompressed size exceeds this many times its compressed size (zip bombs)",
    )
    max_empty_rows: int = Field(
        1000000,
        ge=0,
        description="rows mode: most rows allowed when every row "
        "holds zero bytes (shape (N, 0)), whose count the file size cannot bound",
    )
    max_row_mb: float = Field(
        1024.0,
        gt=0,
        allow_inf_nan=False,
        description="refuse at planning a row whose array "
        "values exceed this many MiB (a row is held whole while it is read and encoded: "
        "about twice its size at peak; one Example holds at most 2048 MiB, protobuf's limit)",
    )
    max_mat_variable_mb: float = Field(
        2048.0,
        gt=0,
        allow_inf_nan=False,
        description="matlab (v4-v7 .mat): refuse "
        "a variable over this many MiB before loading it (SciPy's loadmat reads a "
        "variable whole: about twice this at peak)",
    )
    max_mat_nesting: int = Field(
        DEFAULT_MAX_MAT_NESTING,
        ge=1,
        le=1000,
        description="matlab (v5-v7 .mat): refuse "
        "a variable whose arrays nest deeper than this (cells or structs inside cells or "
        "structs), checked before SciPy loads it (its reader recurses in C)",
    )
    allow_external_storage: bool = Field(
        False,
        description="hdf5: read datasets stored in external raw files, and "
        "follow external links, when those files lie in the input file's own "
        "directory; default: refuse",
    )
    allow_fill_value: bool = Field(
        False,
        description="hdf5: read storage that was never written (unallocated chunks) as the fill value; default: refuse",
    )
    max_datasets: int = Field(
        DEFAULT_MAX_DATASETS,
        ge=1,
        description="hdf5: most datasets walked in one file, and Examples of "
        "one file in datasets mode (cells count); more is refused at planning",
    )
    follow_symlinks: bool = Field(
        False,
        description="read files and directories through symbolic links that lead "
        "outside the input pattern's base directory; default: refuse them (links inside "
        "it are followed)",
    )
    writer: Literal["planned", "beam"] = Field(
        "planned",
        description="planned: shards planned from the source "
        "index, no shuffle, byte-identical reruns; beam: WriteToTFRecord",
    )
    prefix: str = Field("data", pattern=r"^[A-Za-z0-9_.-]+$", description="shard file name prefix")
    dead_letter_dir: str | None = Field(
        None,
        description="write row ranges that cannot be read or encoded "
        "there as JSON lines and go on; default: stop at the first",
    )
    span: str | None = Field(
        None,
        description="--input with {SPAN} or {YYYY}{MM}{DD}: the span to convert: a "
        "number, latest (the largest matched), or a date YYYY-MM-DD for a date pattern; "
        "default: latest",
    )
    version: int | None = Field(
        None, ge=0, description="--input with {VERSION}: the version of the span to convert; default: its largest"
    )
    incremental: bool = Field(
        False,
        description="convert the files matching --input (no placeholders) that no "
        "span of the collection in --output_dir holds yet, as its next span",
    )
    reconvert_changed: bool = Field(
        False,
        description="--incremental: re-convert the span holding a file that "
        "changed since it was converted, instead of stopping",
    )
    allow_schema_change: bool = Field(
        False,
        description="collections: allow a span whose schema differs from "
        "the previous span's (recorded in collection.json)",
    )
    overwrite: bool = Field(
        False, description="replace our files in an existing output directory (files we did not write are kept)"
    )
    dry_run: bool = Field(
        False,
        description="plan and print the plan (files, rows, bytes, row ranges, shards, "
        "reads, features) without writing anything",
    )
    verbose: bool = Field(False, description="show TensorFlow and Beam logs")
    progress: bool | None = Field(
        None,
        description="a progress bar on stderr when it is a terminal (records "
        "and bytes written of the planned total, rate, time left), else one line per "
        "shard written; default: the bar in a terminal, nothing otherwise "
        "(--no-progress: neither)",
    )
    pipeline_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Beam pipeline options as a mapping (YAML only), e.g. {runner: DirectRunner}; flags win",
    )
    max_local_workers: int = Field(
        DEFAULT_MAX_LOCAL_WORKERS,
        ge=1,
        description="the largest --direct_num_workers accepted (default: 4 per CPU, at least 16)",
    )

    _paths = field_validator("input", "output_dir")(classmethod(lambda cls, v: non_blank(v)))
    _span = field_validator("span", mode="before")(  # YAML: span: 7
        classmethod(lambda cls, v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v)
    )
    # YAML may use the flags' comma syntax too ("datasets: /X,/obs")
    _lists = field_validator("datasets", "exclude_datasets", "allow_lossy", "shape", mode="before")(
        classmethod(lambda cls, v: [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v)
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data):
        return renamed_keys(data)

    @model_validator(mode="after")
    def _one_container_choice(self):
        if self.row_group is not None and (self.datasets or self.container_mode == "datasets"):
            raise ValueError(
                "row_group chooses a row group in rows mode: it cannot be combined with datasets or "
                "container_mode datasets"
            )
        if self.splits and self.split is not None:
            raise ValueError("--splits (rows by hash) and --split (every row in one split) cannot be combined")
        if self.split_key is not None and not self.splits:
            raise ValueError("--split_key decides between --splits: pass --splits too")
        if self.tfds_name is not None and self.compression != "none":
            raise ValueError(
                f"TFDS reads TFRecord shards uncompressed (TFDS 4.9's TfRecordFileAdapter opens them "
                f"with tf.data.TFRecordDataset without a compression type: {self.compression} shards "
                f"fail with DataLossError): --tfds_name cannot be combined with --compression "
                f"{self.compression} (convert without --compression)"
            )
        if (
            self.splits or self.split is not None or self.tfds_name or self.shuffle_seed is not None
        ) and self.writer != "planned":
            raise ValueError(
                "--splits, --split, --tfds_name and --shuffle_seed need --writer planned (the shards "
                "are planned; the beam writer lets WriteToTFRecord choose them)"
            )
        from tfrecord_etl.transforms.collections.spans import has_placeholders

        if self.incremental and has_placeholders(self.input):
            raise ValueError(
                "--incremental takes a pattern without placeholders ({SPAN}, dates): placeholders name "
                "the span already; leave --incremental out"
            )
        if (self.span is not None or self.version is not None) and not has_placeholders(self.input):
            raise ValueError("--span and --version need an --input with {SPAN} or {YYYY}{MM}{DD} (and {VERSION})")
        if self.reconvert_changed and not self.incremental:
            raise ValueError("--reconvert_changed goes with --incremental")
        if self.compression_level is not None and (self.compression == "none" or self.writer == "beam"):
            raise ValueError(
                "--compression_level sets the level of gzip or zlib shards written by the planned "
                "writer: pass --compression gzip or zlib (and not --writer beam, which compresses with "
                "Beam's own zlib at level 6)"
            )
        if self.index and self.compression != "none":
            raise ValueError(
                f"index files give byte offsets into uncompressed shards (what the tfrecord package, "
                f"DALI and reader.get seek to): --index cannot be combined with --compression "
                f"{self.compression}"
            )
        return self

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


_LIST_FIELDS = {"datasets", "exclude_datasets", "allow_lossy", "shape"}
_NEGATIVE_VALUE_FLAGS = ("--shape",)  # values that may start with '-' (-1,28,28), which argparse takes for a flag
_DICT_FIELDS = {"feature_encodings", "splits"}
_YAML_ONLY = {"pipeline_options"}


def _flag_type(name: str, annotation):
    if name in _LIST_FIELDS:
        return lambda s: [v.strip() for v in s.split(",") if v.strip()]
    if name in _DICT_FIELDS:

        def parse(s):
            try:
                pairs = [kv.split("=", 1) for kv in s.split(",") if kv.strip()]
                out = dict(pairs)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected NAME=VALUE,..., got {s!r}") from None
            if len(out) != len(pairs):  # dict() keeps the last of a repeated name: its first value would be lost
                twice = next(k for i, (k, _) in enumerate(pairs) if k in (n for n, _ in pairs[:i]))
                raise argparse.ArgumentTypeError(f"{twice!r} is named twice in {s!r}: give each name once")
            return out

        return parse
    base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if base[0] in (int, float):
        return base[0]
    return str


class ConvertOptions(PipelineOptions):
    """The convert pipeline's flags, declared the Beam way; defaults are None so the config file can fill them."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_model_flags(parser, ConvertConfig, skip=BEAM_CLASHES)
        parser.add_argument("--config", default=None, help="YAML config file (keys as the flags)")
        add_renamed_flags(parser, ConvertConfig, _flag_type)


# Our flags that a Beam PipelineOptions class declares too (TestOptions' --dry_run): Beam builds one parser of every
# registered options class, so these are added only to our own parser (config.parse_args), never to Beam's.
BEAM_CLASHES = frozenset({"dry_run"})


def flag_help(field) -> str:
    """A flag's help: its description, then ``(required)``, or ``(default: VALUE)`` when the default is a value
    the description does not state already (no ``(default: None)``, ``[]`` or ``{}``: such a flag is simply off,
    and its description says what happens without it)."""
    if field.is_required():
        return f"{field.description} (required)"
    default = field.get_default(call_default_factory=True)
    if (
        default is None
        or (isinstance(default, (list, dict, tuple)) and not default)
        or re.search(r"\(default[ :]|\bdefault: ", field.description or "")
    ):
        return field.description
    return f"{field.description} (default: {default!r})"


def add_model_flags(parser, model: type[BaseModel], skip=frozenset()) -> None:
    """Adds ``--NAME`` for every field of ``model`` but those in ``skip`` (``--ALIAS`` for a field with an alias,
    e.g. augment's ``--schema``, whose field cannot be named ``schema`` in a pydantic model; help text with the
    default)."""
    for name, field in model.model_fields.items():
        flag = f"--{field.alias or name}"
        if name in _YAML_ONLY or name in skip:
            continue
        help_text = flag_help(field)
        choices = None
        if typing.get_origin(field.annotation) is Literal:
            choices = list(typing.get_args(field.annotation))
        elif typing.get_origin(field.annotation) in (typing.Union, types.UnionType):  # Optional[X] or X | None
            lit = [typing.get_args(a) for a in typing.get_args(field.annotation) if typing.get_origin(a) is Literal]
            choices = list(lit[0]) if lit else None
        if field.annotation is bool or field.annotation == (bool | None):  # equal to Optional[bool] too
            parser.add_argument(flag, dest=name, default=None, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(
                flag, dest=name, default=None, type=_flag_type(name, field.annotation), choices=choices, help=help_text
            )


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses anchors/aliases (a 538-byte "billion laughs" file expands to
    gigabytes) and a key repeated in one mapping (last-wins would silently drop the first value)."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark
            raise ConfigError(
                f"YAML anchors and aliases (&{event.anchor} / *{event.anchor}) are not allowed "
                f"in config files (line {mark.line + 1})",
                file=mark.name,
                hint="write the values out in full",
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise ConfigError(
                    f"Duplicate key {key!r} in the config file (line {line}, first on line {first})",
                    file=key_node.start_mark.name,
                    hint="keep one of them",
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict:
    """A YAML mapping, loaded safely: no tags beyond plain YAML, no anchors/aliases, no repeated keys,
    at most ``max_bytes`` (1 MiB) read.

    Raises:
      ConfigError: a missing/unreadable or too large file, invalid YAML, an alias, a duplicate key.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise ConfigError(f"Cannot read config file: {e.strerror}", file=path) from None
    if len(raw) > max_bytes:
        raise ConfigError(
            f"The config file is larger than {max_bytes} bytes",
            file=path,
            hint="a config file holds a few options; pass large lists in a file of their own",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"The config file is not UTF-8 text (byte offset {e.start})", file=path) from None
    try:
        loader = _StrictLoader(text)
        loader.name = path
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(f"Invalid YAML: {str(e).splitlines()[0]}", file=path) from None
    except RecursionError:
        raise ConfigError("Invalid YAML: nested too deeply", file=path) from None
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
                close = difflib.get_close_matches(key, list(model.model_fields), n=1)
                problems.append(f"unknown key '{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            elif err["type"] == "missing":
                problems.append(f"missing required key '{key}' (--{key})")
            else:
                problems.append(f"'{key}': {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(
            f"Invalid {source}: " + "; ".join(problems), hint="see --help for every key, its type and default"
        ) from None


def build_parser(
    model: type[BaseModel], options_cls: type[PipelineOptions], prog: str, description: str
) -> argparse.ArgumentParser:
    """The argument parser of ``model``'s flags (declared by ``options_cls``), as :func:`parse_args` uses it."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every other flag (--runner, --direct_num_workers, --temp_location, "
        "Dataflow/Flink options) is passed to Beam.",
    )
    options_cls._add_argparse_args(parser)
    for name in BEAM_CLASHES & set(model.model_fields):
        parser.add_argument(
            f"--{name}",
            dest=name,
            default=None,
            action=argparse.BooleanOptionalAction,
            help=f"{model.model_fields[name].description} (default: False)",
        )
    return parser


def parse_args(
    argv: list[str],
    model: type[BaseModel],
    options_cls: type[PipelineOptions],
    prog: str,
    description: str,
    parser: argparse.ArgumentParser | None = None,
):
    """Parses our flags and the config file; returns ``(config, beam_argv)``. ``parser``: the command's parser
    (its flags grouped for ``--help``), else :func:`build_parser`'s.

    Every flag that is neither ours nor a registered Beam pipeline option (on the command line or in the
    YAML ``pipeline_options``) is refused, since Beam silently drops what it does not know.

    Raises:
      ConfigError: invalid YAML, unknown key or flag, wrong type, missing input, too many local workers
        (one line each).
    """
    parser = parser if parser is not None else build_parser(model, options_cls, prog, description)
    argv = list(argv)
    for i in range(len(argv) - 2, -1, -1):
        if argv[i] in _NEGATIVE_VALUE_FLAGS and i + 1 < len(argv):
            argv[i : i + 2] = [f"{argv[i]}={argv[i + 1]}"]
    known, beam_argv = parser.parse_known_args(argv)
    values = load_yaml(known.config) if known.config else {}
    for key, value in vars(known).items():
        if key != "config" and value is not None:
            values[key] = value
    cfg = validate(model, values, f"config ({known.config})" if known.config else "flags")
    beam_argv = cfg.beam_argv(beam_argv) if hasattr(cfg, "beam_argv") else beam_argv
    from tfrecord_etl.transforms.localmode import without_auto

    beam_argv = without_auto(beam_argv)  # --direct_running_mode auto: ours, resolved after planning
    check_beam_flags(beam_argv, [o for a in parser._actions for o in a.option_strings])
    check_not_a_template(beam_argv)
    check_local_workers(
        beam_argv, getattr(cfg, "max_local_workers", DEFAULT_MAX_LOCAL_WORKERS), hasattr(cfg, "max_local_workers")
    )
    return cfg, beam_argv


def check_not_a_template(beam_argv: list[str]) -> None:
    """Refuses Beam's ``--template_location`` (DataflowRunner writes a classic template there instead of running
    the job): the commands plan the job when they run (the input files matched, the row ranges, the shard names)
    and hold the output directory's lock while it runs, so a template would replay the plan of the day it was built
    into a directory nobody checked or locked. Refused before anything is read or written, so a template build
    leaves nothing behind (no run marker, no lock). Run the command itself on a schedule instead, or a Flex
    Template, whose launcher container runs the command.

    Raises:
      ConfigError: ``--template_location`` is given (command line or the YAML ``pipeline_options``).
    """
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

    location = PipelineOptions(beam_argv).view_as(GoogleCloudOptions).template_location
    if location:
        raise ConfigError(
            f"--template_location {location}: a Dataflow classic template of this command cannot "
            "be built: the command plans the job (input files, row ranges, shards) and locks the "
            "output directory when it runs, and a template would replay that plan later unchecked",
            hint="run the command itself on a schedule (see the Airflow DAGs in configs/airflow/), or "
            "package it as a Dataflow Flex Template whose launcher runs the command",
        )


# Runner modules that register their own PipelineOptions subclasses when imported.
_RUNNER_MODULES = (
    "apache_beam.runners.dataflow.dataflow_runner",
    "apache_beam.runners.portability.flink_runner",
    "apache_beam.runners.portability.spark_runner",
    "apache_beam.runners.portability.prism_runner",
    "apache_beam.runners.dask.dask_runner",
)


class _RaisingParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a one-line ConfigError instead of usage text and SystemExit."""

    def error(self, message):
        raise ConfigError(f"Invalid Beam option: {message}", hint="see Beam's PipelineOptions for its flags")


def beam_flag_parser(import_runners: bool = False) -> argparse.ArgumentParser:
    """A parser of every ``--flag`` Beam knows (all registered ``PipelineOptions`` subclasses, recursively).

    With ``import_runners``, the runner modules that declare their own options (Dataflow, Flink, Spark,
    Prism, Dask) are imported first, where installed.
    """
    if import_runners:
        for name in _RUNNER_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a runner whose dependencies are missing declares nothing
                pass
    parser = _RaisingParser(add_help=False, allow_abbrev=False, conflict_handler="resolve")
    seen, stack = set(), list(PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack += cls.__subclasses__()
        try:
            cls._add_argparse_args(parser)
        except Exception:  # noqa: BLE001 - a foreign subclass that conflicts; Beam would fail on it too
            continue
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def check_beam_flags(beam_argv: list[str], ours: Iterable[str] = ()) -> None:
    """Refuses a flag that is neither ours (``ours``: option strings) nor Beam's, with a suggestion.

    Accepts ``--flag=value``, ``--flag value``, boolean ``--flag`` and ``--noflag`` (from a YAML ``false``).

    Raises:
      ConfigError: ``unknown flag --compresion (did you mean --compression?)``, a stray argument, or a
        value Beam's parser refuses (``--direct_num_workers abc``).
    """
    parser = beam_flag_parser()
    actions = _actions(parser)
    names = [str(a) for a in beam_argv]
    if any(_flag_name(n) and _lookup(actions, _flag_name(n)) is None for n in names):
        parser = beam_flag_parser(import_runners=True)
        actions = _actions(parser)
    i = 0
    while i < len(names):
        token = names[i]
        if token == "--":
            break
        name = _flag_name(token)
        if name is None:
            raise ConfigError(
                f"unexpected argument {token!r}", hint="every value belongs to a --flag; quote patterns with spaces"
            )
        action = _lookup(actions, name)
        if action is None:
            candidates = sorted(set(actions) | {o for o in ours if o.startswith("--")})
            close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
            did = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(
                f"unknown flag {name}{did}", hint="see --help for our flags; Beam's are listed in its PipelineOptions"
            )
        i = _flag_end(names, i, action, actions)
    parser.parse_known_args([n for n in names if not (n.startswith("--no") and n.split("=")[0] not in actions)])


def split_beam_flags(argv: list[str], ours: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """``(the other arguments, Beam's flags)``: ``argv`` split into the flags Beam's ``PipelineOptions`` know
    that are not ours (``ours``: option strings), each with its value, and everything else, in order.

    For a command that is not a Beam pipeline (verify) but is started by a Beam launcher such as Airflow's
    ``BeamRunPythonPipelineOperator``, which always adds ``--runner=...`` and ``--labels=...``: it ignores
    Beam's flags and parses the rest strictly, so a misspelled flag of its own is still refused.
    """
    names, ours = [str(a) for a in argv], set(ours)
    parsers, rest, beam, i = {}, list[str](), list[str](), 0
    while i < len(names):
        token, name = names[i], _flag_name(names[i])
        if token == "--":
            rest += names[i:]
            break
        if name is None or name in ours:
            rest.append(token)
            i += 1
            continue
        for import_runners in (False, True):  # the runners' modules are imported only for a flag of theirs
            if import_runners not in parsers:
                parsers[import_runners] = _actions(beam_flag_parser(import_runners))
            actions = parsers[import_runners]
            action = _lookup(actions, name)
            if action is not None:
                break
        end = i + 1 if action is None else _flag_end(names, i, action, actions)
        (rest if action is None else beam).extend(names[i:end])
        i = end
    return rest, beam


def _flag_end(names: list[str], i: int, action: argparse.Action, actions: dict) -> int:
    """The index after Beam flag ``names[i]`` and its values (``--flag=v``, ``--flag v``, ``--flag v1 v2``,
    boolean ``--flag`` / ``--noflag``)."""
    name = _flag_name(names[i])
    i += 1
    if "=" in names[i - 1] or action.nargs == 0 or (name.startswith("--no") and name not in actions):
        return i
    if action.nargs in ("+", "*"):
        while i < len(names) and not names[i].startswith("-"):
            i += 1
    elif i < len(names):
        i += 1  # the flag's value, whatever it looks like (e.g. -1)
    return i


def _flag_name(token: str) -> str | None:
    if not token.startswith("-") or token in ("-", "--") or token[1:2].isdigit():
        return None
    return token.split("=", 1)[0]


def _lookup(actions: dict, name: str):
    if name in actions:
        return actions[name]
    if name.startswith("--no"):  # --noflag: a boolean flag set false (pipeline_options: {flag: false})
        action = actions.get("--" + name[4:])
        if action is not None and action.nargs == 0:
            return action
    return None


def check_local_workers(beam_argv: list[str], limit: int, has_flag: bool = True) -> None:
    """Refuses ``--direct_num_workers`` above ``limit`` (each is a process, or a thread, of its own).

    Raises:
      ConfigError: too many workers (with the limit and the CPU count).
    """
    from apache_beam.options.pipeline_options import DirectOptions

    workers = PipelineOptions([str(a) for a in beam_argv]).view_as(DirectOptions).direct_num_workers
    if workers is not None and workers > limit:
        raise ConfigError(
            f"--direct_num_workers {workers} is more than the limit of {limit} local workers",
            hint=f"this machine has {os.cpu_count()} CPUs: use at most a few per CPU"
            + (", or raise the limit with --max_local_workers" if has_flag else ""),
        )
