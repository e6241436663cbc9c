"""A convert run into a collection (:mod:`transforms.collections.collection`): which span it writes and from which files.

- **Placeholders** (``--input 'raw/{YYYY}-{MM}-{DD}/*.h5'``, :mod:`transforms.collections.spans`): the files of the span
  ``--span`` names (default the latest) at ``--version`` (default the latest).
- **--incremental** (a pattern without placeholders over one growing directory): the files no committed span holds
  (the collection's ledger: path, size and ``mtime_ns`` locally, ETag / generation on gs:// and s3://) become the
  next span (the largest + 1, 0 for the first). A file that differs from its ledger row stops the run, naming it and
  its span, unless ``--reconvert_changed``: then that span is converted again from its recorded files. No new file:
  nothing is written at all (:attr:`CollectionRun.nothing_new`).

The span is written as any output directory (``OUT/span-N[/version-V]``, ``outdir.prepare``: lock, staged
replacement), then listed in ``collection.json`` (:func:`commit`, ``collection.add_span``): a span is visible only
once that commit is done. Planning an incremental run reads the collection once and lists the pattern once (one
``stat`` per file, from the walk): a dict lookup per matched file, no file opened but the new ones.
"""

from __future__ import annotations

import dataclasses

from tfrecord_etl.transforms.collections import collection, matching, spans
from tfrecord_etl.transforms.errors import ConfigError, InputChangedError, printable
from tfrecord_etl.transforms.output import outdir, schemafile
from tfrecord_etl.transforms.output.runlock import failpoint, say
from tfrecord_etl.transforms.planning import map_concurrently
from tfrecord_etl.transforms.storage import conditional, fileio

_SHOWN = 5  # files named in a message
# the flags that choose the span: recorded in collection.json, not in the span's own options (so a re-run of a
# span with --span 7 after one with --span latest is the same run)
_RUN_FLAGS = {
    "span": None,
    "version": None,
    "incremental": False,
    "reconvert_changed": False,
    "allow_schema_change": False,
}


@dataclasses.dataclass
class CollectionRun:
    """One run's span of a collection (:func:`plan_run`).

    Attributes:
      collection_dir: ``--output_dir``. pattern: ``--input``. span, version, date: what the run writes (``date``
        ``YYYY-MM-DD`` for a date pattern). files: ``(path, size)`` it converts. cfg: the ``ConvertConfig`` of the
        span's conversion (``output_dir`` the span's directory; ``input`` the pattern with the span's text in place
        of its placeholders). coll: the collection as planned from. new, changed, deleted: for ``--incremental``,
        the new files, ``(path, span)`` of changed ones, paths of spans' files that no longer match.
        nothing_new: the line to print when there is nothing to convert (then nothing is written).
    """

    collection_dir: str
    pattern: str
    span: int
    version: int | None
    date: str | None
    files: list
    cfg: object
    coll: dict
    new: list = dataclasses.field(default_factory=list)
    changed: list = dataclasses.field(default_factory=list)
    deleted: list = dataclasses.field(default_factory=list)
    reconvert: bool = False
    nothing_new: str | None = None
    allow_schema_change: bool = False

    @property
    def dir(self) -> str:
        return fileio.join(self.collection_dir, *collection.span_dir_name(self.span, self.version).split("/"))


def _names(paths, n: int = _SHOWN) -> str:
    paths = list(paths)
    return ", ".join(printable(p) for p in paths[:n]) + (f" and {len(paths) - n:,} more" if len(paths) > n else "")


def plan_run(cfg) -> CollectionRun | None:
    """The collection run of ``cfg`` (a ``ConvertConfig``), or None for a plain conversion into one output
    directory.

    Raises:
      ConfigError: a plain conversion into a collection directory; placeholders or ``--incremental`` with an
        ``--output_dir`` that is a plain output directory; a bad pattern or span (:func:`spans.resolve`); a
        changed input without ``--reconvert_changed``; an input inside the collection directory, or a pattern
        that would match what the run writes.
      SourceError: nothing matches. SchemaError: an invalid collection.json.
    """
    out = cfg.output_dir
    if not (cfg.incremental or spans.has_placeholders(cfg.input)):
        if collection.is_collection(out):
            raise ConfigError(
                "--output_dir is a collection (it holds collection.json): a conversion without span "
                "placeholders would write over its spans",
                file=out,
                hint="add {SPAN} or {YYYY}{MM}{DD} to --input, pass --incremental, or choose another --output_dir",
            )
        return None
    if fileio.exists(fileio.join(out, outdir.METADATA_FILE)):
        raise ConfigError(
            "--output_dir is the output directory of one conversion (it holds metadata.json), not a "
            "collection of spans",
            file=out,
            hint="choose a new or empty --output_dir for the collection",
        )
    coll = collection.load_versioned(out)[0]
    run = _plan_incremental(cfg, coll) if cfg.incremental else _plan_span(cfg, coll)
    run.allow_schema_change = cfg.allow_schema_change
    if run.nothing_new is None:
        glob = spans.parse(cfg.input).glob if spans.has_placeholders(cfg.input) else cfg.input
        name = collection.span_dir_name(run.span, run.version)
        matching.check_output_unmatched(glob, out, [collection.COLLECTION_FILE, f"{name}/{outdir.METADATA_FILE}"])
        outdir.check_inputs_outside(out, outdir.one_per_directory(p for p, _ in run.files))
    return run


