"""Many jobs on the session's Flink cluster (``conftest.flink``): Beam's Flink runner loads its classes again for
every job and the TaskManagers never unload them, so the cluster's TaskManagers are sized for it and replaced by
fresh ones while no job runs (``flinkmemory``).

    bash configs/engines/setup_flink.sh && PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_flink_jobs.py

TFRECORD_ETL_FLINK=0 skips the module.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from configs.engines import common, flinkmemory

if os.environ.get("TFRECORD_ETL_FLINK") == "0":
    pytest.skip("TFRECORD_ETL_FLINK=0", allow_module_level=True)

pytestmark = pytest.mark.timeout(900)


def both_metaspaces(flink) -> dict:
    """``flinkmemory.metaspace`` once both TaskManagers report it (Flink's REST API fetches metrics on demand)."""
    deadline = time.monotonic() + 60
    while len(found := flinkmemory.metaspace(flink)) < 2:
        assert time.monotonic() < deadline, found
        time.sleep(1)
    return found


def test_taskmanagers_hold_many_jobs_and_are_replaced_before_their_metaspace_fills(flink, tmp_path):
    """Beam's runner loads its classes again for every job (about 28 MB of a TaskManager's metaspace each): with
    Flink's default 256 MB both TaskManagers died of ``OutOfMemoryError: Metaspace`` after about 8 jobs and every
    later job waited forever. The metaspace holds about 35 jobs, and fresh TaskManagers replace the old ones while
    no job runs (the stage's fixture, and ``python -m configs.engines.engines flink`` when idle): a job on the fresh
    ones writes the same bytes."""
    src = tmp_path / "ids.npy"
    np.save(src, np.arange(50, dtype="<i8"))
    first, second = tmp_path / "first", tmp_path / "second"
    common.ok(common.run("convert", ["--input", src, "--output_dir", first], flink.flags(2)))
    used = both_metaspaces(flink)
    assert [round(m) for _u, m in used.values()] == [flinkmemory.METASPACE_MB] * 2, used
    assert all(u > 0 for u, _m in used.values()), used
    assert flinkmemory.recycle(flink, fraction=0.0)  # every job done: replaced at once
    fresh = both_metaspaces(flink)
    assert not set(fresh) & set(used), (fresh, used)  # other TaskManagers
    assert flink.registered_taskmanagers() == 2 and len(flink.tms) == 2
    common.ok(common.run("convert", ["--input", src, "--output_dir", second], flink.flags(2)))
    common.assert_same_output(second, first)
    logs = [p for p in (flink.workdir / "logs").glob("*.log") if "taskmanager" in p.name or "taskexecutor" in p.name]
    assert logs and not [p.name for p in logs if "OutOfMemoryError" in p.read_text(errors="replace")]


SERIES_JOBS = int(os.environ.get("TFRECORD_ETL_FLINK_SERIES_JOBS", "20"))


@common.full_only
@pytest.mark.timeout(2400)
def test_a_long_series_of_jobs_on_flinks_default_metaspace_runs_to_the_end(tmp_path):
    """:data:`SERIES_JOBS` jobs (20) one after another on a cluster of its own whose TaskManagers have Flink's default
    256 MB of metaspace, the size on which both TaskManagers died of ``OutOfMemoryError: Metaspace`` after about 8
    jobs: with :func:`flinkmemory.recycle` between jobs (as the stage's fixture and the idle local cluster call it)
    every job finishes, writes the same bytes, and the TaskManagers were replaced more than once. A variant
    (TFRECORD_ETL_ENGINES_FULL=1): about 10 minutes."""
    from configs.engines.engines import FlinkCluster

    cluster = FlinkCluster(tmp_path / "cluster", taskmanagers=2, slots=1, restarts=None, metaspace_mb=256)
    src = tmp_path / "ids.npy"
    np.save(src, np.arange(50, dtype="<i8"))
    recycled, peaks = 0, []
    cluster.start()
    try:
        for job in range(SERIES_JOBS):
            recycled += flinkmemory.recycle(cluster)
            out = tmp_path / f"out{job}"
            common.ok(common.run("convert", ["--input", src, "--output_dir", out], cluster.flags(2)))
            if job:
                common.assert_same_output(out, tmp_path / "out0")
            peaks.append(max(u for u, _m in both_metaspaces(cluster).values()))
        logs = [p for p in (cluster.workdir / "logs").glob("*.log") if "taskmanager" in p.name]
        assert logs and not [p.name for p in logs if "OutOfMemoryError" in p.read_text(errors="replace")]
    finally:
        cluster.stop()
    print(
        f"{SERIES_JOBS} jobs, TaskManagers replaced {recycled} times, metaspace used after each job (MiB): "
        + " ".join(f"{p:.0f}" for p in peaks)
    )
    # 256 MB held about 8 jobs: replaced at half of it, every 4 or so
    assert recycled >= SERIES_JOBS // 8, (recycled, peaks)
    assert max(peaks) < 256, peaks
