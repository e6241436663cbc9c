"""The launcher's hold on the job it submitted to a portable runner's job server (Flink, Spark): cancelling it on
Ctrl-C, cancelling it where it can be reached when the job server stops answering, and saying what it waits for
while it waits for task slots.

What Beam gives, and why it is not enough (Beam 2.77's Python ``PortableRunner`` with Beam 2.50's Flink job
server, measured on the engines stage's cluster):

* ``PipelineResult.cancel()`` asks the job server to cancel; the job server reports ``CANCELLED`` at once, but the
  Flink job goes on RUNNING (the job server stops waiting for it, it does not cancel it on the cluster). So the
  launcher also cancels it through Flink's REST API (``PATCH /jobs/<id>?mode=cancel``), when it knows where that
  is: ``--flink_master HOST:PORT`` (the JobManager's REST address, as FlinkRunner takes it; the job server gets the
  same option and uses it), and waits up to :data:`CANCEL_WAIT_S` for Flink to report the job CANCELED, before the
  command's cleanup removes the run's temporaries.
* A job server that goes away mid-job ends ``wait_until_finish`` in a raw ``grpc`` error (``UNAVAILABLE``):
  :class:`JobServerLost` carries what the one error line says (:func:`errorlines.job_server_lost_line`).
* A job whose tasks wait for task slots (``--parallelism`` above the cluster's slots, no TaskManager) shows nothing
  for 5-20 minutes: :class:`SlotWatch` reads ``/jobs/<id>`` and ``/overview`` every :data:`POLL_S` and prints a
  ``[tfrecord-etl] waiting for the cluster: ...`` line; ``--max_wait_for_slots_s`` ends the run.

The Flink job is found by name: Flink names it after the Beam job (the job server's job id is
``<job name>_<uuid>``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass

from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions

from tfrecord_etl.transforms.errors import ConfigError

CANCEL_WAIT_S = 30.0  # how long the launcher waits for a cancelled job to reach a terminal state on the cluster
REST_TIMEOUT_S = 5.0  # one request to Flink's REST API, or one call to the job server while cancelling
POLL_S = 2.0  # how often the slot watch reads the cluster's state
SLOT_WAIT_FIRST_S = 15.0  # tasks waiting for slots this long before the first line says so
SLOT_WAIT_REPEAT_S = 60.0  # then one line per this many seconds while they still wait
FLINK_DONE = frozenset({"CANCELED", "FINISHED", "FAILED", "SUSPENDED"})  # Flink's terminal job states
_NO_REST = frozenset({"", "[auto]", "[local]", "[collection]"})  # FlinkRunner's flink_master values naming no REST


class JobControlOptions(PipelineOptions):
    """The launcher's options for a job on a cluster (parsed with Beam's flags; the job server ignores them)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--max_wait_for_slots_s",
            type=float,
            default=None,
            help="Flink with --flink_master: end the run (the job cancelled, nothing committed) when its tasks have "
            "waited this many seconds for free task slots; default: wait as long as Flink does",
        )


def check(beam_argv: list[str]) -> None:
    """Checks the launcher's job options of ``beam_argv`` before anything is read or written.

    Raises:
      ConfigError: ``--max_wait_for_slots_s`` not above 0, or given without ``--flink_master`` (the slots are
        read from Flink's REST API, so it could never act).
    """
    options = PipelineOptions([str(a) for a in beam_argv])
    limit = options.view_as(JobControlOptions).max_wait_for_slots_s
    if limit is None:
        return
    if not limit > 0:
        raise ConfigError(
            f"--max_wait_for_slots_s {limit:g} is not above 0", hint="give the seconds a job may wait for task slots"
        )
    if flink_rest_url(options) is None:
        raise ConfigError(
            "--max_wait_for_slots_s needs --flink_master HOST:PORT (the JobManager's REST address): the launcher "
            "reads the job's task slots there",
            hint="add --flink_master, or leave --max_wait_for_slots_s out",
        )