def _span_cfg(cfg, span: int, version: int | None, pattern: str):
    name = collection.span_dir_name(span, version)
    return cfg.model_copy(
        update={**_RUN_FLAGS, "input": pattern, "output_dir": fileio.join(cfg.output_dir, *name.split("/"))}
    )


def _plan_span(cfg, coll: dict) -> CollectionRun:
    found = spans.resolve(cfg.input, cfg.span, cfg.version, cfg.follow_symlinks)
    return CollectionRun(
        cfg.output_dir,
        cfg.input,
        found.span,
        found.version,
        found.date,
        list(found.files),
        _span_cfg(cfg, found.span, found.version, found.pattern),
        coll,
    )


def _classify(listed, ledger: dict, mtimes: dict, versions: dict, local: bool) -> tuple[list, list]:
    """``(new files [(path, size)], changed files [(path, span)])`` of the files ``listed`` against the collection's
    ``ledger`` (size, modification time, or the object's version differ from ``collection.json``)."""
    new, changed = [], []
    for path, _ in listed if local and not mtimes else ():  # a literal path (no glob): not walked
        if path in ledger:
            mtimes[path] = fileio.pin(path)[1]
    for path, size in listed:
        held = ledger.get(path)
        if held is None:
            new.append((path, size))
            continue
        span, row = held
        if (
            row.get("size") != size
            or (mtimes.get(path, row.get("mtime_ns")) != row.get("mtime_ns"))
            or (path in versions and row.get("version") not in (None, versions[path]))
        ):
            changed.append((path, span))
    return new, changed


def _reconvert(cfg, coll: dict, listed, new: list, changed: list, deleted: list) -> CollectionRun:
    """The run of an incremental conversion when files of committed spans ``changed``: InputChangedError without
    ``--reconvert_changed``, else the earliest changed span converted again from its files as they are now."""
    if not cfg.reconvert_changed:
        path, span = changed[0]
        raise InputChangedError(
            f"{len(changed):,} input file(s) changed since their span was converted (size or "
            f"modification time, or ETag / generation, differ from collection.json): "
            f"{printable(path)} in span {span}"
            + (f", and {_names(p for p, _ in changed[1:])}" if len(changed) > 1 else ""),
            file=path,
            hint=f"pass --reconvert_changed to convert span {span} again from its "
            f"files as they are now, or restore the file",
        )
    span = min(s for _, s in changed)
    entry = max((s for s in coll["spans"] if s["span"] == span), key=lambda s: s["version"] or -1)
    sizes = dict(listed)
    paths = [fileio.absolute(r["path"]) for r in entry["inputs"]]  # relative in a collection of an earlier version
    files = [(p, sizes[p]) for p in paths if p in sizes]
    later = sorted({s for _, s in changed} - {span})
    if later or new:
        say(
            f"re-converting span {span} only; "
            + (f"spans {later} changed too, " if later else "")
            + (f"{len(new):,} new file(s) wait, " if new else "")
            + "for the next run"
        )
    return CollectionRun(
        cfg.output_dir,
        cfg.input,
        span,
        entry["version"],
        entry.get("date"),
        files,
        _span_cfg(cfg, span, entry["version"], cfg.input),
        coll,
        [],
        changed,
        deleted,
        True,
    )


def _plan_incremental(cfg, coll: dict) -> CollectionRun:
    mtimes: dict = {}
    listed = matching.match_inputs(cfg.input, cfg.follow_symlinks, mtimes)
    # a collection converted from a relative --input recorded relative paths: the launcher's paths are absolute now
    ledger = {fileio.absolute(p): held for p, held in collection.ledger(coll).items()}
    local = fileio.is_local(cfg.input)
    remote_old = [p for p, _ in listed if p in ledger] if not local else []
    versions = dict(zip(remote_old, _versions(remote_old)))
    new, changed = _classify(listed, ledger, mtimes, versions, local)
    matched = {p for p, _ in listed} if len(ledger) > len(listed) - len(new) else None
    deleted = [p for p in ledger if p not in matched] if matched is not None else []
    if deleted:
        say(
            f"{len(deleted):,} file(s) held by committed spans no longer match the pattern (deleted or moved; "
            f"their spans are kept as converted): {_names(sorted(deleted))}"
        )
    spans_now = [s["span"] for s in coll["spans"]]
    if changed:
        return _reconvert(cfg, coll, listed, new, changed, deleted)
    span = max(spans_now) + 1 if spans_now else 0
    run = CollectionRun(
        cfg.output_dir, cfg.input, span, None, None, new, _span_cfg(cfg, span, None, cfg.input), coll, new, [], deleted
    )
    if not new:
        run.nothing_new = (
            f"nothing new: {len(listed):,} files matched, all in committed spans ("
            f"{len(coll['spans'])} spans in {printable(cfg.output_dir)}); nothing written"
        )
    return run


