"""Add fields to an existing TFRecord collection of tf.train.Example, without touching the originals.

    python -m pipelines.augment --input 'in/*.tfrecord.gz' --output_dir out/ [--mode rewrite|sidecar] \\
        [--fn mymodule:add_fields --fn_inputs a,b [--fn_batch]] [--constants NAME=VALUE[:DTYPE],...] \\
        [--join_input labels.h5 [--join_by key --key_feature id --join_key id]] [--runner DirectRunner ...]

The pipeline: AugmentShards -> FinalizeAugment (see transforms/augment.py).
"""
from __future__ import annotations

import time
from typing import Any, Literal, Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipelines import common
from transforms import augment, metadata, outdir, tfrecord
from transforms.config import DEFAULT_MAX_LOCAL_WORKERS, ConvertConfig, EncodingName, add_model_flags, parse_args
from transforms.errors import printable


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
            out[key.strip()] = val.strip() if sep else key.strip()
        return out
    if isinstance(value, dict):
        return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
    return value


class AugmentConfig(BaseModel):
    """Options of ``python -m pipelines.augment``; YAML keys and flags have these names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str = Field(description="TFRecord shards of tf.train.Example: a file pattern, or an output directory of "
                                   "the convert pipeline (its metadata.json is used)")
    output_dir: str = Field(description="output directory; an existing non-empty one is refused unless --overwrite")
    mode: Literal["rewrite", "sidecar"] = Field("rewrite", description="rewrite: each record = old bytes + new "
                                                "features; sidecar: only the new features, aligned per record")
    compression: Literal["auto", "none", "gzip", "zlib"] = Field(
        "auto", description="compression of the input: auto = from the metadata, else the suffix, else the first bytes")
    output_compression: Optional[Literal["none", "gzip", "zlib"]] = Field(
        None, description="compression of the output shards; default: the input's")
    fn: Optional[str] = Field(None, description="user function module:function returning {new name: array}")
    fn_inputs: list[str] = Field(default_factory=list, description="existing features decoded for --fn, "
                                 "comma-separated")
    fn_batch: bool = Field(False, description="call --fn once per batch with arrays stacked along a new leading "
                           "axis, instead of once per example")
    constants: dict[str, str] = Field(default_factory=dict, description="constant new features, "
                                      "NAME=VALUE[:DTYPE],... (int -> int64, decimal -> float32, else bytes)")
    join_input: Optional[str] = Field(None, description="HDF5/.npz/.npy file pattern whose rows are joined to "
                                      "the records")
    join_by: Literal["position", "key"] = Field("position", description="position: source row n -> record n in "
                                                "shard order; key: --key_feature = --join_key")
    key_feature: Optional[str] = Field(None, description="the input's key feature (int64 or bytes) for --join_by key")
    join_key: Optional[str] = Field(None, description="the join source's key feature for --join_by key")
    join_fields: dict[str, str] = Field(default_factory=dict, description="source features to add, SOURCE[=NEW],...; "
                                        "default: all but the key")
    join_datasets: Optional[list[str]] = Field(None, description="HDF5 dataset paths of the join source to read, "
                                               "comma-separated; default: all")
    missing: Literal["error", "default"] = Field("error", description="a key with no source row: error, or "
                                                 "--defaults values")
    defaults: dict[str, str] = Field(default_factory=dict, description="values for unmatched keys, NAME=VALUE,...")
    replace_fields: list[str] = Field(default_factory=list, description="new features that replace existing ones "
                                      "(the old values are removed), comma-separated")
    encoding: EncodingName = Field("tensor", description="encoding of the new numeric features")
    feature_encodings: dict[str, EncodingName] = Field(
        default_factory=dict, description="per-new-feature encodings (e.g. mask=packbits), NAME=ENCODING,...")
    allow_lossy: list[str] = Field(default_factory=list, description="new features whose lossy list cast "
                                   "(float64->float32, uint64->int64) is allowed, comma-separated")
    batch_size: int = Field(4096, ge=1, description="records per batch (one encode call per batch)")
    max_record_mb: float = Field(1024.0, gt=0, le=2047, description="limit on one record in MiB (2**20 bytes): input length "
                                 "headers (checked before reading) and output records; protobuf's limit is 2 GB")
    max_features: int = Field(10_000, ge=1, description="limit on the features of one input record, and on the "
                              "distinct feature names inferred from a collection without metadata")
    max_local_workers: int = Field(DEFAULT_MAX_LOCAL_WORKERS, ge=1, description="the largest "
                                   "--direct_num_workers accepted (default: 4 per CPU, at least 16)")
    overwrite: bool = Field(False, description="replace our files in an existing output directory (files we did "
                            "not write are kept)")
    verbose: bool = Field(False, description="show TensorFlow and Beam logs")
    pipeline_options: dict[str, Any] = Field(default_factory=dict, description="Beam pipeline options as a "
                                             "mapping (YAML only), e.g. {runner: DirectRunner}; flags win")

    beam_argv = ConvertConfig.beam_argv

    _lists = field_validator("fn_inputs", "replace_fields", "allow_lossy", "join_datasets", mode="before")(
        classmethod(lambda cls, v: _split(v)))
    _dicts = field_validator("constants", "defaults", mode="before")(classmethod(lambda cls, v: _pairs(v)))
    _fields = field_validator("join_fields", mode="before")(classmethod(lambda cls, v: _pairs(v, allow_bare=True)))


class AugmentOptions(PipelineOptions):
    """The augment pipeline's flags, declared the Beam way; defaults are None so the config file can fill them."""

    @classmethod
    def _add_argparse_args(cls, parser):
        # Beam adds every PipelineOptions subclass to one parser, and ConvertOptions declares --input,
        # --output_dir, --compression, ... too: let ours replace those instead of raising a conflict.
        group = parser.add_argument_group("augment options", conflict_handler="resolve")
        add_model_flags(group, AugmentConfig)
        group.add_argument("--config", default=None, help="YAML config file (keys as the flags)")


