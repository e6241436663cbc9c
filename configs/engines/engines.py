"""Real engines on this machine (loopback only): a Flink session cluster (a JobManager and TaskManagers as separate
JVMs) with Beam's Flink job server, a standalone Spark cluster (a master and workers) with Beam's Spark job server,
and the Python SDK harness as an EXTERNAL worker pool, for configs/engines/test_*.py and bench/engines.py.

Every process is started in a process group of its own (``start_new_session``), logged to a file, and stopped by
:meth:`Processes.stop_all` (SIGTERM to the group, SIGKILL after a grace period), which the fixtures call in a
``finally`` and which ``atexit`` calls again if the interpreter exits another way. ``setup_flink.sh`` /
``setup_spark.sh`` fetch what these start into ``.engines/`` (git-ignored).
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
ENGINES = ROOT / ".engines"
FLINK_HOME = ENGINES / "flink" / "home"
FLINK_JOB_SERVER_JARS = ENGINES / "flink" / "jobserver" / "jars"
SPARK_HOME = ENGINES / "spark" / "py" / "pyspark"
SPARK_JOB_SERVER_JARS = ENGINES / "spark" / "jobserver" / "jars"
PYTHON = os.environ.get("TFRECORD_ETL_ENGINE_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
# Java 17 needs these for Flink 1.16 and Spark 3.3 (both written for Java 8/11) to reach JDK internals.
ADD_OPENS = (
    " ".join(
        f"--add-opens=java.base/{p}=ALL-UNNAMED"
        for p in (
            "java.lang",
            "java.lang.invoke",
            "java.lang.reflect",
            "java.io",
            "java.net",
            "java.nio",
            "java.util",
            "java.util.concurrent",
            "java.util.concurrent.atomic",
            "sun.nio.ch",
            "sun.nio.cs",
            "sun.security.action",
            "sun.util.calendar",
            "java.text",
            "java.time",
        )
    )
    + " "
    + " ".join(
        f"--add-exports={m}=ALL-UNNAMED"
        for m in (
            "java.base/sun.net.util",
            "java.rmi/sun.rmi.registry",
            "java.security.jgss/sun.security.krb5",
            "java.base/sun.nio.ch",
        )
    )
)


class EngineError(RuntimeError):
    """An engine did not start: the message names the command and the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float, what: str, procs=()):
    """Polls ``condition()`` until it is truthy (returns it); raises EngineError after ``timeout`` seconds or when
    one of ``procs`` (:class:`Proc`) exits meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        for p in procs:
            if p.popen.poll() is not None:
                raise EngineError(
                    f"{p.name} exited with {p.popen.returncode} while waiting for {what}: {p.command}\n{p.log_tail()}"
                )
        if time.monotonic() > deadline:
            raise EngineError(
                f"timed out after {timeout:.0f} s waiting for {what}\n"
                + "\n".join(f"--- {p.name}: {p.command}\n{p.log_tail()}" for p in procs)
            )
        time.sleep(0.2)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_json(url: str, timeout: float = 5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def children(pid: int) -> list[int]:
    """Pids of the direct children of ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM of a live process in MB (its peak resident set), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# the line a JVM's (log4j) or Go program's log marks its first failure with
FIRST_ERROR = re.compile(r"\b(ERROR|FATAL)\b|^Exception in thread|^panic:")


