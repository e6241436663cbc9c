"""The verify report: problems, per-file results, progress, and the constants the checks share."""

from __future__ import annotations

import dataclasses

from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import printable
from tfrecord_etl.transforms.output import metadata, outdir

MANIFEST_FILE = "manifest.json"


PROVENANCE_FILE, PROVENANCE_ROW = "_source/file", "_source/row"


KNOWN_FILES = {
    metadata.METADATA_FILE,
    metadata.SCHEMA_FILE,
    MANIFEST_FILE,
    outdir.MARKER_FILE,
    outdir.LOCK_FILE,
    outdir.LEGACY_MARKER_FILE,
    outdir.LEGACY_LOCK_FILE,
}


CHUNK_ROWS = 4096  # rows compared with the source in one vectorized step


PROGRESS_STEP = 1 << 20


@dataclasses.dataclass
class Problem:
    """One finding. ``kind`` is one of:

    ``framing`` (truncated frame, CRC mismatch, undecompressable stream: reading the file stops there),
    ``missing`` (a shard in the metadata is absent), ``count`` (record counts differ), ``size`` (file size
    differs from the metadata), ``decode`` (a record does not decode with the recorded features),
    ``not_example`` (a record of a plain file is not a tf.train.Example), ``kind`` (a feature of plain
    files holds different list kinds), ``source`` (a value differs from the source, or rows are missing
    or extra), ``manifest`` (a sidecar pairing does not hold), ``unreadable`` (a shard that is not a regular
    file, e.g. a FIFO or device: never opened), ``features`` (more distinct feature names than the limit),
    ``index`` (a shard's ``--index`` file does not list the offsets and lengths of its records), ``checksum`` (a
    shard's CRC32C differs from the one metadata.json records: replaced, swapped or changed after it was written),
    ``collection`` (a span's directory does not hold what ``collection.json`` lists: no metadata.json, another
    metadata.json, record count or schema), ``schema`` (``schema.pbtxt`` is missing, not a TensorFlow Metadata
    Schema, or disagrees with ``metadata.json``: names the feature and both values).

    ``offset``: byte offset of the record's frame in the uncompressed stream; ``record``: 0-based index
    of the record in its file; ``feature``: the feature name, when one is at fault.
    """

    kind: str
    message: str
    file: str | None = None
    record: int | None = None
    offset: int | None = None
    feature: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: ``[kind] file, record N, byte offset B, feature 'F': message`` (non-printable characters
        of names and messages escaped, see ``errors.printable``)."""
        return printable(self._describe())

    def _describe(self) -> str:
        where = [self.file] if self.file else []
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        if self.feature:
            where.append(f"feature '{self.feature}'")
        return f"[{self.kind}] {', '.join(where)}: {self.message}" if where else f"[{self.kind}] {self.message}"


@dataclasses.dataclass
class FileReport:
    """What was read of one file. ``complete`` is False when reading stopped at a framing error."""

    file: str
    compression: str
    records: int = 0
    expected_records: int | None = None
    bytes: int | None = None
    complete: bool = True


@dataclasses.dataclass
class Report:
    """The result of :func:`verify`. ``ok`` only when no problem was found.

    ``problems`` holds the first ``max_problems`` findings; ``num_problems`` counts them all.
    ``source``: None, or ``{"patterns", "mode" ('sequential' | 'provenance'), "rows", "compared", "dead_lettered"}``
    (rows expected to have no record: the dead-lettered rows that metadata.json lists).
    ``manifest``: None, or ``{"shards", "originals_checked", "originals_unreachable", "originals_not_named"}``
    for sidecars (``originals_not_named``: shards whose original was not checked because no ``originals``
    were given). ``checksums``: shards whose CRC32C was compared with metadata.json (read to their end).
    ``schema``: how ``schema.pbtxt`` was compared with ``metadata.json`` (``"tensorflow_metadata"``: parsed into
    ``schema_pb2.Schema`` too; ``"text"``: the reader-only install's parser); None for plain files.
    """

    target: str
    kind: str  # "output", "sidecar" or "files"
    compression: str | None = None
    features: list[FeatureSpec] = dataclasses.field(default_factory=list)
    inferred: bool = False
    files: list[FileReport] = dataclasses.field(default_factory=list)
    expected_records: int | None = None
    problems: list[Problem] = dataclasses.field(default_factory=list)
    num_problems: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)
    source: dict | None = None
    manifest: dict | None = None
    checksums: int = 0
    schema: str | None = None  # schema.pbtxt compared with metadata.json: "tensorflow_metadata" or "text" parser
    seconds: float = 0.0
    max_problems: int = 100

    @property
    def ok(self) -> bool:
        return self.num_problems == 0

    @property
    def num_records(self) -> int:
        return sum(f.records for f in self.files)

    def add(self, problem: Problem) -> None:
        self.num_problems += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "kind": self.kind,
            "ok": self.ok,
            "num_records": self.num_records,
            "expected_records": self.expected_records,
            "compression": self.compression,
            "features": [s.to_json() for s in self.features],
            "inferred": self.inferred,
            "files": [dataclasses.asdict(f) for f in self.files],
            "source": self.source,
            "manifest": self.manifest,
            "checksums": self.checksums,
            "schema": self.schema,
            "num_problems": self.num_problems,
            "problems": [p.to_json() for p in self.problems],
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
        }


class Progress:
    """Progress sink: ``start(label, total, unit)`` (unit ``'B'`` bytes or ``'rows'``), ``update(n)``,
    ``close()``. This one does nothing."""

    def start(self, label: str, total: int | None, unit: str = "B") -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass
