"""Running a command's pipeline: the local runner chosen for DirectRunner (``--direct_running_mode``), the run
itself with its workers' stderr kept to what matters (progress lines aside), the counters it reports and their
summary lines. Reached through :mod:`common` (``common.run_pipeline``, ``common.local_runner``,
``common.print_metrics``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

from tfrecord_etl.pipelines import workers
from tfrecord_etl.pipelines.errorlines import RUNNER_MESSAGES
from tfrecord_etl.transforms.localmode import DIRECT_NAMES  # the one list of DirectRunner's names

WORK_SPAN_MS = "work_span_ms"
JOB_NOTE = "tfrecord_etl_job_note"  # on a Ctrl-C's KeyboardInterrupt: what became of the runner's job


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

    A portable runner's job (Flink, Spark through their job servers) is held while it runs
    (:mod:`jobcontrol`): on Ctrl-C it is cancelled, on the cluster too when ``--flink_master`` names it, and
    waited for up to ``jobcontrol.CANCEL_WAIT_S`` before the command's cleanup removes the run's temporaries (what
    became of it is on the KeyboardInterrupt as :data:`JOB_NOTE`); a job server that stops answering raises
    ``jobcontrol.JobServerLost``; with ``--flink_master`` a job waiting for task slots is reported while it
    waits, and ``--max_wait_for_slots_s`` ends it with a ConfigError.
    """
    workers.install()  # a worker process that dies fails the run at once
    workers.forget_deaths()
    workers.quiet_worker_threads()  # Beam's threads' reports of workers we stop stay off stderr
    # deferred: Beam; common, which the reader's commands import, imports this module
    from tfrecord_etl.pipelines import jobcontrol

    job = result = None
    with _worker_stderr_to_log(), workers.interrupts_mark_stopping():
        try:
            result = p.run()
            job, slots = jobcontrol.watch(result, p.options)  # a job server's job: the launcher holds it
            if slots is None:
                result.wait_until_finish()
            else:
                with slots:
                    result.wait_until_finish()
        except KeyboardInterrupt as e:  # Ctrl-C: the job cancelled on the cluster before the cleanup runs
            workers.mark_stopping()
            workers.stop_worker_processes()
            if job is not None:
                setattr(e, JOB_NOTE, job.cancel())
            raise
        except BaseException as e:  # an error, a dead worker: no worker process outlives the failed run
            workers.mark_stopping()
            workers.stop_worker_processes()
            _attach_job_messages(e, result)
            instead = job.failed(e) if job is not None and isinstance(e, Exception) else None
            if instead is not None:
                raise instead from e
            raise
    try:
        from apache_beam.metrics.metric import MetricsFilter

        # deferred: Beam (beam.metrics); common, which the reader's commands import, imports this module
        from tfrecord_etl.transforms.beam.metrics import NAMESPACE, SHARD_END_MS, SHARD_START_MS

        queried = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except Exception:  # noqa: BLE001 - e.g. DaskRunner implements no metrics
        return {}
    out: dict[str, int] = {}
    for c in queried["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
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


def _attach_job_messages(e: BaseException, result) -> None:
    """Keeps on ``e`` (``errorlines.RUNNER_MESSAGES``) the error messages a portable runner's job service streamed
    for the failed job (Beam's ``PortableRunner`` keeps them on its result): their whole text, the worker's Python
    traceback included, where the job's own failure message may be cut short."""
    texts = []
    for message in getattr(result, "_messages", None) or ():
        try:
            if message.HasField("message_response") and message.message_response.message_text:
                texts.append(message.message_response.message_text)
        except (AttributeError, ValueError):  # another runner's result: nothing of the kind
            continue
    if texts:
        try:
            setattr(e, RUNNER_MESSAGES, texts)
        except AttributeError:
            pass


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
