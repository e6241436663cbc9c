"""Augmenting a collection (``collection.json`` + ``span-N/``, see :mod:`transforms.collections.collection`) span by span.

``--input IN`` a collection directory: each span ``--spans`` selects, ``IN/span-N[/version-V]``, is augmented into
``AUG/span-N[/version-V]`` (same span numbers and versions) by the augment of one output directory, and then listed
in ``AUG/collection.json`` (:func:`collection.commit` with :func:`collection.add_span`), one span at a time, in span
order. A span that fails stops the run: the spans committed before it stay committed, the failing one is not
listed (its directory is left as any failed augment leaves its output directory).

Each entry of ``AUG/collection.json`` records its input span as its one input (the ledger row)::

    {"path": "IN/span-N/metadata.json", "size": <bytes>, "mtime_ns": null, "version": "<sha256 of those bytes>"}

The digest (``metadata.digest``) is the input span's identity: the one augment read when it planned and checked
again before its commit (a span re-converted meanwhile fails that check). ``--spans new`` selects the input spans
whose augmented span is missing, or was made from another version of the input span (another digest): what a
scheduled run needs after each conversion, and a catch-up after several.

The schemas of the augmented spans follow those of the input spans: a change the input collection recorded
(``schema_changes``) is allowed, and recorded, in ``AUG/collection.json``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.errors import ConfigError, EtlError
from tfrecord_etl.transforms.output import metadata
from tfrecord_etl.transforms.reading import collection_reader
from tfrecord_etl.transforms.storage import fileio

NEW = "new"  # --spans new: the input spans not augmented yet (or augmented from another version of them)


@dataclasses.dataclass(frozen=True)
class SpanJob:
    """One span to augment: its input entry, input and output directories, and the input's metadata digest when
    it was selected."""

    entry: dict
    input_dir: str
    output_dir: str
    input_digest: str

    @property
    def span(self) -> int:
        return self.entry["span"]


def is_collection_input(cfg) -> bool:
    """True when ``cfg.input`` is a collection directory; ``--spans`` with any other input is refused.

    Raises:
      ConfigError: ``--spans`` for an input that is not a collection directory.
    """
    if collection.is_collection(cfg.input):
        return True
    if getattr(cfg, "spans", None) is not None:
        raise ConfigError(
            "--spans needs a collection --input (a directory holding collection.json)",
            file=cfg.input,
            hint="leave --spans out to augment this input, or name the collection directory",
        )
    return False


def plan_spans(cfg) -> list[SpanJob]:
    """The spans of ``cfg.input`` to augment into ``cfg.output_dir``, in span order (``cfg.spans``: None or
    ``all`` = every span, a ``--spans`` selection, or ``new``).

    Raises:
      ConfigError: a span not committed; ``--join_by position`` (one source's rows cannot be every span's);
        an output directory that is a plain output directory (it holds metadata.json, not collection.json).
      IncompleteOutputError: a selected input span's directory has no metadata.json, or not the one collection.json
        lists (:func:`collection_reader.check_span`: run the convert of that span again).
    """
    if cfg.join_input and cfg.join_by == "position":
        raise ConfigError(
            "--join_by position cannot augment a collection: one source's rows cannot be the records of every span",
            file=cfg.input,
            hint="join by key (--join_by key), or augment one span directory at a time with its own --join_input",
        )
    if fileio.exists(fileio.join(cfg.output_dir, metadata.METADATA_FILE)):
        raise ConfigError(
            "The output directory is an output directory, not a collection: the spans of a collection "
            "go to a collection directory",
            file=cfg.output_dir,
            hint="choose a new --output_dir (or an earlier augmented collection of this input)",
        )
    source = collection.load(cfg.input)
    new = (cfg.spans or "").strip() == NEW
    entries = collection.select(source, None if new else cfg.spans, cfg.input)
    done = (
        {(s["span"], s["version"]): s for s in collection.load_versioned(cfg.output_dir)[0]["spans"]}
        if collection.is_collection(cfg.output_dir)
        else {}
    )
    jobs = []
    for entry in entries:
        input_dir = collection_reader.span_dir(cfg.input, entry)
        _, digest = metadata.load_with_digest(input_dir)
        collection_reader.check_span(entry, input_dir, digest)  # the span collection.json lists, or refused
        made = done.get((entry["span"], entry["version"]))
        if new and made is not None and [row.get("version") for row in made["inputs"]] == [digest]:
            continue
        jobs.append(SpanJob(entry, input_dir, collection_reader.span_dir(cfg.output_dir, entry), digest))
    return jobs


def input_row(job: SpanJob, digest: str) -> dict:
    """The ledger row of an augmented span: the input span's ``metadata.json`` and its digest."""
    path = fileio.join(job.input_dir, metadata.METADATA_FILE)
    return {"path": path, "size": fileio.size(path), "mtime_ns": None, "version": digest}


def commit_span(cfg, job: SpanJob, digest: str, allow_schema_change: bool, run_id: str) -> dict:
    """Lists the augmented span ``job`` in ``cfg.output_dir``'s ``collection.json`` (compare-and-swap); returns
    its entry. ``digest``: the input span's metadata digest the augment planned from (and checked at its commit).

    Raises:
      SchemaError: a schema change the input collection did not record. OutputError: lost races too often.
    """
    entry = collection.span_entry(
        cfg.output_dir,
        job.span,
        job.entry["version"],
        [input_row(job, digest)],
        date=job.entry.get("date"),
        run_id=run_id,
    )
    add = collection.add_span(entry, allow_schema_change, where=cfg.output_dir)

    def update(coll: dict) -> dict:
        coll["input_pattern"] = coll.get("input_pattern") or cfg.input
        return add(coll)

    collection.commit(cfg.output_dir, update)
    return entry


def augment_collection(cfg, augment_one: Callable[[object], str], say: Callable[[str], None] = print) -> int:
    """Augments the selected spans of the collection ``cfg.input`` one by one with ``augment_one(span_cfg)`` (the
    augment of one output directory; returns the input metadata digest its plan read) and commits each. Returns
    the number of spans augmented.

    Raises:
      whatever ``augment_one`` raises for a span (with ``span=N`` in its context): the run stops there.
    """
    jobs = plan_spans(cfg)
    if not jobs:
        say(f"nothing new: every span of {cfg.input} is augmented in {cfg.output_dir} from its current version")
        return 0
    allow = bool(collection.load(cfg.input)["schema_changes"])
    run_id = uuid.uuid4().hex
    say(
        f"augmenting {len(jobs)} span{'s' if len(jobs) != 1 else ''} of {cfg.input}: "
        f"{', '.join(str(j.span) for j in jobs)}"
    )
    for job in jobs:
        span_cfg = cfg.model_copy(update={"input": job.input_dir, "output_dir": job.output_dir, "spans": None})
        try:
            digest = augment_one(span_cfg)
            entry = commit_span(cfg, job, digest, allow, run_id)
        except EtlError as e:
            raise e.with_context(span=job.span) from None
        say(f"span {job.span}: {entry['num_records']} records committed to {collection.path_of(cfg.output_dir)}")
    return len(jobs)
