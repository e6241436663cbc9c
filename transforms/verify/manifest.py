"""Verify a sidecar collection's ``manifest.json``: :func:`check_manifest`, composed of named steps.

The manifest's ``input`` paths are never opened: an original is the file of the same name among the files the user
named (``--original``; regular files only, a FIFO or device is never opened).
"""

from __future__ import annotations

from collections.abc import Sequence

import google_crc32c

from tfrecord_etl.transforms.errors import RecordError, SchemaError, SourceError, printable
from tfrecord_etl.transforms.reading.sidecar import load_manifest, original_files
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.records import file_size, iter_file_records
from tfrecord_etl.transforms.verify.report import MANIFEST_FILE, Problem, Progress, Report


def named_originals(report: Report, originals: Sequence[str]) -> dict[str, str]:
    """Step 1: ``{file name: path}`` of the files ``originals`` (directories or patterns) name; a pattern that
    names nothing readable is a ``manifest`` problem."""
    named: dict[str, str] = {}
    for pattern in originals:
        try:
            named.update(original_files(pattern))
        except SourceError as e:
            report.add(Problem("manifest", f"--original {pattern}: {e.message}", e.context.get("file", pattern)))
    return named


def check_sidecar(report: Report, sidecar_dir: str, entry: dict, counted: dict) -> None:
    """Step 2, per manifest entry: its sidecar shard listed in ``metadata.json`` and holding the original's count."""
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


def check_original(
    report: Report, entry: dict, original: str, progress: Progress, max_record_bytes: int | None
) -> None:
    """Step 3, per original found: its size, then its frames, record count and CRC32C against the manifest's
    entry (one ``manifest`` problem per difference; a changed size stops there)."""
    size = file_size(original)
    if size != entry["bytes"]:
        report.add(
            Problem(
                "manifest",
                f"Original shard changed after its sidecar was written ({size} bytes, manifest.json: {entry['bytes']})",
                original,
            )
        )
        return
    checksum, count = google_crc32c.Checksum(), 0
    try:
        for _ in iter_file_records(original, entry["compression"], progress, checksum, max_record_bytes):
            count += 1
    except RecordError as e:
        message = f"Original shard is corrupt: {e.message}"
        report.add(Problem("manifest", message, original, e.context.get("record"), e.context.get("offset")))
        return
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


def warn_unchecked(report: Report, not_named: int, unreachable: list[str]) -> None:
    """Step 4: one warning for the originals not checked because ``--original`` was not given, one for those not
    among its files."""
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


def check_manifest(
    report: Report,
    sidecar_dir: str,
    counted: dict,
    progress: Progress,
    originals: Sequence[str] = (),
    max_record_bytes: int | None = None,
) -> None:
    """Sidecar shard counts against ``manifest.json``; with ``originals`` (directories or patterns the user
    named), each original shard's count, size and CRC32C. ``counted``: ``{sidecar shard name: FileReport}`` of the
    shards verified. Sets ``report.manifest`` (shards, originals checked / unreachable / not named).

    Steps: the manifest loaded (a ``manifest`` problem if it is invalid), the originals named
    (:func:`named_originals`), each entry's sidecar (:func:`check_sidecar`) and original (:func:`check_original`),
    the warnings (:func:`warn_unchecked`).
    """
    try:
        manifest = load_manifest(sidecar_dir)
    except SchemaError as e:
        report.add(Problem("manifest", e.message, fileio.join(sidecar_dir, MANIFEST_FILE)))
        return
    named = named_originals(report, originals)
    checked, unreachable, not_named = 0, [], 0
    for entry in manifest["shards"]:
        check_sidecar(report, sidecar_dir, entry, counted)
        if not originals:
            not_named += 1
            continue
        original = named.get(fileio.basename(entry["input"]))
        if original is None:
            unreachable.append(fileio.basename(entry["input"]))
            continue
        checked += 1
        check_original(report, entry, original, progress, max_record_bytes)
    warn_unchecked(report, not_named, unreachable)
    report.manifest = {
        "shards": len(manifest["shards"]),
        "originals_checked": checked,
        "originals_unreachable": len(unreachable),
        "originals_not_named": not_named,
    }