def build_pipeline(p: beam.Pipeline, plan: augment.AugmentPlan):
    """Composes the augment pipeline on ``p``; returns the PCollection holding the committed output dir."""
    return (p
            | "AugmentShards" >> augment.AugmentShards(plan)
            | "FinalizeAugment" >> augment.FinalizeAugment(plan))


def main(argv: list[str]) -> int:
    cfg, beam_argv = parse_args(argv, AugmentConfig, AugmentOptions, "python -m pipelines.augment", __doc__)
    common.configure_filesystems(beam_argv)  # pipeline_options from the YAML config too
    tfrecord.require_fast_crc32c()
    started = time.time()
    plan = augment.plan_augment(cfg)
    files = [s.output_file for s in plan.collection.shards] + ([outdir.MANIFEST_FILE] if cfg.mode == "sidecar" else [])
    with outdir.prepare(cfg.output_dir, command="augment", options=cfg.model_dump(), files=files,
                        overwrite=cfg.overwrite):
        p = beam.Pipeline(options=PipelineOptions(beam_argv))
        build_pipeline(p, plan)
        counters = common.run_pipeline(p)
    meta = metadata.load(cfg.output_dir)
    info = meta["augment"]
    common.print_summary(cfg.output_dir, meta, time.time() - started, {
        "mode": cfg.mode,
        "records in / out": f"{info['records_in']} / {meta['num_records']} (checked per shard)",
        "new features": ", ".join(f"{printable(s.name)} {s.dtype} {list(s.shape)} {s.encoding}" for s in plan.new_specs),
        **({"replaced": ", ".join(map(printable, plan.replace))} if plan.replace else {}),
        **({"manifest": f"{cfg.output_dir}/manifest.json"} if cfg.mode == "sidecar" else {}),
    })
    common.print_metrics(counters, meta["num_records"])
    return 0


if __name__ == "__main__":
    raise SystemExit(common.run_main(main))
