"""The options of the augment pipeline (``tfrecord-etl augment``, ``AugmentTFRecord``): the pydantic model
that validates flags and YAML keys, and the Beam ``PipelineOptions`` subclass that declares the flags.

The join source (``--join_input``) takes convert's format options (``--envi_rows``, ``--dtype``/``--shape``,
``--npz_mode``, ``--container_mode``, ...): :class:`AugmentConfig` is :class:`AugmentCommon` plus every registered
format's options model (``sources.option_models``), with the same names, checks and ``--help`` groups. Two kinds are
refused (:data:`NOT_FOR_JOIN`): ``--datasets`` (the join names its datasets with ``--join_datasets``) and the
options of formats that a join source cannot be (chosen only by ``--format``, which the join does not take: file
collections)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from apache_beam.options.pipeline_options import PipelineOptions
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tfrecord_etl.transforms.codec.encodings import AUTO
from tfrecord_etl.transforms.config import (
    ConvertConfig,
    DefaultEncodingName,
    EncodingName,
    add_model_flags,
    command_field,
    flag_type,
)
from tfrecord_etl.transforms.renamed_flags import add_renamed_flags, renamed_keys
from tfrecord_etl.transforms.sources import join_option_models, join_refused_options, option_models


def _split(value):
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _pairs(value, allow_bare=False):
    """``"A=B,C=D"`` (flags) or a mapping (YAML) -> ``{A: B, C: D}``; values as strings."""
    if isinstance(value, (str, list)):
        items, out = _split(value) if isinstance(value, str) else value, {}
        for item in items:
            key, sep, val = str(item).partition("=")
            if not sep and not allow_bare:
                raise ValueError(f"expected NAME=VALUE, got {item!r}")
            if key.strip() in out:  # the first value would be lost
                raise ValueError(f"{key.strip()!r} is named twice: give each name once")
            out[key.strip()] = val.strip() if sep else key.strip()
        return out
    if isinstance(value, dict):
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    return value


# option name -> why a join refuses it (datasets, and the options of formats a join cannot read: file collections)
NOT_FOR_JOIN = join_refused_options()


class AugmentCommon(BaseModel):
    """The options of ``tfrecord-etl augment`` of its own; :data:`AugmentConfig` adds the join source's format
    options (every registered format's options model). YAML keys and flags have these names."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    input: str = Field(
        description="TFRecord shards of tf.train.Example: a file pattern, or an output directory of "
        "the convert pipeline (its metadata.json is used)"
    )
    output_dir: str = Field(description="output directory; an existing non-empty one is refused unless --overwrite")
    spans: str | None = Field(
        None,
        description="a collection --input's spans to augment, each IN/span-N -> "
        "OUTPUT_DIR/span-N, committed in OUTPUT_DIR/collection.json: 7, 3,5,9, 3-9, "
        "latest, latest:N, all, or new (spans not augmented yet, or whose input changed)",
    )
    mode: Literal["rewrite", "sidecar"] = Field(
        "rewrite",
        description="rewrite: each record = old bytes + new "
        "features; sidecar: only the new features, aligned per record",
    )
    compression: Literal["auto", "none", "gzip", "zlib"] = Field(
        "auto", description="compression of the input: auto = from the metadata, else the suffix, else the first bytes"
    )
    output_compression: Literal["none", "gzip", "zlib"] | None = Field(
        None, description="compression of the output shards; default: the input's"
    )
    compression_level: int | None = Field(
        None,
        ge=0,
        le=9,
        description="gzip/zlib level of the output's "
        "compression backend: isal 0-3 (default 3), zlib-ng 0-9 (default 3), "
        "zlib 0-9 (default 6); default: the backend's",
    )
    input_schema: str | None = Field(
        None,
        alias="schema",
        description="a tensorflow_metadata schema.pbtxt (e.g. from TFX SchemaGen) declaring the "
        "input's features, for a collection without metadata.json; every record is checked against it (default: learn "
        "the features from every record)",
    )
    fn: str | None = Field(None, description="user function module:function returning {new name: array}")
    fn_inputs: list[str] = Field(
        default_factory=list, description="existing features decoded for --fn, comma-separated"
    )
    fn_batch: bool = Field(
        False,
        description="call --fn once per batch with arrays stacked along a new leading "
        "axis, instead of once per example",
    )
    constants: dict[str, str] = Field(
        default_factory=dict,
        description="constant new features, NAME=VALUE[:DTYPE],... (int -> int64, decimal -> float32, else bytes)",
    )
    join_input: str | None = Field(
        None,
        description="file pattern (HDF5, .npz, .npy, raw, ENVI, ...: a format told by content or suffix) or a Zarr "
        "store whose rows are joined to the records; its format options are convert's flags (groups below)",
    )
    join_by: Literal["position", "key"] = Field(
        "position", description="position: source row n -> record n in shard order; key: --key_feature = --join_key"
    )
    key_feature: str | None = Field(None, description="the input's key feature (int64 or bytes) for --join_by key")
    join_key: str | None = Field(None, description="the join source's key feature for --join_by key")
    join_fields: dict[str, str] = Field(
        default_factory=dict, description="source features to add, SOURCE[=NEW],...; default: all but the key"
    )
    join_datasets: list[str] | None = Field(
        None, description="HDF5 dataset paths of the join source to read, comma-separated; default: all"
    )
    missing: Literal["error", "default"] = Field(
        "error", description="a key with no source row: error, or --defaults values"
    )
    defaults: dict[str, str] = Field(default_factory=dict, description="values for unmatched keys, NAME=VALUE,...")
    replace_fields: list[str] = Field(
        default_factory=list,
        description="new features that replace existing ones (the old values are removed), comma-separated",
    )
    encoding: DefaultEncodingName = Field(
        AUTO,
        description="encoding of the new numeric features: auto = the "
        "collection's style (tensor in a collection of tensor features, else "
        "typed lists where exact and not much larger, as convert's auto), or one "
        "of the encodings",
    )
    feature_encodings: dict[str, EncodingName] = Field(
        default_factory=dict, description="per-new-feature encodings (e.g. mask=packbits), NAME=ENCODING,..."
    )
    allow_lossy: list[str] = Field(
        default_factory=list,
        description="new features whose lossy list cast (float64->float32, uint64->int64) is allowed, comma-separated",
    )
    batch_size: int = Field(4096, ge=1, description="records per batch (one encode call per batch)")
    max_record_mb: float = Field(
        1024.0,
        gt=0,
        le=2047,
        description="limit on one record in MiB (2**20 bytes): input length "
        "headers (checked before reading) and output records; protobuf's limit is 2 GB",
    )
    max_features: int = Field(
        10_000,
        ge=1,
        description="limit on the features of one input record, and on the "
        "distinct feature names inferred from a collection without metadata",
    )
    max_local_workers: int = command_field("max_local_workers")
    overwrite: bool = command_field("overwrite")
    verbose: bool = command_field("verbose")
    progress: bool | None = Field(
        None,
        description="a progress bar on stderr when it is a terminal (records "
        "and bytes written of the planned total, rate, time left); default: on in a "
        "terminal (--no-progress: off)",
    )
    pipeline_options: dict[str, Any] = command_field("pipeline_options")

    beam_argv = ConvertConfig.beam_argv

    _lists = field_validator("fn_inputs", "replace_fields", "allow_lossy", "join_datasets", mode="before")(
        classmethod(lambda cls, v: _split(v))
    )
    _dicts = field_validator("constants", "defaults", mode="before")(classmethod(lambda cls, v: _pairs(v)))
    _fields = field_validator("join_fields", mode="before")(classmethod(lambda cls, v: _pairs(v, allow_bare=True)))

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data):  # the join source's --hdf5_group and --hdf5_mode, as convert takes them
        return renamed_keys(data)

    @model_validator(mode="after")
    def _join_source_options(self):
        """Refuses the format options a join cannot use, then checks the join source's options together as
        convert checks them (each format model's validators), with ``--join_datasets`` as the datasets."""
        refused = [name for name in NOT_FOR_JOIN if name in self.model_fields_set]
        if refused:
            raise ValueError("; ".join(f"--{name} does not apply to augment: {NOT_FOR_JOIN[name]}" for name in refused))
        for model in join_option_models():
            values = {n: getattr(self, n) for n in model.model_fields if n not in NOT_FOR_JOIN}
            if "datasets" in model.model_fields:
                values["datasets"] = self.join_datasets
            try:
                model.model_validate(values)
            except ValidationError as e:
                problems = "; ".join(str(err.get("ctx", {}).get("error", err["msg"])) for err in e.errors())
                raise ValueError(f"the join source's options (--join_datasets as its datasets): {problems}") from None
        return self


class AugmentConfig(*reversed(option_models()), AugmentCommon):  # type: ignore[misc]
    """Options of ``tfrecord-etl augment``: its own (:class:`AugmentCommon`) and the join source's format options,
    every registered format's (``sources.option_models()``), as convert takes them; YAML keys and flags have these
    names. The options in :data:`NOT_FOR_JOIN` are refused."""

    if TYPE_CHECKING:  # the formats' fields are known when the registry is imported: Any to a type checker

        def __getattr__(self, name: str) -> Any: ...


class AugmentOptions(PipelineOptions):
    """The augment pipeline's flags, declared the Beam way; defaults are None so the config file can fill them."""

    @classmethod
    def _add_argparse_args(cls, parser):
        # Beam adds every PipelineOptions subclass to one parser, and ConvertOptions declares --input,
        # --output_dir, --compression, ... too: let ours replace those instead of raising a conflict.
        group = parser.add_argument_group("augment options", conflict_handler="resolve")
        add_model_flags(group, AugmentConfig, hidden=frozenset(NOT_FOR_JOIN))
        add_renamed_flags(group, AugmentConfig, flag_type)
        group.add_argument("--config", default=None, help="YAML config file (keys as the flags)")
