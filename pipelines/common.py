"""What every command shares: quiet logs, one-line errors, the summary (the output directory: transforms.output.outdir)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable

from tfrecord_etl._install import pip_install
from tfrecord_etl.pipelines import gcsaccess, resume_gc
from tfrecord_etl.pipelines.gcsaccess import connect_to_gcs_anonymously  # re-exported
from tfrecord_etl.pipelines.workers import (  # noqa: F401
    WORKER_DIED_LINE,
    dead_worker_signals,
    died_line,
    mark_stopping,
    quiet_worker_threads as _quiet_worker_threads,
    stop_worker_processes,
    stopped_count,
)
from tfrecord_etl.transforms import compression
from tfrecord_etl.transforms.errors import ConfigError, EtlError, printable


def quiet_logs(verbose: bool) -> None:
    """Keeps TensorFlow's and Beam's logs out of the default output; ``--verbose`` shows them."""
    if verbose:
        os.environ["TFRECORD_ETL_VERBOSE"] = "1"
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    for name in ("apache_beam", "absl", "tensorflow"):  # a worker's failure comes back as our one line
        logging.getLogger(name).setLevel(logging.CRITICAL)
    logging.getLogger("tfrecord_etl").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")


# the import names of the pipelines' dependencies (setup.py's "beam" extra): `pip install .` alone brings
# the reader's (NumPy, google-crc32c), with which verify and inspect run and convert and augment cannot
PIPELINE_MODULES = (
    "apache_beam",
    "tensorflow",
    "tfx_bsl",
    "tensorflow_metadata",
    "pyarrow",
    "h5py",
    "hdf5plugin",
    "pydantic",
    "yaml",
    "scipy",
    "tqdm",
)


def missing_pipelines_line(error: ImportError, what: str) -> str | None:
    """The one-line error for ``what`` (a command) failing on an ImportError of one of :data:`PIPELINE_MODULES`
    (says which and what to install); None for any other ImportError."""
    missing = (getattr(error, "name", None) or "").split(".")[0]
    if missing not in PIPELINE_MODULES:
        return None
    return f"{what} needs the pipeline dependencies ({missing} is not installed): {pip_install('beam')}"


# setup.py's WORKER_ENV: an sdist built while it is 1 (Beam's stager building --setup_file's sdist in the launcher)
# installs the pipelines' requirements without extras, as Dataflow workers install it
WORKER_SDIST_ENV = "TFRECORD_ETL_WORKER_SDIST"


def run_main(main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Runs ``main`` and turns our errors (raised directly or from inside a Beam worker) into one line."""
    global LAST_RUN_LOG
    LAST_RUN_LOG = None  # an earlier in-process run's log must not be named on this run's error line
    argv = sys.argv[1:] if argv is None else argv
    resume_gc()  # the command's imports are done (see pipelines/__init__.py)
    os.environ.setdefault(WORKER_SDIST_ENV, "1")  # an sdist Beam builds from setup.py here is for the workers
    quiet_logs("--verbose" in argv)
    try:
        configure_filesystems(argv)  # gs:// paths on the command line: reachable, or one line at once
        return main(argv)
    except EtlError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"error: {MEMORY_ERROR_LINE}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout's reader went away (`convert ... | head -1`): no traceback, exit status 1
        return _stdout_closed()
    except KeyboardInterrupt:  # Ctrl-C: the lock is released on the way here, so no worker commits after it
        mark_stopping()
        _quiet_worker_threads()
        stopped = stop_worker_processes() or stopped_count()  # (the pipeline's failure may have stopped them)
        print(
            f"error: {INTERRUPTED_LINE}"
            + (f" ({stopped} worker process{'es' if stopped > 1 else ''} stopped)" if stopped else ""),
            file=sys.stderr,
        )
        return INTERRUPTED
    except Exception as e:  # Beam may wrap a worker's error; find ours in the chain or in its text
        if isinstance(e, ImportError):  # the reader's install: e.g. verify --source reads the inputs with h5py
            line = missing_pipelines_line(e, f"tfrecord-etl {getattr(main, '__module__', '').rpartition('.')[2]}")
            if line is not None:
                print(f"error: {line}", file=sys.stderr)
                return 2
        inner = _find_etl_error(e)
        line = f"{type(inner).__name__}: {inner}" if inner is not None else _etl_error_line(str(e))
        if line is None:
            line = _output_error_line(e, _flag_value(argv, "--output_dir"))
        if line is None and _worker_died(e):
            signals = dead_worker_signals()
            line = died_line(signals[0] if signals else None)
            mark_stopping()
            _quiet_worker_threads()
            stop_worker_processes()
        if line is None:
            line = _runner_job_failed_line(e)
        if line is None:
            raise
        log = f" [runner log: {LAST_RUN_LOG}; --verbose shows it live]" if LAST_RUN_LOG else ""
        print(f"error: {line}{log}", file=sys.stderr)
        return 2


INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it)
INTERRUPTED_LINE = (
    "OutputError: Interrupted: the run stopped before its commit, so the output directory holds "
    "what it held before (an output being replaced is still complete). Hint: run the command again"
)
# what Beam's runners raise when a worker process (DirectRunner multi_processing, a portable worker) went away
_WORKER_GONE = ("Channel closed prematurely",)


# what Beam's PortableRunner raises when the job fails in the runner itself (a Flink or Spark job server): a lost
# TaskManager or executor with no restart left, a killed JobManager
_JOB_FAILED = re.compile(r"^Pipeline (\S+) failed in state (FAILED|CANCELLED|UNKNOWN): ?(.*)", re.S)
JOB_FAILED_LINE = "OutputError: The runner's job {job} ended in state {state}: {why}; {holds}. Hint: {hint}"
_RESTART_HINT = (
    "on a cluster, give the runner a restart strategy (Flink: restart-strategy: fixed-delay) so that a "
    "lost worker is retried"
)
# what the output directory holds after the failed job (the lock's cleanup checks the commit point first:
# runlock.OUTPUT_STATE); a runner may report a job failed after its workers finished it, commit included
_JOB_FAILED_HOLDS = {
    "this run": (
        "its commit ran before the failure: this run's output was committed and is complete",
        f"check it with tfrecord-etl verify; {_RESTART_HINT}",
    ),
    "previous": ("nothing was committed: the previous output is complete", f"run again; {_RESTART_HINT}"),
    "none": ("nothing was committed: the output directory holds no output", f"run again; {_RESTART_HINT}"),
    None: ("nothing was committed, so the output directory holds what it held before", f"run again; {_RESTART_HINT}"),
}


def _runner_job_failed_line(e: BaseException) -> str | None:
    """One line for a job the runner failed (``Pipeline NAME failed in state FAILED: <the runner's message>``),
    saying which output the directory holds (``runlock.OUTPUT_STATE``, set by the run's cleanup)."""
    match = _JOB_FAILED.match(str(e).strip())
    if match is None:
        return None
    why = " ".join(match.group(3).split()).rstrip(".") or "no reason given"
    from tfrecord_etl.transforms.output.runlock import OUTPUT_STATE

    holds, hint = _JOB_FAILED_HOLDS.get(getattr(e, OUTPUT_STATE, None), _JOB_FAILED_HOLDS[None])
    return JOB_FAILED_LINE.format(job=match.group(1), state=match.group(2), why=why[:300], holds=holds, hint=hint)


def _worker_died(e: BaseException) -> bool:
    text = "".join(str(x) for x in (e, e.__cause__, e.__context__) if x is not None)
    return any(marker in text for marker in _WORKER_GONE)


