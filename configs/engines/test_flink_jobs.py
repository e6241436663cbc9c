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
