"""The output directory: its file names, which files in it are ours, the run marker, and the rules for what a
run may delete or replace. Every command that writes an output directory (convert, augment) goes through
:func:`prepare`; nothing else deletes files there.

The guarantees:

- **Only our files are ever deleted or replaced.** A file is ours when the directory's run marker
  (``.tf-etl-run.json``, written before the first shard; ``.tfrecord-etl-run.json`` in earlier versions) or its
  ``metadata.json`` lists it, or it is a temporary of such a file (``.tmp-<32 hex>-<name_key>``; earlier
  ``.tmp-<listed name>-<hex>``) or the Beam temp dir of a listed run (``beam-temp-<prefix>-<hex>``); the lock's
  temporary (``.tf-etl.lock.<pid>``, :data:`lockfile.LOCK_TEMP`) is removed by the run holding the lock. Names alone
  never make a file ours: another tool's ``data-00000-of-00002.tfrecord.gz`` in a directory without our marker is
  not ours. No name of ours but the shards matches the usual shard patterns (``*.tfrecord*``, ``data-*``, ...).
- **Anything else makes a run refuse** unless ``--overwrite``; with ``--overwrite`` our files are
  replaced and the others kept (and named). A file of someone else's with the name of a file this run
  writes is never replaced, ``--overwrite`` or not.
- **A replaced output stays complete until the new one commits**: the new generation is written beside it
  (:func:`generation_name` where the names would collide), ``metadata.json`` is replaced by a rename, and only
  then are the old files deleted (:func:`finish_replacement`).
- **Paths are literal.** The output directory is never globbed (``o[ab]`` is a directory name, not a
  pattern): local directories are listed with ``os.scandir``, remote ones with the glob characters of
  the directory escaped.
- **Inputs are never inside the output directory** (checked with ``os.path.realpath``: symlinks too).
- **One run at a time**, and no commit by a run that no longer holds the lock (:mod:`transforms.output.runlock`).
- **Every deletion is printed** on stderr at the default log level.

The model is TFDS's ``incomplete_file`` and Beam's ``FileBasedSink.finalize_write``: temporaries under
names of their own, renamed when complete, and only a list of known names cleaned up.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Iterable

from tfrecord_etl.transforms.errors import ConfigError, printable
from tfrecord_etl.transforms.output import listing, resume, sink
from tfrecord_etl.transforms.output.listing import (  # noqa: F401 - the names of an output, used here and by others
    GENERATION_TAG,
    LEGACY_MARKER_FILE,
    MANIFEST_FILE,
    MARKER_FILE,
    MARKER_FORMAT,
    METADATA_FILE,
    SCHEMA_FILE,
    SIDECAR_FORMAT,
    Replacement,
    check_inputs_outside,
    check_output_path,
    check_space,
    delete_names,
    generation_name,
    generation_prefix,
    list_names,
    nested_outputs,
    one_per_directory,
    owned,
    temp_of,
)
from tfrecord_etl.transforms.output.lockfile import LOCK_TEMP
from tfrecord_etl.transforms.output.resume import record_shards  # noqa: F401 - its home now; metadata.write uses it
from tfrecord_etl.transforms.output.runlock import (  # noqa: F401
    FAILPOINT_ENV,
    LEGACY_LOCK_FILE,
    LOCK_FILE,
    RUN_ENV,
    Lock,
    check_commit,
    failpoint,
    process_start,
    read_json,
    say,
    utc_now,
)
from tfrecord_etl.transforms.output.sink import TEMP_PREFIX, name_key  # noqa: F401 - the temporaries' names, sink's
from tfrecord_etl.transforms.renamed_flags import current_names  # options recorded under a flag's old name
from tfrecord_etl.transforms.storage import conditional, fileio

# ---------------------------------------------------------------- prepare

# options that do not change what an output holds; the collection flags choose which output directory a run
# writes (a span of a collection, reset in the span's own options), and the limits added since refuse an input
# rather than change an output, so an output written before they existed compares equal
_NOT_COMPARED = ("overwrite", "verbose", "progress", "span", "version", "incremental", "reconvert_changed")
_NOT_COMPARED += ("allow_schema_change", "max_row_mb")


def _comparable(options: dict | None) -> dict | None:
    if options is None:
        return None
    return {k: v for k, v in current_names(options).items() if k not in _NOT_COMPARED}


def _count(items, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _names_list(names: Iterable[str], n: int = 3) -> str:
    names = sorted(names)
    shown = ", ".join(printable(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def prepare(
    output_dir: str,
    *,
    command: str,
    options: dict,
    files: Iterable[str],
    overwrite: bool,
    beam_temp_prefixes: Iterable[str] = (),
    keep: Iterable[str] = (),
    planned_bytes: int | None = None,
    identity: dict | None = None,
    shard_files: dict | None = None,
    resuming: bool = False,
) -> Lock:
    """Makes ``output_dir`` ready for a run that writes ``files`` (names, generation 0) and returns the run's held
    :class:`Lock` (use it as a context manager around the pipeline), which says which generation the run writes
    (``lock.generation``: write ``generation_name(name, lock.generation)`` for each of ``files``) and which files
    of the output it replaces (``lock.replacement``: pass it to the commit, see :class:`Replacement`).

    - missing or empty: created;
    - a crashed run's files, temporaries and markers (ours, not part of a complete output): removed;
    - a complete output (ours; the same ``options``, or any with ``overwrite``): **kept** until the new one
      commits. The run writes its files beside it: under their own names when no committed file has them, else
      under the other generation's (:func:`generation_name`); the commit replaces ``metadata.json`` (a rename) and
      only then deletes the replaced files. A crash, a kill or a full disk before the commit leaves the old output
      complete; after it, the new one;
    - a complete output of other options: refused unless ``overwrite``;
    - files that are not ours: refused unless ``overwrite``; with it, they are kept (and named);
    - a file that is not ours but has the name of one of the files written: always refused.
    Then the run marker listing the files written and replaced is written.

    ``keep``: names of our files this run adds to rather than replaces (the other splits of a TFDS directory:
    ``convert.carried_splits``); never deleted, and the directory's earlier options do not make the run refuse.
    ``planned_bytes``: the bytes the run will write at least, checked against the free space of a local file
    system (the old output stays until the commit, so both must fit). ``identity`` (``resume.identity``) and
    ``shard_files`` (``{shard plan index: its files' names, generation 0}``): recorded in the marker, with a receipt
    name per shard plan; ``resuming`` (``--resume``): ``resume.examine`` first, and the shards it keeps are not
    removed (``lock.resumed``: ``{index: entries}``).

    Raises:
      ConfigError: any refusal above, an unusable path, another live run holding the lock, too little space.
    """
    check_output_path(output_dir)
    files = set(files) | {METADATA_FILE, SCHEMA_FILE}
    run_id = uuid.uuid4().hex
    lock = _locked(output_dir, run_id)
    try:
        resumed = resume.examine(output_dir, identity, shard_files) if resuming else resume.Resumption()
        lock.generation, lock.replaced, written = _clear(
            output_dir, options, files, overwrite, set(keep), planned_bytes, resumed.names
        )
        if resumed.kept and lock.generation != resumed.generation:  # the same plan: never seen
            say(f"resume: the earlier run wrote other names in {output_dir}: running in full")
            resumed = resume.Resumption()
        lock.resumed = resumed.kept
        written |= set(resume.receipt_names(len(shard_files))) if identity is not None and shard_files else set()
        lock.files = frozenset(written)
        metadata_version = (
            None if fileio.is_local(output_dir) else conditional.version(fileio.join(output_dir, METADATA_FILE))
        )
        lock.replacement = Replacement(tuple(sorted(lock.replaced)), metadata_version)
        lock.discard = functools.partial(
            discard_uncommitted, output_dir, frozenset(written - _REWRITTEN), lock.replaced
        )
        marker = _marker(run_id, command, options, written, lock, metadata_version, beam_temp_prefixes)
        marker.update({"identity": identity} if identity is not None else {})
        sink.write_json(fileio.join(output_dir, MARKER_FILE), marker, default=str)
    except BaseException:
        lock.release()
        raise
    failpoint("prepared")
    return lock


def _marker(run_id: str, command: str, options: dict, written: set, lock: Lock, metadata_version, prefixes) -> dict:
    """The run marker's content (``.tf-etl-run.json``): the run, and every file it writes or replaces."""
    return {
        "format": MARKER_FORMAT,
        "run_id": run_id,
        "command": command,
        "created": utc_now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "files": sorted(written | lock.replaced),
        "replaces": sorted(lock.replaced),
        "generation": lock.generation,
        "metadata_version": metadata_version,
        "beam_temp_prefixes": sorted({generation_prefix(p, lock.generation) for p in prefixes}),
        "options": options,
    }


def _locked(output_dir: str, run_id: str) -> Lock:
    """The run's :class:`Lock` of ``output_dir``, held (a local directory created first); ConfigError when the
    directory cannot be created or written."""
    if fileio.is_local(output_dir):
        try:
            os.makedirs(output_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"Cannot create the output directory: {e.strerror}", file=output_dir) from None
    lock = Lock(output_dir, run_id)
    try:
        lock.acquire()
    except OSError as e:
        raise ConfigError(
            f"Cannot write in the output directory: {e.strerror}",
            file=output_dir,
            hint="choose a writable --output_dir",
        ) from None
    return lock


# files every output has under one name, replaced in place (each by a rename) when the run commits
_REWRITTEN = frozenset({METADATA_FILE, SCHEMA_FILE, MANIFEST_FILE, "dataset_info.json", "features.json"})


def _clear(
    output_dir: str,
    options: dict,
    files: set[str],
    overwrite: bool,
    keep: set[str] = frozenset(),
    planned_bytes: int | None = None,
    spared: frozenset = frozenset(),
) -> tuple[int, frozenset, set]:
    """The checks and cleanup of :func:`prepare` (``spared``: files a resumed run keeps); returns ``(generation,
    committed files replaced, names the run writes)``."""
    names = _without_lock_temps(output_dir, set(list_names(output_dir)) - {LOCK_FILE, LEGACY_LOCK_FILE})
    if not names:
        check_space(output_dir, planned_bytes, False)
        return 0, frozenset(), set(files)
    own = owned(output_dir, names)
    ours = {n for n in names if own.is_ours(n)}
    kept = ours & keep
    ours -= keep
    strangers = names - ours - kept
    committed = (own.committed & names) - keep
    generation = 0
    shards = files - _REWRITTEN
    if shards & committed:
        generation = 1
        if {generation_name(n, 1) for n in shards} & committed:
            generation, committed = 0, set()  # both generations listed (not written by this version): no staging
    written = {generation_name(n, generation) if n not in _REWRITTEN else n for n in files}
    _refuse(output_dir, strangers, written, overwrite, own.complete and not kept and not overwrite, own, options)
    check_space(output_dir, planned_bytes, bool(committed))
    _remove_debris(output_dir, ours - spared, committed)
    if committed:
        say(
            f"keeping the complete output in {output_dir} until this run commits ({_count(committed, 'file')}; "
            f"its shards are replaced then)"
        )
    if kept:
        say(f"keeping {_count(kept, 'file')} of the splits already in {output_dir}: {_names_list(kept, 5)}")
    if strangers:
        say(
            f"keeping {_count(strangers, 'file')} tfrecord-etl did not write in {output_dir}: "
            f"{_names_list(strangers, 5)}"
        )
    return generation, frozenset(committed - written), written


def _without_lock_temps(output_dir: str, names: set[str]) -> set[str]:
    """``names`` without the lock's temporaries, which are deleted: the run calling this holds the lock, so a
    temporary of it is a failed or killed earlier run's."""
    lock_temps = {n for n in names if LOCK_TEMP.match(n) or conditional.PROBE.match(n)}  # (and conditional-write
    # probes a killed run left)
    if lock_temps:
        say(
            f"removing {_count(lock_temps, 'lock temporary')} of an earlier run that is gone in {output_dir}: "
            f"{_names_list(lock_temps, 5)}"
        )
        delete_names(output_dir, sorted(lock_temps))
    return names - lock_temps


def _refuse(output_dir, strangers: set, written: set, overwrite: bool, compare: bool, own, options: dict) -> None:
    """ConfigError when :func:`prepare` must refuse: files not ours with the names this run writes (always),
    files not ours (unless ``overwrite``), a complete output of other options (when ``compare``)."""
    clashes = strangers & (written | {MARKER_FILE})
    if clashes:
        raise ConfigError(
            f"The output directory holds files tfrecord-etl did not write with the names this run "
            f"writes ({_names_list(clashes)})",
            file=output_dir,
            hint="they are never replaced, --overwrite or not: move them away or choose another --output_dir",
        )
    if strangers and not overwrite:
        raise ConfigError(
            f"The output directory holds files tfrecord-etl did not write ({_names_list(strangers)})",
            file=output_dir,
            hint="pass --overwrite to replace tfrecord-etl's files there (the others "
            "are kept), or choose another --output_dir",
        )
    if compare and _comparable(own.options) != _comparable(options):
        raise ConfigError(
            "The output directory holds a complete output of another run",
            file=output_dir,
            hint="pass --overwrite to replace it, or choose another --output_dir",
        )


def _remove_debris(output_dir: str, ours: set[str], committed: set[str]) -> None:
    """Deletes our files that are not part of the complete output (a crashed run's), ``metadata.json`` first and the
    run markers last, so a crash during the cleanup leaves the rest ours."""
    markers = {MARKER_FILE, LEGACY_MARKER_FILE}
    # the run marker is not debris: this run's replaces it (a rename) once the rest is removed, so a crash meanwhile
    # leaves the rest listed; beside a complete output it is the marker of the run that wrote that output
    debris = ours - committed - {MARKER_FILE}
    if debris:
        order = [n for n in (METADATA_FILE,) if n in debris] + sorted(debris - {METADATA_FILE} - markers)
        order += sorted(debris & markers)  # the markers last: a crash during cleanup leaves the rest ours
        what = "of an earlier run that did not complete" if committed and debris - markers else "of an earlier run"
        say(f"removing {_count(debris, 'file')} {what} in {output_dir}: {_names_list(order, 5)}")
        delete_names(output_dir, order)


def finish_replacement(output_dir: str, replacement: Replacement) -> None:
    """After a run's ``metadata.json`` is written (the commit): deletes the files of the output it replaced
    (``replacement.files``) that the new metadata does not list, each by its exact name, and prints them. A crash
    during it leaves the new output complete; the run marker lists what is left, so the next run removes it."""
    failpoint("committed")
    replaced = set(replacement.files)
    if not replaced:
        return
    names = set(list_names(output_dir))
    now = owned(output_dir, names).committed
    gone = sorted((replaced & names) - now)
    if gone:
        say(f"removing {_count(gone, 'file')} of the output this run replaced in {output_dir}: {_names_list(gone, 5)}")
        delete_names(output_dir, gone)


def discard_uncommitted(output_dir: str, written: Iterable[str], replaced: Iterable[str] = ()) -> str:
    """Cleans up after a failed run (its lock already closed, so nothing of it commits any more) and returns what
    the directory holds: ``"this run"``, ``"previous"`` or ``"none"``.

    The commit point is ``metadata.json``: when it lists files of ``written`` (names of this run's generation, which
    no earlier output's metadata lists), the run's commit ran before the failure (a runner may report a job failed
    after its workers finished it, e.g. Flink's TaskManagers going on without their killed JobManager): the output
    is this run's, complete, and what its commit had not done yet is done: the files of the output it replaced
    (``replaced``) that the new ``metadata.json`` does not list, and the temporaries of ``written``, are removed.
    Otherwise the temporaries of ``written`` are removed, and its files that ``metadata.json`` does not list unless
    a receipt of the run says they were committed (``resume.receipted``: kept, unlisted, for ``--resume``; the last
    line says so): readers see the output it found (the previous one, complete, or none). Only names of ``written`` and ``replaced`` (ours) and their temporaries are
    deleted, each by its exact name, and every deletion is printed."""
    written = set(written)
    listing.abort_uploads(output_dir, written)  # killed attempts' (S3 multipart), never an object
    names = set(list_names(output_dir))
    own = owned(output_dir, names)
    committed = own.committed
    temps = {n for n in names if temp_of(n, written)}
    if committed & written:
        temps |= {n for n in names & written if resume.RECEIPT.match(n)}
        gone = sorted(((set(replaced) & names) - committed) | temps)
        say(
            f"this run's output was committed in {output_dir} before the failure"
            + (
                f"; removing {_count(gone, 'file')} of the output it replaced and of killed attempts: "
                f"{_names_list(gone, 5)}"
                if gone
                else ""
            )
        )
        delete_names(output_dir, gone)
        return "this run"
    kept = resume.receipted(output_dir, (written & names) - committed)  # committed shards: kept for --resume
    gone = sorted(((written & names) - committed - kept) | temps)
    if gone:
        say(f"removing {_count(gone, 'file')} this failed run wrote in {output_dir}: {_names_list(gone, 5)}")
        delete_names(output_dir, gone)
    if kept:
        resume.note_kept(output_dir, sum(1 for n in kept if resume.RECEIPT.match(n)))
    return "previous" if own.complete else "none"


def remove_temporaries(output_dir: str, files: Iterable[str]) -> None:
    """Deletes the ``.tmp-<name>-<hex>`` temporaries of ``files`` (killed or duplicate attempts), by exact name, and
    aborts their unfinished uploads (``listing.abort_uploads``)."""
    files = set(files)
    if aborted := listing.abort_uploads(output_dir, files):
        say(f"aborted the unfinished uploads of killed attempts in {output_dir}: {_names_list(aborted, 5)}")
    stale = [n for n in list_names(output_dir) if temp_of(n, files)]
    if stale:
        say(
            f"removing {_count(stale, 'temporary file')} of killed or duplicate attempts in {output_dir}: "
            f"{_names_list(stale, 5)}"
        )
        delete_names(output_dir, stale)