def exit_process(code: int):
    """Ends a command's process with exit status ``code``, skipping CPython's teardown where that is safe.

    Why: once Beam is imported (about 2,000 modules), the interpreter's finalization (clearing every module and a
    last full garbage collection) takes about 0.45 s of wall and CPU on this project's 2-core machine kind, after
    the output is committed: measured as the time from the last statement to the process's end, 0.46-0.48 s with
    ``import apache_beam`` against 0.02-0.04 s with only NumPy and h5py (docs/performance.md, "Laptop-sized jobs").
    Nothing of ours needs it: every file is closed and committed before ``main`` returns.

    What still runs: the ``atexit`` handlers (logging's flush, multiprocessing's and Beam's clean-ups, temporary
    files registered there), then stdout and stderr are flushed, then ``os._exit(code)``. While any non-daemon
    thread other than the main one is alive (a thread pool not shut down), the normal exit is taken instead, so
    such threads are joined as Python would join them; after a Ctrl-C (``code`` 130) the process ends at once, as
    the interrupted pipeline's threads would never end. Only for the ``__main__`` of a command and the console
    script: ``run_main`` and the commands' ``main`` return their code for callers in the same process.
    """
    import atexit
    import threading

    if code == INTERRUPTED:  # the interrupted pipeline's threads would never end: no join, no clean-ups
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        raise SystemExit(code)
    atexit._run_exitfuncs()  # the handlers Python's own exit would run; private name, stable since Python 3.0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``) or a closed stream: nothing more to say
            pass
    os._exit(code)


