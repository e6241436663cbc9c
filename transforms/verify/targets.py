"""The verify targets: :func:`verify` chooses one; an output directory (:func:`verify_output`, in named steps) or
a sidecar collection here, plain TFRecord files in ``files.py``, a sidecar's manifest in ``manifest.py``."""

from __future__ import annotations

import time
from collections.abc import Sequence

import google_crc32c
import numpy as np

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.collections import schemacheck
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError, SourceError
from tfrecord_etl.transforms.output import metadata, outdir, resume, tfrecord
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.compare import make_comparer
from tfrecord_etl.transforms.verify.files import verify_files
from tfrecord_etl.transforms.verify.manifest import check_manifest
from tfrecord_etl.transforms.verify.records import (
    decode_problem,
    file_size,
    framing_problem,
    iter_file_records,
    not_example_reason,
)
from tfrecord_etl.transforms.verify.report import KNOWN_FILES, MANIFEST_FILE, FileReport, Problem, Progress, Report


def verify(
    target: str,
    sources: Sequence[str] = (),
    progress: Progress | None = None,
    max_problems: int = 100,
    *,
    originals: Sequence[str] = (),
    max_record_bytes: int | None = None,
    max_features: int | None = None,
) -> Report:
    """Verifies an output directory (with ``metadata.json``), a sidecar collection, or plain TFRecord files.

    Args:
      target: an output directory of tfrecord-etl, or a file / glob of TFRecord files without metadata.
      sources: file patterns of the convert input; every array is then compared with it exactly
        (output directories only).
      progress: receives the stored bytes read (default: none).
      max_problems: findings kept in the report (all are counted).
      originals: directories or file patterns of a sidecar's original collection; only these files are
        read as originals (paired by file name with the manifest's entries). Without them the originals
        are not checked (a warning says so).
      max_record_bytes: limit on one record's length header, checked before it is read (default
        ``tfrecord.record_limit()``, 1024 MB). max_features: limit on the features of one record and on
        the distinct names of plain files (default ``codec.MAX_FEATURES``).

    Raises:
      IncompleteOutputError: a directory without ``metadata.json``.
      SchemaError: an invalid ``metadata.json`` (e.g. a shard path leaving the directory).
      ConfigError: ``sources`` for plain files, or an exact comparison that is impossible for this output.
      SourceError: nothing matches ``target`` or a source pattern.
    """
    progress = progress or Progress()
    if fileio.is_dir(target) or fileio.exists(fileio.join(target, metadata.METADATA_FILE)):
        return verify_output(
            target,
            sources,
            progress,
            max_problems,
            originals=originals,
            max_record_bytes=max_record_bytes,
            max_features=max_features,
        )
    if sources:
        raise ConfigError(
            "--source needs an output directory with metadata.json (it holds the convert options)", file=target
        )
    if originals:
        raise ConfigError("--original needs a sidecar collection (an output directory with manifest.json)", file=target)
    return verify_files(target, progress, max_problems, max_record_bytes=max_record_bytes, max_features=max_features)


def verify_output(
    output_dir: str,
    sources: Sequence[str] = (),
    progress: Progress | None = None,
    max_problems: int = 100,
    *,
    originals: Sequence[str] = (),
    max_record_bytes: int | None = None,
    max_features: int | None = None,
) -> Report:
    """Verifies an output directory (see the package docstring); raises as :func:`verify`.

    Steps: ``metadata.json`` loaded (:func:`load_metadata`), ``schema.pbtxt`` against it (:func:`check_schema`),
    each shard read and checked (:func:`check_shard`, compared with ``sources`` when given), the counts of the
    splits and the whole (:func:`check_counts`), the comparison's summary (:func:`finish_comparison`), the sidecar's
    manifest (``manifest.check_manifest``), the warnings (:func:`warn_output`).
    """
    started = time.time()
    progress = progress or Progress()
    meta = load_metadata(output_dir)
    has_manifest = fileio.exists(fileio.join(output_dir, MANIFEST_FILE))
    report = Report(
        output_dir,
        "sidecar" if has_manifest else "output",
        meta["compression"],
        list(meta["features"]),
        expected_records=meta.get("num_records"),
        max_problems=max_problems,
    )
    check_schema(report, output_dir, meta)
    comparer = make_comparer(meta, sources, report, progress, output_dir) if sources else None
    shards = list(zip(meta["shards"], metadata.shard_paths(output_dir, meta)))
    sizes = {path: file_size(path) for _, path in shards}
    progress.start("verifying", sum(s for s in sizes.values() if s))
    limits = (max_record_bytes, max_features)
    for shard, path in shards:
        check_shard(report, output_dir, meta, shard, path, sizes[path], comparer, progress, limits)
    progress.close()
    check_counts(report, output_dir, meta, shards)
    if comparer:
        finish_comparison(report, comparer, sources)
    if has_manifest:
        counted = {fileio.basename(f.file): f for f in report.files}
        check_manifest(report, output_dir, counted, progress, originals, max_record_bytes)
    elif originals:
        raise ConfigError("--original needs a sidecar collection: this output has no manifest.json", file=output_dir)
    warn_output(report, output_dir, meta, shards)
    report.seconds = time.time() - started
    return report


