"""Verifying a collection directory (``collection.json`` + ``span-N/``): every selected span as an output directory,
plus what holds the spans together.

Per selected span (:func:`collection.select`: span order, each at its latest version):

* its directory holds ``metadata.json`` (else a ``collection`` problem: the span is listed but gone);
* the digest of that ``metadata.json`` is the entry's ``metadata`` (else a ``collection`` problem: a re-run of the
  span committed its directory and not the collection, is still running, or crashed between the two commits;
  readers read the directory's own ``metadata.json``, a complete output);
* its record count is the entry's ``num_records`` and the fingerprint of its ``schema.pbtxt`` the entry's
  ``schema``;
* the span's output directory is verified as any output directory (:func:`targets.verify_output`: framing, CRCs,
  counts, decoding, shard CRC32Cs, index files), with ``sources`` compared per span: only the files the span's
  entry records as its inputs (its ledger), and only those that the ``sources`` patterns match (verify reads only
  the files the user names).

Span directories present but not listed (a run that has not committed yet, or crashed before it did) are
reported as uncommitted: a warning, not a problem (readers never read them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Sequence

from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.errors import EtlError
from tfrecord_etl.transforms.output import metadata
from tfrecord_etl.transforms.reading import collection_reader
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.report import Problem, Progress, Report
from tfrecord_etl.transforms.verify.targets import verify_output


@dataclasses.dataclass
class SpanReport:
    """One span: its ``collection.json`` entry, the report on its output directory (None when it could not be
    verified: its directory has no valid ``metadata.json``), and the collection-level problems about it."""

    entry: dict
    dir: str
    report: Report | None
    problems: list[Problem] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.report is not None and self.report.ok

    def to_json(self) -> dict:
        return {
            "span": self.entry["span"],
            "version": self.entry["version"],
            "dir": self.dir,
            "ok": self.ok,
            "listed_records": self.entry["num_records"],
            "problems": [p.to_json() for p in self.problems],
            "report": None if self.report is None else self.report.to_json(),
        }


@dataclasses.dataclass
class CollectionReport:
    """The result of :func:`verify_collection`: one :class:`SpanReport` per selected span, in span order."""

    target: str
    spans: list[SpanReport]
    num_spans: int  # spans the collection lists (at their latest version)
    uncommitted: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    kind: str = "collection"

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.spans)

    @property
    def num_records(self) -> int:
        return sum(s.report.num_records for s in self.spans if s.report is not None)

    @property
    def num_problems(self) -> int:
        return sum(len(s.problems) + (s.report.num_problems if s.report else 0) for s in self.spans)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "kind": self.kind,
            "ok": self.ok,
            "num_records": self.num_records,
            "num_spans": self.num_spans,
            "spans": [s.to_json() for s in self.spans],
            "num_problems": self.num_problems,
            "uncommitted": list(self.uncommitted),
            "seconds": round(self.seconds, 3),
        }


def verify_collection(
    target: str,
    spans=None,
    sources: Sequence[str] = (),
    progress: Progress | None = None,
    max_problems: int = 100,
    *,
    max_record_bytes: int | None = None,
    max_features: int | None = None,
) -> CollectionReport:
    """Verifies the spans ``spans`` selects of the collection ``target`` (see the module docstring).

    Raises:
      IncompleteOutputError: no ``collection.json``. SchemaError: an invalid one.
      ConfigError: a span that is not committed, no span selected; an exact comparison impossible for a span.
      SourceError: a ``sources`` pattern matches nothing.
    """
    started = time.time()
    coll = collection.load(target)
    entries = collection.select(coll, spans, target)
    named = _named_files(sources)
    out = []
    for entry in entries:
        where = collection_reader.span_dir(target, entry)
        span = SpanReport(entry, where, None)
        out.append(span)
        try:
            meta, digest = metadata.load_with_digest(where, counts=False)  # verify_output reports the counts
        except EtlError as e:
            gone = "its directory is missing" if not fileio.is_dir(where) else f"its {e.message}"
            span.problems.append(
                Problem("collection", f"Span {entry['span']} is listed in collection.json but {gone}", where)
            )
            continue
        span.problems += _entry_problems(entry, where, meta, digest)
        span_sources = _span_sources(span, named) if sources else ()
        span.report = verify_output(
            where, span_sources, progress, max_problems, max_record_bytes=max_record_bytes, max_features=max_features
        )
    return CollectionReport(
        target,
        out,
        len(collection.latest_versions(coll)),
        collection.unlisted_span_dirs(target, coll),
        time.time() - started,
    )


def _entry_problems(entry: dict, where: str, meta: dict, digest: str) -> list[Problem]:
    """What differs between a span's ``collection.json`` entry and its directory."""
    problems, span = [], entry["span"]
    meta_path = fileio.join(where, metadata.METADATA_FILE)
    if digest != entry["metadata"]:
        problems.append(
            Problem(
                "collection",
                f"Span {span}'s metadata.json is not the one collection.json lists "
                "(its digest differs): a re-run of the span committed its directory but not the "
                "collection (it is running, or crashed between the two commits); readers read the "
                "directory's metadata.json. Convert the span again to list it",
                meta_path,
            )
        )
    if meta["num_records"] != entry["num_records"]:
        problems.append(
            Problem(
                "collection",
                f"Span {span} holds {meta['num_records']} records, collection.json says {entry['num_records']}",
                meta_path,
            )
        )
    schema_path = fileio.join(where, metadata.SCHEMA_FILE)
    schema = hashlib.sha256(fileio.read_bytes(schema_path)).hexdigest() if fileio.exists(schema_path) else None
    if schema != entry["schema"]:
        what = "is missing" if schema is None else "has another fingerprint than collection.json records"
        problems.append(Problem("collection", f"Span {span}'s schema.pbtxt {what}", schema_path))
    return problems


def _local(path: str) -> str:
    return os.path.abspath(path) if fileio.is_local(path) else path


def _named_files(sources: Sequence[str]) -> set[str]:
    """The files the ``sources`` patterns match (SourceError when one matches nothing)."""
    return {_local(p) for pattern in sources for p, _ in fileio.match(pattern)}


def _span_sources(span: SpanReport, named: set[str]) -> list[str]:
    """The span's recorded input files (its ledger), in path order, when the user's ``--source`` patterns match
    every one of them; else none (a ``source`` problem says why the span is not compared)."""
    recorded = sorted(row["path"] for row in span.entry["inputs"])
    outside = [p for p in recorded if _local(p) not in named]
    if not recorded or outside:
        why = (
            "records no input files"
            if not recorded
            else f"has {len(outside)} of its {len(recorded)} input files outside the --source files (first: {outside[0]})"
        )
        span.problems.append(
            Problem("source", f"Span {span.entry['span']} {why}: not compared with its source", span.dir)
        )
        return []
    return recorded
