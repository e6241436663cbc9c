"""Output metadata: ``metadata.json``, the commit point of an output directory (written with ``schema.pbtxt``,
:mod:`schemafile`).

``metadata.json`` is written only after every shard is final; a directory without it is incomplete
and every reader refuses it. Format (``"format": "tfrecord-etl/1"``)::

    {"format": "tfrecord-etl/1", "tool_version": "0.1.0", "created": "2026-11-23T10:00:00Z",
     "compression": "none" | "gzip" | "zlib",
     "features": [{"name": "images", "dtype": "|u1", "shape": [64, 64, 3], "encoding": "tensor"}, ...],
     "shards": [{"file": "data-00000-of-00002.tfrecord", "records": 5000, "bytes": 61440000,
                 "crc32c": "1c291ca3"}, ...],
     "num_records": 10000, "sources": [{"path": "in.h5", "rows": 10000}], "writer": "beam",
     "options": {...the validated config...}}

A ``sources`` entry may carry ``"attributes"`` (``{path: {attribute: value}}``, what the input's conventions say
its numbers mean: an NWB series' unit and rate, ``sources.hdf5nwb.attributes``). A convert run adds ``rows_read`` and ``rows_dead_lettered``, and with ``--dead_letter_dir`` the rows that have no
record: ``"dead_letters": [{"file": "in.h5", "start": 300, "stop": 400, "rows": 100, "error": "SourceError"}]``
(``beam.deadletters.dead_range``; files modes add ``"files"``), which ``verify --source`` expects to be absent.
The counts add up and each shard file is listed once: :func:`load` refuses a ``metadata.json`` that breaks either
(:func:`count_problems`; ``verify`` reports the counts as problems instead).

gzip and zlib outputs (convert and augment) add the library that compressed them, its version and level
(``transforms.compression.settings``): ``"compression_backend": {"name": "isal", "version": "1.9.1", "level": 3}``
(``--writer beam`` adds ``"by": "Beam WriteToTFRecord"``: Beam's own zlib). A re-run gives the same shard bytes
only with the same backend and level; ``verify`` compares records, not compressed bytes.

Each shard's ``bytes`` and ``crc32c`` (the CRC32C of the file's bytes as stored, compressed ones for ``.gz`` and
``.deflate`` shards, as 8 hex digits like GCS's ``crc32c`` and ``google_crc32c.Checksum.hexdigest``) are its
identity: computed while it is written (``tfrecord.ShardWriter``), checked by ``verify``, by the index readers
(``reader.RandomAccess``) and by ``augment`` reading the output as its input. Outputs of earlier versions have no
``crc32c``; they are read as before, without that check.

``schema.pbtxt`` (the features as a tensorflow_metadata Schema) is :mod:`schemafile`'s.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec, normalize_dtype, spec_from_json
from tfrecord_etl.transforms.codec.encodings import ENCODINGS
from tfrecord_etl.transforms.errors import IncompleteOutputError, OutputError, SchemaError
from tfrecord_etl.transforms.output import outdir, sink
from tfrecord_etl.transforms.output.outdir import METADATA_FILE, SCHEMA_FILE  # the output directory's names
from tfrecord_etl.transforms.output.runlock import check_commit
from tfrecord_etl.transforms.output.schemafile import schema_text
from tfrecord_etl.transforms.storage import conditional, fileio

FORMAT = "tfrecord-etl/1"
VERSION = "0.1.0"
_CRC32C = re.compile(r"[0-9a-f]{8}")


def build(specs, shards, compression, sources, writer, options) -> dict:
    """The ``metadata.json`` document. A feature whose list values went through an allowed lossy cast
    (``--allow_lossy``) records the dtype on the wire as ``stored_dtype`` (float64 features hold float32 values)."""
    lossy = tuple((options or {}).get("allow_lossy") or ()) if isinstance(options, dict) else ()
    features = []
    for s in specs:
        entry = s.to_json()
        stored = ENCODINGS[s.encoding].stored_dtype(s, lossy) if s.encoding in ENCODINGS else None
        if stored:
            entry["stored_dtype"] = stored
        features.append(entry)
    meta = {
        "format": FORMAT,
        "tool_version": VERSION,
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "compression": compression,
        "features": features,
        "shards": list(shards),
        "num_records": sum(s["records"] for s in shards),
        "sources": list(sources),
        "writer": writer,
        "options": options,
    }
    split_names = list(dict.fromkeys(sh["split"] for sh in shards if "split" in sh))
    if split_names:  # --splits / --split / --tfds_name: the records of each split, in file order
        meta["splits"] = {
            name: {
                "num_records": sum(sh["records"] for sh in shards if sh.get("split") == name),
                "num_shards": sum(1 for sh in shards if sh.get("split") == name),
            }
            for name in split_names
        }
    return meta


def write(output_dir: str, meta: dict, specs: Sequence[FeatureSpec], expected_version: str | None = None) -> None:
    """Writes ``schema.pbtxt``, the shards' sizes and checksums into the run marker (``outdir.record_shards``), and
    then ``metadata.json``, the commit point, each through ``sink.committed_file``.

    ``expected_version``: on S3 and GCS, the version of ``metadata.json`` the run started from
    (``conditional.version``, recorded by ``outdir.prepare``; ``conditional.ABSENT`` for none): ``metadata.json`` is then
    written in one conditional request (S3 ``If-Match`` / ``If-None-Match``, GCS ``ifGenerationMatch``), so a run
    whose output directory another run committed meanwhile commits nothing.

    Raises:
      OutputError: another run committed ``output_dir`` since this run started.
    """
    sink.write_file(fileio.join(output_dir, SCHEMA_FILE), schema_text(specs).encode())
    outdir.failpoint("schema-written")  # the old metadata.json beside the new schema.pbtxt (schemacheck.pending)
    outdir.record_shards(output_dir, meta["shards"])
    path = fileio.join(output_dir, METADATA_FILE)
    if expected_version is None or fileio.is_local(output_dir):
        sink.write_json(path, meta)
        return

    check_commit(path)
    try:
        conditional.write_if_version(path, json.dumps(meta, indent=1).encode(), expected_version)
    except conditional.VersionConflict:
        raise OutputError(
            "Another run committed this output directory while this run wrote it (metadata.json "
            "changed since this run started): this run's commit is refused",
            file=path,
            hint="nothing of this run is listed in metadata.json; run one command per output "
            "directory at a time, then run again",
        ) from None


def load(output_dir: str, counts: bool = True) -> dict:
    """The metadata of a complete output directory. ``counts``: as :func:`load_with_digest`.

    Raises:
      IncompleteOutputError: no ``metadata.json`` (a run in progress, crashed, or not our output).
      SchemaError: the file is not valid metadata: among others a file listed as two shards, or counts that do not
        add up (:func:`count_problems`).
    """
    return load_with_digest(output_dir, counts)[0]


def digest(data: bytes) -> str:
    """The identity of one version of a ``metadata.json``: the SHA-256 of its bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def load_with_digest(output_dir: str, counts: bool = True) -> tuple[dict, str]:
    """``(metadata, digest of the bytes it was parsed from)`` of a complete output directory (:func:`load`): a run
    that reads the output as its input keeps the digest and compares it again when it commits (augment).
    ``counts``: refuse counts that do not add up (:func:`count_problems`); ``verify`` passes False and reports them.

    Raises:
      IncompleteOutputError, SchemaError: as :func:`load`.
    """
    path = fileio.join(output_dir, METADATA_FILE)
    if not fileio.exists(path):
        nested = outdir.nested_outputs(output_dir) if fileio.is_dir(output_dir) else []
        if nested:
            shown = ", ".join(nested[:5]) + (f" and {len(nested) - 5} more" if len(nested) > 5 else "")
            raise IncompleteOutputError(
                f"Not an output directory: it holds {len(nested)} output directories ({shown})",
                file=output_dir,
                hint="name one of them",
            )
        raise IncompleteOutputError(
            "No metadata.json: the output is incomplete (a run is going on or "
            "crashed) or was not written by tfrecord-etl",
            file=output_dir,
            hint="re-run the command that writes it",
        )
    try:
        data = fileio.read_bytes(path)
        meta = json.loads(data)
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
        meta["features"] = [_checked(spec_from_json(f)) for f in meta["features"]]
        listed: dict[str, int] = {}
        for i, shard in enumerate(meta["shards"]):
            name = shard["file"]
            for key in ("file", "index") if "index" in shard else ("file",):
                if not _plain_name(shard[key]):
                    raise ValueError(f"shard {key} {shard[key]!r} is not a plain file name")
                if shard[key] in listed:
                    raise SchemaError(
                        f"Invalid metadata.json: the file {shard[key]!r} is listed twice (shards {listed[shard[key]]} "
                        f"and {i}): every record of it would be read twice, and the shard it replaced never",
                        hint=f"metadata.json was edited or damaged after the output was written: {REDO}",
                    )
                listed[shard[key]] = i
            if "split" in shard and not (
                isinstance(shard["split"], str) and shard["split"] in (meta.get("splits") or {})
            ):
                raise ValueError(f"shard {name!r} names a split {shard['split']!r} that 'splits' does not list")
            if not isinstance(shard["records"], int) or shard["records"] < 0:
                raise ValueError(f"shard {name!r} has a bad record count {shard['records']!r}")
            if "crc32c" in shard and not (isinstance(shard["crc32c"], str) and _CRC32C.fullmatch(shard["crc32c"])):
                raise ValueError(f"shard {name!r} has a bad crc32c {shard['crc32c']!r} (8 hex digits expected)")
        wrong = count_problems(meta) if counts else []
    except SchemaError as e:
        raise e.with_context(file=path) from None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # RecursionError: deep JSON
        raise SchemaError(f"Invalid metadata.json: {str(e)[:300]}", file=path) from None
    if wrong:
        raise SchemaError(
            f"Invalid metadata.json: its counts do not add up: {wrong[0]}"
            + (f" ({len(wrong) - 1} more)" if len(wrong) > 1 else ""),
            file=path,
            hint=f"metadata.json was edited or damaged after the output was written: {REDO}",
        )
    return meta, digest(data)