def load_metadata(output_dir: str) -> dict:
    """Step 1: ``metadata.json`` loaded (``metadata.load``) and its compression one of ours.

    Raises:
      IncompleteOutputError: no ``metadata.json``. SchemaError: an invalid one.
    """
    meta = metadata.load(output_dir, counts=False)  # counts that do not add up: problems of check_counts
    if meta.get("compression") not in tfrecord.COMPRESSIONS:
        raise SchemaError(
            f"Invalid metadata.json: compression {meta.get('compression')!r}",
            file=fileio.join(output_dir, metadata.METADATA_FILE),
        )
    return meta


def check_shard(
    report: Report,
    output_dir: str,
    meta: dict,
    shard: dict,
    path: str,
    size: int | None,
    comparer,
    progress: Progress,
    limits: tuple[int | None, int | None],
) -> None:
    """Step 3, per shard of ``metadata.json``: present, its size, every frame and record (decoded with the recorded
    features, fed to ``comparer``), its CRC32C, its record count and its index file against the metadata.
    ``limits``: ``(max_record_bytes, max_features)``."""
    expected = shard["records"]
    fr = FileReport(path, meta["compression"], 0, expected, size)
    report.files.append(fr)
    if comparer:
        comparer.begin_shard(expected)
    if size is None:
        fr.complete = False
        report.add(Problem("missing", f"Shard listed in metadata.json is missing ({expected} records)", path))
    else:
        if isinstance(shard.get("bytes"), int) and shard["bytes"] != size:
            report.add(Problem("size", f"File holds {size} bytes, metadata.json says {shard['bytes']}", path))
        checksum = google_crc32c.Checksum() if isinstance(shard.get("crc32c"), str) else None
        frames = _read_shard(
            report, fr, path, meta["compression"], list(meta["features"]), comparer, progress, *limits, checksum
        )
        if checksum is not None and fr.complete:
            check_checksum(report, shard, path, checksum)
        if fr.complete and fr.records != expected:
            report.add(Problem("count", f"Shard holds {fr.records} records, metadata.json says {expected}", path))
        if fr.complete and "index" in shard:
            _check_index(report, fileio.join(output_dir, shard["index"]), frames)
    if comparer:
        comparer.end_shard()


def check_checksum(report: Report, shard: dict, path: str, checksum) -> None:
    """A complete shard's CRC32C (``checksum``, fed while it was read) against its ``metadata.json`` entry."""
    report.checksums += 1
    crc = checksum.hexdigest().decode()
    if crc != shard["crc32c"]:
        report.add(
            Problem(
                "checksum",
                f"File's CRC32C is {crc}, metadata.json says {shard['crc32c']}: the shard was replaced, swapped "
                "with another or changed after it was written",
                path,
            )
        )


def check_counts(report: Report, output_dir: str, meta: dict, shards: list) -> None:
    """Step 4: the counts ``metadata.json`` records add up (``metadata.count_problems``: ``num_records`` and each
    split's against the records its shards list, ``rows_read`` against the records written plus the rows
    dead-lettered, augment's ``records_in``): a ``count`` problem each."""
    path = fileio.join(output_dir, metadata.METADATA_FILE)
    if "num_records" not in meta:
        report.add(Problem("count", "metadata.json has no num_records", path))
    for wrong in metadata.count_problems(meta):
        report.add(
            Problem(
                "count",
                f"metadata.json's counts do not add up: {wrong}; it was edited or damaged after the "
                "output was written: convert it again",
                path,
            )
        )


def finish_comparison(report: Report, comparer, sources: Sequence[str]) -> None:
    """Step 5 (with ``sources``): the comparison's last checks, its sources closed, its summary in the report."""
    comparer.finish()
    for plan in comparer.plans:
        plan.source.close()
    report.source = comparer.summary(sources)


def warn_output(report: Report, output_dir: str, meta: dict, shards: list) -> None:
    """Step 7: warnings for shards without a CRC32C (an earlier version's output) and for files in the directory
    that ``metadata.json`` does not list (temporaries of killed attempts, others)."""
    unsummed = sum(1 for s, _ in shards if not isinstance(s.get("crc32c"), str))
    if unsummed:
        report.warnings.append(
            f"{unsummed} of {len(shards)} shards have no CRC32C in metadata.json (an output of "
            "an earlier version): a shard swapped with, or replaced by, another of the same size "
            "could not be detected without --source; convert again to record them"
        )
    listed_files = {s[k] for s, _ in shards for k in ("file", "index") if k in s}
    report.warnings += _unlisted_files(output_dir, listed_files | set((meta.get("tfds") or {}).get("files", [])))


