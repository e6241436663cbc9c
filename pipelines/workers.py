"""The launcher's Beam worker processes (DirectRunner ``--direct_running_mode multi_processing``; Beam's FnApiRunner
starts one SDK worker process per ``--direct_num_workers``): a worker that dies ends the run at once, and every
worker process is stopped before a failed or interrupted launcher exits.

Why: Beam 2.77's ``SubprocessSdkWorkerHandler`` starts each worker through a shell (``/bin/sh -c python -m
apache_beam.runners.worker.sdk_worker_main``) on a thread that raises when the process exits with a non-zero status
(``local_job_service.SubprocessSdkWorker.run``), and nothing else looks at that: the launcher keeps waiting on the
gRPC control stream for the answer to the bundle the dead worker was running, forever (a worker killed while it
wrote a shard hung the launcher for as long as it was let run). Stopping the workers after a Ctrl-C stopped the
shells, and their worker processes lived on.

What :func:`install` changes: the handler of Beam's ``beam:env:harness_subprocess_python:v1`` environment is
:class:`WatchedSubprocessWorkerHandler` (registered with Beam's own ``WorkerHandler.register_environment``). It
starts the worker with ``exec`` (the worker process is the launcher's child, so stopping the children stops the
workers), and when a worker exits with a non-zero status while the run goes on, every instruction the launcher sent
it and every later one is answered with our error (:data:`WORKER_DIED_LINE`): the bundle fails as a bundle whose
worker reported an error does (Beam's bundle loop polls for that answer every second), and the run ends in one line
within a few seconds (the bundle's failure, then Beam's gRPC servers stopped). The model is Beam's ``DockerSdkWorkerHandler.watch_container``, which fails the control
connection of a container that stopped.
"""

from __future__ import annotations

import os
import re
import signal
import sysconfig
import threading
import time
import traceback
import weakref

WORKER_DIED_LINE = (
    "OutputError: A worker process died{how}: killed, or out of memory; nothing was committed, so the "
    "output directory holds what it held before. Hint: run again; if it happens again, pass fewer "
    "--direct_num_workers or a smaller --target_range_mb"
)

STOP_WAIT_SECONDS = 10.0  # how long stopping a worker waits for its process to exit before killing it
_deaths: list[int] = []  # the signal (or exit status) of each worker process that died while its run went on
_deaths_lock = threading.Lock()
_SHELL_SYNTAX = re.compile(rb"[;&|<>()$`\\\n*?\[\]{}~#'\"]")


def died_signals() -> list[int]:
    """The signals that ended worker processes of this launcher while their run went on (exit statuses for a
    worker that exited on its own with a non-zero one), in the order they died."""
    with _deaths_lock:
        return list(_deaths)


def forget_deaths() -> None:
    """Clears :func:`died_signals` and :func:`stopped_count` (a new run in the same process)."""
    global _stopped
    _stopping.clear()
    with _deaths_lock:
        _deaths.clear()
        _stopped = 0


_stopped = 0  # worker processes stopped by stop_worker_processes since the run began


def stopped_count() -> int:
    """How many worker processes :func:`stop_worker_processes` stopped since the run began."""
    return _stopped


def _signal_of(returncode: int) -> int:
    """The signal from a worker's exit status: ``-N`` (killed by signal N), ``128 + N`` (a shell reporting its child
    killed by signal N), else the status itself."""
    return -returncode if returncode < 0 else returncode - 128 if returncode > 128 else returncode


def died_line(sig: int | None) -> str:
    """:data:`WORKER_DIED_LINE` naming ``sig``: ``(signal 9)``, or the exit status of a worker that exited on its
    own."""
    if not sig:
        how = ""
    elif 0 < sig < signal.NSIG and sig != 1:
        how = f" (signal {sig})"
    else:
        how = f" (exit status {sig})"
    return WORKER_DIED_LINE.format(how=how)


