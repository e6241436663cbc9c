"""The one line a command prints when it fails, from the exception: our errors (``ConfigError: ... Hint: ...``), an
output that cannot be written (disk full, read-only, no permission), out of memory, a worker process that went away
and a runner's job that failed (Flink, Spark); none of them a traceback. :mod:`common`'s ``run_main`` prints them.
"""

from __future__ import annotations

import errno
import os
import re

from tfrecord_etl.transforms.errors import EtlError
from tfrecord_etl.transforms.output.runlock import OUTPUT_STATE

# what Beam's runners raise when a worker process (DirectRunner multi_processing, a portable worker) went away
WORKER_GONE = ("Channel closed prematurely",)


# what Beam's PortableRunner raises when the job fails in the runner itself (a Flink or Spark job server): a lost
# TaskManager or executor with no restart left, a killed JobManager
JOB_FAILED = re.compile(r"^Pipeline (\S+) failed in state (FAILED|CANCELLED|UNKNOWN): ?(.*)", re.S)
JOB_FAILED_LINE = "OutputError: The runner's job {job} ended in state {state}: {why}; {holds}. Hint: {hint}"
RESTART_HINT = (
    "on a cluster, give the runner a restart strategy (Flink: restart-strategy: fixed-delay) so that a "
    "lost worker is retried"
)
# what the output directory holds after the failed job (the lock's cleanup checks the commit point first:
# runlock.OUTPUT_STATE); a runner may report a job failed after its workers finished it, commit included
JOB_FAILED_HOLDS = {
    "this run": (
        "its commit ran before the failure: this run's output was committed and is complete",
        f"check it with tfrecord-etl verify; {RESTART_HINT}",
    ),
    "previous": ("nothing was committed: the previous output is complete", f"run again; {RESTART_HINT}"),
    "none": ("nothing was committed: the output directory holds no output", f"run again; {RESTART_HINT}"),
    None: ("nothing was committed, so the output directory holds what it held before", f"run again; {RESTART_HINT}"),
}


# the last line of a Python traceback: ``[package.]Name: message`` (or ``Name`` alone), not indented
PY_EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)))(?:: (.*))?$")
TRACEBACK = "Traceback (most recent call last):"
RUNNER_MESSAGES = "runner_messages"  # running.run_pipeline: the job's error messages (the job service's stream)
IMPORT_HINT = (
    "the Python environment of the workers lacks a module this run needs (the launcher's may have it): install it "
    "where the workers run (the SDK harness image, the worker pool's environment, or Beam's --requirements_file / "
    "--setup_file), then run again"
)
CUT_HINT = (
    "its type and message are in the runner log (or the TaskManager's or executor's log): fix what it names, then "
    "run again"
)
RAISED_HINT = "fix what the message names (the worker's traceback is in the runner log), then run again"


def worker_exception(text: str) -> tuple[str, str] | None:
    """``(type name, message)`` of the exception that ended the last Python traceback in ``text`` (a runner's
    message: a Java exception holding the SDK harness's traceback, chained tracebacks included), else None. The
    message is its first line, Beam's ``[while running 'STEP']`` kept."""
    start = text.rfind(TRACEBACK)
    if start < 0:
        return None
    for line in text[start + len(TRACEBACK) :].splitlines():
        if not line.strip() or line[0] in " \t":  # frames and their source lines are indented
            continue
        m = PY_EXCEPTION.match(line.rstrip())
        if m:
            return m.group(2), (m.group(3) or "").strip()
        return None  # the traceback ended in something else (a Java frame, a truncated text)
    return None


def runner_messages_text(e: BaseException) -> str:
    """``e``'s text, then that of the failed job's messages ``running.run_pipeline`` attached to it."""
    return "\n".join([str(e), *getattr(e, RUNNER_MESSAGES, ())])