def _versions(paths: list[str]) -> list[str | None]:
    """The current versions (ETag / generation) of remote files: one request each, a bounded pool in flight."""
    return map_concurrently(conditional.version, paths) if paths else []


def ledger_rows(run: CollectionRun, plan) -> list[dict]:
    """The ledger rows of the files ``plan`` (a ``ConvertPlan``) reads: ``{"path", "size", "mtime_ns",
    "version"}``, from what planning pinned (a local file's size and ``mtime_ns``: ``Source.pin_files``; a remote
    object's ETag / generation: the version its reads are pinned to, ``conditional.read_version``)."""
    sizes = dict(run.files)
    pins = getattr(plan.inputs.source, "pins", None) or {}
    rows = []
    for path in plan.inputs.paths:
        size, mtime = pins.get(path, (sizes.get(path), None))
        rows.append(
            {
                "path": path,
                "size": size,
                "mtime_ns": mtime,
                "version": None if fileio.is_local(path) else conditional.read_version(path),
            }
        )
    return rows


def check_before_writing(run: CollectionRun, plan) -> None:
    """The commit's checks (``collection.add_span``: schema change, inputs another span holds) made on the plan
    before anything is written, so a refused span leaves no directory behind.

    Raises:
      SchemaError, OutputError: as ``collection.add_span``.
    """
    schema = collection.schema_fingerprint(schemafile.schema_text(plan.specs))
    untagged = collection.schema_fingerprint(schemafile.schema_text(plan.specs, native_tags=False))
    rows = [{"path": p} for p in plan.inputs.paths]
    entry = {"span": run.span, "version": run.version, "inputs": rows, "schema": schema, "schema_untagged": untagged}
    collection.add_span(entry, run.allow_schema_change, run.collection_dir)(dict(run.coll))  # (replaces lists)


def commit(run: CollectionRun, plan, run_id: str) -> dict:
    """Lists the span (its output directory committed) in ``collection.json``: ``collection.commit`` of
    ``collection.add_span``; returns the collection committed.

    Raises:
      SchemaError, OutputError: as ``collection.add_span`` / ``collection.commit``.
    """
    failpoint("before-collection-commit")
    entry = collection.span_entry(
        run.collection_dir, run.span, run.version, ledger_rows(run, plan), date=run.date, run_id=run_id
    )
    add = collection.add_span(entry, run.allow_schema_change, run.collection_dir)

    def update(coll: dict) -> dict:
        coll = add(coll)
        coll["input_pattern"] = coll.get("input_pattern") or run.pattern
        return coll

    return collection.commit(run.collection_dir, update)


def describe(run: CollectionRun) -> list[str]:
    """The lines ``convert --dry_run`` adds for a collection run."""
    what = (
        f"span {run.span}"
        + (f" version {run.version}" if run.version is not None else "")
        + (f" ({run.date})" if run.date else "")
    )
    lines = [
        f"collection: {printable(run.collection_dir)} ({len(run.coll['spans'])} committed spans)",
        f"{what} -> {printable(run.dir)}" + (" (re-converted: files changed)" if run.reconvert else ""),
        f"files of the span: {len(run.files):,}: {_names(p for p, _ in run.files)}",
    ]
    if run.new or run.changed or run.deleted:
        lines.append(
            f"incremental: {len(run.new):,} new, {len(run.changed):,} changed"
            + (f" ({_names(f'{p} (span {s})' for p, s in run.changed)})" if run.changed else "")
            + f", {len(run.deleted):,} gone"
        )
    return lines


def summary(run: CollectionRun, coll: dict) -> dict:
    """The summary lines of a committed span: the span and its collection."""
    latest = collection.latest_versions(coll)
    numbers = [s["span"] for s in latest]
    return {
        "span": f"{run.span}"
        + (f" version {run.version}" if run.version is not None else "")
        + (f" ({run.date})" if run.date else "")
        + f" in {printable(run.dir)}",
        "collection": f"{printable(run.collection_dir)}: {len(latest)} spans"
        + (f" ({numbers[0]}-{numbers[-1]})" if numbers else "")
        + f", {sum(s['num_records'] for s in latest):,} records",
    }