def flink_rest_url(options: PipelineOptions) -> str | None:
    """``http://HOST:PORT`` of the Flink REST API named by ``--flink_master`` (a scheme added when missing); None
    without one, or for FlinkRunner's ``[auto]`` / ``[local]`` / ``[collection]``."""
    master = str(options.get_all_options(retain_unknown_options=True).get("flink_master") or "").strip()
    if master in _NO_REST:
        return None
    return (master if "://" in master else f"http://{master}").rstrip("/")


def is_portable(result) -> bool:
    """Whether ``result`` is a job server's job (Beam's portable ``PipelineResult``), which the launcher can cancel."""
    return hasattr(result, "_job_service") and hasattr(result, "_job_id")


class FlinkRest:
    """Flink's REST API at ``url`` (the JobManager): the job of a Beam job id, its state, its slots, cancel."""

    def __init__(self, url: str):
        self.url = url

    def get(self, path: str):
        """The JSON at ``path``, or None when the JobManager does not answer or answers with an error."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=REST_TIMEOUT_S) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def find_job(self, beam_job_id: str) -> str | None:
        """Flink's job id of the Beam job ``beam_job_id`` (the newest job named ``<job name>``), or None."""
        name = beam_job_id.rpartition("_")[0] or beam_job_id
        jobs = [j for j in (self.get("/jobs/overview") or {}).get("jobs", []) if j.get("name") == name]
        return max(jobs, key=lambda j: j.get("start-time", 0))["jid"] if jobs else None

    def state(self, jid: str) -> str | None:
        return (self.get(f"/jobs/{jid}") or {}).get("state")

    def cancel(self, jid: str) -> bool:
        """Asks Flink to cancel ``jid`` (``PATCH /jobs/<id>?mode=cancel``); True when it accepted."""
        request = urllib.request.Request(f"{self.url}/jobs/{jid}?mode=cancel", method="PATCH")
        try:
            with urllib.request.urlopen(request, timeout=REST_TIMEOUT_S) as r:
                return r.status < 300
        except (OSError, ValueError):
            return False

    def cancel_and_wait(self, beam_job_id: str, wait_s: float = CANCEL_WAIT_S) -> tuple[str | None, str | None]:
        """Cancels the Flink job of ``beam_job_id`` and waits up to ``wait_s`` for a terminal state; returns
        ``(Flink's job id or None when not found, its last state or None when unknown)``."""
        deadline = time.monotonic() + wait_s
        jid = self.find_job(beam_job_id)
        while jid is None and time.monotonic() < min(deadline, time.monotonic() + 5):  # submitted a moment ago
            time.sleep(0.5)
            jid = self.find_job(beam_job_id)
        if jid is None:
            return None, None
        state = self.state(jid)
        if state not in FLINK_DONE:
            self.cancel(jid)
        while state not in FLINK_DONE and time.monotonic() < deadline:
            time.sleep(0.5)
            state = self.state(jid) or state
        return jid, state


class JobServerLost(RuntimeError):
    """The job server stopped answering while it ran the job (its gRPC stream broke): what the error line says."""

    def __init__(self, endpoint: str, job_id: str, reason: str, fate: str):
        self.endpoint, self.job_id, self.reason, self.fate = endpoint, job_id, reason, fate
        super().__init__(f"the job server at {endpoint} stopped answering while it ran {job_id}: {reason}; {fate}")


def _grpc_reason(e: BaseException) -> str | None:
    """``CODE: details`` of a gRPC error (the job server's stream broke), else None."""
    import grpc

    if not isinstance(e, grpc.RpcError):
        return None
    code = getattr(e, "code", lambda: None)()
    details = " ".join(str(getattr(e, "details", lambda: "")() or "").split())[:200]
    return f"{getattr(code, 'name', code)}: {details}" if details else str(getattr(code, "name", code))