def runner_job_failed_line(e: BaseException) -> str | None:
    """One line for a job the runner failed (``Pipeline NAME failed in state FAILED: <the runner's message>``),
    saying which output the directory holds (``runlock.OUTPUT_STATE``, set by the run's cleanup). When a worker's
    Python code raised (its traceback in the runner's message, or in the job's messages attached by
    ``running.run_pipeline``), the line names that exception's type and message, with a hint that fits it (a module
    the workers lack: install it there; anything else: fix it), not the restart strategy's."""
    match = JOB_FAILED.match(str(e).strip())
    if match is None:
        return None
    holds, hint = JOB_FAILED_HOLDS.get(getattr(e, OUTPUT_STATE, None), JOB_FAILED_HOLDS[None])
    raised = worker_exception(match.group(3))
    for text in reversed(getattr(e, RUNNER_MESSAGES, ())):
        raised = raised or worker_exception(text)
    if raised is not None:
        name, message = raised
        why = f"a worker raised {name}" + (f": {message}" if message else "")
        if len(why) > 400:
            why = why[:397] + "..."
        fits = IMPORT_HINT if name in ("ImportError", "ModuleNotFoundError") else RAISED_HINT
        if "its commit ran" in holds:
            fits = f"check it with tfrecord-etl verify; {fits}"
        return JOB_FAILED_LINE.format(job=match.group(1), state=match.group(2), why=why, holds=holds, hint=fits)
    why = " ".join(match.group(3).split()).rstrip(".") or "no reason given"
    if TRACEBACK in why:  # a worker's traceback the runner cut short before its exception
        why = (
            why[: why.index(TRACEBACK)].rstrip(" :") + ": a worker raised an exception the runner's message cuts short"
        )
        hint = CUT_HINT
    return JOB_FAILED_LINE.format(job=match.group(1), state=match.group(2), why=why[:300], holds=holds, hint=hint)


def worker_died(e: BaseException) -> bool:
    text = "".join(str(x) for x in (e, e.__cause__, e.__context__) if x is not None)
    return any(marker in text for marker in WORKER_GONE)


ERROR_NAMES = (
    "ConfigError",
    "InputChangedError",
    "SourceError",
    "UnreadFormatError",
    "SchemaError",
    "RecordError",
    "IncompleteOutputError",
    "OutputError",
)


def etl_error_line(text: str) -> str | None:
    """Our error's ``Name: message`` line from a remote traceback's text (Beam's multi_processing and
    portable runners re-raise a worker's error as a RuntimeError holding only the traceback text)."""
    found = None
    for line in text.splitlines():
        m = re.match(rf"^\s*(?:[\w.]+\.)?({'|'.join(ERROR_NAMES)}): (.*)$", line)
        if m:
            found = f"{m.group(1)}: {m.group(2)}"
    return found


# errno of an output that cannot be written -> what to do about it
OUTPUT_ERRNOS = {
    errno.ENOSPC: "free space on that file system or choose another --output_dir",
    errno.EDQUOT: "free space within your quota or choose another --output_dir",
    errno.EROFS: "the file system is read-only: choose another --output_dir",
    errno.EACCES: "you may not write there: fix its permissions or choose another --output_dir",
    errno.EPERM: "you may not write there: fix its permissions or choose another --output_dir",
    errno.ENOTDIR: "a part of the path is a file, not a directory: choose another --output_dir",
    errno.EISDIR: "a directory stands where a file is written: choose another --output_dir",
}
MEMORY_ERROR_LINE = (
    "OutputError: Out of memory while reading, encoding or writing. Hint: pass a smaller "
    "--target_range_mb (rows read at once per worker) or fewer --direct_num_workers"
)


