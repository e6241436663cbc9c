"""Sidecar collections (``tfrecord-etl augment --mode sidecar``) read back: the original shards paired with their
sidecar shards (:func:`open_sidecar`, checked against ``manifest.json``), and read merged, record i of one with
record i of the other, as NumPy (:func:`iter_numpy_merged`) or tf.data (:func:`to_tf_dataset_merged`). Public
through ``tfrecord_etl.transforms.reader``."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator, Sequence

import numpy as np

from tfrecord_etl.transforms.codec import FeatureSpec, encoding_of, spec_from_json
from tfrecord_etl.transforms.codec.block import BlockDecoder
from tfrecord_etl.transforms.collections import schemacheck
from tfrecord_etl.transforms.errors import IncompleteOutputError, RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata, tfrecord
from tfrecord_etl.transforms.output.outdir import MANIFEST_FILE, SIDECAR_FORMAT
from tfrecord_etl.transforms.reading import reader, tfdata
from tfrecord_etl.transforms.reading.collection_reader import select_features
from tfrecord_etl.transforms.reading.shardcheck import file_crc32c
from tfrecord_etl.transforms.reading.tfdata import decode_tf, parse_spec, refuse_varying_dtypes  # re-exported
from tfrecord_etl.transforms.storage import fileio


@dataclasses.dataclass(frozen=True)
class SidecarPair:
    """One original shard and its sidecar shard: record i of one belongs with record i of the other."""

    original: str
    original_compression: str
    sidecar: str
    records: int


@dataclasses.dataclass(frozen=True)
class SidecarCollection:
    """A verified pairing of original shards with sidecar shards (see :func:`open_sidecar`).

    ``original_inferred``: the original features were inferred (a collection without metadata), so a
    ``list`` feature of shape ``(None,)`` has no ``<name>/shape`` companion.
    """

    pairs: tuple[SidecarPair, ...]
    original_specs: tuple[FeatureSpec, ...]
    sidecar_specs: tuple[FeatureSpec, ...]
    sidecar_compression: str
    original_inferred: bool

    @property
    def specs(self) -> tuple[FeatureSpec, ...]:
        return self.original_specs + self.sidecar_specs


def load_manifest(sidecar_dir: str) -> dict:
    """The ``manifest.json`` of a sidecar collection.

    Raises:
      IncompleteOutputError: no manifest (not a sidecar collection, or an incomplete one).
      SchemaError: the file is not a valid manifest.
    """
    path = fileio.join(sidecar_dir, MANIFEST_FILE)
    if not fileio.exists(path):
        raise IncompleteOutputError(
            "No manifest.json: not a sidecar collection, or an incomplete one",
            file=sidecar_dir,
            hint="write it with tfrecord-etl augment --mode sidecar",
        )
    try:
        manifest = json.loads(fileio.read_bytes(path))
        if manifest.get("format") != SIDECAR_FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {SIDECAR_FORMAT!r}")
        manifest["features"] = tuple(spec_from_json(f) for f in manifest["features"])
        for entry in manifest["shards"]:
            for key, kind in (
                ("input", str),
                ("sidecar", str),
                ("records", int),
                ("bytes", int),
                ("crc32c", str),
                ("compression", str),
            ):
                if not isinstance(entry[key], kind):
                    raise ValueError(f"shard entry {entry!r}: '{key}' is not a {kind.__name__}")
    except SchemaError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SchemaError(f"Invalid manifest.json: {e}", file=path) from None
    return manifest


def original_files(original: str) -> dict[str, str]:
    """File name -> path of an original collection: its metadata's shards, a directory's files, or a pattern."""
    if fileio.is_dir(original):
        if fileio.exists(fileio.join(original, metadata.METADATA_FILE)):
            return {fileio.basename(p): p for p in metadata.shard_paths(original, metadata.load(original))}
        paths = [p for p, _ in fileio.match(fileio.join(original, "*"))]
    else:
        paths = [p for p, _ in fileio.match(original)]
    out = {fileio.basename(p): p for p in paths if not fileio.basename(p).startswith(".")}
    for p in out.values():
        tfrecord.check_regular(p)  # a FIFO or device among the originals is never opened
    return out


def _pair(
    entry: dict, originals: dict, side_counts: dict, original: str, sidecar_dir: str, checksums: bool
) -> SidecarPair:
    """The :class:`SidecarPair` of one ``manifest.json`` shard entry, its original taken out of ``originals``
    (name -> path); the errors of :func:`open_sidecar`."""
    name = fileio.basename(entry["input"])
    path = originals.pop(name, None)
    if path is None:
        raise SchemaError(
            f"Original shard '{name}' of the sidecar collection is not in the original collection",
            file=original,
            shard=name,
            hint="pass the collection the sidecar was written for",
        )
    side_path = fileio.join(sidecar_dir, entry["sidecar"])
    if side_counts.get(entry["sidecar"]) != entry["records"]:
        raise RecordError(
            f"Sidecar shard holds {side_counts.get(entry['sidecar'])} records but its original "
            f"'{name}' holds {entry['records']}: misaligned pair",
            file=side_path,
            shard=name,
        )
    size = fileio.size(path)
    if size != entry["bytes"] or (checksums and file_crc32c(path) != (entry["bytes"], entry["crc32c"])):
        what = (
            f"{size} bytes, the manifest says {entry['bytes']}"
            if size != entry["bytes"]
            else "its CRC32C differs from the manifest's"
        )
        raise RecordError(
            f"Original shard changed after its sidecar was written ({what}): misaligned pair",
            file=path,
            shard=name,
            hint="re-run tfrecord-etl augment --mode sidecar on it",
        )
    return SidecarPair(path, entry["compression"], side_path, entry["records"])


def open_sidecar(original: str, sidecar_dir: str, check_checksums: bool = True) -> SidecarCollection:
    """Pairs the shards of ``original`` with the sidecar shards of ``sidecar_dir`` and verifies the pairing.

    Args:
      original: the original collection: an output directory of tfrecord-etl, a directory of shards, or a
        file pattern of its shards (file names must be those recorded in the manifest).
      sidecar_dir: an output directory of ``tfrecord-etl augment --mode sidecar``.
      check_checksums: also compare each original shard's CRC32C with the manifest (reads every
        original byte once; sizes and record counts are always compared).

    Raises:
      IncompleteOutputError: no metadata.json or manifest.json in ``sidecar_dir``.
      SchemaError: the sidecar's ``schema.pbtxt`` disagrees with its ``metadata.json``; an original shard of the manifest is missing, or an original shard has no sidecar.
      RecordError: an original shard changed since the sidecar was written (size or checksum), or a
        sidecar shard's record count differs from its original's (naming the shard).
    """
    meta = schemacheck.load_output(sidecar_dir)[0]  # schema.pbtxt agrees with metadata.json
    manifest = load_manifest(sidecar_dir)
    originals = original_files(original)
    side_counts = {s["file"]: s["records"] for s in meta["shards"]}
    pairs = [_pair(e, originals, side_counts, original, sidecar_dir, check_checksums) for e in manifest["shards"]]
    if originals:
        raise SchemaError(
            f"Original shards without a sidecar shard: {sorted(originals)[:5]}",
            file=original,
            hint="pass only the shards the sidecar was written for (a narrower pattern)",
        )
    return SidecarCollection(
        tuple(pairs),
        manifest["features"],
        tuple(meta["features"]),
        meta["compression"],
        bool(manifest.get("inferred", False)),
    )


def iter_numpy_merged(
    original: str, sidecar_dir: str, features: Sequence[str] | None = None, check_checksums: bool = True
) -> Iterator[dict[str, np.ndarray]]:
    """Yields one merged ``{name: np.ndarray}`` per example: the original's features and the sidecar's.

    The pairing is verified first (see :func:`open_sidecar`); record i of an original shard is merged
    with record i of its sidecar shard by concatenating the two serialized Examples (one valid Example).
    Arrays are as in :func:`reader.iter_numpy`; features inferred from a collection without metadata decode as
    their native lists (``int64``, ``float32``, object arrays of bytes). No TensorFlow import.

    Raises:
      IncompleteOutputError, SchemaError, RecordError: see :func:`open_sidecar`; also RecordError when a
        pair of shards turns out to hold different record counts while reading (naming both files).
    """
    coll = open_sidecar(original, sidecar_dir, check_checksums)
    specs = select_features(coll.specs, features)
    decoder = BlockDecoder(specs)  # one record at a time, each merged pair of one layout decoded from its offsets
    for pair in coll.pairs:
        originals = reader.iter_records(pair.original, pair.original_compression)
        sidecars = reader.iter_records(pair.sidecar, coll.sidecar_compression)
        for left, right in itertools.zip_longest(originals, sidecars):
            if left is None or right is None:
                index = (right if left is None else left)[0]
                raise RecordError(
                    f"{'Original' if left is None else 'Sidecar'} shard ended at record {index}: misaligned pair",
                    file=pair.original,
                    sidecar=pair.sidecar,
                    record=index,
                )
            try:  # not around the yield (see reader.iter_numpy)
                example = decoder.decode_one(left[2] + right[2])
            except RecordError as e:
                raise RecordError(
                    f"Cannot decode merged example: {e}", file=pair.original, sidecar=pair.sidecar, record=left[0]
                ) from None
            yield example


def to_tf_dataset_merged(
    original: str,
    sidecar_dir: str,
    batch_size: int | None = None,
    features: Sequence[str] | None = None,
    check_checksums: bool = True,
):
    """A ``tf.data.Dataset`` of merged ``{name: tensor}`` examples: the original's features and the sidecar's.

    The pairing is verified first (see :func:`open_sidecar`). Then, as plain tf.data::

        tf.data.Dataset.zip((TFRecordDataset(originals), TFRecordDataset(sidecars)))
            .map(lambda a, b: tf.strings.join([a, b]))      # concatenated Examples = one merged Example
            .map(parse + decode)                             # as reader.to_tf_dataset

    Dtypes and shapes as :func:`reader.to_tf_dataset`; features inferred from a collection without metadata
    keep their native list types (a varying-length one is a 1-D dense tensor).

    Raises:
      SchemaError: a feature whose dtype varies between examples (read it with :func:`iter_numpy_merged`).
    """
    import tensorflow as tf

    coll = open_sidecar(original, sidecar_dir, check_checksums)
    specs = select_features(coll.specs, features)
    refuse_varying_dtypes(specs, sidecar_dir, "iter_numpy_merged")
    native = [s for s in specs if coll.original_inferred and s in coll.original_specs and s.shape == (None,)]
    regular = [s for s in specs if s not in native]
    parsing = parse_spec(tf, regular)
    kinds = {"bytes": tf.string, "int64": tf.int64, "float": tf.float32}
    parsing.update({s.name: tf.io.VarLenFeature(kinds[encoding_of(s).kind(s.dtype)]) for s in native})

    def decode(serialized):
        parsed = tf.io.parse_single_example(serialized, parsing)
        out = decode_tf(tf, parsed, regular)
        out.update({s.name: tf.sparse.to_dense(parsed[s.name]) for s in native})
        return out

    side_comp = reader.TF_COMPRESSION[coll.sidecar_compression]
    groups = itertools.groupby(coll.pairs, key=lambda p: p.original_compression)  # one zip per run of shards
    ds = None
    for compression, pairs in groups:
        run = list(pairs)
        part = tf.data.Dataset.zip(
            (
                tf.data.TFRecordDataset([p.original for p in run], compression_type=reader.TF_COMPRESSION[compression]),
                tf.data.TFRecordDataset([p.sidecar for p in run], compression_type=side_comp),
            )
        )
        ds = part if ds is None else ds.concatenate(part)
    ds = ds.map(lambda a, b: tf.strings.join([a, b]))
    if not native:  # batched parsing (transforms.reading.tfdata)
        return tfdata.dataset(tf, ds, regular, batch_size)
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch_size) if batch_size else ds
