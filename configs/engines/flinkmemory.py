"""The local Flink cluster's TaskManagers across many jobs: their metaspace, sized and read, and the TaskManagers
replaced by fresh ones when it fills.

Beam's Flink runner (2.50's job server on Flink 1.16) loads its classes again in every job's user-code class loader
and the TaskManager never unloads them: measured about 28 MB of metaspace per TaskManager per job (a tiny convert,
parallelism 2), so Flink's default 256 MB held about 8 jobs before both TaskManagers ended in ``OutOfMemoryError:
Metaspace`` and every later job waited forever. :data:`METASPACE_MB` sizes it (``FlinkCluster``'s flink-conf), and
:func:`recycle` replaces the TaskManagers while no job runs, once one of them has used :data:`RECYCLE_FRACTION` of it:
the engines tests call it before each test, ``python -m configs.engines.engines flink`` when it has been idle."""

from __future__ import annotations

import time

from configs.engines.engines import http_json, wait_for

# a TaskManager's metaspace (taskmanager.memory.jvm-metaspace.size): about 35 jobs at 28 MB each; the process size
# grows by as much over Flink's defaults (256 MB in 1024 MB), so heap and network memory stay what they were. A cap,
# committed only as classes load: 3 clusters of 2 TaskManagers (the engines stage's most) at most 6 x 1.75 GB of
# the machine's 24 GB, about 1.3 GB each with recycle() at half of it.
METASPACE_MB = 1024
RECYCLE_FRACTION = 0.5
DONE = ("FINISHED", "FAILED", "CANCELED", "SUSPENDED")


def conf(metaspace_mb: int = METASPACE_MB) -> dict:
    """The flink-conf.yaml lines that size a TaskManager's memory (``FlinkCluster._conf``): ``metaspace_mb`` of
    metaspace (MB), the process grown by as much over Flink's 256 MB default."""
    return {
        "taskmanager.memory.process.size": f"{1024 - 256 + metaspace_mb}m",
        "taskmanager.memory.jvm-metaspace.size": f"{metaspace_mb}m",
    }


def metaspace(cluster) -> dict[str, tuple[float, float]]:
    """``{TaskManager id: (used MiB, max MiB)}`` of the cluster's registered TaskManagers, from Flink's REST API
    (``/taskmanagers/ID/metrics``, ``Status.JVM.Memory.Metaspace.Used`` and ``.Max``); a TaskManager whose metrics
    are not reported yet is left out."""
    found = {}
    for tm in (http_json(f"{cluster.rest_url}/taskmanagers") or {}).get("taskmanagers", []):
        url = f"{cluster.rest_url}/taskmanagers/{tm['id']}/metrics?get=Status.JVM.Memory.Metaspace.Used,Status.JVM.Memory.Metaspace.Max"
        values = {m["id"].rsplit(".", 1)[1]: float(m["value"]) / 2**20 for m in http_json(url) or []}
        if "Used" in values and "Max" in values:
            found[tm["id"]] = (values["Used"], values["Max"])
    return found


def idle_for(cluster) -> float | None:
    """Seconds since the cluster's last job ended (since it started when no job ran yet), or None while a job is
    not done (running, restarting, being created)."""
    jobs = (http_json(f"{cluster.rest_url}/jobs/overview") or {}).get("jobs", [])
    if any(j.get("state") not in DONE for j in jobs):
        return None
    ended = max((j.get("end-time", 0) for j in jobs), default=0) / 1000
    return time.time() - max(ended, cluster.started)


def recycle(cluster, fraction: float = RECYCLE_FRACTION, idle_s: float = 0.0) -> bool:
    """Replaces every TaskManager of ``cluster`` (a started ``FlinkCluster``) by a fresh one when one of them has used
    more than ``fraction`` of its metaspace and no job has run for ``idle_s`` seconds: the new ones registered
    first, then the old ones stopped (SIGTERM) and dropped by the JobManager. Returns whether it replaced them.

    Raises:
      EngineError: a new TaskManager did not register, or the JobManager kept an old one, within 180 s.
    """
    used = metaspace(cluster)
    if not any(u > fraction * m for u, m in used.values()):
        return False
    idle = idle_for(cluster)
    if idle is None or idle < idle_s:
        return False
    old = list(cluster.tms)
    for _ in old:
        cluster.add_taskmanager()
    for tm in old:
        cluster.procs.stop(tm)
        cluster.tms.remove(tm)
    wait_for(lambda: cluster.registered_taskmanagers() == len(cluster.tms), 180, "the JobManager to drop the old ones")
    return True