def flag_value(argv: list[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``argv`` (``--flag value`` or ``--flag=value``), else None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
    return found


def output_error_line(e: BaseException, output_dir: str | None = None) -> str | None:
    """``OutputError: <strerror> writing '<path>'. Hint: ...`` for an OSError of an unwritable output
    (disk full, quota, read-only, permission, a file where a directory should be), raised directly, in the
    exception chain, or in the text of a Beam-wrapped worker error (``OSError: [Errno 28] No space left on
    device: '/path'``); a MemoryError likewise. None for anything else. When the error names no file,
    the line names ``output_dir`` (the command's ``--output_dir``) instead."""
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MemoryError):
            return MEMORY_ERROR_LINE
        if isinstance(cur, OSError) and cur.errno in OUTPUT_ERRNOS:
            path = cur.filename if cur.filename is not None else "?"
            return output_line(cur.errno, cur.strerror or os.strerror(cur.errno), str(path), output_dir)
        cur = cur.__cause__ or cur.__context__
    text = str(e)
    found = None
    for m in re.finditer(
        r"(?:OSError|IOError|PermissionError|FileNotFoundError|NotADirectoryError|"
        r"IsADirectoryError|[\w.]*Error): \[Errno (\d+)\] ([^:\n\[\]]+)(?:: '([^'\n]*)')?",
        text,
    ):
        code = int(m.group(1))
        if code in OUTPUT_ERRNOS:
            found = output_line(code, m.group(2).strip(), m.group(3) or "?", output_dir)
    if found is None and re.search(r"^\s*MemoryError\b", text, re.M):
        return MEMORY_ERROR_LINE
    if found is None and re.search(r"No space left on device", text):
        found = output_line(errno.ENOSPC, os.strerror(errno.ENOSPC), "?", output_dir)
    return found


def output_line(code: int, strerror: str, path: str, output_dir: str | None = None) -> str:
    where = (
        f" writing {path!r}"
        if path != "?"
        else f" writing into --output_dir {output_dir!r}"
        if output_dir
        else " writing the output"
    )
    return f"OutputError: {strerror}{where} (errno {errno.errorcode.get(code, code)}). Hint: {OUTPUT_ERRNOS[code]}"


def find_etl_error(e: BaseException | None):
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, EtlError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


# the object stores' client errors (botocore's, Beam's S3 client's, google-api-core's, a refused connection), by
# class name along the exception chain (no import of the clients here); their text names the request that failed
STORE_ERRORS = (
    "ClientError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ResponseStreamingError",
    "IncompleteReadError",
    "S3ClientError",
    "GoogleAPICallError",
    "ServiceUnavailable",
    "InternalServerError",
    "TooManyRequests",
    "RetryError",
)
STORE_HOLDS = {
    "this run": "its commit ran before the failure: this run's output was committed and is complete",
    "previous": "nothing was committed: the previous output is complete",
    "none": "nothing was committed: the output directory holds no output",
    None: "nothing was committed, so the output directory holds what it held before",
}


def store_error_line(e: BaseException, output_dir: str | None = None) -> str | None:
    """``OutputError: The object store failed ...`` for an error of an s3:// or gs:// client that ended the run in
    the launcher (a store that stopped answering, refused a request after its retries, or cut off its responses):
    the request and the store's message, what the output directory holds (``runlock.OUTPUT_STATE``), and what to
    do. None for anything else."""
    seen, cur, found = set(), e, None
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        names = {c.__name__ for c in type(cur).__mro__}
        if names & set(STORE_ERRORS) or ("BeamIOError" in names and "S3ClientError" in str(cur)):
            found = cur
            break
        cur = cur.__cause__ or cur.__context__
    if found is None:
        return None
    message = " ".join(str(found).split())
    if len(message) > 300:
        message = message[:297] + "..."
    state = getattr(e, OUTPUT_STATE, None)
    where = f" for {output_dir!r}" if output_dir else ""
    return (
        f"OutputError: The object store failed{where}: {type(found).__name__}: {message}; {STORE_HOLDS[state]}. "
        "Hint: check that the store is up and reachable from here and from every worker (endpoint, credentials, "
        "quota), then run the command again"
    )


JOB_SERVER_LOST_LINE = (
    "OutputError: The job server at --job_endpoint {endpoint} stopped answering while it ran job {job} ({reason}); "
    "{holds}; {fate}. Hint: restart the job server (or check the network to it) and run the command again"
)


def job_server_lost_line(e: BaseException) -> str | None:
    """One line for a job server that stopped answering mid-job (``jobcontrol.JobServerLost``, matched by name:
    that module imports Beam): the job endpoint, the gRPC status, what the output directory holds
    (``runlock.OUTPUT_STATE``) and what became of the job on the cluster (cancelled, or how to cancel it). None for
    anything else."""
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen and type(cur).__name__ != "JobServerLost":
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    if cur is None or id(cur) in seen:
        return None
    holds = STORE_HOLDS[getattr(e, OUTPUT_STATE, None) or getattr(cur, OUTPUT_STATE, None)]
    return JOB_SERVER_LOST_LINE.format(
        endpoint=cur.endpoint, job=cur.job_id, reason=cur.reason, holds=holds, fate=cur.fate
    )
