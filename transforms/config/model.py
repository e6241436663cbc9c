"""The pydantic model of ``tfrecord-etl convert``'s options (:class:`ConvertConfig`) and its limits: what a YAML
``--config`` file, the command line and Python callers are validated against."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from tfrecord_etl.transforms.codec.encodings import AUTO, ENCODINGS
from tfrecord_etl.transforms.collections.spans import has_placeholders
from tfrecord_etl.transforms.renamed_flags import renamed_keys
from tfrecord_etl.transforms.sources import REGISTRY as SOURCE_REGISTRY, option_models
from tfrecord_etl.transforms.sources.options import comma_list

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


# the fields convert and augment both declare, alike: their defaults, checks and help written once (command_field)
_COMMAND_FIELDS: dict[str, dict[str, Any]] = {
    "overwrite": {
        "default": False,
        "description": "replace our files in an existing output directory (files we did not write are kept)",
    },
    "verbose": {"default": False, "description": "show TensorFlow and Beam logs"},
    "pipeline_options": {
        "default_factory": dict,
        "description": "Beam pipeline options as a mapping (YAML only), e.g. {runner: DirectRunner}; flags win",
    },
    "max_local_workers": {
        "default": DEFAULT_MAX_LOCAL_WORKERS,
        "ge": 1,
        "description": "the largest --direct_num_workers accepted (default: 4 per CPU, at least 16)",
    },
}


def command_field(name: str) -> Any:
    """A new pydantic ``Field`` of the option ``name`` that convert and augment share (``overwrite``, ``verbose``,
    ``pipeline_options``, ``max_local_workers``): its default, checks and help, the same in both models."""
    return Field(**_COMMAND_FIELDS[name])


def non_blank(value: str) -> str:
    """``value`` unless empty or only whitespace (an empty --output_dir would mean the current directory).

    Raises:
      ValueError: (a pydantic validation error) for an empty or blank path.
    """
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty or blank")
    return value


class ConvertCommon(BaseModel):
    """The options of ``tfrecord-etl convert`` that every format shares; :data:`ConvertConfig` adds each registered
    format's own (``sources.option_models``). YAML keys and flags have these names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str = Field(min_length=1, description="file pattern of the inputs (local, gs://, s3://)")
    output_dir: str = Field(min_length=1, description="output directory of the shards and metadata")
    format: FormatName | None = Field(
        None,
        description="input format; default: told by each file's "
        "content (its first bytes, a Zarr store by its metadata), else by its suffix; files "
        "only when named",
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
        description="number of shards (at most the number of rows); default: ceil(input bytes / "
        "--target_shard_mb), the same on every runner",
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
    overwrite: bool = command_field("overwrite")
    resume: bool = Field(
        False,
        description="continue a run that failed or was killed, into the same output: the shards it committed "
        "are kept (checked by size and the stamp recorded when each was written), only the missing ones are "
        "written; refused when the inputs, an option or the output format differ (docs/reliability.md)",
    )
    dry_run: bool = Field(
        False,
        description="plan and print the plan (files, rows, bytes, row ranges, shards, "
        "reads, features) without writing anything",
    )
    verbose: bool = command_field("verbose")
    progress: bool | None = Field(
        None,
        description="a progress bar on stderr when it is a terminal (records "
        "and bytes written of the planned total, rate, time left), else one line per "
        "shard written; default: the bar in a terminal, nothing otherwise "
        "(--no-progress: neither)",
    )
    pipeline_options: dict[str, Any] = command_field("pipeline_options")
    max_local_workers: int = command_field("max_local_workers")

    _paths = field_validator("input", "output_dir")(classmethod(lambda cls, v: non_blank(v)))
    _span = field_validator("span", mode="before")(  # YAML: span: 7
        classmethod(lambda cls, v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v)
    )
    # YAML may use the flags' comma syntax too ("datasets: /X,/obs")
    _lists = field_validator("allow_lossy", mode="before")(classmethod(lambda cls, v: comma_list(v)))

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data):
        return renamed_keys(data)

    @model_validator(mode="after")
    def _consistent(self):
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


def build_config_model() -> type[BaseModel]:
    """A config model of the formats registered now: :class:`ConvertCommon`'s fields, then each registered format's
    options (``sources.option_models()``, in registry order), with their checks; frozen, unknown keys refused.
    :class:`ConvertConfig` is the one built when the registry is first imported."""
    return create_model("ConvertConfig", __base__=_format_bases(), __module__=__name__, __doc__=ConvertConfig.__doc__)


def _format_bases() -> tuple[type[BaseModel], ...]:
    return (*reversed(option_models()), ConvertCommon)  # pydantic lists the last base's fields first


class ConvertConfig(*_format_bases()):  # type: ignore[misc]
    """Options of ``tfrecord-etl convert``: the shared ones (:class:`ConvertCommon`) and every registered format's
    (``sources.option_models()``: HDF5 and the containers, NumPy, raw, file collections, MATLAB, ENVI, ...); YAML
    keys and flags have these names: see the flag reference."""

    if TYPE_CHECKING:  # the formats' fields are known when the registry is imported: Any to a type checker

        def __getattr__(self, name: str) -> Any: ...
