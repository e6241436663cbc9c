"""The launcher's hold on a job running on a Flink cluster: Ctrl-C cancels the job on the cluster before the
command's cleanup (no temporary written after it, the previous output intact), a job server killed mid-job ends
the command in one line with the job cancelled through Flink's REST API, and a job waiting for task slots says so
within seconds (``--max_wait_for_slots_s`` ends it).

One cluster of its own (one TaskManager with 2 slots, no restarts), since a test kills its job server (and starts
it again). The launcher is given ``--flink_master`` (the JobManager's REST address), as docs/scale.md says to.

    PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_jobcontrol.py
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from configs.engines import common
from configs.engines.engines import FlinkCluster, http_json

if os.environ.get("TFRECORD_ETL_FLINK") == "0":
    pytest.skip("TFRECORD_ETL_FLINK=0", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)

CANCEL_WAIT_S = 30  # pipelines.jobcontrol.CANCEL_WAIT_S: the launcher's bound on waiting for a cancel


@pytest.fixture(scope="module")
def flink(tmp_path_factory):
    cluster = FlinkCluster(tmp_path_factory.mktemp("flink_jobcontrol"), taskmanagers=1, slots=2, restarts=None)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def flags(flink, parallelism=2):
    return [*flink.flags(parallelism), f"--flink_master={flink.rest_url}"]


def flink_jobs(flink) -> dict[str, str]:
    """Flink job id -> state, of every job the cluster knows."""
    return {j["jid"]: j["state"] for j in (http_json(f"{flink.rest_url}/jobs/overview") or {}).get("jobs", [])}


def test_ctrl_c_cancels_the_flink_job_and_nothing_is_written_after(flink, small_converted, tmp_path):
    out, log = tmp_path / "out", tmp_path / "launcher.log"
    before = set(flink_jobs(flink))
    proc, previous = common.start_over_previous(small_converted, out, flags(flink), log)
    try:
        common.wait_for_temporary(out, proc)
        (jid,) = set(flink_jobs(flink)) - before
        assert flink_jobs(flink)[jid] == "RUNNING"
        proc.send_signal(signal.SIGINT)
    finally:
        code = common.finish(proc, CANCEL_WAIT_S + 90)
    text = log.read_text(errors="replace")
    assert code == 130, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    (line,) = common.error_lines(text)
    assert line == (
        "error: OutputError: Interrupted: the run stopped before its commit, so the output directory holds what it "
        "held before (an output being replaced is still complete). Hint: run the command again (the runner's job "
        f"cancelled: Flink job {jid} at {flink.rest_url} CANCELED)"
    ), line
    assert flink_jobs(flink)[jid] == "CANCELED"  # the launcher waited for it before it exited
    common.assert_previous_output_stays(out, previous)


def test_a_killed_job_server_fails_in_one_line_and_the_job_is_cancelled(flink, small_converted, tmp_path):
    out, log = tmp_path / "out", tmp_path / "launcher.log"
    before = set(flink_jobs(flink))
    proc, previous = common.start_over_previous(small_converted, out, flags(flink), log)
    try:
        common.wait_for_temporary(out, proc)
        (jid,) = set(flink_jobs(flink)) - before
        flink.procs.kill(flink.job_server)  # SIGKILL: the job server's JVM is gone, the Flink job runs on
    finally:
        code = common.finish(proc, CANCEL_WAIT_S + 120)
        flink.start_job_server()  # the module's cluster whole again
    text = log.read_text(errors="replace")
    assert code == 2, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    (line,) = common.error_lines(text)
    want = (
        re.escape(
            f"error: OutputError: The job server at --job_endpoint 127.0.0.1:{flink.job_port} stopped answering "
            "while it ran job "
        )
        + r"BeamApp-\S+ \(UNAVAILABLE[^;]*\); "
        + re.escape(
            f"nothing was committed: the previous output is complete; Flink job {jid} at {flink.rest_url} CANCELED. "
            "Hint: restart the job server (or check the network to it) and run the command again"
        )
        + r"( \[runner log: \S+; --verbose shows it live\])?"
    )
    assert re.fullmatch(want, line), line
    assert flink_jobs(flink)[jid] == "CANCELED"
    common.assert_previous_output_stays(out, previous)


def test_a_job_waiting_for_task_slots_says_so_and_the_limit_ends_it(flink, small_converted, tmp_path):
    out, log = tmp_path / "out", tmp_path / "launcher.log"
    before = set(flink_jobs(flink))
    # parallelism 4 on a cluster of 2 slots: Flink would wait for slots until its slot request times out (5 min)
    limit = ["--max_wait_for_slots_s", "25"]
    proc, previous = common.start_over_previous(small_converted, out, flags(flink, 4) + limit, log)
    started = time.monotonic()
    try:
        common.wait_until(lambda: "waiting for the cluster" in log.read_text(errors="replace"), 150, "the line", proc)
        said = time.monotonic() - started
    finally:
        code = common.finish(proc, 180)
    text = log.read_text(errors="replace")
    (jid,) = set(flink_jobs(flink)) - before
    waiting = [line for line in text.splitlines() if "waiting for the cluster" in line]
    assert re.fullmatch(
        r"\[tfrecord-etl\] waiting for the cluster \(\d+ s\): the job needs 4 task slots, the cluster has 0 free of 2 "
        rf"on 1 TaskManager \(Flink at {re.escape(flink.rest_url)}\); add TaskManagers or lower --parallelism to 2 "
        r"or less; --max_wait_for_slots_s 25 ends the run",
        waiting[0],
    ), waiting
    assert code == 2, text[-4000:]
    (line,) = common.error_lines(text)
    assert re.fullmatch(
        r"error: ConfigError: The job waited 2\d s \(--max_wait_for_slots_s\) for task slots: "
        + re.escape(
            f"the job needs 4 task slots, the cluster has 0 free of 2 on 1 TaskManager (Flink at {flink.rest_url}); "
            f"the job was cancelled (Flink job {jid} CANCELED) and nothing was committed, so the output directory "
            "holds what it held before. Hint: add TaskManagers or lower --parallelism to 2 or less"
        ),
        line,
    ), line
    assert flink_jobs(flink)[jid] == "CANCELED"
    common.assert_previous_output_stays(out, previous)
    print(f"the waiting line came {said:.0f} s after the launcher started")
