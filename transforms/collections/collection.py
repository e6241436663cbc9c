"""A collection: the spans of a growing dataset, each a complete output directory, listed by one file.

Layout (``OUT`` is the collection directory)::

    OUT/collection.json          the commit point: which spans exist (written last, atomically)
    OUT/span-7/                  span 7: an output directory of convert (shards, schema.pbtxt, metadata.json, ...)
    OUT/span-8/version-2/        span 8, version 2 (inputs whose pattern has ``{VERSION}``)

A span is visible only once ``collection.json`` lists it: a run writes ``OUT/span-N/`` with the output-directory
protocol of :mod:`transforms.output.outdir` (staged replacement, lock, run marker) and then commits the collection file
with a compare-and-swap: on S3 and GCS one conditional request (S3 ``If-Match`` / ``If-None-Match``, GCS
``ifGenerationMatch``, :func:`conditional.write_if_version`); on local disk a rename under an ``flock`` after checking
that the file is still the one the run read. Of two runs racing to commit, the second re-reads the file and adds
its span to what the first committed, or fails if the first committed the same span (:func:`commit`).

``collection.json`` (:func:`dumps`: the fields, then one compact line per span)::

    {"format": "tfrecord-etl-collection/1",
     "input_pattern": "raw/{YYYY}-{MM}-{DD}/*.h5",          # the --input of the runs (null: unknown)
     "spans": [                                            # sorted by (span, version)
       {"span": 20416, "version": null, "dir": "span-20416", "date": "2025-11-24",
        "inputs": [{"path": ".../a.h5", "size": 123, "mtime_ns": 1, "version": null}],   # the ledger
        "num_records": 500, "schema": "<sha256 of schema.pbtxt>", "metadata": "<sha256 of metadata.json>",
        "schema_untagged": "<sha256 of that schema without the list features' annotations>",
        "run_id": "...", "committed": "2026-11-25T20:00:00Z"}],
     "schema_changes": [{"span": 20417, "version": null, "schema": "<new>", "previous": "<old>"}]}

Each input records its size and, locally, ``mtime_ns``; on gs:// and s3:// its ``version`` (ETag / generation).

The concepts (span, version, ``{SPAN}``/``{VERSION}``/``{YYYY}{MM}{DD}`` placeholders, "latest N spans") are TFX
ExampleGen's (``tfx/components/example_gen/utils.py``, the ``RangeConfig`` proto).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable

from tfrecord_etl.transforms.collections.selection import (  # noqa: F401 - selection's names, used here and by others
    SpanSelector,
    check_same_schema,
    latest_versions,
    same_schema,
    select,
)
from tfrecord_etl.transforms.errors import IncompleteOutputError, OutputError, SchemaError, SourceError
from tfrecord_etl.transforms.output import metadata, outdir, schemafile, sink
from tfrecord_etl.transforms.output.runlock import utc_now
from tfrecord_etl.transforms.storage import conditional, fileio

COLLECTION_FILE = "collection.json"
FORMAT = "tfrecord-etl-collection/1"
LOCAL_LOCK_FILE = ".tf-etl-collection.lock"  # flock'ed while a local commit compares and renames
MAX_COMMIT_ATTEMPTS = 8  # a commit that keeps losing races to other runs gives up after this many tries


def span_dir_name(span: int, version: int | None = None) -> str:
    """The directory of a span inside the collection, relative: ``span-N`` or ``span-N/version-V``."""
    return f"span-{span}" if version is None else f"span-{span}/version-{version}"


def path_of(collection_dir: str) -> str:
    return fileio.join(collection_dir, COLLECTION_FILE)


def is_collection(path: str) -> bool:
    """True when ``path`` is a collection directory (holds ``collection.json``)."""
    return fileio.exists(path_of(path))


def empty(input_pattern: str | None = None) -> dict:
    """A collection with no spans (what :func:`load` returns for a directory with no ``collection.json`` yet)."""
    return {"format": FORMAT, "input_pattern": input_pattern, "spans": [], "schema_changes": []}


def schema_fingerprint(schema_text: str) -> str:
    """The identity of a span's schema: the SHA-256 (hex) of its ``schema.pbtxt`` text
    (``schemafile.schema_text(specs)``): two spans have the same features, dtypes, shapes and encodings iff equal."""
    return hashlib.sha256(schema_text.encode()).hexdigest()


def _validate(coll, path: str) -> dict:
    try:
        if not isinstance(coll, dict) or coll.get("format") != FORMAT:
            raise ValueError(f"format {coll.get('format') if isinstance(coll, dict) else None!r}, expected {FORMAT!r}")
        seen = set()
        for s in coll["spans"]:
            if (
                not isinstance(s["span"], int)
                or s["span"] < 0
                or not (s["version"] is None or isinstance(s["version"], int))
            ):
                raise ValueError(f"bad span/version {s.get('span')!r}/{s.get('version')!r}")
            if s["dir"] != span_dir_name(s["span"], s["version"]):
                raise ValueError(
                    f"span {s['span']} has dir {s['dir']!r}, expected {span_dir_name(s['span'], s['version'])!r}"
                )
            key = (s["span"], s["version"])
            if key in seen:
                raise ValueError(f"span {s['span']} version {s['version']} listed twice")
            seen.add(key)
            if not isinstance(s["num_records"], int) or not isinstance(s["inputs"], list):
                raise ValueError(f"span {s['span']}: bad num_records or inputs")
        if not isinstance(coll["schema_changes"], list):
            raise ValueError("schema_changes is not a list")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SchemaError(
            f"Invalid collection.json: {str(e)[:300]}",
            file=path,
            hint="it was not written by tfrecord-etl, or was edited by hand",
        ) from None
    return coll


def _local_token(data: bytes | None) -> str:
    return conditional.ABSENT if data is None else hashlib.sha256(data).hexdigest()


def load_versioned(collection_dir: str) -> tuple[dict, str | None]:
    """``(collection, version)``: the collection (:func:`empty` when there is no ``collection.json`` yet) and the
    version of its file to pass to :func:`commit` (an ETag / generation on S3 / GCS, a SHA-256 of the bytes
    locally, :data:`conditional.ABSENT` for none).

    Raises:
      SchemaError: ``collection.json`` is not a valid collection file.
    """
    path = path_of(collection_dir)
    version = None if fileio.is_local(path) else conditional.version(path)
    if version == conditional.ABSENT or (version is None and not fileio.exists(path)):
        return empty(), conditional.ABSENT
    data = fileio.read_bytes(path)
    try:
        coll = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise SchemaError(f"Invalid collection.json: {str(e)[:300]}", file=path) from None
    return _validate(coll, path), (version if version is not None else _local_token(data))


def load(collection_dir: str) -> dict:
    """The committed collection of ``collection_dir``.

    Raises:
      IncompleteOutputError: no ``collection.json`` (not a collection, or no span committed yet).
      SchemaError: not a valid collection file.
    """
    if not is_collection(collection_dir):
        raise IncompleteOutputError(
            "No collection.json: not a collection directory, or no span of it is committed yet",
            file=collection_dir,
            hint="convert a span into it (--input with {SPAN} or {YYYY}{MM}{DD}, or "
            "--incremental), or name one output directory",
        )
    return load_versioned(collection_dir)[0]


def span_dirs(collection_dir: str, spans: SpanSelector = None) -> list[str]:
    """The output directories of the selected spans (:func:`select`), in span order."""
    coll = load(collection_dir)
    return [fileio.join(collection_dir, *s["dir"].split("/")) for s in select(coll, spans, collection_dir)]


@contextlib.contextmanager
def _local_commit_lock(collection_dir: str):
    import fcntl  # deferred: fcntl, POSIX only (the reader imports this module on any platform)

    os.makedirs(collection_dir, exist_ok=True)
    fd = os.open(os.path.join(collection_dir, LOCAL_LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def dumps(coll: dict) -> bytes:
    """``collection.json``'s bytes: the collection's fields, then one line per span (compact JSON, so that a
    collection whose ledger holds 100,000 files is written by the C encoder in about 0.1 s, not by the indenting
    pure-Python one in 4 s; a line per span keeps it readable and diffable)."""
    head = {k: v for k, v in coll.items() if k != "spans"}
    lines = ",\n".join(json.dumps(s, separators=(",", ":")) for s in coll["spans"])
    return (json.dumps(head)[:-1] + (', "spans": [\n' + lines + "\n]}\n" if lines else ', "spans": []}\n')).encode()


def _write(collection_dir: str, coll: dict, expected: str) -> None:
    """Replaces ``collection.json`` with ``coll`` if its version is still ``expected``.

    Raises:
      conditional.VersionConflict: another run committed it since.
    """
    path = path_of(collection_dir)
    data = dumps(coll)
    if not fileio.is_local(path):
        conditional.write_if_version(path, data, expected)
        return
    with _local_commit_lock(collection_dir):
        current = fileio.read_bytes(path) if os.path.exists(path) else None
        if _local_token(current) != expected:
            raise conditional.VersionConflict(path)
        sink.write_file(path, data)


def _listed(coll: dict) -> dict:
    """``{(span, version): the entry's JSON}``: what a collection lists, kept before an update changes it."""
    return {(s["span"], s["version"]): json.dumps(s, sort_keys=True) for s in coll["spans"]}


def _check_span_dirs(collection_dir: str, listed: dict, after: dict) -> None:
    """Refuses to list a span entry (one this commit adds or changes) whose ``metadata`` digest is not that of its
    directory's ``metadata.json`` now: another run converted the same span and replaced its output after this run
    committed it, so this run's entry describes files that are gone. (A directory without ``metadata.json`` is not
    checked: :func:`span_entry` makes entries from committed directories only.)

    Raises:
      OutputError: naming the span and its directory.
    """
    for s in after["spans"]:
        if listed.get((s["span"], s["version"])) == json.dumps(s, sort_keys=True):
            continue
        path = fileio.join(collection_dir, *s["dir"].split("/"), "metadata.json")
        try:
            data = fileio.read_bytes(path)
        except (OSError, SourceError):
            continue
        if hashlib.sha256(data).hexdigest() != s["metadata"]:
            raise OutputError(
                f"Span {s['span']} is not committed: its directory {s['dir']} now holds another run's "
                f"output (its metadata.json is not the one this run's entry was made from)",
                file=path,
                hint="another run converted this span meanwhile and listed it; run again to see what is committed",
            )


def commit(collection_dir: str, update: Callable[[dict], dict]) -> dict:
    """Commits ``update(collection)`` as the new ``collection.json`` by compare-and-swap: reads the file and its
    version, applies ``update`` to what it read, and writes the result only if the file is still at that version. When
    another run committed in between, the file is read again and ``update`` applied to what it now holds, so
    ``update`` must check what this run planned against the collection it is given and raise when another run's
    commit conflicts with this one (e.g. it committed the same span, or an input this run converted); an entry
    whose span directory another run has replaced since is refused here (:func:`_check_span_dirs`); at most
    :data:`MAX_COMMIT_ATTEMPTS` tries. Returns the collection committed.

    Raises:
      OutputError: still losing races after that many tries; an entry whose span directory holds another run's
        output. Whatever ``update`` raises.
    """
    coll, version = load_versioned(collection_dir)
    for _ in range(MAX_COMMIT_ATTEMPTS):
        listed = _listed(coll)
        new = _validate(update(coll), path_of(collection_dir))  # (a lost race reads a fresh one)
        new["spans"].sort(key=lambda s: (s["span"], -1 if s["version"] is None else s["version"]))
        _check_span_dirs(collection_dir, listed, new)
        try:
            _write(collection_dir, new, version)
            return new
        except conditional.VersionConflict:
            coll, version = load_versioned(collection_dir)
    raise OutputError(
        f"Cannot commit collection.json: other runs kept committing it ({MAX_COMMIT_ATTEMPTS} tries)",
        file=path_of(collection_dir),
        hint="run again when the other runs are done",
    )


def span_entry(
    collection_dir: str,
    span: int,
    version: int | None,
    inputs: list[dict],
    *,
    date: str | None = None,
    run_id: str = "",
) -> dict:
    """The ``collection.json`` entry of a span whose output directory is committed (its ``metadata.json`` and
    ``schema.pbtxt`` are read back: record count, schema fingerprint, metadata digest). ``inputs``: the ledger
    rows of the files it was converted from (``{"path", "size", "mtime_ns", "version"}``).

    Raises:
      IncompleteOutputError: the span's directory has no committed ``metadata.json``.
    """
    name = span_dir_name(span, version)
    out = fileio.join(collection_dir, *name.split("/"))
    meta, digest = metadata.load_with_digest(out)
    schema = fileio.read_bytes(fileio.join(out, metadata.SCHEMA_FILE))
    return {
        "span": span,
        "version": version,
        "dir": name,
        "date": date,
        "inputs": list(inputs),
        "num_records": int(meta["num_records"]),
        "schema": hashlib.sha256(schema).hexdigest(),
        "schema_untagged": schema_fingerprint(schemafile.schema_text(meta["features"], native_tags=False)),
        "metadata": digest,
        "run_id": run_id,
        "committed": utc_now(),
    }


def add_span(entry: dict, allow_schema_change: bool = False, where: str = "") -> Callable[[dict], dict]:
    """The :func:`commit` update that lists ``entry`` (replacing the entry of the same span and version: a
    re-run). Its schema is compared with the newest other span's; a different one is refused unless
    ``allow_schema_change``, and then recorded in ``schema_changes``. An input path that another span of the
    collection already holds (a run that committed meanwhile converted it too) is refused.

    Raises:
      SchemaError: a schema change without ``allow_schema_change``. OutputError: an input another span holds.
    """
    key = (entry["span"], entry["version"])

    def update(coll: dict) -> dict:
        others = [s for s in coll["spans"] if (s["span"], s["version"]) != key]
        mine = {i["path"] for i in entry["inputs"]}
        for s in others:
            if s["span"] == entry["span"]:
                continue  # another version of the same span holds the same files by design
            taken = [i["path"] for i in s["inputs"] if i["path"] in mine]
            if taken:
                raise OutputError(
                    f"{len(taken)} input file(s) of span {entry['span']} are already in span "
                    f"{s['span']} (another run committed it meanwhile), e.g. {taken[0]}",
                    file=where or None,
                    hint="run again: the next run plans from what is committed",
                )
        before = [s for s in others if (s["span"], s["version"] or -1) < (entry["span"], entry["version"] or -1)]
        reference = (before or others)[-1:] if others else []
        if reference and not same_schema(reference[0], entry):
            ref = reference[0]
            if not allow_schema_change:
                raise SchemaError(
                    f"Span {entry['span']} has another schema than span {ref['span']} (features, "
                    f"dtypes, shapes or encodings differ)",
                    file=where or None,
                    hint="convert it with the same options, or pass --allow_schema_change to "
                    "record the change in collection.json",
                )
            coll["schema_changes"] = [c for c in coll["schema_changes"] if (c["span"], c["version"]) != key] + [
                {
                    "span": entry["span"],
                    "version": entry["version"],
                    "schema": entry["schema"],
                    "previous": ref["schema"],
                    "previous_span": ref["span"],
                }
            ]
        coll["spans"] = others + [entry]  # commit() sorts
        return coll

    return update


def ledger(coll: dict) -> dict[str, tuple[int, dict]]:
    """``{input path: (span, its ledger row)}`` over every committed span (at every version: a file converted
    in any version of a span is held by that span)."""
    out = {}
    for s in coll["spans"]:
        for row in s["inputs"]:
            out[row["path"]] = (s["span"], row)
    return out


_SPAN_DIR, _VERSION_DIR = re.compile(r"^span-(\d+)$"), re.compile(r"^version-(\d+)$")


def unlisted_span_dirs(collection_dir: str, coll: dict) -> list[str]:
    """The span directories (``span-N``, ``span-N/version-V``) present in ``collection_dir`` that ``coll`` does not
    list: spans of a run that has not committed the collection yet, or crashed before it did (readers never read
    them). Sorted by span and version; the direct children are listed, never globbed."""
    listed = {s["dir"] for s in coll["spans"]}
    found = []
    for name, path in outdir.list_names(collection_dir).items():
        m = _SPAN_DIR.match(name)
        if not m or not fileio.is_dir(path):
            continue
        versions = [(int(v.group(1)), n) for n in outdir.list_names(path) if (v := _VERSION_DIR.match(n))]
        for version, sub in sorted(versions) or [(-1, None)]:
            rel = name if sub is None else f"{name}/{sub}"
            if rel not in listed:
                found.append(((int(m.group(1)), version), rel))
    return [rel for _, rel in sorted(found)]
