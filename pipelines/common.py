"""What every command shares: quiet logs, one-line errors, the summary (the output directory: transforms.output.outdir)."""

from __future__ import annotations

import argparse
import atexit
import difflib
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable

from tfrecord_etl._install import pip_install
from tfrecord_etl.pipelines import errorlines, resume_gc, running
from tfrecord_etl.pipelines.errorlines import MEMORY_ERROR_LINE
from tfrecord_etl.pipelines.running import local_runner, print_metrics, run_pipeline  # noqa: F401 - the commands call them through common
from tfrecord_etl.pipelines.workers import (  # noqa: F401
    WORKER_DIED_LINE,
    dead_worker_signals,
    died_line,
    mark_stopping,
    quiet_worker_threads as _quiet_worker_threads,
    stop_worker_processes,
    stopped_count,
)
from tfrecord_etl.transforms import codec, compression
from tfrecord_etl.transforms.errors import ConfigError, EtlError, printable
from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.output.runtime import RESUME_NOTES
from tfrecord_etl.transforms.storage import fileio, gcsaccess, remote as remote_store


def quiet_logs(verbose: bool) -> None:
    """Keeps TensorFlow's and Beam's logs out of the default output; ``--verbose`` shows them."""
    if verbose:
        os.environ["TFRECORD_ETL_VERBOSE"] = "1"
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return
    # an earlier --verbose run in this process (the API, a test) must not make this one verbose
    os.environ.pop("TFRECORD_ETL_VERBOSE", None)
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
    """Runs ``main`` and turns our errors (raised directly or from inside a Beam worker) into one line; when the
    failed run kept shards it committed for ``--resume``, a last line says so."""
    RESUME_NOTES.clear()
    code = _run_main(main, argv)
    if code and RESUME_NOTES:
        print(f"[tfrecord-etl] {RESUME_NOTES[-1]}", file=sys.stderr)
    return code


def _run_main(main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    running.LAST_RUN_LOG = None  # an earlier in-process run's log must not be named on this run's error line
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
    except KeyboardInterrupt as e:  # Ctrl-C: the lock is released on the way here, so no worker commits after it
        mark_stopping()
        _quiet_worker_threads()
        stopped = stop_worker_processes() or stopped_count()  # (the pipeline's failure may have stopped them)
        job = getattr(e, running.JOB_NOTE, None)  # a cluster's job: cancelled, and what the cluster says of it
        print(
            f"error: {INTERRUPTED_LINE}"
            + (f" ({stopped} worker process{'es' if stopped > 1 else ''} stopped)" if stopped else "")
            + (f" (the runner's job cancelled: {job})" if job else ""),
            file=sys.stderr,
        )
        return INTERRUPTED
    except Exception as e:  # Beam may wrap a worker's error; find ours in the chain or in its text
        if isinstance(e, ImportError):  # the reader's install: e.g. verify --source reads the inputs with h5py
            line = missing_pipelines_line(e, f"tfrecord-etl {getattr(main, '__module__', '').rpartition('.')[2]}")
            if line is not None:
                print(f"error: {line}", file=sys.stderr)
                return 2
        inner = errorlines.find_etl_error(e)
        line = (
            f"{type(inner).__name__}: {inner}"
            if inner is not None
            else errorlines.job_server_lost_line(e) or errorlines.etl_error_line(errorlines.runner_messages_text(e))
        )
        if line is None:
            line = errorlines.output_error_line(e, errorlines.flag_value(argv, "--output_dir"))
        if line is None and errorlines.worker_died(e):
            signals = dead_worker_signals()
            line = died_line(signals[0] if signals else None)
            mark_stopping()
            _quiet_worker_threads()
            stop_worker_processes()
        if line is None:
            line = errorlines.runner_job_failed_line(e)
        if line is None:
            line = errorlines.store_error_line(e, errorlines.flag_value(argv, "--output_dir"))
        if line is None:
            raise
        log = f" [runner log: {running.LAST_RUN_LOG}; --verbose shows it live]" if running.LAST_RUN_LOG else ""
        print(f"error: {line}{log}", file=sys.stderr)
        return 2


INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it)
INTERRUPTED_LINE = (
    "OutputError: Interrupted: the run stopped before its commit, so the output directory holds "
    "what it held before (an output being replaced is still complete). Hint: run the command again"
)


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
            # deferred: Beam and pydantic (config); verify and inspect parse their flags without them
            from tfrecord_etl.transforms.config import split_beam_flags

            args, _ = split_beam_flags(
                sys.argv[1:] if args is None else args, [o for a in self._actions for o in a.option_strings]
            )
        return super().parse_known_args(args, namespace)

    def error(self, message):
        m = re.search(r"unrecognized arguments: (--[\w-]+)", message)
        if m:
            known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            close = difflib.get_close_matches(m.group(1), known, n=1, cutoff=0.75)
            message = f"unknown flag {m.group(1)}" + (f" (did you mean {close[0]}?)" if close else "")
        raise ConfigError(message, hint=f"{self.prog} --help lists every flag")


def add_record_limit_flags(parser: argparse.ArgumentParser) -> None:
    """``--max_record_mb`` and ``--max_features``: the limits on hostile TFRecord files (verify, inspect)."""
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
    (:func:`tfrecord_etl.transforms.storage.gcsaccess.check`: a few seconds at most, not a 2-minute hang).

    Beam only does this when a ``Pipeline`` is constructed, but the launcher matches, indexes and cleans
    inputs and outputs before that: without it an ``s3://`` path fails with "Must provide one of client or
    options". Unknown flags are ignored; the options are parsed lazily, by the filesystem that needs them.

    Raises:
      ConfigError: Google Cloud Storage (or the emulator, or the proxy) cannot be reached for a gs:// path.
    """
    argv = [str(a) for a in beam_argv if str(a) not in ("-h", "--help")]
    remote_store.store_retries()  # S3 clients made from here on retry a burst of 503 SlowDown
    remote = []
    if len(argv) == len(beam_argv) and any("gs://" in a.lower() for a in [*argv, *map(str, paths)]):  # not --help
        remote = gcsaccess.gcs_paths([*argv, *(str(p) for p in paths if p)])
        gcsaccess.check(remote, argv)
    try:
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:  # the reader's install (verify, inspect): no Beam options; see transforms/storage/lightfs.py
        return
    options = PipelineOptions(argv)
    FileSystems.set_options(options)
    if not gcsaccess.anonymous_where_no_credentials_apply(options) and remote:
        gcsaccess.search_credentials(remote, argv)


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
