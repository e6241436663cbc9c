"""The local lock file's two writes, each whole or not at all: creating ``.tf-etl.lock`` only when there is none
(:func:`create_local`) and replacing it (:func:`replace_local`, a failed run closing its lock), both through a
temporary of the process (:func:`lock_temp`, ``.tf-etl.lock.<pid>``, a name ``outdir`` knows as ours:
:data:`LOCK_TEMP`). Remote locks are conditional writes (:mod:`transforms.storage.conditional`);
:mod:`transforms.output.runlock` holds the protocol."""

from __future__ import annotations

import contextlib
import os
import re
import threading

from tfrecord_etl.transforms.output.runtime import failpoint


def lock_temp(lock_path: str, pid: int | None = None) -> str:
    """The temporary a run (``pid``, default this process) writes the closed lock to before renaming it over
    ``lock_path``: ``.tf-etl.lock.<pid>`` (``outdir`` knows the name as ours: :data:`LOCK_TEMP`)."""
    return f"{lock_path}.{os.getpid() if pid is None else pid}"


LOCK_TEMP = re.compile(r"^\.tf-etl\.lock\.(?P<pid>\d+)$")  # lock_temp's names: ours, removed by the next run


def create_local(path: str, data: bytes) -> bool:
    """Creates the local file ``path`` holding ``data`` unless it exists (False), in one step a kill cannot split:
    written to :func:`lock_temp`, hard-linked to ``path`` (``link`` fails on an existing file, as ``O_EXCL``), the
    temporary unlinked. A launcher killed then leaves no lock or a complete one (stale at once), never the empty
    one ``O_CREAT|O_EXCL`` and a write left between the two (refused for a minute). No hard links: those two."""
    with _CREATING:  # one temporary name per process (lock_temp): threads take turns
        return _create_once(path, data)


_CREATING = threading.Lock()


def _create_once(path: str, data: bytes) -> bool:
    temp = lock_temp(path)
    try:
        with open(temp, "wb") as f:
            f.write(data)
        failpoint("lock-written")
        os.link(temp, path)
        failpoint("lock-linked")
    except FileExistsError:
        return False
    except OSError:  # no hard links here (some FUSE and SMB mounts)
        try:
            with os.fdopen(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644), "wb") as f:
                f.write(data)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    return True


def replace_local(path: str, data: bytes) -> None:
    """Replaces the local file ``path`` with ``data`` (a temporary beside it, renamed over it); on any error the
    temporary is deleted and the error raised (a full disk used to leave a 0-byte ``.tf-etl.lock.<pid>``)."""
    temp = lock_temp(path)
    try:
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