class Job:
    """The launcher's hold on a submitted job: ``result`` (a portable ``PipelineResult``) and the options it ran
    with (``--job_endpoint``, ``--flink_master``)."""

    def __init__(self, result, options: PipelineOptions):
        self.result = result
        self.job_id = str(result._job_id)
        self.endpoint = options.view_as(PortableOptions).job_endpoint or "(Beam's own job server)"
        url = flink_rest_url(options)
        self.rest = FlinkRest(url) if url else None
        self.slot_wait: SlotWait | None = None  # set when --max_wait_for_slots_s ended the run

    def _cancel_on_job_server(self) -> bool:
        from apache_beam.portability.api import beam_job_api_pb2

        try:
            request = beam_job_api_pb2.CancelJobRequest(job_id=self.job_id)
            self.result._job_service.Cancel(request, timeout=REST_TIMEOUT_S)
            return True
        except Exception:  # noqa: BLE001 - a job server that is gone: the cluster's REST API is what is left
            return False

    def cancel(self, job_server: bool = True) -> str:
        """Cancels the job (through the job server unless ``job_server`` is False, and through Flink's REST API
        when ``--flink_master`` names it), waits up to :data:`CANCEL_WAIT_S` for the cluster to end it, and returns
        what happened, for the command's line."""
        asked = self._cancel_on_job_server() if job_server else False
        if self.rest is None:
            if asked:
                return (
                    f"the job server at {self.endpoint} was asked to cancel it (Spark's job server stops the job; "
                    "Flink's does not stop the Flink job: with --flink_master HOST:PORT, the JobManager's REST "
                    "address, the launcher cancels it on the cluster, else cancel it there: flink cancel JOB_ID, the "
                    "web UI)"
                )
            return self._may_still_run()
        if self.rest.get("/overview") is None:
            return f"Flink's REST API at {self.rest.url} does not answer either: {self._may_still_run()}"
        jid, state = self.rest.cancel_and_wait(self.job_id)
        if jid is None:
            return f"Flink at {self.rest.url} has no job named after it" + (
                "" if asked else f": {self._may_still_run()}"
            )
        if state in FLINK_DONE:
            return f"Flink job {jid} at {self.rest.url} {state}"
        return (
            f"Flink job {jid} at {self.rest.url} still {state or 'unknown'} {CANCEL_WAIT_S:.0f} s after its cancel: "
            f"check it there (flink cancel {jid}, the web UI)"
        )

    def _may_still_run(self) -> str:
        return (
            "the job may still run on the cluster: cancel it there (Flink: flink cancel JOB_ID or the web UI; with "
            "--flink_master HOST:PORT the launcher cancels it itself; Spark: the job ends with its job server, which "
            "is its driver)"
        )

    def failed(self, e: BaseException) -> BaseException | None:
        """The exception to raise instead of ``e`` (what ``wait_until_finish`` raised), after cancelling the job
        where that is still needed: :class:`JobServerLost` for a job server that stopped answering, a
        ConfigError when ``--max_wait_for_slots_s`` ended the run; None to raise ``e`` itself."""
        if self.slot_wait is not None:
            w = self.slot_wait
            return ConfigError(
                f"The job waited {w.waited_s:.0f} s (--max_wait_for_slots_s) for task slots: {w.describe()}; the "
                f"job was cancelled ({self._flink_fate()}) and nothing was committed, so the output directory holds "
                "what it held before.",
                hint=w.hint(),
            )
        reason = _grpc_reason(e)
        if reason is None:
            return None
        return JobServerLost(self.endpoint, self.job_id, reason, self.cancel(job_server=False))

    def _flink_fate(self) -> str:
        jid = self.rest.find_job(self.job_id) if self.rest else None
        return f"Flink job {jid} {self.rest.state(jid) or 'state unknown'}" if self.rest and jid else "on Flink"