def check_schema(report: Report, output_dir: str, meta: dict) -> None:
    """Step 2: ``schema.pbtxt`` against ``metadata.json`` (:mod:`transforms.collections.schemacheck`): a ``schema`` problem per
    difference, naming the feature and both values. With tensorflow_metadata installed the text is also parsed
    into ``schema_pb2.Schema`` (every field and enum checked); the reader-only install compares the fields we
    write (``report.schema``: which)."""
    path = fileio.join(output_dir, metadata.SCHEMA_FILE)
    todo = "; one of the two files was edited or replaced after the output was written: convert it again"
    try:
        text = schemacheck.read_schema(output_dir).decode("utf-8")
    except SchemaError as e:
        report.add(Problem("schema", e.message + todo, path))
        return
    except UnicodeDecodeError:
        report.add(
            Problem("schema", "schema.pbtxt is not a TensorFlow Metadata Schema in text format: not UTF-8" + todo, path)
        )
        return
    proto = schemacheck.proto_available()
    report.schema = "tensorflow_metadata" if proto else "text"
    error = schemacheck.proto_error(text) if proto else None
    if error:
        report.add(
            Problem("schema", f"schema.pbtxt is not a TensorFlow Metadata Schema in text format: {error}" + todo, path)
        )
        return
    found = schemacheck.disagreements(text, meta["features"])
    if found and schemacheck.pending(output_dir, meta):
        report.warnings.append(
            f"schema.pbtxt disagrees with metadata.json ({found[0].message()}) while a run "
            "replacing this output has not committed (it writes schema.pbtxt just before "
            "metadata.json): the readers read the committed output; verify again once that run "
            "has committed, or run it again if it was killed"
        )
        return
    for d in found:
        report.add(Problem("schema", d.detail() + todo, path, feature=d.feature))


def _check_index(report: Report, path: str, frames: list[tuple[int, int]]) -> None:
    """The shard's ``tfrecord2idx`` index file (``--index``) against the frames read: one line per record with
    its byte offset and frame length."""
    try:
        offsets, lengths = tfrecord.parse_index(fileio.read_bytes(path), path)
    except RecordError as e:
        report.add(Problem("index", e.message, path))
        return
    except Exception as e:  # noqa: BLE001 - a missing or unreadable index is one problem
        report.add(Problem("index", f"Index file listed in metadata.json cannot be read: {e}", path))
        return
    if len(offsets) != len(frames):
        report.add(Problem("index", f"Index lists {len(offsets)} records, the shard holds {len(frames)}", path))
        return
    got = np.array(frames, np.int64).reshape(-1, 2)
    bad = np.flatnonzero((got[:, 0] != offsets) | (got[:, 1] != lengths))
    if bad.size:
        k = int(bad[0])
        report.add(
            Problem(
                "index",
                f"Index line {k + 1} says record {k} is at byte {offsets[k]} ({lengths[k]} "
                f"bytes); the shard has it at byte {got[k, 0]} ({got[k, 1]} bytes)",
                path,
            )
        )


def _read_shard(
    report: Report,
    fr: FileReport,
    path: str,
    compression: str,
    specs,
    comparer,
    progress,
    max_record_bytes: int | None = None,
    max_features: int | None = None,
    checksum=None,
) -> list[tuple[int, int]]:
    """Reads and checks one shard; returns the ``(byte offset, frame length)`` of each record read. ``checksum``
    (a ``google_crc32c.Checksum``) gets the shard's stored bytes in the same pass."""
    frames: list[tuple[int, int]] = []
    try:
        tfrecord.check_regular(path)
    except SourceError as e:
        fr.complete = False
        report.add(Problem("unreadable", e.message, path))
        return frames
    try:
        for index, offset, record in iter_file_records(path, compression, progress, checksum, max_record_bytes):
            fr.records += 1
            frames.append((offset, 16 + len(record)))
            try:
                decoded = codec.decode_example(record, specs, max_features)
            except (RecordError, SchemaError) as e:
                reason = not_example_reason(record)
                problem = RecordError(f"Not a tf.train.Example: {reason}") if reason else e
                report.add(decode_problem("not_example" if reason else "decode", problem, path, index, offset))
                decoded = None
            if comparer:
                comparer.feed(path, index, offset, decoded)
    except RecordError as e:
        fr.complete = False
        framing_problem(report, e, path, compression)
    return frames


def _unlisted_files(output_dir: str, listed: set) -> list[str]:
    try:
        found = list(outdir.list_names(output_dir))
    except Exception:  # noqa: BLE001 - an unlistable directory only loses the warnings
        return []
    out = []
    kept = resume.receipted(output_dir, set(found) - listed)  # a failed run's committed shards and their receipts
    for name in sorted(set(found) - listed - KNOWN_FILES):
        if name in kept:
            what = "the receipt of a shard" if resume.RECEIPT.match(name) else "a shard"
            out.append(
                f"{name}: {what} a failed run committed, kept for --resume (the same command with --resume writes "
                "only the missing shards; without it, the next run removes it)"
            )
        elif name.startswith("."):
            out.append(f"{name}: a temporary file (of a killed or retried attempt); the next run removes it")
        else:
            out.append(f"{name}: not listed in metadata.json; readers that glob the directory would read it")
    return out
