"""Verify plain TFRecord files (no ``metadata.json``): :func:`verify_files`, composed of named steps."""

from __future__ import annotations

import time

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.errors import RecordError, SchemaError
from tfrecord_etl.transforms.verify.records import (
    check_example,
    decode_problem,
    file_compression,
    framing_problem,
    iter_file_records,
    list_record_files,
)
from tfrecord_etl.transforms.verify.report import FileReport, Problem, Progress, Report


class FeatureKinds:
    """The features of plain files, learned from every record: ``stats`` (``codec.FeatureStats``, the specs every
    record satisfies, not a guess from the first records) and each name's kind (``bytes``, ``float``, ``int64``),
    reporting a ``kind`` problem where a record holds another kind than the records before it and one ``features``
    problem when there are more than ``limit`` distinct names (later new names are not checked)."""

    def __init__(self, report: Report, limit: int):
        self.report, self.limit = report, limit
        self.stats = codec.FeatureStats()
        self.kinds: dict[str, str] = {}
        self.too_many = False

    def observe(self, parsed: dict, path: str, index: int, offset: int) -> None:
        """One record's parsed features (``check_example``) at ``index`` / byte ``offset`` of ``path``."""
        if not self.too_many:
            try:
                self.stats.observe(parsed, self.limit, index)
            except RecordError:  # more distinct names than the limit: reported below, once
                pass
        for name, (kind, _) in parsed.items():
            if kind is None:
                continue
            if name not in self.kinds and len(self.kinds) >= self.limit:
                self._too_many(path, index, offset)
                continue
            seen = self.kinds.setdefault(name, kind)
            if seen != kind:
                self.report.add(
                    Problem(
                        "kind",
                        f"Feature holds a {kind} list here, a {seen} list in earlier records",
                        path,
                        index,
                        offset,
                        name,
                    )
                )

    def _too_many(self, path: str, index: int, offset: int) -> None:
        if self.too_many:
            return
        self.too_many = True
        self.report.add(
            Problem(
                "features",
                f"More than {self.limit} distinct feature names (--max_features {self.limit}); later new names "
                "are not checked",
                path,
                index,
                offset,
            )
        )


def check_file(
    report: Report, kinds: FeatureKinds, path: str, size: int, progress: Progress, max_record_bytes: int | None
) -> str:
    """Step 2, per file: its compression (suffix, else first bytes), its frames and CRCs, each record a
    tf.train.Example (a ``not_example`` problem otherwise) observed by ``kinds``; a framing error ends the file (a
    ``framing`` problem, the file incomplete). Returns the file's compression."""
    compression = file_compression(path)
    fr = FileReport(path, compression, 0, None, size)
    report.files.append(fr)
    try:
        for index, offset, record in iter_file_records(path, compression, progress, None, max_record_bytes):
            fr.records += 1
            try:
                parsed = check_example(record, kinds.limit)
            except RecordError as e:
                report.add(decode_problem("not_example", e, path, index, offset))
                continue
            kinds.observe(parsed, path, index, offset)
    except RecordError as e:
        fr.complete = False
        framing_problem(report, e, path, compression)
    return compression


def record_features(report: Report, kinds: FeatureKinds) -> None:
    """Step 3: the features learned from every record into the report, or a warning when a feature had two kinds
    (each such record is already a ``kind`` problem)."""
    try:
        kinds.stats.check_kinds()
        report.features = list(kinds.stats.specs())
    except SchemaError as e:
        report.warnings.append(f"features not inferred: {e.message}")


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

    Steps: the files matched (step 1, ``records.list_record_files``), each file checked (:func:`check_file`), the
    features learned (:func:`record_features`).

    Raises:
      SourceError: nothing matches ``pattern``, or a match is not a regular file.
    """
    started = time.time()
    progress = progress or Progress()
    files = list_record_files(pattern)
    report = Report(pattern, "files", inferred=True, max_problems=max_problems)
    kinds = FeatureKinds(report, codec.MAX_FEATURES if max_features is None else max_features)
    progress.start("verifying", sum(s for _, s in files))
    compressions = {check_file(report, kinds, path, size, progress, max_record_bytes) for path, size in files}
    progress.close()
    report.compression = compressions.pop() if len(compressions) == 1 else "mixed"
    record_features(report, kinds)
    report.seconds = time.time() - started
    return report
