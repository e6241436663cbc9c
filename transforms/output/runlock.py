"""The lock of an output directory and the checks that tie every commit to the run holding it (see
:mod:`transforms.output.outdir` for the rest of the protocol): one run at a time (``.tf-etl.lock``, created with
``O_CREAT|O_EXCL``, holding the launcher's host, pid and process start time; a lock whose process is gone on the
same host is stale and taken over), commits refused once the run no longer holds it (:func:`check_commit`), and the
failpoints the tests crash a run at.

On S3 and GCS every change of the lock is a conditional request on the version of the lock object the run read
(:mod:`transforms.storage.conditional`: S3 ``If-None-Match: *`` / ``If-Match: <ETag>`` on ``PutObject`` and ``If-Match`` on
``DeleteObject``, GCS ``ifGenerationMatch``): creating it (absent), taking a stale one over (replacing exactly the
stale version read: of two launchers taking over the same stale lock one wins), closing it when a run fails, and
releasing it (deleting only the version the run holds, never a lock another run took meanwhile). Elsewhere (local
disk: ``O_EXCL``; HDFS) a take-over and a release are a read followed by a delete: two launchers taking over the
same stale lock at the same moment can both pass the read, which is the window left there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time

from tfrecord_etl.transforms.errors import ConfigError, OutputError
from tfrecord_etl.transforms.output import runtime
from tfrecord_etl.transforms.output.lockfile import create_local, replace_local
from tfrecord_etl.transforms.output.runtime import (  # noqa: F401 - runtime's names, used here and by others
    FAILPOINT_ENV,
    FAILPOINT_ONCE_ENV,
    RUN_ENV,
    failpoint,
    process_start,
    read_json,
    say,
    utc_now,
)
from tfrecord_etl.transforms.storage import conditional, fileio, remote

LOCK_FILE = ".tf-etl.lock"
LEGACY_LOCK_FILE = ".tfrecord-etl.lock"  # the lock's name in earlier versions (a run of one may be going on)


def _lock_record(run_id: str) -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": process_start(pid), "run_id": run_id, "since": utc_now()}


def _is_stale(record: dict | None, path: str) -> bool:
    if record is None:  # empty or torn (a launcher killed between create and write): stale after a minute
        if fileio.is_local(path):
            try:
                return time.time() - os.path.getmtime(path) > 60
            except OSError:
                return True
        return False
    if record.get("host") != socket.gethostname() or not isinstance(record.get("pid"), int):
        return False
    start = process_start(record["pid"])
    return start is None or (start != "?" and record.get("start") not in (None, "?") and start != record["start"])


def _read_lock(path: str) -> tuple[dict | None, str | None]:
    """The lock record at ``path`` (None: none, empty or unreadable) and, on S3 and GCS, the version of the object
    it was read from (``conditional.ABSENT``: no object), for a conditional replace or delete of exactly that version;
    None elsewhere."""
    if fileio.is_local(path):
        return read_json(path), None
    try:
        data, version = conditional.read_versioned(path)  # version None: HDFS, no conditional requests
    except Exception:  # noqa: BLE001 - unreadable: not ours
        return None, None
    if data is None or len(data) > runtime.MAX_JSON_BYTES:
        return None, version
    try:
        record = json.loads(data)
    except ValueError:
        return None, version
    return (record if isinstance(record, dict) else None), version


def _remove(path: str, version: str | None) -> None:
    """Deletes the lock ``path`` if it is still at ``version`` (from :func:`_read_lock`; None: unconditionally).

    Raises:
      conditional.VersionConflict: it was replaced since (another run's now): kept.
    """
    if version is None:
        fileio.delete([path])
    else:
        conditional.delete_if_version(path, version)


def _create(path: str, data: bytes) -> bool:
    """Creates the remote object ``path`` only when there is none: one conditional write on S3 and GCS (S3
    ``If-None-Match: *``, GCS ``ifGenerationMatch=0``: of two launchers, exactly one wins); elsewhere a write after
    an existence check (best effort). False when it exists."""
    try:
        if conditional.version(path) is None and fileio.exists(path):
            return False
        conditional.write_if_version(path, data, conditional.ABSENT)
    except conditional.VersionConflict:
        return False
    return True


# the attribute a failed run's exception carries out of ``with lock:``: "this run" (its commit ran before the failure:
# the directory holds this run's output, complete), "previous" (nothing committed: the previous output, complete)
# or "none" (nothing committed and no output there)
OUTPUT_STATE = "tfrecord_etl_output_state"
CLOSED = ":closed"  # appended to the run id in the lock while a failed run removes its files: no more commits


class Lock:
    """The exclusive lock of one run on an output directory (a context manager; released on exit)."""

    def __init__(self, output_dir: str, run_id: str):
        self.path = fileio.join(output_dir, LOCK_FILE)
        self.run_id = run_id
        self.held = False
        self.generation = 0  # set by prepare: the generation of names this run writes
        self.files: frozenset = frozenset()  # set by prepare: the names this run writes
        self.replaced: frozenset = frozenset()  # set by prepare: the committed files the run's commit replaces
        self.replacement = None  # set by prepare: the outdir.Replacement to pass to the commit
        self.discard = None  # set by prepare: removes what a failed run wrote and did not commit
        self.resumed: dict = {}  # set by prepare (--resume): {shard plan index: entries} of the shards kept
        self.output_state = None  # after a failed run: what the directory holds (outdir.discard_uncommitted)

    def acquire(self) -> Lock:
        """Raises ConfigError when another live run holds the lock (this version's or, under its older name, an
        earlier version's)."""
        legacy = fileio.join(fileio.dirname(self.path), LEGACY_LOCK_FILE)
        if fileio.exists(legacy):
            other, version = _read_lock(legacy)
            taken = _is_stale(other, legacy)
            if taken:
                say(f"taking over the stale lock {legacy} of a run that is gone ({_describe(other)})")
                try:
                    _remove(legacy, version)
                except conditional.VersionConflict:  # written again since it was read: a live run's
                    taken, other = False, _read_lock(legacy)[0] or other
            if not taken:
                raise ConfigError(
                    f"Another run ({_describe(other)}) is writing this output directory",
                    file=legacy,
                    hint="wait for it to finish or choose another --output_dir; if no such run "
                    f"exists, delete {LEGACY_LOCK_FILE}",
                )
        record = _lock_record(self.run_id)
        data = json.dumps(record).encode()
        conditional.check_conditional_writes(fileio.dirname(self.path))  # the lock rests on them
        for attempt in range(2):
            if fileio.is_local(self.path):
                if create_local(self.path, data):
                    self.held = True
                    return self
            elif _create(self.path, data) and (read_json(self.path) or {}).get("run_id") == self.run_id:
                self.held = True
                return self
            other, version = _read_lock(self.path)
            if attempt == 0 and version == conditional.ABSENT:  # released between the create and the read
                continue
            if attempt == 0 and _is_stale(other, self.path):
                say(f"taking over the stale lock {self.path} of a run that is gone ({_describe(other)})")
                if version is None:  # local (O_EXCL again after the delete), HDFS
                    fileio.delete([self.path])
                    continue
                try:  # replaces exactly the stale version read: of two launchers taking it over, one wins
                    conditional.write_if_version(self.path, data, version)
                except conditional.VersionConflict:
                    other = _read_lock(self.path)[0] or other
                else:
                    self.held = True
                    return self
            raise ConfigError(
                f"Another run ({_describe(other)}) is writing this output directory",
                file=self.path,
                hint=f"wait for it to finish or choose another --output_dir; if no such run exists, delete {LOCK_FILE}",
            )
        raise AssertionError("unreachable")

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                record, version = _read_lock(self.path)
                if (record or {}).get("run_id") in (self.run_id, self.run_id + CLOSED):
                    _remove(self.path, version)  # only the version read: never a lock another run took since
            except Exception:  # noqa: BLE001 - a lock left behind is stale for the next run; another run's is kept
                pass

    def _discard_uncommitted(self) -> None:
        """A run that failed (an error, Ctrl-C) while holding the lock: first the lock's run id is changed, so no
        worker process commits anything more (:func:`check_commit`), then the commit point is checked and the files
        it wrote that no ``metadata.json`` lists are removed (``self.discard``, which returns what the directory
        holds: kept in ``self.output_state``). On S3 and GCS the lock is changed only if it is
        still the version read; when another run holds the lock now (it took it over), nothing is changed or
        removed: the files may be that run's. Best effort: what is left, the next run removes."""
        try:
            record, version = _read_lock(self.path)
            record = record or {}
            if record.get("run_id") == self.run_id:
                data = json.dumps(dict(record, run_id=self.run_id + CLOSED)).encode()
                if fileio.is_local(self.path):
                    # a full disk: the lock stays open, and the workers are stopped already
                    # (``pipelines.common.run_pipeline``), so what this run wrote is still removed
                    with contextlib.suppress(OSError):
                        replace_local(self.path, data)
                else:
                    conditional.write_if_version(self.path, data, version or conditional.ABSENT)
            elif record.get("run_id") not in (None, self.run_id + CLOSED):
                return  # another run's lock: its files are not this run's to remove
            self.output_state = self.discard()
        except Exception:  # noqa: BLE001 - the original error matters; the next run cleans up (VersionConflict:
            pass  # another run took the lock over between the read and the write)

    def __enter__(self):
        """While the block runs, every file committed into the output directory (``sink.committed_file``, in this
        process and in the worker processes it starts, which inherit the environment) first checks that this run
        still holds the lock (:func:`check_commit`)."""
        self._saved_env = os.environ.get(RUN_ENV)
        if self.held:
            os.environ[RUN_ENV] = json.dumps({"lock": self.path, "run_id": self.run_id})
        return self

    def __exit__(self, *exc):
        with _interrupts_deferred(raise_after=exc[0] is None):
            if exc[0] is not None and self.held and self.discard is not None:
                self._discard_uncommitted()
                if self.output_state is not None and exc[1] is not None:
                    # for the error's one line (pipelines.common): which output the directory holds (an exception
                    # type without a __dict__: the line says less)
                    with contextlib.suppress(Exception):
                        setattr(exc[1], OUTPUT_STATE, self.output_state)
            self.release()
            saved = getattr(self, "_saved_env", None)
            if saved is None:
                os.environ.pop(RUN_ENV, None)
            else:
                os.environ[RUN_ENV] = saved
        return False


class _interrupts_deferred:
    """While the block runs (a run's removal of what it wrote, then the lock's release: short, bounded work), a
    Ctrl-C (SIGINT) is held back instead of raising ``KeyboardInterrupt`` halfway through, which would leave the lock
    behind: a second Ctrl-C, or each worker of a run interrupted at once. Afterwards the interrupt is raised if
    ``raise_after`` (the block ended a run that had not failed), else dropped: the run is already ending on an
    error. Only in the main thread (the only one Python delivers signals to); elsewhere a no-op."""

    def __init__(self, raise_after: bool):
        self._raise_after, self._pending, self._installed, self._saved = raise_after, False, False, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._saved = signal.signal(signal.SIGINT, self._hold)
            self._installed = True
        return self

    def _hold(self, signum, frame) -> None:
        self._pending = True

    def __exit__(self, *exc):
        if self._installed:  # (None: a handler not set from Python; Python's own default then)
            signal.signal(signal.SIGINT, self._saved if self._saved is not None else signal.default_int_handler)
        if self._pending and self._raise_after and exc[0] is None:
            raise KeyboardInterrupt
        return False


class CarriesRun:
    """Mixin for our DoFns (``class WriteShardFn(CarriesRun, beam.DoFn)``): the run the launcher holds when it builds
    the pipeline (inside ``with lock:``, so :data:`RUN_ENV` names it) is kept in the DoFn, pickled with it, and set
    in the worker's environment by :meth:`setup`, so :func:`check_commit` guards every commit of that run in every
    worker. DirectRunner's worker processes inherit the launcher's environment; an SDK harness started by a Flink or
    Spark worker pool (or a Dataflow worker) never sees it, and without this a job that outlived a killed launcher
    could go on renaming shards into a directory a re-run is writing. A DoFn with its own ``setup`` calls
    ``super().setup()``.

    It carries the launcher's filesystem options too (Beam's ``FileSystems`` options: ``--s3_endpoint_url``,
    ``--s3_region_name``, GCS project options, ...: the flags given, not the defaults) and gives them to a worker
    whose ``FileSystems`` has none. Beam sets them in an SDK harness started by its boot program (Dataflow, the
    Docker SDK image) from the provisioned pipeline options, but a harness started by Beam's Python worker pool
    (``python -m apache_beam.runners.worker.worker_pool_main``, the sidecar of docs/scale.md) never gets them, so
    every s3:// write there failed with S3IO's "Must provide one of client or options" (found on Prism, Flink and
    Spark workers that reach their data through object storage only). A worker whose harness set its own options
    keeps them."""

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self._carried_run = os.environ.get(RUN_ENV)  # unpickling restores the launcher's value over the worker's
        self._carried_filesystem_options = _filesystem_options()
        return self

    def setup(self):
        if self._carried_run and os.environ.get(RUN_ENV) != self._carried_run:
            os.environ[RUN_ENV] = self._carried_run
        remote.store_retries()
        carried = getattr(self, "_carried_filesystem_options", None)  # (a DoFn pickled by an older version)
        if carried is not None:
            _give_filesystem_options(carried)


def _filesystem_options() -> dict | None:
    """The flags Beam's ``FileSystems`` was given in this process (``Pipeline`` or ``configure_filesystems``
    sets them), as ``{name: value}`` without the defaults; None when Beam is not loaded or none were set."""
    beam_fs = sys.modules.get("apache_beam.io.filesystems")
    options = getattr(getattr(beam_fs, "FileSystems", None), "_pipeline_options", None)
    return None if options is None else options.get_all_options(drop_default=True)


def _give_filesystem_options(flags: dict) -> None:
    """Sets ``flags`` (from :func:`_filesystem_options`) as this worker's ``FileSystems`` options, unless it has
    options already."""
    from apache_beam.io.filesystems import FileSystems  # deferred: Beam (a DoFn's setup runs where Beam is)
    from apache_beam.options.pipeline_options import PipelineOptions  # deferred: Beam

    if FileSystems._pipeline_options is None:
        FileSystems.set_options(PipelineOptions.from_dictionary(flags))


def check_commit(final: str) -> None:
    """Before ``final`` is committed (renamed into place) into the output directory of a run that holds its lock
    (``with lock:``; the environment names it): raises OutputError when that run no longer holds it: the lock is
    gone (the launcher stopped and released it), holds another run's id (a newer run took it over), or names a
    launcher on this host that is no longer alive (killed). So worker processes that outlive their launcher
    commit nothing into a directory a re-run may already be writing. One read of the lock file per commit."""
    held = os.environ.get(RUN_ENV)
    if not held:
        return
    try:
        run = json.loads(held)
        lock, run_id = run["lock"], run["run_id"]
    except (ValueError, KeyError, TypeError):
        return
    if fileio.dirname(final) != fileio.dirname(lock):
        return
    record = read_json(lock)
    if record is None or record.get("run_id") != run_id:
        why = "its lock is gone (the launcher stopped)" if record is None else "another run took its lock over"
    elif _is_stale(record, lock):
        why = f"its launcher (pid {record.get('pid')}) is no longer running"
    else:
        return
    raise OutputError(
        f"Not committing {fileio.basename(final)}: this run no longer owns the output directory: {why}",
        file=fileio.dirname(final),
        hint="nothing of this run is committed; run the command again",
    )


def _describe(record: dict | None) -> str:
    if not record:
        return "unknown: the lock file is empty or unreadable"
    return f"host {record.get('host')}, pid {record.get('pid')}, since {record.get('since')}"
