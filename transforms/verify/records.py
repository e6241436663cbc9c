"""Files, compression and records of a verify target (framing and CRCs checked as they are read)."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import RecordError, SchemaError, SourceError
from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.reading.reader import file_compression  # noqa: F401 - one home: the reader
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.report import KNOWN_FILES, PROGRESS_STEP, Problem, Progress, Report


class _CountingReader(io.RawIOBase):
    """A read-only stream that reports the bytes read from ``raw`` to a Progress (and a CRC32C)."""

    def __init__(self, raw: BinaryIO, progress: Progress, checksum=None):
        self._raw, self._progress, self._checksum = raw, progress, checksum
        self.bytes, self._unreported = 0, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        data = self._raw.read() if n is None or n < 0 else self._raw.read(n)
        self._count(data)
        return data

    def readinto(self, b) -> int:
        data = self._raw.read(len(b))
        b[: len(data)] = data
        self._count(data)
        return len(data)

    def _count(self, data: bytes) -> None:
        self.bytes += len(data)
        self._unreported += len(data)
        if self._checksum is not None:
            self._checksum.update(data)
        if self._unreported >= PROGRESS_STEP:
            self.flush_progress()

    def flush_progress(self) -> None:
        if self._unreported:
            self._progress.update(self._unreported)
            self._unreported = 0

    def drain(self) -> None:
        """Reads (and counts) the rest of the raw stream, e.g. the bytes after a gzip stream's end."""
        while self.read(1 << 22):
            pass


def file_size(path: str) -> int | None:
    """Size in bytes of ``path``, or None when it does not exist."""
    try:
        found = fileio.find(path)
    except ImportError:
        raise
    except Exception:  # noqa: BLE001 - Beam raises BeamIOError for a missing path on some filesystems
        return None
    return found[0][1] if found else None


def list_record_files(target: str) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of the TFRecord files of a directory (not recursive) or a file pattern.

    Hidden files (``.*``, e.g. ``.tmp-`` files of a killed run) and ``metadata.json``, ``schema.pbtxt``
    and ``manifest.json`` are left out. Sorted by path.

    Raises:
      SourceError: nothing matches (naming the pattern), or a match is not a regular file (a FIFO or a
        device is never opened).
    """
    pattern = fileio.join(target, "*") if fileio.is_dir(target) else target
    files = [
        (p, s)
        for p, s in fileio.match(pattern)
        if not fileio.basename(p).startswith(".") and fileio.basename(p) not in KNOWN_FILES
    ]
    if not files:
        raise SourceError(
            "No TFRecord file matches (hidden files and metadata are left out)",
            file=target,
            hint="pass a file, a directory of TFRecord files, or a glob such as 'dir/*.gz'",
        )
    for path, _ in files:
        tfrecord.check_regular(path)
    return files


def iter_file_records(
    path: str, compression: str, progress: Progress, checksum=None, max_record_bytes: int | None = None
) -> Iterator[tuple[int, int, bytes]]:
    """``(index, offset, record)`` of one file, CRCs and record sizes checked (``max_record_bytes``, default
    ``tfrecord.record_limit()``); reports the stored bytes read to ``progress``. A file that is not regular
    raises SourceError before it is opened."""
    tfrecord.check_regular(path)
    with fileio.open_read(path) as raw:
        counting = _CountingReader(raw, progress, checksum)
        try:
            yield from tfrecord.iter_records(
                tfrecord.open_decompressed(counting, compression), path, max_record_bytes=max_record_bytes
            )
            if checksum is not None:
                counting.drain()
        finally:
            counting.flush_progress()


def not_example_reason(record: bytes) -> str | None:
    """Why a record that is no ``tf.train.Example`` is something else, when it can tell: a record whose
    fields are ``1: Features`` and ``2: FeatureLists`` is a ``tf.train.SequenceExample``. Else None."""
    try:
        fields = list(codec.iter_fields(record, 0, len(record)))
        if not fields or not any(f == 2 for f, _, _ in fields) or any(w != 2 or f not in (1, 2) for f, w, _ in fields):
            return None
        for f, _, (start, stop) in fields:
            if f == 2:  # FeatureLists{1: repeated {1: key, 2: FeatureList}}
                for f2, w2, _ in codec.iter_fields(record, start, stop):
                    if f2 != 1 or w2 != 2:
                        return None
    except RecordError:
        return None
    return (
        "it is a tf.train.SequenceExample (context and feature_lists); read it with tf.io.parse_single_sequence_example"
    )


def check_example(record: bytes, max_features: int | None = None) -> dict:
    """``codec.parse_example(record, max_features)``, with the RecordError saying what the payload is when it can."""
    try:
        return codec.parse_example(record, max_features)
    except RecordError:
        reason = not_example_reason(record)
        if reason is None:
            raise
        raise RecordError(f"Not a tf.train.Example: {reason}") from None


def infer_specs(records: Sequence[bytes], path: str = "", max_features: int | None = None) -> tuple[FeatureSpec, ...]:
    """The features of serialized Examples without metadata (:func:`codec.infer_feature_specs`).

    Raises:
      RecordError: a record is not a tf.train.Example (naming ``path``, the record index and, for a
        ``tf.train.SequenceExample``, what it is instead); more than ``max_features`` features in a record
        or distinct names in all (default ``codec.MAX_FEATURES``). SchemaError: a feature has two kinds.
    """
    for i, record in enumerate(records):
        try:
            check_example(record, max_features)
        except RecordError as e:
            raise RecordError(
                f"Cannot infer the features: {e.message}",
                file=path or None,
                record=i,
                payload_offset=e.context.get("offset"),
                hint=e.hint,
            ) from None
    try:
        return codec.infer_feature_specs(records, max_features)
    except (SchemaError, RecordError) as e:
        raise e.with_context(file=path or None) from None


def framing_problem(report: Report, e: RecordError, path: str, compression: str) -> None:
    """A ``framing`` problem for ``e``, raised while reading ``path`` with ``compression``; at the first record, it
    says so when the file's first bytes look like another compression."""
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


def decode_problem(kind: str, e, path: str, index: int, offset: int) -> Problem:
    """A ``kind`` problem for the record ``index`` at byte ``offset`` of ``path`` that ``e`` refused (the byte in
    the record's payload where it says)."""
    message = e.message
    if e.context.get("offset") is not None:
        message += f" (at byte {e.context['offset']} of the record's payload)"
    return Problem(kind, message, path, index, offset, e.context.get("feature"))