def _stdout_closed() -> int:
    """Python's recipe for a closed pipe (https://docs.python.org/3/library/signal.html#note-on-sigpipe): what is
    left for stdout goes to /dev/null, so the exit flush cannot fail again; one line on stderr; status 1."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    try:
        print(
            "error: the reader of standard output went away (a pipe such as `| head`), so the command stopped "
            "where it was printing (convert and augment print after their output is committed). Hint: redirect "
            "stdout to a file, or pipe it into a reader that reads it all",
            file=sys.stderr,
        )
    except OSError:
        pass
    return 1


def _have_beam() -> bool:
    """Whether Apache Beam is installed (not with the reader's install alone: no Beam flags to drop then)."""
    from tfrecord_etl.transforms.storage import fileio

    return fileio._beam_filesystems() is not None


class CommandParser(argparse.ArgumentParser):
    """The parser of a command without Beam flags (verify, inspect): a bad or unknown flag is a one-line
    ConfigError (exit 2 through ``run_main``), with a suggestion for a misspelled flag.

    ``ignore_beam_flags=True``: the flags Beam's ``PipelineOptions`` know (``--runner``, ``--labels``, ...) and are
    not the command's own are dropped before parsing (``config.split_beam_flags``), for a command that a Beam
    launcher such as Airflow's ``BeamRunPythonPipelineOperator`` starts; every other unknown flag is refused.
    """

    def __init__(self, *args, ignore_beam_flags: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.ignore_beam_flags = ignore_beam_flags

    def parse_known_args(self, args=None, namespace=None):
        if self.ignore_beam_flags and _have_beam():
            from tfrecord_etl.transforms.config import split_beam_flags

            args, _ = split_beam_flags(
                sys.argv[1:] if args is None else args, [o for a in self._actions for o in a.option_strings]
            )
        return super().parse_known_args(args, namespace)

    def error(self, message):
        import difflib
        import re

        m = re.search(r"unrecognized arguments: (--[\w-]+)", message)
        if m:
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            close = difflib.get_close_matches(m.group(1), known, n=1, cutoff=0.75)
            message = f"unknown flag {m.group(1)}" + (f" (did you mean {close[0]}?)" if close else "")
        raise ConfigError(message, hint=f"{self.prog} --help lists every flag")


def add_record_limit_flags(parser: argparse.ArgumentParser) -> None:
    """``--max_record_mb`` and ``--max_features``: the limits on hostile TFRecord files (verify, inspect)."""
    from tfrecord_etl.transforms import codec
    from tfrecord_etl.transforms.output import tfrecord

    parser.add_argument(
        "--max_record_mb",
        type=float,
        default=tfrecord.MAX_RECORD_MB,
        help="limit on one record in MiB (2**20 bytes), checked on its length header before it is read "
        f"(default: {tfrecord.MAX_RECORD_MB:g}; protobuf's own limit is 2048)",
    )
    parser.add_argument(
        "--max_features",
        type=int,
        default=codec.MAX_FEATURES,
        help="limit on the features of one record and on the distinct feature names inferred "
        f"from files without metadata (default: {codec.MAX_FEATURES})",
    )


def record_limits(args) -> tuple[int, int]:
    """``(max record bytes, max features)`` from the flags of :func:`add_record_limit_flags`.

    Raises:
      ConfigError: ``--max_record_mb`` outside (0, 2047] or ``--max_features`` below 1.
    """
    from tfrecord_etl.transforms.output import tfrecord

    if not 0 < args.max_record_mb <= 2047 or args.max_features < 1:
        raise ConfigError(
            "--max_record_mb must be in (0, 2047] and --max_features at least 1",
            hint=f"got --max_record_mb {args.max_record_mb}, --max_features {args.max_features}",
        )
    return tfrecord.record_limit(args.max_record_mb), args.max_features


def configure_filesystems(beam_argv: list[str], paths=()) -> None:
    """Gives Beam's ``FileSystems`` the pipeline options (``--s3_endpoint_url``, ``--s3_access_key_id``,
    ``--s3_region_name``, GCS project/credentials options, ...) before any file is touched, and checks that the
    gs:// paths among ``beam_argv`` and ``paths`` (a config file's ``input``, ``output_dir``, ...) can be reached
    (:func:`tfrecord_etl.pipelines.gcsaccess.check`: a few seconds at most, not a 2-minute hang).

    Beam only does this when a ``Pipeline`` is constructed, but the launcher matches, indexes and cleans
    inputs and outputs before that: without it an ``s3://`` path fails with "Must provide one of client or
    options". Unknown flags are ignored; the options are parsed lazily, by the filesystem that needs them.

    Raises:
      ConfigError: Google Cloud Storage (or the emulator, or the proxy) cannot be reached for a gs:// path.
    """
    argv = [str(a) for a in beam_argv if str(a) not in ("-h", "--help")]
    remote = []
    if len(argv) == len(beam_argv) and any("gs://" in a.lower() for a in [*argv, *map(str, paths)]):  # not --help
        remote = gcsaccess.gcs_paths([*argv, *(str(p) for p in paths if p)])
        gcsaccess.check(remote, argv)
    try:
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:  # the reader's install (verify, inspect): no Beam options; see transforms/storage/lightfs.py
        return
    FileSystems.set_options(PipelineOptions(argv))
    if os.environ.get("STORAGE_EMULATOR_HOST") or "--no_auth" in argv:
        connect_to_gcs_anonymously()
    elif remote:
        gcsaccess.search_credentials(remote, argv)


_ERROR_NAMES = (
    "ConfigError",
    "InputChangedError",
    "SourceError",
    "SchemaError",
    "RecordError",
    "IncompleteOutputError",
    "OutputError",
)


def _etl_error_line(text: str) -> str | None:
    """Our error's ``Name: message`` line from a remote traceback's text (Beam's multi_processing and
    portable runners re-raise a worker's error as a RuntimeError holding only the traceback text)."""
    import re

    found = None
    for line in text.splitlines():
        m = re.match(rf"^\s*(?:[\w.]+\.)?({'|'.join(_ERROR_NAMES)}): (.*)$", line)
        if m:
            found = f"{m.group(1)}: {m.group(2)}"
    return found


# errno of an output that cannot be written -> what to do about it
_OUTPUT_ERRNOS = {
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


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``argv`` (``--flag value`` or ``--flag=value``), else None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
    return found


def _output_error_line(e: BaseException, output_dir: str | None = None) -> str | None:
    """``OutputError: <strerror> writing '<path>'. Hint: ...`` for an OSError of an unwritable output
    (disk full, quota, read-only, permission, a file where a directory should be), raised directly, in the
    exception chain, or in the text of a Beam-wrapped worker error (``OSError: [Errno 28] No space left on
    device: '/path'``); a MemoryError likewise. None for anything else. When the error names no file,
    the line names ``output_dir`` (the command's ``--output_dir``) instead."""
    import re

    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MemoryError):
            return MEMORY_ERROR_LINE
        if isinstance(cur, OSError) and cur.errno in _OUTPUT_ERRNOS:
            path = cur.filename if cur.filename is not None else "?"
            return _output_line(cur.errno, cur.strerror or os.strerror(cur.errno), str(path), output_dir)
        cur = cur.__cause__ or cur.__context__
    text = str(e)
    found = None
    for m in re.finditer(
        r"(?:OSError|IOError|PermissionError|FileNotFoundError|NotADirectoryError|"
        r"IsADirectoryError|[\w.]*Error): \[Errno (\d+)\] ([^:\n\[\]]+)(?:: '([^'\n]*)')?",
        text,
    ):
        code = int(m.group(1))
        if code in _OUTPUT_ERRNOS:
            found = _output_line(code, m.group(2).strip(), m.group(3) or "?", output_dir)
    if found is None and re.search(r"^\s*MemoryError\b", text, re.M):
        return MEMORY_ERROR_LINE
    if found is None and re.search(r"No space left on device", text):
        found = _output_line(errno.ENOSPC, os.strerror(errno.ENOSPC), "?", output_dir)
    return found


def _output_line(code: int, strerror: str, path: str, output_dir: str | None = None) -> str:
    where = (
        f" writing {path!r}"
        if path != "?"
        else f" writing into --output_dir {output_dir!r}"
        if output_dir
        else " writing the output"
    )
    return f"OutputError: {strerror}{where} (errno {errno.errorcode.get(code, code)}). Hint: {_OUTPUT_ERRNOS[code]}"


def _find_etl_error(e: BaseException | None):
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, EtlError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def print_summary(output_dir: str, meta: dict, seconds: float, extra: dict | None = None) -> None:
    shards = meta["shards"]
    total_bytes = sum(s["bytes"] for s in shards)
    n = meta["num_records"]
    chosen = meta.get("compression_backend")  # gzip/zlib: the library that compressed them, its version and level
    backend = f" through {compression.label(chosen)}" if chosen else ""
    print(
        f"wrote {n} examples in {len(shards)} shards, {total_bytes} bytes "
        f"({meta['compression']}{backend}) to {printable(output_dir)} in {seconds:.1f} s ({n / max(seconds, 1e-9):,.0f} examples/s)"
    )
    for key, value in (extra or {}).items():
        print(f"  {key}: {value}")


def preload_tensorflow() -> None:
    """Imports TensorFlow with its C++ start-up chatter (absl, oneDNN, CUDA probes) sent to /dev/null.

    TF_CPP_MIN_LOG_LEVEL does not silence the lines printed before absl's logging starts.
    """
    if "tensorflow" in sys.modules or os.environ.get("TFRECORD_ETL_VERBOSE"):
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def show_progress(setting: bool | None) -> bool:
    """Progress lines on stderr: as configured, else when stderr is a terminal."""
    return sys.stderr.isatty() if setting is None else setting


WORK_SPAN_MS = "work_span_ms"
from tfrecord_etl.transforms.localmode import DIRECT_NAMES  # noqa: E402 - the one list of DirectRunner's names


def local_runner(options):
    """The runner a command builds its pipeline with: for DirectRunner (named or by default), Beam's FnApiRunner
    itself, given the pipeline options as DirectRunner gives them; None (the runner named in ``options``) else.

    Why: in Beam 2.77 DirectRunner first tries the Prism runner, which downloads a binary at run time; offline
    (CI, this project's tests and benchmark) that fails and DirectRunner falls back to the FnApiRunner with
    ``--direct_running_mode`` / ``--direct_num_workers``, but on a connected laptop the download succeeds and the
    pipeline would run on Prism instead, untested and with other parallelism. Running the FnApiRunner directly
    makes the local runner the one that is tested (apache_beam/runners/direct/direct_runner.py,
    ``SwitchingDirectRunner.run_pipeline``).
    """
    from apache_beam.options.pipeline_options import StandardOptions

    if options.view_as(StandardOptions).runner not in DIRECT_NAMES:
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(
        provision_info=fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    )


def run_pipeline(p) -> dict[str, int]:
    """Runs ``p`` to completion and returns our Beam metrics counters ({} where the runner has none),
    plus ``work_span_ms``: from the first shard writer's start to the last one's end, in ms (the run's
    work without start-up, planning and tear-down), when the runner reports distributions.

    Unless ``--verbose``, the stderr of the run (Beam's worker processes log their tracebacks there)
    goes to a log file; our progress lines are echoed live, and a failure ends as one line naming it.
    """
    from tfrecord_etl.pipelines import workers

    workers.install()  # a worker process that dies fails the run at once
    workers.forget_deaths()
    workers.quiet_worker_threads()  # Beam's threads' reports of workers we stop stay off stderr
    with _worker_stderr_to_log(), workers.interrupts_mark_stopping():
        try:
            result = p.run()
            result.wait_until_finish()
        except BaseException:  # an error, a dead worker, Ctrl-C: no worker process outlives the failed run
            workers.mark_stopping()
            workers.stop_worker_processes()
            raise
    try:
        from apache_beam.metrics.metric import MetricsFilter

        from tfrecord_etl.transforms.beam_io import NAMESPACE

        queried = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except Exception:  # noqa: BLE001 - e.g. DaskRunner implements no metrics
        return {}
    out: dict[str, int] = {}
    for c in queried["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    from tfrecord_etl.transforms.beam_io import SHARD_END_MS, SHARD_START_MS

    starts, ends = [], []
    for d in queried.get("distributions", ()):
        value = d.committed if d.committed is not None else d.attempted
        if value is None or not value.count:
            continue
        if d.key.metric.name == SHARD_START_MS:
            starts.append(value.min)
        elif d.key.metric.name == SHARD_END_MS:
            ends.append(value.max)
    if starts and ends:
        out[WORK_SPAN_MS] = max(0, max(ends) - min(starts))
    return out


def print_metrics(counters: dict[str, int], records: int | None = None) -> None:
    """A table of the run's Beam metrics counters (nothing where the runner reports none), then the work
    span (first shard started to last shard written) and ``records`` per second of it."""
    counters = dict(counters)
    span_ms = counters.pop(WORK_SPAN_MS, None)
    if not counters:
        return
    print("Beam metrics:")
    width = max(len(k) for k in counters)
    for name in sorted(counters):
        print(f"  {name:<{width}}  {counters[name]:>14,}")
    if span_ms is not None:
        rate = f", {records / (span_ms / 1000):,.0f} records/s" if records and span_ms else ""
        print(f"work span: {span_ms / 1000:.3f} s (first shard started to last shard written{rate})")


class _worker_stderr_to_log:
    """Sends file descriptor 2 (inherited by Beam's worker processes) to a temporary log file and echoes
    our ``[tfrecord-etl]`` progress lines from it to the real stderr while the pipeline runs."""

    def __enter__(self):
        import tempfile
        import threading

        self.active = not os.environ.get("TFRECORD_ETL_VERBOSE")
        if not self.active:
            return self
        sys.stderr.flush()
        self.log = tempfile.NamedTemporaryFile(prefix="tfrecord-etl-", suffix=".log", delete=False)
        self.saved = os.dup(2)
        os.dup2(self.log.fileno(), 2)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._echo, daemon=True)
        self.thread.start()
        return self

    def _echo(self):
        with open(self.log.name, "rb") as f:
            pending = b""
            while True:
                chunk = f.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.startswith(b"[tfrecord-etl]"):
                            os.write(self.saved, line + b"\n")
                elif self.done.is_set():
                    return
                else:
                    self.done.wait(0.2)

    def __exit__(self, *exc):
        if not self.active:
            return False
        sys.stderr.flush()
        self.done.set()
        self.thread.join(timeout=5)
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.log.close()
        global LAST_RUN_LOG
        if exc[0] is None or not _more_than_progress(self.log.name):  # nothing to show: no file left in /tmp
            os.unlink(self.log.name)
        else:
            LAST_RUN_LOG = self.log.name
        return False


def _more_than_progress(path: str) -> bool:
    """True when the runner log ``path`` holds a line besides our ``[tfrecord-etl]`` lines (already echoed to
    stderr): a worker's traceback or a library's warning. Reads up to the first such line."""
    with open(path, "rb") as f:
        return any(line.strip() and not line.startswith(b"[tfrecord-etl]") for line in f)


LAST_RUN_LOG: str | None = None  # the runner log of a failed run, named on the error line
