"""Resuming a failed run at shard level (``--resume``): the receipt each committed shard leaves, the identity of a run
(what must not change for a failed run's shards to be kept), and the decision a resumed run takes under the lock.

- **A receipt per shard**, ``.tf-etl-done-NNNNN.json`` (``NNNNN``: the shard plan's index), written with
  ``sink.write_json`` (a temporary, then a rename, through the commit guard) only AFTER every file of the shard
  (its split files, its index files) is committed under its final name. It records the run identity's digest,
  the shard's entries as the writer yields them for ``metadata.json`` (file, records, bytes, CRC32C, dead letters)
  and, per file, what a cheap check compares: the size and, locally, ``st_mtime_ns`` (S3: the ETag; GCS: the
  generation). A crash before the receipt leaves a shard without one: never trusted, rewritten. The run marker
  lists every receipt name, so receipts are ours and removed by exact name like the shards.
- **The identity** (:func:`identity`), recorded in the run marker by ``outdir.prepare``: the tool and metadata
  format versions, the compression backend, every option except those that change no byte (:data:`NOT_BYTES`),
  and each input as the plan pins it (path, size, ``st_mtime_ns`` for a local file).
- **The decision** (:func:`examine`, in ``outdir.prepare`` once the lock is held, before anything is written):
  nothing of an earlier run: run in full; the earlier run committed: :class:`NothingToResume`; its identity differs:
  ConfigError naming the first difference; else the receipts whose digest is this run's, whose files are the names
  this run writes for that shard and whose files pass the cheap check are kept, the others rewritten (and named).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping

from tfrecord_etl.transforms.errors import ConfigError, printable
from tfrecord_etl.transforms.output import listing, sink
from tfrecord_etl.transforms.output.listing import MARKER_FILE, MARKER_FORMAT, METADATA_FILE
from tfrecord_etl.transforms.output.runlock import read_json, say
from tfrecord_etl.transforms.output.runtime import RESUME_NOTES
from tfrecord_etl.transforms.storage import conditional, fileio

RECEIPT = re.compile(r"^\.tf-etl-done-(?P<index>[0-9]{5})\.json$")
RECEIPT_FORMAT = "tfrecord-etl-receipt/1"
# the files every run writes under one name (not a shard): outdir's
_REWRITTEN = {METADATA_FILE, listing.SCHEMA_FILE, listing.MANIFEST_FILE, "dataset_info.json", "features.json"}
# options that change no byte of an output's shards, schema or indexes: a resume may differ in them
NOT_BYTES = frozenset(
    {"overwrite", "verbose", "progress", "resume", "dry_run", "pipeline_options", "max_local_workers"}
)


class NothingToResume(Exception):
    """``--resume`` where the earlier run of the same identity committed: the output is complete (exit 0)."""


def receipt_name(index: int) -> str:
    """The receipt of shard plan ``index`` (0-based): ``.tf-etl-done-00003.json``, a name no shard pattern matches."""
    return f".tf-etl-done-{index:05d}.json"


def receipt_names(num_shards: int) -> list[str]:
    """The receipts of a run of ``num_shards`` shard plans, in order."""
    return [receipt_name(i) for i in range(num_shards)]


# ---------------------------------------------------------------- the identity of a run


def identity(options: Mapping, inputs: Iterable[tuple[str, int | None, int | None]], versions: Mapping) -> dict:
    """What a resumed run must share with the failed one: ``versions`` (the tool's and the metadata format's, the
    compression backend's), ``options`` (a config's ``model_dump()``) without :data:`NOT_BYTES`, and ``inputs``
    (``(path, size in bytes, st_mtime_ns or None)`` of each input file as the plan pins it). JSON-ready."""
    return {
        "versions": dict(versions),
        "options": {k: v for k, v in options.items() if k not in NOT_BYTES},
        "inputs": [list(i) for i in inputs],
    }


def digest(ident: Mapping) -> str:
    """32 hex digits of SHA-256 of ``ident`` as canonical JSON: what each receipt records."""
    text = json.dumps(ident, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def difference(earlier: Mapping, now: Mapping) -> str | None:
    """The first difference between two identities, in words (None: the same): the versions, an option (as its
    flag), or an input (added, removed, its size or modification time)."""
    earlier = json.loads(json.dumps(earlier, default=str))
    now = json.loads(json.dumps(now, default=str))
    old_opts, new_opts = earlier.get("options") or {}, now.get("options") or {}
    for key in sorted(set(old_opts) | set(new_opts)):
        if old_opts.get(key) != new_opts.get(key):
            return f"--{key} differs ({new_opts.get(key)!r}, the earlier run's {old_opts.get(key)!r})"
    old_in = {i[0]: i[1:] for i in earlier.get("inputs") or ()}
    new_in = {i[0]: i[1:] for i in now.get("inputs") or ()}
    for path in sorted(set(old_in) | set(new_in)):
        if path not in new_in:
            return f"the inputs changed ({printable(path)} was an input of the earlier run, it is not now)"
        if path not in old_in:
            return f"the inputs changed ({printable(path)} is new)"
        (s0, m0), (s1, m1) = old_in[path], new_in[path]
        if s0 != s1:
            return f"the inputs changed ({printable(path)}: {s1} bytes, the earlier run's {s0})"
        if m0 != m1:
            return f"the inputs changed ({printable(path)} was modified since the earlier run)"
    old_v, new_v = earlier.get("versions") or {}, now.get("versions") or {}
    for key in sorted(set(old_v) | set(new_v)):
        if old_v.get(key) != new_v.get(key):
            what = "the compression backend differs (" if key == "codec" else f"the output format differs ({key} "
            return f"{what}{new_v.get(key)!r}, the earlier run's {old_v.get(key)!r})"
    if earlier != now:
        return "the run's identity differs"
    return None


# ---------------------------------------------------------------- receipts


def stamp(path: str) -> dict:
    """What the cheap check of a committed file compares: ``{"bytes", "mtime_ns"}`` locally, ``{"bytes",
    "version"}`` on S3 (ETag) and GCS (generation); one ``stat`` or HEAD, never a read of its bytes."""
    if fileio.is_local(path):
        st = os.stat(path)
        return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    return {"bytes": fileio.size(path), "version": conditional.version(path)}


def write_receipt(output_dir: str, index: int, entries: list[dict], key: str) -> None:
    """Records shard plan ``index`` as committed: its ``entries`` (the writer's per-file dicts) and each file's
    :func:`stamp`, under the run identity's digest ``key``. Called only after every file of the shard is
    committed; written through the commit guard (``sink.write_json``)."""
    files = [e["file"] for e in entries] + [e["index"] for e in entries if e.get("index")]
    receipt = {
        "format": RECEIPT_FORMAT,
        "identity": key,
        "shard": index,
        "entries": entries,
        "stamps": {f: stamp(fileio.join(output_dir, f)) for f in files},
    }
    sink.write_json(fileio.join(output_dir, receipt_name(index)), receipt, default=str)


def _read_receipt(output_dir: str, name: str) -> dict | None:
    receipt = read_json(fileio.join(output_dir, name))
    if receipt is None or receipt.get("format") != RECEIPT_FORMAT or not isinstance(receipt.get("entries"), list):
        return None
    return receipt


def receipted(output_dir: str, names: Iterable[str]) -> set[str]:
    """Of the children ``names`` of ``output_dir``, the receipts and the files their receipts name (what a failed run
    committed and keeps for ``--resume``)."""
    names = set(names)
    out = set()
    for name in sorted(n for n in names if RECEIPT.match(n)):
        receipt = _read_receipt(output_dir, name)
        stamps = receipt.get("stamps") if receipt else None
        if isinstance(stamps, dict) and set(stamps) <= names:
            out |= {name, *stamps}
    return out


def note_kept(output_dir: str, shards: int) -> None:
    """Notes, for the failed command's last line, that ``shards`` shards it committed are kept in ``output_dir``."""
    RESUME_NOTES.append(
        f"{shards} shard{'s' if shards != 1 else ''} this run committed {'are' if shards != 1 else 'is'} kept in "
        f"{output_dir} (not listed by metadata.json): the same command with --resume writes only the missing ones"
    )


def remove_receipts(output_dir: str) -> None:
    """After a commit: deletes the receipts the run marker lists, by exact name (they are not part of the output),
    then the marker's list of them (a crash in between leaves names listed that are gone: harmless)."""
    path = fileio.join(output_dir, MARKER_FILE)
    marker = read_json(path)
    if marker is None or marker.get("format") != MARKER_FORMAT:
        return
    listed = listing.plain_names(marker.get("files"))
    receipts = {n for n in listed if RECEIPT.match(n)}
    if receipts:
        listing.delete_names(output_dir, sorted(receipts & set(listing.list_names(output_dir))))
        files = [f for f in marker.get("files") or () if f not in receipts]
        sink.write_json(path, {**marker, "files": files}, default=str)


# ---------------------------------------------------------------- the decision of a resumed run


class Resumption:
    """What ``--resume`` keeps: ``kept`` ``{shard index: [entries]}`` (replayed into the commit), ``names`` (the files
    kept with their receipts: not removed as debris), ``rewritten`` (``[(file, why)]``, said on stderr) and
    ``generation``, the generation of names the earlier run wrote (the resumed run writes the same)."""

    def __init__(self, kept=None, names: frozenset = frozenset(), rewritten=None, generation: int = 0):
        self.kept, self.names, self.rewritten, self.generation = kept or {}, names, rewritten or [], generation


def examine(output_dir: str, ident: dict, shard_files: Mapping[int, tuple[str, ...]]) -> Resumption:
    """The decision of ``--resume`` on ``output_dir`` (the lock held, nothing written yet), for a run of identity
    ``ident`` whose shard plan ``i`` writes the files ``shard_files[i]`` (generation 0's names, index files
    included); the earlier run's marker says which generation it wrote (``Resumption.generation``).

    Raises:
      NothingToResume: the earlier run of the same identity committed.
      ConfigError: the earlier run's identity differs (one line naming the first difference).
    """
    names = set(listing.list_names(output_dir))
    marker = read_json(fileio.join(output_dir, MARKER_FILE)) if MARKER_FILE in names else None
    earlier = marker.get("identity") if marker and marker.get("format") == MARKER_FORMAT else None
    if not isinstance(earlier, dict):
        say(f"resume: nothing of an earlier run in {output_dir}: running in full")
        return Resumption()
    listed = listing.owned(output_dir, names).committed if METADATA_FILE in names else frozenset()
    # the files the earlier run wrote (not those it replaced): all listed by metadata.json when its commit ran
    wrote = listing.plain_names(marker.get("files")) - listing.plain_names(marker.get("replaces"))
    wrote = {n for n in wrote if not RECEIPT.match(n)} - _REWRITTEN
    if wrote and wrote <= listed:
        if difference(earlier, ident) is None:  # what its commit had left to do: its receipts, the files it replaced
            gone = {n for n in names if RECEIPT.match(n)} | (listing.plain_names(marker.get("replaces")) - listed)
            listing.delete_names(output_dir, sorted(gone & names & listing.plain_names(marker.get("files"))))
            raise NothingToResume(f"resume: the earlier run committed {output_dir}: nothing to resume")
        say(f"resume: the earlier run in {output_dir} committed another output: running in full")
        return Resumption()
    receipts = sorted(n for n in names if RECEIPT.match(n))
    if not receipts:
        say(f"resume: the earlier run in {output_dir} committed no shard: running in full")
        return Resumption()
    why = difference(earlier, ident)
    if why is not None:
        raise ConfigError(
            f"Cannot resume: {why}; resuming would mix two different outputs",
            file=output_dir,
            hint="run the same command as the earlier run, or run without --resume to replace its shards",
        )
    key, generation = digest(ident), marker.get("generation") if marker.get("generation") in (0, 1) else 0
    kept, keep_names, rewritten = {}, set(), []
    for name in receipts:
        receipt = _read_receipt(output_dir, name)
        index = int(RECEIPT.match(name).group("index"))
        files = shard_files.get(index)
        files = None if files is None else [listing.generation_name(f, generation) for f in files]
        problem = _check(output_dir, receipt, key, files, names)
        if problem is None:
            kept[index] = receipt["entries"]
            keep_names |= {name, *receipt["stamps"]}
        else:
            rewritten.append((name if receipt is None else receipt["entries"][0]["file"], problem))
    total = len(shard_files)
    say(
        f"resume: keeping {len(kept)} of the {total} shards the earlier run committed in {output_dir}; "
        f"writing the {total - len(kept)} missing"
    )
    for file, problem in rewritten:
        say(f"resume: rewriting {printable(file)}: {problem}")
    return Resumption(kept, frozenset(keep_names), rewritten, generation)


def _check(output_dir: str, receipt: dict | None, key: str, files, names: set) -> str | None:
    """Why the shard of ``receipt`` cannot be kept (None: it can): a torn receipt, another identity, other file names,
    a file missing, or one whose size or stamp is not the one recorded."""
    if receipt is None:
        return "its receipt is unreadable"
    if receipt.get("identity") != key:
        return "its receipt is of another run"
    stamps = receipt.get("stamps")
    if files is None or not isinstance(stamps, dict) or set(stamps) != set(files):
        return "the earlier run wrote other files for that shard"
    for f in sorted(stamps):
        if f not in names:
            return f"{printable(f)} is missing"
        now = stamp(fileio.join(output_dir, f))
        if now.get("bytes") != stamps[f].get("bytes"):
            return f"{printable(f)} has {now.get('bytes')} bytes, {stamps[f].get('bytes')} when it was written"
        if now != stamps[f]:
            return f"{printable(f)} was modified after it was written"
    return None


def record_shards(output_dir: str, shards: Iterable[dict]) -> None:
    """Adds to the run marker, just before ``metadata.json`` is written, each committed shard it lists, with its
    record count, size (bytes) and CRC32C: the marker then says what this run's shards are, not only their names.
    Nothing is written when the directory has no marker of ours or it lists none of ``shards`` (a pipeline built
    without ``prepare``)."""
    path = fileio.join(output_dir, MARKER_FILE)
    marker = read_json(path)
    if marker is None or marker.get("format") != MARKER_FORMAT:
        return
    listed = listing.plain_names(marker.get("files"))
    entries = [
        {k: s[k] for k in ("file", "records", "bytes", "crc32c", "index", "split") if k in s}
        for s in shards
        if s.get("file") in listed
    ]
    if entries:
        sink.write_json(path, {**marker, "shards": entries}, default=str)