REDO = (
    "check the output with tfrecord-etl verify (with --source to compare the values with the input) and "
    "convert it again"
)


def count_problems(meta: dict) -> list[str]:
    """What does not add up among the counts ``meta`` (a loaded ``metadata.json``) records, one sentence each:
    ``num_records`` against the records its shards list (and each split's ``num_records`` against its shards'),
    ``rows_read`` against ``num_records + rows_dead_lettered`` (convert: every row read is a record or a dead
    letter; a directory of several runs' splits sums both sides over its runs) and augment's ``records_in``
    against ``num_records``. A count that is absent (outputs of earlier versions; augment outputs have no
    ``rows_read``) is not compared; one that is not an integer >= 0 is a problem. ``[]`` when they add up. Every
    reader refuses an output whose counts do not add up (:func:`load_with_digest`); ``verify`` reports each as a
    ``count`` problem."""
    out: list[str] = []

    def count(where: dict, key: str, label: str) -> int | None:
        value = where.get(key)
        if value is not None and (type(value) is not int or value < 0):
            out.append(f"{label} is {value!r}, not a count")
            return None
        return value

    held = sum(s["records"] for s in meta["shards"])
    num_records = count(meta, "num_records", "num_records")
    if num_records is not None and num_records != held:
        out.append(f"num_records is {num_records} but its shards hold {held} records")
    splits = meta.get("splits") or {}
    for name, info in splits.items() if isinstance(splits, dict) else ():
        split_held = sum(s["records"] for s in meta["shards"] if s.get("split") == name)
        said = info.get("num_records") if isinstance(info, dict) else info
        if said != split_held:
            out.append(f"split {name!r} has num_records {said} but its shards hold {split_held} records")
    rows_read = count(meta, "rows_read", "rows_read")
    dead = count(meta, "rows_dead_lettered", "rows_dead_lettered") or 0
    if rows_read is not None and rows_read != held + dead:
        out.append(
            f"rows_read is {rows_read} but the records written ({held}) and the rows dead-lettered ({dead}) add up "
            f"to {held + dead}"
        )
    augment = meta.get("augment")
    records_in = count(augment, "records_in", "augment's records_in") if isinstance(augment, dict) else None
    if records_in is not None and records_in != held:
        out.append(f"augment's records_in is {records_in} but its shards hold {held} records")
    return out


