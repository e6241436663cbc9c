"""TFDS metadata of an output directory (``--tfds_name``): ``dataset_info.json`` and ``features.json``, so
``tfds.builder_from_directory(output_dir)`` loads every split as it is, with no hand work.

The features are TFDS's own connectors describing the bytes we wrote (``tensorflow_datasets/core/features/
tensor_feature.py``): a ``tensor`` feature is ``Tensor(shape, dtype, encoding=Encoding.BYTES)`` (raw little-endian
bytes, decoded with ``tf.io.decode_raw``), ``zlib`` is ``Encoding.ZLIB`` (what TFDS decodes; byte-identical to
TFDS's encoder with the zlib compression backend), a ``list`` feature is ``Tensor(shape, dtype)`` (native lists; TFDS casts int64/float32 back to the dtype), a scalar
``str`` feature is ``Text()``, other strings ``Tensor(dtype=tf.string)``. A feature name with ``/`` becomes a
nested ``FeaturesDict`` (TFDS flattens nesting with ``/``: ``_source/file`` is ``{"_source": {"file": ...}}``).
One dimension may vary (TFDS reshapes with -1); our ``<name>/shape`` companions are ignored by TFDS.

A ``--splits`` output written without ``--tfds_name`` gets the same files by default, named after its directory
(:func:`default_name`), unless TFDS could not read it (:func:`default_refusal`).

The split infos (shard lengths, bytes, the ``{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}`` file template) come from
the counts the writers report; nothing is re-read. TensorFlow Datasets (the ``tfds`` extra) is imported only here
and only when writing; :func:`check_features` is pure and runs at planning.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from collections.abc import Sequence

import numpy as np

from tfrecord_etl._install import pip_install
from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec, encoding_of
from tfrecord_etl.transforms.errors import ConfigError, SchemaError
from tfrecord_etl.transforms.output import outdir, sink
from tfrecord_etl.transforms.storage import fileio

VERSION = "1.0.0"  # the dataset version written (TFDS needs one; builder_from_directory reads it back)


def _problem(spec: FeatureSpec) -> str | None:
    """Why TFDS cannot describe ``spec`` as written, or None."""
    encoding = encoding_of(spec)
    if encoding.tfds_encoding is None:
        return f"the {spec.encoding} encoding has no TFDS feature (use list, tensor or zlib)"
    if spec.dtype is None or spec.shape is None:
        return "its dtype or rank varies between examples"
    if list(spec.shape).count(None) > 1:
        return "more than one of its dimensions varies (TFDS stores that under <name>/value)"
    if spec.dtype == VLEN_BYTES:
        return None
    dt = np.dtype(spec.dtype)
    if dt.kind in "SU" and not encoding.native:
        return f"fixed-width strings are {spec.encoding}-encoded (use --feature_encodings {spec.name}=list)"
    if dt.kind == "V":
        return "opaque void bytes have no TFDS dtype"
    if dt.str == "<u4" and not encoding.native:  # tf.io.decode_raw has no uint32
        return f"TFDS cannot decode {spec.encoding} uint32 (use --feature_encodings {spec.name}=list)"
    return None


def check_features(specs: Sequence[FeatureSpec]) -> None:
    """Raises SchemaError naming the first feature TFDS could not read as written, or a name that is both a
    feature and a group of features (``a`` and ``a/b``). No TFDS import."""
    for spec in specs:
        why = _problem(spec)
        if why:
            raise SchemaError(
                f"--tfds_name: feature '{spec.name}' cannot be described to TFDS: {why}", feature=spec.name
            )
    names = {s.name for s in specs}
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in names:
                raise SchemaError(
                    f"--tfds_name: feature '{name}' lies under feature '{'/'.join(parts[:i])}' (TFDS "
                    "nests features by '/')",
                    feature=name,
                )
        if any(p == "" for p in parts):
            raise SchemaError(f"--tfds_name: feature name '{name}' has an empty part between '/'", feature=name)


def default_name(output_dir: str) -> str:
    """The TFDS dataset name of a ``--splits`` output written without ``--tfds_name``: the output directory's
    name in TFDS's form (``^[a-z][a-z0-9_]*$``, at most 64 characters: lower case, other characters ``_``, a
    leading ``d`` when it starts with a digit or ``_``), e.g. ``out/My-Data.v2`` -> ``my_data_v2``."""
    base = re.sub(r"[^a-z0-9_]", "_", fileio.basename(output_dir.rstrip("/")).lower()).strip("_") or "dataset"
    return (base if base[0].isalpha() else "d" + base)[:64]


def default_refusal(compression: str, specs: Sequence[FeatureSpec]) -> str | None:
    """Why a ``--splits`` output written without ``--tfds_name`` gets no TFDS files (None: it gets them, see
    :func:`default_name`): compressed shards (TFDS 4.9's ``TfRecordFileAdapter`` opens shards with
    ``tf.data.TFRecordDataset`` without a compression type), TensorFlow Datasets not installed, or a feature TFDS
    cannot describe (:func:`check_features`)."""
    if compression != "none":
        return f"TFDS reads uncompressed shards only, these are {compression}"
    try:
        check_features(specs)
    except SchemaError as e:
        return e.message.replace("--tfds_name: ", "")

    if importlib.util.find_spec("tensorflow_datasets") is None:  # not imported at planning: it imports TensorFlow
        return f"TensorFlow Datasets is not installed ({pip_install('tfds')})"
    return None


def require_tfds() -> None:
    """Raises ConfigError when TensorFlow Datasets is not installed (the ``tfds`` extra)."""
    try:
        import tensorflow_datasets  # noqa: F401
    except ImportError:
        raise ConfigError("--tfds_name needs TensorFlow Datasets", hint=pip_install("tfds")) from None


def _feature(spec: FeatureSpec):
    from tensorflow_datasets.core import features as tfds_features

    if spec.dtype == VLEN_BYTES or np.dtype(spec.dtype).kind in "SU":
        if spec.dtype != VLEN_BYTES and np.dtype(spec.dtype).kind == "U" and spec.shape == ():
            return tfds_features.Text()
        return tfds_features.Tensor(shape=spec.shape, dtype=np.object_)
    dt = np.dtype(spec.dtype)
    dtype = np.int64 if dt.kind in "Mm" else dt.newbyteorder("=").type
    return tfds_features.Tensor(shape=spec.shape, dtype=dtype, encoding=encoding_of(spec).tfds_encoding)


def features_dict(specs: Sequence[FeatureSpec]):
    """The ``tfds.features.FeaturesDict`` of ``specs`` (names with ``/`` nested)."""
    from tensorflow_datasets.core import features as tfds_features

    tree: dict = {}
    for spec in specs:
        *groups, leaf = spec.name.split("/")
        node = tree
        for g in groups:
            node = node.setdefault(g, {})
        node[leaf] = _feature(spec)

    def build(node):
        return tfds_features.FeaturesDict({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(tree)


def _template(name: str, split: str, first_file: str) -> str:
    """TFDS's file template of a split whose first shard is ``first_file``: the default
    ``{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}``, or with the generation tag a run that replaced the split
    wrote (``outdir.generation_name``: ``NAME-g1-SPLIT.tfrecord-...``), or, for files whose prefix is not the
    dataset's name (``--splits`` without ``--tfds_name``: ``data-train.tfrecord-...``), that prefix in place of
    ``{DATASET}``."""
    from tensorflow_datasets.core import naming

    if first_file.startswith(f"{outdir.generation_prefix(name, 1)}-{split}."):
        return naming.DEFAULT_FILENAME_TEMPLATE.replace("{DATASET}", "{DATASET}" + outdir.GENERATION_TAG)
    prefix = first_file.rpartition(f"-{split}.tfrecord-")[0]
    if prefix and prefix != name:
        return naming.DEFAULT_FILENAME_TEMPLATE.replace("{DATASET}", prefix)
    return naming.DEFAULT_FILENAME_TEMPLATE


def write(
    output_dir: str, name: str, specs: Sequence[FeatureSpec], shards: Sequence[dict], description: str = ""
) -> list[str]:
    """Writes TFDS's metadata files of ``output_dir`` (``dataset_info.json``, ``features.json``) for the TFDS dataset
    ``name`` whose shards (``[{"file", "records", "bytes", "split"}]``, in file order) are already final; each file
    is committed with ``sink.write_file`` (a rename), ``dataset_info.json`` last. Returns the names written.

    Raises:
      ConfigError: TensorFlow Datasets missing.
    """
    require_tfds()
    from etils import epath
    from tensorflow_datasets.core import dataset_info, naming, splits as split_lib, utils

    by_split: dict[str, list[dict]] = {}
    for shard in shards:
        by_split.setdefault(shard["split"], []).append(shard)
    infos = [
        split_lib.SplitInfo(
            name=split,
            shard_lengths=[s["records"] for s in items],
            num_bytes=sum(s["bytes"] for s in items),
            filename_template=naming.ShardedFileTemplate(
                data_dir=epath.Path(output_dir),
                dataset_name=name,
                filetype_suffix="tfrecord",
                template=_template(name, split, items[0]["file"]),
                split=split,
            ),
        )
        for split, items in by_split.items()
    ]
    identity = dataset_info.DatasetIdentity(
        name=name, version=utils.Version(VERSION), data_dir=output_dir, module_name=""
    )
    info = dataset_info.DatasetInfo(
        builder=identity, features=features_dict(specs), description=description or f"{name}: converted by tfrecord-etl"
    )
    info.set_file_format("tfrecord")
    info.set_splits(split_lib.SplitDict(infos))
    with tempfile.TemporaryDirectory() as tmp:
        info.write_to_directory(tmp)
        names = sorted(os.listdir(tmp), key=lambda n: (n == "dataset_info.json", n))
        for n in names:
            with open(os.path.join(tmp, n), "rb") as f:
                sink.write_file(fileio.join(output_dir, n), f.read())
    return names