class Proc:
    def __init__(self, name: str, command: list[str], popen: subprocess.Popen, log: pathlib.Path):
        self.name, self.command, self.popen, self.log = name, " ".join(map(str, command)), popen, log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, n: int = 40, first_error: int = 15) -> str:
        """The last ``n`` lines of the process's log, after the ``first_error`` lines from its first ERROR or FATAL
        line when that is older than the tail (a JVM's log ends in the stack of the failure's last consequence, its
        cause is logged first)."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        start = max(0, len(lines) - n)
        first = next((i for i, line in enumerate(lines[:start]) if FIRST_ERROR.search(line)), None)
        if first is None:
            return "\n".join(lines[start:])
        head = lines[first : min(first + first_error, start)]
        return "\n".join([f"(first error, line {first + 1}:)", *head, f"(... last {n} lines:)", *lines[start:]])


class Processes:
    """The processes one fixture started; :meth:`stop_all` stops every one of them (and their groups)."""

    def __init__(self, log_dir: pathlib.Path, wrap=None):
        self.log_dir = pathlib.Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        # ``wrap(command) -> command``: how every process is started (stores.Isolation.wrap: in a private mount
        # namespace); None: as it is
        self.wrap = wrap
        atexit.register(self.stop_all)

    def start(self, name: str, command: list, env: dict | None = None, cwd=None) -> Proc:
        log = self.log_dir / f"{name}.log"
        if self.wrap is not None:
            command = self.wrap(command)
        with open(log, "ab") as f:
            popen = subprocess.Popen(
                [str(c) for c in command],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        proc = Proc(name, command, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc, grace: float = 15.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.popen.wait(wait)
                # the group may hold more (a worker pool's harnesses): SIGKILL what is left of it
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            except subprocess.TimeoutExpired:
                continue
        if proc in self.procs:
            self.procs.remove(proc)

    def kill(self, proc: Proc) -> None:
        """SIGKILL to ``proc``'s process group (no shutdown hook runs), waited for, forgotten."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.popen.wait(30)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self, grace: float = 10.0) -> None:
        for proc in reversed(list(self.procs)):
            if grace > 0:
                self.stop(proc, grace=grace)
            else:
                self.kill(proc)


def java_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("TFRECORD_ETL_FAILPOINT", None)
    env.update(extra or {})
    return env