def _plain_name(name) -> bool:
    return isinstance(name, str) and not any(c in name for c in "/\\\x00") and name not in ("", ".", "..")


def _checked(spec: FeatureSpec) -> FeatureSpec:
    """``spec`` when its shape is None or dimensions that are None or ints >= 0, and its dtype None,
    ``'bytes'`` or a supported NumPy dtype string; else ValueError."""
    if spec.shape is not None and not all(d is None or (type(d) is int and d >= 0) for d in spec.shape):
        raise ValueError(f"feature {spec.name!r} has a bad shape {spec.shape!r}")
    if spec.dtype is not None and spec.dtype != VLEN_BYTES:
        if not isinstance(spec.dtype, str):
            raise ValueError(f"feature {spec.name!r} has a bad dtype {spec.dtype!r}")

        normalize_dtype(np.dtype(spec.dtype), spec.name)  # SchemaError: object, structured, float128...
    return spec


def shard_paths(output_dir: str, meta: dict) -> list[str]:
    return [fileio.join(output_dir, s["file"]) for s in meta["shards"]]


def select_split(meta: dict, split: str | None, where: str = "") -> dict:
    """``meta`` with only the shards of ``split`` (all of them when None), num_records counted again.

    Raises:
      SchemaError: ``split`` is not one of the output's splits (naming them).
    """
    if split is None:
        return meta
    names = list(meta.get("splits") or {})
    if split not in names:
        raise SchemaError(
            f"No split {split!r} in this output"
            + (f"; its splits are {names}" if names else " (it was written without splits)"),
            file=where or None,
        )
    shards = [s for s in meta["shards"] if s.get("split") == split]
    return {**meta, "shards": shards, "num_records": sum(s["records"] for s in shards)}