@dataclass
class SlotWait:
    """What a job waits for: ``needed`` task slots (its largest waiting vertex's parallelism) on a cluster of
    ``total`` slots, ``free`` of them free, on ``taskmanagers`` TaskManagers, for ``waited_s`` seconds."""

    url: str
    needed: int
    total: int
    free: int
    taskmanagers: int
    waited_s: float = 0.0

    def describe(self) -> str:
        if not self.taskmanagers:
            return f"the job needs {self.needed} task slots and the cluster has no TaskManager (Flink at {self.url})"
        return (
            f"the job needs {self.needed} task slots, the cluster has {self.free} free of {self.total} on "
            f"{self.taskmanagers} TaskManager{'s' if self.taskmanagers != 1 else ''} (Flink at {self.url})"
        )

    def hint(self) -> str:
        if not self.taskmanagers:
            return "start TaskManagers for the cluster, or check that they reach the JobManager"
        if self.total < self.needed:
            return f"add TaskManagers or lower --parallelism to {self.total} or less"
        return "other jobs hold the slots: wait for them, cancel them, or lower --parallelism"


def slot_wait(rest: FlinkRest, jid: str) -> SlotWait | None:
    """The slots Flink job ``jid`` waits for now (tasks SCHEDULED: asked for a slot, none given yet, and the
    cluster's free slots fewer than they need), or None when none of its tasks waits."""
    job = rest.get(f"/jobs/{jid}") or {}
    if job.get("state") not in ("CREATED", "RUNNING", "RESTARTING"):
        return None
    waiting = [v.get("parallelism", 0) for v in job.get("vertices", []) if (v.get("tasks") or {}).get("SCHEDULED")]
    if not waiting:
        return None
    overview = rest.get("/overview") or {}
    free = int(overview.get("slots-available", 0))
    if free >= max(waiting):
        return None
    return SlotWait(
        rest.url, max(waiting), int(overview.get("slots-total", 0)), free, int(overview.get("taskmanagers", 0))
    )


class SlotWatch:
    """While the job runs: a thread that finds its Flink job and, while its tasks wait for slots, prints what they
    wait for after :data:`SLOT_WAIT_FIRST_S` and then every :data:`SLOT_WAIT_REPEAT_S`; after
    ``--max_wait_for_slots_s`` it cancels the job (the run then fails with :meth:`Job.failed`'s line). A no-op
    without ``--flink_master``."""

    def __init__(self, job: Job, options: PipelineOptions):
        self.job = job
        self.limit = options.view_as(JobControlOptions).max_wait_for_slots_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tfrecord-etl-slot-watch", daemon=True)

    def __enter__(self):
        if self.job.rest is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(REST_TIMEOUT_S * 2)
        return False

    def _run(self):
        rest, jid, since, said = self.job.rest, None, None, None
        assert rest is not None
        while not self.stop.wait(POLL_S):
            jid = jid or rest.find_job(self.job.job_id)
            wait = slot_wait(rest, jid) if jid else None
            now = time.monotonic()
            if wait is None:
                since = said = None
                continue
            since = since or now
            wait.waited_s = now - since
            if wait.waited_s >= SLOT_WAIT_FIRST_S and (said is None or now - said >= SLOT_WAIT_REPEAT_S):
                said = now
                limit = f"; --max_wait_for_slots_s {self.limit:g} ends the run" if self.limit else ""
                print(
                    f"[tfrecord-etl] waiting for the cluster ({wait.waited_s:.0f} s): {wait.describe()}; "
                    f"{wait.hint()}{limit}",
                    file=sys.stderr,
                    flush=True,
                )
            if self.limit is not None and wait.waited_s >= self.limit:
                self.job.slot_wait = wait
                self.job.cancel()
                return


def watch(result, options: PipelineOptions):
    """``(Job, SlotWatch)`` for a portable runner's ``result``; ``(None, None)`` for any other runner's."""
    if not is_portable(result):
        return None, None
    job = Job(result, options)
    return job, SlotWatch(job, options)
