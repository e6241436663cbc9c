"""What every step of a run on the output side uses: failpoints (``TFRECORD_ETL_FAILPOINT``, the crash tests' hooks),
the run's lines on stderr, bounded JSON reads (a marker, a lock, ``metadata.json``), a process's start time (is the
lock holder alive) and UTC timestamps.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import signal
import sys
import threading
import time

from tfrecord_etl.transforms.storage import fileio

MAX_JSON_BYTES = 64 * 2**20  # a marker, lock or metadata.json larger than this is not ours

RUN_ENV = "TFRECORD_ETL_RUN"  # the lock path and run id of the run this process (or its launcher) holds
FAILPOINT_ENV = "TFRECORD_ETL_FAILPOINT"
FAILPOINT_ONCE_ENV = "TFRECORD_ETL_FAILPOINT_ONCE"  # the file a ":once" failpoint creates when it fires
# what a failed run kept for --resume, said on the command's last line (resume.note_kept, pipelines.common)
RESUME_NOTES: list[str] = []


def failpoint(stage: str) -> None:
    """Kills this process with SIGKILL at ``stage`` when the environment variable ``TFRECORD_ETL_FAILPOINT`` names
    it (``STAGE:launcher`` kills the launcher holding the run's lock instead, from a worker process; ``:INT`` sends
    SIGINT, a Ctrl-C, instead of SIGKILL): how the tests crash a run at a chosen moment (``prepared``: lock and
    marker written; ``shard-opened``: a shard's temporary file created, nothing written to it yet, in the process
    that writes it; ``lock-written`` / ``lock-linked``: a local lock's temporary written, not yet linked / linked,
    not yet unlinked; ``shard-committed``: a shard renamed into place, in the process that wrote it;
    ``before-commit``: every shard final, no metadata yet; ``committed``: ``metadata.json`` written, the replaced
    files not yet deleted; ``before-collection-commit``: a span's output committed, ``collection.json`` not yet)
    instead of after a sleep. ``:once`` fires in the first process that reaches the stage only (it creates the file
    ``TFRECORD_ETL_FAILPOINT_ONCE`` names, ``O_EXCL``): one of several worker processes. ``:hang-at-exit`` kills
    nothing: the process goes on, and when it exits it never finishes (an exit handler that waits forever), as a
    worker stuck in its interpreter's shutdown is. ``:sleep=S`` kills nothing either: the process waits ``S``
    seconds at the stage, then goes on (a test stops a store meanwhile). Unset, it costs one dictionary lookup."""
    wanted = os.environ.get(FAILPOINT_ENV)
    if wanted and wanted.split(":")[0] == stage:
        parts = wanted.split(":")[1:]
        if "once" in parts:
            try:
                os.close(os.open(os.environ[FAILPOINT_ONCE_ENV], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except (FileExistsError, KeyError):
                return
        if "hang-at-exit" in parts:
            atexit.register(threading.Event().wait)
            return
        pause = next((float(p[len("sleep=") :]) for p in parts if p.startswith("sleep=")), None)
        if pause is not None:  # kills nothing: holds the process at the stage (a store stopped meanwhile)
            time.sleep(pause)
            return
        sig = next((getattr(signal, f"SIG{p}") for p in parts if hasattr(signal, f"SIG{p}")), signal.SIGKILL)
        pid = os.getpid()
        if "launcher" in parts:  # the launcher holding the run's lock (Beam starts workers through a shell)
            pid = (read_json(json.loads(os.environ.get(RUN_ENV, "{}")).get("lock", "")) or {}).get("pid", pid)
        os.kill(pid, sig)


def say(message: str) -> None:
    """One line on stderr, shown at the default log level (deletions, kept files, stale locks)."""
    print(f"[tfrecord-etl] {message}", file=sys.stderr, flush=True)


def read_json(path: str) -> dict | None:
    """The JSON object in the file ``path`` (a lock, a run marker, ``metadata.json``), or None when it is missing,
    larger than 64 MiB (local), unreadable, not JSON or not an object: such a file is not one of ours."""
    try:
        if fileio.is_local(path) and (not os.path.isfile(path) or os.path.getsize(path) > MAX_JSON_BYTES):
            return None
        data = json.loads(fileio.read_bytes(path))
    except Exception:  # noqa: BLE001 - unreadable: not ours
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------- the lock


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux ``/proc/<pid>/stat`` field 22), None when it is gone or a zombie
    (killed or exited, not yet reaped by its parent: a launcher killed while its workers run is one until its shell
    waits for it, and it holds no lock any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        fields = stat.rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else fields[19]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return "?"
        return "?"


def utc_now() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ`` (what locks and run markers record)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