class _AnsweringConnection:
    """A worker handler's control connection (Beam's ``ControlConnection``) that can answer for a dead worker:
    after :meth:`fail`, every instruction pushed before (not answered yet) and after gets an
    ``InstructionResponse`` whose ``error`` is the given line. Everything else is the wrapped connection's."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()
        self._pending = weakref.WeakSet()  # futures of instructions sent; the bundle loop holds those it waits on
        self._error: str | None = None

    def push(self, req):
        from apache_beam.runners.portability.fn_api_runner import worker_handlers

        if req is worker_handlers.BeamFnControlServicer._DONE_MARKER:
            return self._conn.push(req)
        with self._lock:
            if self._error is None:
                future = self._conn.push(req)
                self._pending.add(future)
                return future
        return worker_handlers.ControlFuture(req.instruction_id or "failed", self._answer(req.instruction_id))

    def _answer(self, instruction_id: str):
        from apache_beam.portability.api import beam_fn_api_pb2

        return beam_fn_api_pb2.InstructionResponse(instruction_id=instruction_id, error=self._error)

    def fail(self, error: str) -> None:
        """Answers every instruction sent and not answered, and every later one, with ``error``."""
        with self._lock:
            self._error = error
            pending = list(self._pending)
        for future in pending:
            if not future.is_done():
                future.set(self._answer(future.instruction_id))

    def __getattr__(self, name):
        return getattr(self._conn, name)


def _handler_class():
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    class WatchedSubprocessWorkerHandler(worker_handlers.SubprocessSdkWorkerHandler):
        """Beam's ``SubprocessSdkWorkerHandler`` whose worker process is the launcher's child (``exec``) and whose
        death fails the run at once (see the module's docstring)."""

        def __init__(self, worker_command_line, state, provision_info, grpc_server):
            super().__init__(worker_command_line, state, provision_info, grpc_server)
            self.control_conn = _AnsweringConnection(self.control_conn)
            self._stopping = False

        def start_worker(self):
            command = self._worker_command_line
            if not _SHELL_SYNTAX.search(command):  # one plain command: the shell becomes the worker
                command = b"exec " + command
            self.worker = local_job_service.SubprocessSdkWorker(
                command, self.control_address, self.provision_info, self.worker_id
            )
            self.worker_thread = threading.Thread(name="run_worker", target=self._run, daemon=True)
            self.worker_thread.start()

        def _run(self):
            try:
                self.worker.run()
            except RuntimeError as e:  # "Worker subprocess exited with return code N"
                m = re.search(r"return code (-?\d+)", str(e))
                if m is None or self._stopping:
                    return
                sig = _signal_of(int(m.group(1)))
                with _deaths_lock:
                    _deaths.append(sig)
                mark_stopping()
                self.control_conn.fail(died_line(sig))

        def stop_worker(self):
            """Beam's ``stop_worker`` joins the thread that waits for the worker process, with no bound: a worker
            that never finishes exiting (seen under load: an h5py object freed at interpreter shutdown waiting for
            h5py's lock, held by a thread the shutdown had stopped) hung the launcher after its run had ended or
            failed. Here the wait is bounded (:data:`STOP_WAIT_SECONDS`), then the worker process is killed."""
            self._stopping = True
            self.worker_thread.join(STOP_WAIT_SECONDS)
            if self.worker_thread.is_alive():
                for pid in worker_pids(self.worker_id):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            super().stop_worker()

    return WatchedSubprocessWorkerHandler


_installed = False


def install() -> None:
    """Makes Beam's FnApiRunner in this process start its subprocess workers with
    :class:`WatchedSubprocessWorkerHandler` (idempotent; does nothing when Beam's worker handlers change shape)."""
    global _installed
    if _installed:
        return
    try:
        from apache_beam.portability import python_urns
        from apache_beam.runners.portability.fn_api_runner import worker_handlers

        worker_handlers.WorkerHandler.register_environment(python_urns.SUBPROCESS_SDK, bytes)(_handler_class())
    except (ImportError, AttributeError):
        return
    _installed = True


# ---------------------------------------------------------------- the launcher's worker processes, from /proc


def quiet_worker_threads() -> None:
    """Beam's threads in the launcher report workers stopped by us with tracebacks on stderr: the worker-watching
    thread (``run_worker``: "Worker subprocess exited") always, and once a run is stopping (:func:`mark_stopping`:
    a Ctrl-C, a dead worker, any failure) the gRPC threads that read the workers' control and data streams
    (``beam_control_read``, ``read_grpc_client_inputs``) when those streams are cut. Those reports are dropped; every
    other thread's exception, and any exception raised outside Beam's and gRPC's own code, still prints. Idempotent."""
    previous = threading.excepthook
    if getattr(previous, "quiets_workers", False):  # installed already
        return

    def hook(args):
        if (
            args.thread is not None
            and args.thread.name == "run_worker"
            and "Worker subprocess exited" in str(args.exc_value)
        ):
            return
        if _stopping.is_set() and _raised_in_beam_threads(args.exc_traceback):
            return
        previous(args)

    hook.quiets_workers = True
    threading.excepthook = hook


_stopping = threading.Event()  # set while a run of this process is being stopped (see quiet_worker_threads)


def mark_stopping() -> None:
    """Says that this process's run is ending on an interrupt or a failure: from now on Beam's stream-reading threads
    that fail because their worker went away are quiet (:func:`quiet_worker_threads`)."""
    _stopping.set()


def _raised_in_beam_threads(tb) -> bool:
    """True when every frame of ``tb`` is in Beam, gRPC or the standard library (a thread of Beam's runner failing
    on a closed stream), so no code of ours, and no user code, is being silenced."""
    stdlib = sysconfig.get_paths()["stdlib"]
    frames = traceback.extract_tb(tb) if tb is not None else []
    marks = (f"{os.sep}apache_beam{os.sep}", f"{os.sep}grpc{os.sep}")
    return bool(frames) and all(any(m in f.filename for m in marks) or f.filename.startswith(stdlib) for f in frames)


class interrupts_mark_stopping:
    """While a run goes on in the main thread, Ctrl-C (SIGINT) first marks the run as stopping
    (:func:`mark_stopping`), then raises ``KeyboardInterrupt`` as Python's default handler does: Beam's gRPC threads
    that fail while the interrupted run unwinds (before our error handling is reached) stay quiet. Elsewhere, or
    when SIGINT has a handler that is not Python's default, a no-op."""

    def __enter__(self):
        self._saved = None
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._saved = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    @staticmethod
    def _on_sigint(signum, frame):
        mark_stopping()
        signal.default_int_handler(signum, frame)

    def __exit__(self, *exc):
        if self._saved is not None:
            signal.signal(signal.SIGINT, self._saved)
        return False


def children() -> list[tuple[int, str, int]]:
    """``(pid, state, exit signal or 0)`` of this process's Beam worker processes and dead (zombie) children, from
    Linux's ``/proc`` (``stat`` fields 3, 4 and 52: state, parent pid, exit code of a zombie); [] without it."""
    me, out = os.getpid(), []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(me) and (fields[0] == "Z" or is_beam_worker(pid)):
            exit_code = int(fields[49]) if len(fields) > 49 and fields[49].isdigit() else 0
            out.append((pid, fields[0], exit_code & 0x7F))
    return out


def worker_pids(worker_id: str) -> list[int]:
    """The live worker processes of this launcher that Beam started as ``worker_id`` (their ``WORKER_ID``
    environment variable, Linux's ``/proc/<pid>/environ``); [] without ``/proc``."""
    wanted, out = f"WORKER_ID={worker_id}".encode(), []
    for pid, state, _ in children():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if state != "Z" and wanted in f.read().split(b"\0"):
                    out.append(pid)
        except OSError:
            continue
    return out


def is_beam_worker(pid: int) -> bool:
    """True for a Beam SDK worker process (its command line runs ``apache_beam.runners.worker``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"apache_beam.runners.worker" in f.read()
    except OSError:
        return False


def dead_worker_signals() -> list[int]:
    """The signals that ended this launcher's worker processes: those :func:`died_signals` recorded, else those of
    dead (not yet reaped) worker processes."""
    return died_signals() or [sig for _, state, sig in children() if state == "Z" and sig]


def stop_worker_processes(grace: float = 2.0) -> int:
    """Stops the live worker processes of this launcher (after a Ctrl-C, a dead worker or any failure): SIGTERM,
    then SIGKILL after ``grace`` seconds, and waits until they are gone (at most ``grace`` more seconds). Returns how
    many were running."""
    live = [pid for pid, state, _ in children() if state != "Z"]
    for pid in live:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    if not live:
        return 0
    global _stopped
    _stopped += len(live)
    for sig in (signal.SIGKILL, None):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _running(live):
            time.sleep(0.02)
        for pid in _running(live) if sig is not None else ():
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return len(live)


def _running(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are still this launcher's live children (a zombie has ended)."""
    now = {pid: state for pid, state, _ in children()}
    return [pid for pid in pids if now.get(pid, "Z") != "Z"]