def worker_pool(
    procs: Processes, name: str = "worker-pool", failpoint: str | None = None, env: dict | None = None
) -> tuple[Proc, int]:
    """Beam's Python worker pool: the EXTERNAL environment that starts one SDK harness process per worker the runner
    asks for; it imports this project (PYTHONPATH is the checkout). It is ``worker_pool_main`` with each harness
    keyed by the runner's connection too (configs/engines/worker_pool.py: the stock pool, shared by two
    TaskManagers, stops one TaskManager's harness when the other closes a worker of the same id). ``env``: more
    of the pool's environment, which its harnesses inherit (an object store's endpoint and credentials, as a
    cluster's worker pool gets them)."""
    port = free_port()
    # the pool starts each harness as ``python -c ...``: the first python on PATH must be this environment's
    env = java_env(
        {
            "PYTHONPATH": str(ROOT),
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PATH": f"{pathlib.Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **(env or {}),
        }
    )
    if failpoint:
        env["TFRECORD_ETL_FAILPOINT"] = failpoint
    proc = procs.start(name, [PYTHON, "-m", "configs.engines.worker_pool", f"--service_port={port}"], env=env, cwd=ROOT)
    wait_for(lambda: port_open(port), 120, f"the worker pool on port {port}", [proc])
    return proc, port


def harness_pids(pool: Proc) -> list[int]:
    """SDK harness processes the worker pool started (its children)."""
    return children(pool.pid)


# ----------------------------------------------------------------------------------------------------------------
# Flink
# ----------------------------------------------------------------------------------------------------------------


class FlinkCluster:
    """A Flink session cluster (one JobManager, ``taskmanagers`` TaskManagers with ``slots`` slots each, every one a
    JVM of its own), Beam's Flink job server pointed at its REST port, and a worker pool.

    ``restarts``: the cluster's restart strategy, ``(attempts, delay_s)`` (fixed delay) or None (no restart);
    ``metaspace_mb``: each TaskManager's metaspace (MB; ``flinkmemory.METASPACE_MB`` when None)."""

    def __init__(
        self,
        workdir,
        taskmanagers: int = 2,
        slots: int = 2,
        restarts: tuple | None = (3, 10),
        pool_env: dict | None = None,
        wrap=None,
        metaspace_mb: int | None = None,
    ):
        from configs.engines import flinkmemory  # it imports this module

        self.workdir = pathlib.Path(workdir)
        self.taskmanagers, self.slots, self.restarts = taskmanagers, slots, restarts
        self.metaspace_mb = metaspace_mb or flinkmemory.METASPACE_MB
        self.pool_env = pool_env
        self.procs = Processes(self.workdir / "logs", wrap=wrap)
        self.tms: list[Proc] = []

    def _conf(self) -> pathlib.Path:
        from configs.engines import flinkmemory  # it imports this module

        conf = self.workdir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        for name in ("log4j.properties", "log4j-console.properties"):
            (conf / name).write_bytes((FLINK_HOME / "conf" / name).read_bytes())
        self.rest_port, self.rpc_port = free_port(), free_port()
        lines = {
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.rpc.port": self.rpc_port,
            "jobmanager.bind-host": "127.0.0.1",
            "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.host": "127.0.0.1",
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": self.rest_port,
            "blob.server.port": "0",
            "taskmanager.rpc.port": "0",
            "taskmanager.data.port": "0",
            "jobmanager.memory.process.size": "768m",
            # room for the classes Beam's runner loads again for every job (flinkmemory: about 35 jobs)
            **flinkmemory.conf(self.metaspace_mb),
            "taskmanager.numberOfTaskSlots": self.slots,
            "env.java.opts": ADD_OPENS,
            "io.tmp.dirs": str(self.workdir / "tmp"),
            # a lost TaskManager is noticed in seconds, not the default 50 s
            "heartbeat.interval": "2000",
            "heartbeat.timeout": "8000",
            "execution.checkpointing.interval": "0",
            # a job's slots spread over the TaskManagers (else a job of parallelism 2 may run in the two slots of
            # one TaskManager, and killing the other one misses it)
            "cluster.evenly-spread-out-slots": "true",
        }
        if self.restarts:
            lines.update(
                {
                    "restart-strategy": "fixed-delay",
                    "restart-strategy.fixed-delay.attempts": self.restarts[0],
                    "restart-strategy.fixed-delay.delay": f"{self.restarts[1]} s",
                }
            )
        else:
            lines["restart-strategy"] = "none"
        (self.workdir / "tmp").mkdir(exist_ok=True)
        (conf / "flink-conf.yaml").write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
        return conf

    def _env(self) -> dict:
        return java_env(
            {
                "FLINK_CONF_DIR": str(self.conf),
                "FLINK_LOG_DIR": str(self.workdir / "logs"),
                "FLINK_PID_DIR": str(self.workdir),
                "FLINK_HOME": str(FLINK_HOME),
            }
        )

    def start(self) -> FlinkCluster:
        if not (FLINK_HOME / "bin" / "jobmanager.sh").exists() or not FLINK_JOB_SERVER_JARS.is_dir():
            raise EngineError(f"{FLINK_HOME} is missing: run bash configs/engines/setup_flink.sh")
        self.started = time.time()
        try:
            self._start_jobmanager()
            for _ in range(self.taskmanagers):
                self.add_taskmanager()
            self.pool, self.pool_port = worker_pool(self.procs, env=self.pool_env)
            self.job_port = free_port()
            self.start_job_server()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_jobmanager(self, attempts: int = 2) -> None:
        """The JobManager, up to ``attempts`` times with fresh ports while it exits before its REST API answers, as a
        supervisor would restart a node: seen once in CI with the machine loaded, the JobManager's ResourceManager
        failed as it started (exit 239, Flink's fatal uncaught exception). Each failure is printed with its log's
        first error; the last one raises.

        Raises:
          EngineError: the JobManager exited ``attempts`` times, or its REST API did not answer within 180 s.
        """
        for attempt in range(1, attempts + 1):
            # fresh ports: another process may have taken the ones free_port() found free before the JVM bound them
            self.conf = self._conf()
            self.jobmanager = self.procs.start(
                "jobmanager", ["bash", FLINK_HOME / "bin" / "jobmanager.sh", "start-foreground"], env=self._env()
            )
            try:
                wait_for(
                    lambda: http_json(f"{self.rest_url}/overview"), 180, "the JobManager's REST API", [self.jobmanager]
                )
                return
            except EngineError as e:
                if self.jobmanager.popen.poll() is None or attempt == attempts:
                    raise
                print(f"[flink] the JobManager did not start (attempt {attempt} of {attempts}): {e}", file=sys.stderr)
                self.procs.procs.remove(self.jobmanager)
                log = self.jobmanager.log
                log.rename(log.with_name(f"jobmanager-attempt{attempt}.log"))

    def start_job_server(self) -> Proc:
        """Beam's Flink job server on :attr:`job_port`, pointed at this cluster's REST port (again, after a test
        killed it: ``procs.kill(cluster.job_server)``)."""
        self.job_server = self.procs.start(
            "flink-job-server",
            [
                "java",
                "-cp",
                f"{FLINK_JOB_SERVER_JARS}/*",
                "org.apache.beam.runners.flink.FlinkJobServerDriver",
                f"--flink-master=127.0.0.1:{self.rest_port}",
                "--job-host=127.0.0.1",
                f"--job-port={self.job_port}",
                "--artifact-port=0",
                "--expansion-port=0",
                f"--flink-conf-dir={self.conf}",
            ],
            env=java_env(),
        )
        wait_for(lambda: port_open(self.job_port), 180, "the Flink job server", [self.job_server])
        return self.job_server

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def registered_taskmanagers(self) -> int:
        return len((http_json(f"{self.rest_url}/taskmanagers") or {}).get("taskmanagers", []))

    def add_taskmanager(self) -> Proc:
        before = self.registered_taskmanagers()
        tm = self.procs.start(
            f"taskmanager-{len(self.tms)}",
            ["bash", FLINK_HOME / "bin" / "taskmanager.sh", "start-foreground"],
            env=self._env(),
        )
        self.tms.append(tm)
        wait_for(lambda: self.registered_taskmanagers() > before, 180, f"{tm.name} to register", [tm])
        return tm

    def kill_taskmanager(self, tm: Proc) -> None:
        """SIGKILL to the TaskManager's JVM (no shutdown hook runs), then a fresh TaskManager in its place."""
        os.killpg(tm.pid, signal.SIGKILL)
        tm.popen.wait(30)
        self.procs.procs.remove(tm)
        self.tms.remove(tm)
        wait_for(lambda: self.registered_taskmanagers() < self.taskmanagers, 60, "the JobManager to drop it")

    def restarts_logged(self) -> int:
        """How many times the JobManager logged a job switching to RESTARTING (a lost task being retried)."""
        return sum(
            p.read_text(errors="replace").count("to RESTARTING")
            for p in (self.workdir / "logs").glob("*.log")
            if "jobmanager" in p.name or "standalonesession" in p.name
        )

    def running_jobs(self) -> list[str]:
        jobs = (http_json(f"{self.rest_url}/jobs") or {}).get("jobs", [])
        return [j["id"] for j in jobs if j["status"] in ("RUNNING", "RESTARTING", "CREATED", "INITIALIZING")]

    def flags(self, parallelism: int = 2) -> list[str]:
        """The command's flags for this cluster: configs/flink-local.yaml with this cluster's ports."""
        return [
            "--config",
            str(ROOT / "configs" / "flink-local.yaml"),
            f"--job_endpoint=127.0.0.1:{self.job_port}",
            f"--environment_config=127.0.0.1:{self.pool_port}",
            f"--parallelism={parallelism}",
        ]

    def stop(self) -> None:
        self.procs.stop_all()


# ----------------------------------------------------------------------------------------------------------------
# Spark
# ----------------------------------------------------------------------------------------------------------------


class SparkCluster:
    """A standalone Spark master and ``workers`` workers (one JVM each, from the pyspark wheel's distribution),
    Beam's Spark job server pointed at the master, and a worker pool.

    The job server is the driver of every job's Spark application (one SparkContext per job): its web UI listens on
    ``ui_port`` (loopback; Spark's REST API under ``/api/v1``, which :meth:`busy_executors` reads while a job runs)
    and it writes each application's event log under ``workdir/events`` (what :meth:`lost_tasks` reads after it)."""

    def __init__(self, workdir, workers: int = 2, cores: int = 1, pool_env: dict | None = None, wrap=None):
        self.workdir = pathlib.Path(workdir)
        self.n_workers, self.cores = workers, cores
        self.pool_env = pool_env
        self.procs = Processes(self.workdir / "logs", wrap=wrap)
        self.workers: list[Proc] = []

    def _env(self) -> dict:
        return java_env(
            {
                "SPARK_HOME": str(SPARK_HOME),
                "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOCAL_DIRS": str(self.workdir / "local"),
                "SPARK_LOG_DIR": str(self.workdir / "logs"),
                "SPARK_WORKER_DIR": str(self.workdir / "work"),
                "SPARK_NO_DAEMONIZE": "1",
                "SPARK_MASTER_OPTS": ADD_OPENS,
                "SPARK_WORKER_OPTS": ADD_OPENS,
                "PYSPARK_PYTHON": PYTHON,
            }
        )

    def start(self) -> SparkCluster:
        if not (SPARK_HOME / "bin" / "spark-class").exists() or not SPARK_JOB_SERVER_JARS.is_dir():
            raise EngineError(f"{SPARK_HOME} is missing: run bash configs/engines/setup_spark.sh")
        for d in ("local", "work"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        self.master_port, self.master_ui, self.ui_port = free_port(), free_port(), free_port()
        self.events = self.workdir / "events"
        self.events.mkdir(parents=True, exist_ok=True)
        try:
            self.master = self.procs.start(
                "spark-master",
                [
                    SPARK_HOME / "bin" / "spark-class",
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    self.master_port,
                    "--webui-port",
                    self.master_ui,
                ],
                env=self._env(),
            )
            wait_for(
                lambda: http_json(f"http://127.0.0.1:{self.master_ui}/json/"), 180, "the Spark master", [self.master]
            )
            for _ in range(self.n_workers):
                self.add_worker()
            self.pool, self.pool_port = worker_pool(self.procs, env=self.pool_env)
            self.job_port = free_port()
            self.start_job_server()
        except BaseException:
            self.stop()
            raise
        return self

    def start_job_server(self) -> Proc:
        """Beam's Spark job server on :attr:`job_port`, the driver of every job (again, after a test killed it:
        ``procs.kill(cluster.job_server)``)."""
        self.job_server = self.procs.start(
            "spark-job-server",
            [
                # each job's SparkContext reads spark.* system properties: its UI port and an event log per job
                "java",
                *ADD_OPENS.split(),
                f"-Dspark.ui.port={self.ui_port}",
                "-Dspark.eventLog.enabled=true",
                f"-Dspark.eventLog.dir={self.events.as_uri()}",
                "-cp",
                f"{SPARK_HOME}/jars/*:{SPARK_JOB_SERVER_JARS}/*",  # Spark's own jars first: its
                # jackson-module-scala refuses the newer jackson-databind Beam brings
                "org.apache.beam.runners.spark.SparkJobServerDriver",
                f"--spark-master-url={self.master_url}",
                "--job-host=127.0.0.1",
                f"--job-port={self.job_port}",
                "--artifact-port=0",
                "--expansion-port=0",
            ],
            env=self._env(),
        )
        wait_for(lambda: port_open(self.job_port), 180, "the Spark job server", [self.job_server])
        return self.job_server

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def alive_workers(self) -> int:
        state = http_json(f"http://127.0.0.1:{self.master_ui}/json/") or {}
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def add_worker(self) -> Proc:
        before = self.alive_workers()
        w = self.procs.start(
            f"spark-worker-{len(self.workers)}",
            [
                SPARK_HOME / "bin" / "spark-class",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                self.cores,
                "--memory",
                "1g",
                "--webui-port",
                free_port(),
                self.master_url,
            ],
            env=self._env(),
        )
        self.workers.append(w)
        wait_for(lambda: self.alive_workers() > before, 180, f"{w.name} to register", [w])
        return w

    def executors(self) -> list[int]:
        """Pids of the executor JVMs (children of the worker JVMs)."""
        return [c for w in self.workers for c in children(w.pid)]

    def executor_processes(self) -> dict[tuple[str, str], tuple[Proc, int]]:
        """``(application id, executor id) -> (worker, executor pid)`` for every executor JVM of the workers (from
        the executor's command line: ``... CoarseGrainedExecutorBackend ... --executor-id N ... --app-id APP``)."""
        found = {}
        for w in self.workers:
            for pid in children(w.pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        args = f.read().decode(errors="replace").split("\0")
                except OSError:
                    continue
                if "--executor-id" in args and "--app-id" in args:
                    found[(args[args.index("--app-id") + 1], args[args.index("--executor-id") + 1])] = (w, pid)
        return found

    def busy_executors(self) -> list[tuple[str, str]]:
        """``(application id, executor id)`` of the executors that run tasks now, from the driver's REST API (the
        job server's SparkContext), the driver itself left out; [] when no job runs."""
        busy = []
        for app in http_json(f"http://127.0.0.1:{self.ui_port}/api/v1/applications") or []:
            for e in http_json(f"http://127.0.0.1:{self.ui_port}/api/v1/applications/{app['id']}/executors") or []:
                if e.get("id") != "driver" and e.get("isActive") and e.get("activeTasks", 0) > 0:
                    busy.append((app["id"], e["id"]))
        return busy

    def events_of(self, app_id: str) -> list[dict]:
        """The event log of an application (the job server writes one per job: ``events/APP`` once the job ended,
        ``APP.inprogress`` before)."""
        events = []
        for path in sorted(self.events.glob(f"{app_id}*")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
        return events

    def lost_tasks(self, app_id: str, executor_id: str) -> tuple[int, bool]:
        """What the application's event log says about a lost executor: how many of its tasks ended with
        ``ExecutorLostFailure`` (tasks that were running on it when it was lost; Spark re-runs them) and whether the
        executor was removed."""
        events = self.events_of(app_id)
        lost = sum(
            1
            for e in events
            if e.get("Event") == "SparkListenerTaskEnd"
            and (e.get("Task End Reason") or {}).get("Reason") == "ExecutorLostFailure"
            and str((e.get("Task Info") or {}).get("Executor ID")) == executor_id
        )
        removed = any(
            e.get("Event") == "SparkListenerExecutorRemoved" and str(e.get("Executor ID")) == executor_id
            for e in events
        )
        return lost, removed

    def kill_worker(self, worker: Proc) -> None:
        """SIGKILL to the worker's process group: the worker JVM and the executor JVMs it started."""
        os.killpg(worker.pid, signal.SIGKILL)
        worker.popen.wait(30)
        self.procs.procs.remove(worker)
        self.workers.remove(worker)

    def flags(self) -> list[str]:
        """The command's flags for this cluster: configs/spark-local.yaml with this cluster's ports."""
        return [
            "--config",
            str(ROOT / "configs" / "spark-local.yaml"),
            f"--job_endpoint=127.0.0.1:{self.job_port}",
            f"--environment_config=127.0.0.1:{self.pool_port}",
        ]

    def stop(self) -> None:
        self.procs.stop_all()


def recycle_when_idle(cluster: FlinkCluster) -> None:
    """Fresh TaskManagers for ``main``'s Flink cluster once their metaspace is half used and no job has run for 30
    s (``flinkmemory.recycle``): a line says so; a failure to is a line too, and the cluster keeps running."""
    from configs.engines import flinkmemory

    try:
        if flinkmemory.recycle(cluster, idle_s=30):
            print(
                "fresh TaskManagers: the old ones held half their metaspace (Beam's classes of every job)", flush=True
            )
    except EngineError as e:
        print(f"could not replace the TaskManagers: {str(e).splitlines()[0]}", flush=True)


def main(argv=None) -> None:
    """``python -m configs.engines.engines flink|spark|s3|gcs``: starts one engine or store on loopback, prints what a
    user passes to reach it (the command's flags, the environment), then waits; Ctrl-C (SIGINT) or SIGTERM stops
    every process it started and exits 0."""
    import argparse
    import tempfile

    from configs.engines import stores

    parser = argparse.ArgumentParser(prog="python -m configs.engines.engines", description=main.__doc__)
    parser.add_argument("what", choices=["flink", "spark", "s3", "gcs"])
    args = parser.parse_args(argv)
    cls = {"flink": FlinkCluster, "spark": SparkCluster, "s3": stores.SeaweedFS, "gcs": stores.FakeGCS}[args.what]
    # SIGTERM (kill, a service manager, a CI stage) stops it like Ctrl-C; SIGINT restored in case a parent that
    # started it in the background set it to be ignored
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    thing = cls(tempfile.mkdtemp(prefix=f"tfrecord-etl-{args.what}-"))
    try:
        thing.start()
        if args.what in ("s3", "gcs"):
            print(f"{args.what} endpoint: {thing.endpoint}", flush=True)
            print("environment (launcher and workers):", flush=True)
            for key, value in thing.env().items():
                print(f"  export {key}={value}", flush=True)
            if thing.flags():
                print("pipeline flags:", " ".join(thing.flags()), flush=True)
            print(f"make a bucket: {args.what}://NAME (python: stores.{cls.__name__}.bucket)", flush=True)
        else:
            print("pipeline flags:", " ".join(thing.flags()), flush=True)
            if args.what == "flink":  # the launcher cancels its job there on Ctrl-C and reports a wait for slots
                print(f"Flink REST API and web UI: {thing.rest_url} (add --flink_master={thing.rest_url})", flush=True)
        print("running: Ctrl-C or SIGTERM (kill PID) stops every process", flush=True)
        while True:
            time.sleep(15)
            if args.what == "flink":
                recycle_when_idle(thing)
    except KeyboardInterrupt:
        pass
    finally:
        thing.stop()


if __name__ == "__main__":
    main()
