"""The verify targets: an output directory, a sidecar collection, plain TFRecord files."""

from __future__ import annotations

import time
from collections.abc import Sequence

import google_crc32c
import numpy as np

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError, SourceError, printable
from tfrecord_etl.transforms.output import metadata, outdir, tfrecord
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.compare import make_comparer
from tfrecord_etl.transforms.verify.records import (
    check_example,
    file_compression,
    file_size,
    iter_file_records,
    list_record_files,
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


def _framing_problem(report: Report, e: RecordError, path: str, compression: str) -> None:
    message = e.message
    if e.context.get("record") == 0:
        try:
            with fileio.open_read(path) as raw:
                looks = tfrecord.detect_compression(raw.read(12))
        except SourceError:
            looks = compression
        if looks != compression:
            looks = "uncompressed" if looks == "none" else f"{looks}-compressed"
            message += f" (the file looks {looks}, but is read with compression {compression})"
    if e.hint:
        message += f"; {e.hint}"
    report.add(Problem("framing", message, path, e.context.get("record"), e.context.get("offset")))


def _decode_problem(kind: str, e, path: str, index: int, offset: int) -> Problem:
    message = e.message
    if e.context.get("offset") is not None:
        message += f" (at byte {e.context['offset']} of the record's payload)"
    return Problem(kind, message, path, index, offset, e.context.get("feature"))


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
    """Verifies an output directory (see the module docstring); raises as :func:`verify`."""
    started = time.time()
    progress = progress or Progress()
    meta = metadata.load(output_dir)
    if meta.get("compression") not in tfrecord.COMPRESSIONS:
        raise SchemaError(
            f"Invalid metadata.json: compression {meta.get('compression')!r}",
            file=fileio.join(output_dir, metadata.METADATA_FILE),
        )
    has_manifest = fileio.exists(fileio.join(output_dir, MANIFEST_FILE))
    report = Report(
        output_dir,
        "sidecar" if has_manifest else "output",
        meta["compression"],
        list(meta["features"]),
        expected_records=meta.get("num_records"),
        max_problems=max_problems,
    )
    _check_schema(report, output_dir, meta)
    comparer = make_comparer(meta, sources, report, progress, output_dir) if sources else None
    specs = list(meta["features"])
    shards = list(zip(meta["shards"], metadata.shard_paths(output_dir, meta)))
    sizes = {path: file_size(path) for _, path in shards}
    progress.start("verifying", sum(s for s in sizes.values() if s))
    for shard, path in shards:
        expected = shard["records"]
        fr = FileReport(path, meta["compression"], 0, expected, sizes[path])
        report.files.append(fr)
        if comparer:
            comparer.begin_shard(expected)
        if sizes[path] is None:
            fr.complete = False
            report.add(Problem("missing", f"Shard listed in metadata.json is missing ({expected} records)", path))
        else:
            if isinstance(shard.get("bytes"), int) and shard["bytes"] != sizes[path]:
                report.add(
                    Problem("size", f"File holds {sizes[path]} bytes, metadata.json says {shard['bytes']}", path)
                )
            checksum = google_crc32c.Checksum() if isinstance(shard.get("crc32c"), str) else None
            frames = _read_shard(
                report,
                fr,
                path,
                meta["compression"],
                specs,
                comparer,
                progress,
                max_record_bytes,
                max_features,
                checksum,
            )
            if checksum is not None and fr.complete:
                report.checksums += 1
                crc = checksum.hexdigest().decode()
                if crc != shard["crc32c"]:
                    report.add(
                        Problem(
                            "checksum",
                            f"File's CRC32C is {crc}, metadata.json says {shard['crc32c']}: "
                            "the shard was replaced, swapped with another or changed after it was "
                            "written",
                            path,
                        )
                    )
            if fr.complete and fr.records != expected:
                report.add(Problem("count", f"Shard holds {fr.records} records, metadata.json says {expected}", path))
            if fr.complete and "index" in shard:
                _check_index(report, fileio.join(output_dir, shard["index"]), frames)
        if comparer:
            comparer.end_shard()
    progress.close()
    for name, info in (meta.get("splits") or {}).items():
        held = sum(s["records"] for s, _ in shards if s.get("split") == name)
        if not isinstance(info, dict) or info.get("num_records") != held:
            report.add(
                Problem(
                    "count",
                    f"metadata.json says split {name!r} holds "
                    f"{info.get('num_records') if isinstance(info, dict) else info} records but its "
                    f"shards hold {held}",
                    fileio.join(output_dir, metadata.METADATA_FILE),
                )
            )
    listed = sum(s["records"] for s, _ in shards)
    if meta.get("num_records") != listed:
        report.add(
            Problem(
                "count",
                f"metadata.json says num_records {meta.get('num_records')} but its shards hold {listed}",
                fileio.join(output_dir, metadata.METADATA_FILE),
            )
        )
    if comparer:
        comparer.finish()
        for plan in comparer.plans:
            plan.source.close()
        report.source = comparer.summary(sources)
    if has_manifest:
        _check_manifest(
            report,
            output_dir,
            {fileio.basename(f.file): f for f in report.files},
            progress,
            originals,
            max_record_bytes,
        )
    elif originals:
        raise ConfigError("--original needs a sidecar collection: this output has no manifest.json", file=output_dir)
    unsummed = sum(1 for s, _ in shards if not isinstance(s.get("crc32c"), str))
    if unsummed:
        report.warnings.append(
            f"{unsummed} of {len(shards)} shards have no CRC32C in metadata.json (an output of "
            "an earlier version): a shard swapped with, or replaced by, another of the same size "
            "could not be detected without --source; convert again to record them"
        )
    listed_files = {s[k] for s, _ in shards for k in ("file", "index") if k in s}
    report.warnings += _unlisted_files(output_dir, listed_files | set((meta.get("tfds") or {}).get("files", [])))
    report.seconds = time.time() - started
    return report


def _check_schema(report: Report, output_dir: str, meta: dict) -> None:
    """``schema.pbtxt`` against ``metadata.json`` (:mod:`transforms.collections.schemacheck`): a ``schema`` problem per
    difference, naming the feature and both values. With tensorflow_metadata installed the text is also parsed
    into ``schema_pb2.Schema`` (every field and enum checked); the reader-only install compares the fields we
    write (``report.schema``: which)."""
    from tfrecord_etl.transforms.collections import schemacheck

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
                report.add(_decode_problem("not_example" if reason else "decode", problem, path, index, offset))
                decoded = None
            if comparer:
                comparer.feed(path, index, offset, decoded)
    except RecordError as e:
        fr.complete = False
        _framing_problem(report, e, path, compression)
    return frames


def _unlisted_files(output_dir: str, listed: set) -> list[str]:
    try:
        found = list(outdir.list_names(output_dir))
    except Exception:  # noqa: BLE001 - an unlistable directory only loses the warnings
        return []
    out = []
    for name in sorted(set(found) - listed - KNOWN_FILES):
        if name.startswith("."):
            out.append(f"{name}: a temporary file (of a killed or retried attempt); the next run removes it")
        else:
            out.append(f"{name}: not listed in metadata.json; readers that glob the directory would read it")
    return out


def _check_manifest(
    report: Report,
    sidecar_dir: str,
    counted: dict,
    progress: Progress,
    originals: Sequence[str] = (),
    max_record_bytes: int | None = None,
) -> None:
    """Sidecar shard counts against ``manifest.json``; with ``originals`` (directories or patterns the user
    named), each original shard's count, size and CRC32C.

    The manifest's ``input`` paths are never opened: an original is the file of the same name among the
    files ``originals`` names (regular files only; a FIFO or device is never opened).
    """
    from tfrecord_etl.transforms.reading.sidecar import load_manifest, original_files

    try:
        manifest = load_manifest(sidecar_dir)
    except SchemaError as e:
        report.add(Problem("manifest", e.message, fileio.join(sidecar_dir, MANIFEST_FILE)))
        return
    named: dict[str, str] = {}
    for pattern in originals:
        try:
            named.update(original_files(pattern))
        except SourceError as e:
            report.add(Problem("manifest", f"--original {pattern}: {e.message}", e.context.get("file", pattern)))
    checked, unreachable, not_named = 0, [], 0
    for entry in manifest["shards"]:
        side = counted.get(entry["sidecar"])
        side_path = fileio.join(sidecar_dir, entry["sidecar"])
        if side is None:
            report.add(Problem("manifest", "Sidecar shard of manifest.json is not listed in metadata.json", side_path))
        elif side.complete and side.records != entry["records"]:
            report.add(
                Problem(
                    "manifest",
                    f"Sidecar shard holds {side.records} records, manifest.json says "
                    f"{entry['records']} (its original's count): misaligned pair",
                    side_path,
                )
            )
        if not originals:
            not_named += 1
            continue
        original = named.get(fileio.basename(entry["input"]))
        if original is None:
            unreachable.append(fileio.basename(entry["input"]))
            continue
        size = file_size(original)
        checked += 1
        if size != entry["bytes"]:
            report.add(
                Problem(
                    "manifest",
                    f"Original shard changed after its sidecar was written ({size} bytes, "
                    f"manifest.json: {entry['bytes']})",
                    original,
                )
            )
            continue
        checksum, count = google_crc32c.Checksum(), 0
        try:
            for _ in iter_file_records(original, entry["compression"], progress, checksum, max_record_bytes):
                count += 1
        except RecordError as e:
            report.add(
                Problem(
                    "manifest",
                    f"Original shard is corrupt: {e.message}",
                    original,
                    e.context.get("record"),
                    e.context.get("offset"),
                )
            )
            continue
        crc = checksum.hexdigest().decode()
        if count != entry["records"]:
            report.add(
                Problem(
                    "manifest",
                    f"Original shard holds {count} records, manifest.json says {entry['records']}: misaligned pair",
                    original,
                )
            )
        if crc != entry["crc32c"]:
            report.add(
                Problem(
                    "manifest",
                    f"Original shard changed after its sidecar was written (CRC32C {crc}, "
                    f"manifest.json: {entry['crc32c']})",
                    original,
                )
            )
    if not_named:
        report.warnings.append(
            f"{not_named} original shards were not checked: verify reads only the files it is "
            "given, never the paths in manifest.json; pass --original DIR_OR_PATTERN (the "
            "collection the sidecar was written for) to check their counts, sizes and CRC32Cs"
        )
    if unreachable:
        report.warnings.append(
            f"{len(unreachable)} original shards are not among the --original files (first: "
            f"{printable(unreachable[0])}): their counts and checksums were not checked"
        )
    report.manifest = {
        "shards": len(manifest["shards"]),
        "originals_checked": checked,
        "originals_unreachable": len(unreachable),
        "originals_not_named": not_named,
    }


def verify_files(
    pattern: str,
    progress: Progress | None = None,
    max_problems: int = 100,
    *,
    max_record_bytes: int | None = None,
    max_features: int | None = None,
) -> Report:
    """Verifies plain TFRecord files: framing, CRCs, each record a tf.train.Example, one kind per feature.

    The features are learned from every record (``codec.FeatureStats``: fixed ``list`` where every record holds
    the same number of values, else ``varlen``); a feature with another kind than in earlier records is a ``kind``
    problem. Compression is told per file (suffix, else first bytes). A record over
    ``max_record_bytes`` is a ``framing`` problem (reading that file stops there, before the record is
    read); a record with more than ``max_features`` features a ``not_example`` one; names beyond
    ``max_features`` distinct ones one ``features`` problem (they are not tracked further).

    Raises:
      SourceError: nothing matches ``pattern``, or a match is not a regular file.
    """
    feature_limit = codec.MAX_FEATURES if max_features is None else max_features
    started = time.time()
    progress = progress or Progress()
    files = list_record_files(pattern)
    report = Report(pattern, "files", inferred=True, max_problems=max_problems)
    progress.start("verifying", sum(s for _, s in files))
    stats = codec.FeatureStats()  # the features every record satisfies (not a guess from the first records)
    kinds: dict[str, str] = {}
    too_many = False
    compressions = set()
    for path, size in files:
        compression = file_compression(path)
        compressions.add(compression)
        fr = FileReport(path, compression, 0, None, size)
        report.files.append(fr)
        try:
            for index, offset, record in iter_file_records(path, compression, progress, None, max_record_bytes):
                fr.records += 1
                try:
                    parsed = check_example(record, feature_limit)
                except RecordError as e:
                    report.add(_decode_problem("not_example", e, path, index, offset))
                    continue
                if not too_many:
                    try:
                        stats.observe(parsed, feature_limit, index)
                    except RecordError:  # more distinct names than the limit: reported below, once
                        pass
                for name, (kind, _) in parsed.items():
                    if kind is None:
                        continue
                    if name not in kinds and len(kinds) >= feature_limit:
                        if not too_many:
                            too_many = True
                            report.add(
                                Problem(
                                    "features",
                                    f"More than {feature_limit} distinct feature names "
                                    f"(--max_features {feature_limit}); later new names are not checked",
                                    path,
                                    index,
                                    offset,
                                )
                            )
                        continue
                    seen = kinds.setdefault(name, kind)
                    if seen != kind:
                        report.add(
                            Problem(
                                "kind",
                                f"Feature holds a {kind} list here, a {seen} list in earlier records",
                                path,
                                index,
                                offset,
                                name,
                            )
                        )
        except RecordError as e:
            fr.complete = False
            _framing_problem(report, e, path, compression)
    progress.close()
    report.compression = compressions.pop() if len(compressions) == 1 else "mixed"
    try:
        stats.check_kinds()
        report.features = list(stats.specs())
    except SchemaError as e:  # already reported record by record (kind)
        report.warnings.append(f"features not inferred: {e.message}")
    report.seconds = time.time() - started
    return report
