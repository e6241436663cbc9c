"""The input collection: shards, their compression and features (reading their records: :mod:`records`)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from tfrecord_etl.transforms.augment.common import INFER_RECORDS, PROBE_RECORDS, amend_error
from tfrecord_etl.transforms.augment.records import InputShard, differs_hint, read_sample
from tfrecord_etl.transforms.codec import FeatureSpec, infer_feature_specs
from tfrecord_etl.transforms.collections import schemacheck
from tfrecord_etl.transforms.errors import ConfigError, InputChangedError, RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata, schemafile, tfrecord
from tfrecord_etl.transforms.reading.reader import file_compression
from tfrecord_etl.transforms.storage import fileio

SCHEMA_MAX_BYTES = 64 << 20  # a --schema file larger than this is refused before it is read


@dataclasses.dataclass(frozen=True)
class InputCollection:
    """The input shards and their features: from ``metadata.json``; from ``--schema`` (``schema_file``); or, when
    ``inferred``, from a sample of records (a guess that augment replaces with what every record holds)."""

    pattern: str
    shards: tuple[InputShard, ...]
    specs: tuple[FeatureSpec, ...]
    inferred: bool
    schema_file: str | None = None
    metadata_path: str | None = None  # the input's metadata.json, read at planning
    metadata_digest: str | None = None  # ... and the digest of its bytes then (metadata.digest)
    tfds_name: str | None = None  # the TFDS dataset its metadata.json names (it has dataset_info.json), else None
    indexed: bool = False  # every input shard has a tfrecord2idx index file listed in its metadata.json (--index)

    @property
    def observed(self) -> bool:
        """True when no metadata.json vouches for the features, so every record is observed
        (``codec.FeatureStats``): to learn them (inferred) or to check them (``--schema``)."""
        return self.inferred or self.schema_file is not None

    @property
    def num_records(self) -> int | None:
        counts = [s.records for s in self.shards]
        return None if None in counts else sum(counts)

    @property
    def compressions(self) -> set[str]:
        return {s.compression for s in self.shards}


def output_name(path: str, compression: str, output_compression: str) -> str:
    """The output shard name of input ``path``: the same name, the compression suffix swapped."""
    name = fileio.basename(path)
    for suffix in {"gzip": (".gz",), "zlib": tfrecord.ZLIB_SUFFIXES}.get(compression, ()):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name + tfrecord.SUFFIXES[output_compression]


def suggest_pattern(directory: str) -> str:
    """A file pattern for the shards in ``directory`` that matches them: ``DIR/*<suffix>`` with the suffix most of
    its files share (TFX names shards ``data_tfrecord-00000-of-00001.gz``, so ``*.tfrecord*`` would match nothing),
    else ``DIR/*``."""
    try:
        names = [fileio.basename(p) for p, _ in fileio.match(fileio.join(directory, "*"))]
    except Exception:  # noqa: BLE001 - an empty or unreadable directory: the generic pattern
        names = []
    suffixes = collections.Counter("." + n.rsplit(".", 1)[1] for n in names if "." in n and not n.startswith("."))
    for suffix, _ in suffixes.most_common(1):
        if suffix not in (".json", ".pbtxt"):
            return fileio.join(directory, "*" + suffix)
    return fileio.join(directory, "*")


def resolve_input(
    pattern: str,
    compression: str = "auto",
    sample_size: int | None = None,
    max_record_bytes: int | None = None,
    max_features: int | None = None,
    schema: str | None = None,
) -> tuple[InputCollection, list[bytes]]:
    """Finds the input shards, their compression and features; returns them and a sample of records.

    ``pattern`` is an output directory of tfrecord-etl (its ``metadata.json`` gives the shards, the
    compression, the features and the record counts) or a file pattern of TFRecord shards (when all
    matched files sit in such a directory and are listed in its metadata, the metadata is used too).
    ``compression`` ``auto``: from the metadata, else each file's suffix, else the first bytes of the
    first file without a suffix (applied to all files without one). ``schema``: a tensorflow_metadata
    ``schema.pbtxt`` declaring the features of a collection without metadata (``schemafile.specs_from_schema``).

    Returns:
      ``(collection, sample)``: ``output_file`` is still the input name (see :func:`output_name`); with
      metadata, ``tfds_name`` (its ``tfds`` entry) and ``indexed`` (every shard lists an ``index`` file) are set;
      ``sample`` holds up to ``sample_size`` (default :data:`INFER_RECORDS`) first records of the
      collection (features of a collection without metadata are inferred from it).

    Raises:
      ConfigError: a directory without metadata.json; ``schema`` for a collection with metadata.json.
        SourceError: nothing matches, or a match is not a regular file (FIFO, device).
      SchemaError: the input's ``schema.pbtxt`` disagrees with its ``metadata.json`` (:mod:`transforms.collections.schemacheck`).
      SchemaError, RecordError: records that are not tf.train.Example, a record over ``max_record_bytes``
        (default ``tfrecord.record_limit()``), more than ``max_features`` features (default
        ``codec.MAX_FEATURES``) in a record or in the sample.
    """
    paths, sizes, meta, digest, meta_dir = find_shards(pattern)
    shards, recorded = input_shards(paths, sizes, compression, meta)
    sample = read_sample(shards, (sample_size or INFER_RECORDS) if meta is None else PROBE_RECORDS, max_record_bytes)
    if meta is not None:
        pinned = {"metadata_path": fileio.join(meta_dir, metadata.METADATA_FILE), "metadata_digest": digest}
        return described_collection(pattern, shards, meta, recorded, pinned, schema), sample
    if schema:
        return InputCollection(pattern, shards, schema_specs(schema), False, schema), sample
    try:
        specs = infer_feature_specs(sample, max_features)
    except RecordError as e:
        raise amend_error(e, "the input must hold tf.train.Example records", file=shards[0].path) from None
    except SchemaError as e:
        raise e.with_context(file=pattern) from None
    return InputCollection(pattern, shards, specs, True), sample


def find_shards(pattern: str) -> tuple[list[str], dict, dict | None, str | None, str | None]:
    """``(paths, sizes, meta, digest, meta_dir)``: the input's shard paths (an output directory's, from its
    ``metadata.json``; else the files ``pattern`` matches, with their sizes), and the metadata that describes them
    (with its digest and directory), or None: matched files are described by the metadata of the one directory they
    sit in when it lists every one of them.

    Raises:
      ConfigError: a directory without metadata.json. SourceError: nothing matches.
      SchemaError: the input's ``schema.pbtxt`` disagrees with its ``metadata.json``.
    """
    # an object store has no directories: s3://b/out (no trailing slash) is an output when it holds metadata.json
    remote_output = (
        not fileio.is_local(pattern)
        and not any(c in pattern for c in "*?[")
        and fileio.exists(fileio.join(pattern, metadata.METADATA_FILE))
    )
    if fileio.is_dir(pattern) or remote_output:
        if not fileio.exists(fileio.join(pattern, metadata.METADATA_FILE)):
            raise ConfigError(
                "--input is a directory without metadata.json (not a complete tfrecord-etl output)",
                file=pattern,
                hint=f"pass a file pattern of its TFRecord shards, e.g. '{suggest_pattern(pattern)}'",
            )
        meta, digest = schemacheck.load_output(pattern)
        return metadata.shard_paths(pattern, meta), {}, meta, digest, pattern
    matched = fileio.match(pattern)
    paths, sizes = [p for p, _ in matched], dict(matched)
    parents = {p[: len(p) - len(fileio.basename(p))] for p in paths}
    if len(parents) == 1:
        parent = parents.pop()
        if fileio.exists(fileio.join(parent, metadata.METADATA_FILE)):
            candidate, candidate_digest = schemacheck.load_output(parent)
            if {fileio.basename(p) for p in paths} <= {s["file"] for s in candidate["shards"]}:
                return paths, sizes, candidate, candidate_digest, parent
    return paths, sizes, None, None, None


def input_shards(
    paths: list[str], sizes: dict, compression: str, meta: dict | None
) -> tuple[tuple[InputShard, ...], dict]:
    """``(shards, recorded)``: an :class:`InputShard` per path (regular files only: a FIFO or device among them is
    never opened), with its compression, recorded count, split and identity; ``recorded``: the metadata's entry of
    each shard by file name (empty without metadata)."""
    counts, split_of, recorded = {}, {}, {}
    if meta is not None:
        counts = {s["file"]: s["records"] for s in meta["shards"]}
        split_of = {s["file"]: s["split"] for s in meta["shards"] if "split" in s}
        recorded = {s["file"]: s for s in meta["shards"]}
    for path in paths:
        tfrecord.check_regular(path)
    comps = _compressions(paths, compression, meta)
    shards = tuple(
        InputShard(
            i,
            p,
            c,
            fileio.basename(p),
            counts.get(fileio.basename(p)),
            split=split_of.get(fileio.basename(p)),
            **_identity(p, recorded.get(fileio.basename(p)), sizes.get(p)),
        )
        for i, (p, c) in enumerate(zip(paths, comps))
    )
    return shards, recorded


def described_collection(
    pattern: str, shards: tuple[InputShard, ...], meta: dict, recorded: dict, pinned: dict, schema: str | None
) -> InputCollection:
    """The collection of an input described by its ``metadata.json``: its features, TFDS name and whether every
    shard has an index file.

    Raises:
      ConfigError: ``schema`` given too (the metadata's features are used).
    """
    if schema:
        raise ConfigError(
            "--schema is for collections without metadata.json; this one has it",
            file=pattern,
            hint="drop --schema: the metadata's features are used",
        )
    tfds_name = (meta.get("tfds") or {}).get("name") if isinstance(meta.get("tfds"), dict) else None
    indexed = bool(shards) and all("index" in recorded.get(fileio.basename(s.path), {}) for s in shards)
    return InputCollection(
        pattern,
        shards,
        tuple(meta["features"]),
        False,
        **pinned,
        tfds_name=tfds_name if isinstance(tfds_name, str) else None,
        indexed=indexed,
    )


def schema_specs(schema: str) -> tuple:
    """The features ``--schema`` (a ``schema.pbtxt``) declares (``schemafile.specs_from_schema``).

    Raises:
      ConfigError: no such file, or one over ``SCHEMA_MAX_BYTES``. SchemaError: not a schema we can read.
    """
    if not fileio.exists(schema) or fileio.is_dir(schema):
        raise ConfigError("--schema names no file", file=schema, hint="pass the path of a schema.pbtxt")
    if fileio.size(schema) > SCHEMA_MAX_BYTES:
        raise ConfigError(
            f"--schema is {fileio.size(schema):,} bytes, over {SCHEMA_MAX_BYTES:,}: not a schema.pbtxt", file=schema
        )
    return schemafile.specs_from_schema(fileio.read_bytes(schema).decode("utf-8", "replace"), schema)


def _identity(path: str, entry: dict | None, listed_size: int | None) -> dict:
    """The ``pin`` and ``crc32c`` of an input shard at planning: the size its metadata entry records (else the
    listing's, else asked for) and a local file's modification time; the entry's CRC32C.

    Raises:
      RecordError: a local shard whose size is not the one its metadata.json entry records: it differs at rest
        (truncated, corrupted or replaced after it was written), which running again cannot change.
    """
    entry = entry or {}
    size = entry.get("bytes") if type(entry.get("bytes")) is int else listed_size
    found = fileio.pin(path, size)
    if "bytes" in entry and found[1] is not None and found[0] != size:
        raise RecordError(
            f"Input shard holds {found[0]} bytes, its metadata.json says {size}: it was truncated, "
            "corrupted or replaced after it was written",
            file=path,
            hint=differs_hint(path),
        )
    return {"pin": (found[0] if size is None else size, found[1]), "crc32c": entry.get("crc32c")}


def check_collection(collection: InputCollection) -> None:
    """At commit: the input is still the collection planned: its ``metadata.json`` has the bytes read at planning
    (a collection replaced meanwhile, e.g. by ``convert --overwrite``, has another), and each local shard its pinned
    size and modification time (one ``os.stat`` each; remote shards were pinned by their reads).

    Raises:
      InputChangedError: naming the metadata.json or the shard that changed.
    """
    if collection.metadata_path is not None:
        try:
            now = metadata.digest(fileio.read_bytes(collection.metadata_path))
        except Exception:  # noqa: BLE001 - gone or unreadable: not the metadata planned
            now = None
        if now != collection.metadata_digest:
            raise InputChangedError(
                "The input collection changed while it was read (its metadata.json is "
                f"{'gone' if now is None else 'not the one planned'}): run again",
                file=collection.metadata_path,
                hint="wait until the run writing the input collection has finished, then run the command again",
            )
    for shard in collection.shards:
        if shard.pin is not None and shard.pin[1] is not None:
            fileio.check_pin(shard.path, shard.pin, "Input shard")


def _compressions(paths: Sequence[str], compression: str, meta: dict | None) -> list[str]:
    if compression != "auto":
        return [compression] * len(paths)
    if meta is not None:
        return [meta["compression"]] * len(paths)
    comps = [tfrecord.compression_from_path(p) for p in paths]
    unsuffixed = [p for p, c in zip(paths, comps) if c == "none"]
    if unsuffixed:
        detected = file_compression(unsuffixed[0])
        comps = [detected if p in set(unsuffixed) else c for p, c in zip(paths, comps)]
    return comps
