"""The pipelines on a real standalone Spark cluster on this machine: a master and two workers (separate JVMs, the
Spark 3.3.4 that the pyspark wheel bundles), Beam's Spark job server (Beam 2.50.0's beam-runners-spark-3: the
newest Maven Central serves here) and the Python SDK harness (Beam 2.77) as an EXTERNAL worker pool. Outputs are
byte-identical to the DirectRunner's, also after a worker (and its executor) is killed while the executor runs a
task of the job (Spark's event log must show that task lost with its executor).

    bash configs/engines/setup_spark.sh && PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_spark.py

TFRECORD_ETL_SPARK=0 skips the module; TFRECORD_ETL_ENGINES_FULL=1 adds augment (covered on Flink and Prism by
default).
"""

from __future__ import annotations

import os
import re
import signal

import pytest

from configs.engines import common
from configs.engines.common import full_only
from configs.engines.conftest import CONVERT_FLAGS, KILL_FLAGS
from configs.engines.engines import SparkCluster

if os.environ.get("TFRECORD_ETL_SPARK") == "0":
    pytest.skip("TFRECORD_ETL_SPARK=0", allow_module_level=True)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    cluster = SparkCluster(tmp_path_factory.mktemp("spark"), workers=2, cores=1)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_convert_is_byte_identical(spark, inputs, reference, tmp_path):
    directory, _ = inputs
    got = tmp_path / "spark"
    args = ["--input", directory / "in.h5", *CONVERT_FLAGS]
    want = reference("convert", [*args, "--output_dir", "OUT"])
    stdout = common.ok(common.run("convert", [*args, "--output_dir", got], spark.flags()))
    assert "wrote 240 examples in 3 shards" in stdout
    common.assert_same_output(got, want)
    assert common.leftovers(got) == [] and len(common.tf_read(got)) == 240


@full_only
@pytest.mark.timeout(1500)
def test_augment_is_byte_identical(spark, inputs, reference, tmp_path):
    directory, _ = inputs
    src = reference("convert", ["--input", directory / "in.h5", *CONVERT_FLAGS, "--output_dir", "OUT"])
    aug = [
        "--input",
        src,
        "--fn",
        "tests.augment_fns:add_one",
        "--fn_inputs",
        "id",
        "--join_input",
        directory / "labels.npy",
        "--join_fields",
        "array=label",
        "--constants",
        "w=0.5:float32",
    ]
    want = reference("augment", [*aug, "--output_dir", "OUT"])
    common.ok(common.run("augment", [*aug, "--output_dir", tmp_path / "a-spark"], spark.flags(), timeout=1400))
    common.assert_same_output(tmp_path / "a-spark", want)


def test_a_worker_killed_mid_job_the_output_is_identical(spark, big_input, big_reference, tmp_path):
    """The worker killed is one whose executor runs a task of this job at that moment (the driver's REST API says
    so), and Spark's event log must then show that task lost with its executor: the kill hit the job."""
    out = tmp_path / "out"
    hit = {}

    def executor_at_work():
        # a shard being written, and an executor of the job's application running tasks on one of our workers
        if not (out.exists() and any(p.name.startswith((".tmp-", "data-")) for p in out.iterdir())):
            return False
        processes = spark.executor_processes()
        for app_executor in spark.busy_executors():
            if app_executor in processes:
                hit["app"], hit["executor"] = app_executor
                hit["worker"], hit["pid"] = processes[app_executor]
                return True
        return False

    proc = common.start(
        "convert", ["--input", big_input, "--output_dir", out, *KILL_FLAGS], spark.flags(), tmp_path / "launcher.log"
    )
    try:
        common.wait_until(executor_at_work, 600, "an executor running the job's tasks while a shard is written", proc)
        spark.kill_worker(hit["worker"])  # the worker JVM and its executor (same process group)
        code = proc.wait(900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        spark.add_worker()
    log = (tmp_path / "launcher.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    lost, removed = spark.lost_tasks(hit["app"], hit["executor"])
    # Spark lost the executor with tasks of this job on it (and ran them again elsewhere: the output is complete)
    assert lost >= 1 and removed, (hit, lost, removed)
    common.assert_same_output(out, big_reference)
    assert common.leftovers(out) == []


def test_ctrl_c_stops_the_spark_job_and_nothing_is_written_after(spark, small_converted, tmp_path):
    out, log = tmp_path / "out", tmp_path / "launcher.log"
    proc, previous = common.start_over_previous(small_converted, out, spark.flags(), log)
    try:
        common.wait_for_temporary(out, proc)
        proc.send_signal(signal.SIGINT)
    finally:
        code = common.finish(proc, 240)  # (under a loaded machine, the end of the job took over 90 s once)
    text = log.read_text(errors="replace")
    assert code == 130, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    (line,) = common.error_lines(text)
    assert line.startswith(
        "error: OutputError: Interrupted: the run stopped before its commit, so the output directory holds what it "
        "held before (an output being replaced is still complete). Hint: run the command again (the runner's job "
        f"cancelled: the job server at 127.0.0.1:{spark.job_port} was asked to cancel it"
    ), line
    common.assert_previous_output_stays(out, previous)
    assert spark.busy_executors() == []  # the job's tasks are stopped


def test_a_killed_spark_job_server_fails_in_one_line(spark, small_converted, tmp_path):
    out, log = tmp_path / "out", tmp_path / "launcher.log"
    proc, previous = common.start_over_previous(small_converted, out, spark.flags(), log)
    try:
        common.wait_for_temporary(out, proc)
        spark.procs.kill(spark.job_server)  # SIGKILL: the job server is the job's Spark driver
    finally:
        code = common.finish(proc, 240)  # (under a loaded machine, the end of the job took over 90 s once)
        spark.start_job_server()  # the module's cluster whole again
    text = log.read_text(errors="replace")
    assert code == 2, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    (line,) = common.error_lines(text)
    assert re.fullmatch(
        re.escape(
            f"error: OutputError: The job server at --job_endpoint 127.0.0.1:{spark.job_port} stopped answering "
            "while it ran job "
        )
        + r"BeamApp-\S+ \(UNAVAILABLE[^;]*\); "
        + re.escape(
            "nothing was committed: the previous output is complete; the job may still run on the cluster: cancel it "
            "there (Flink: flink cancel JOB_ID or the web UI; with --flink_master HOST:PORT the launcher cancels it "
            "itself; Spark: the job ends with its job server, which is its driver). Hint: restart the job server (or "
            "check the network to it) and run the command again"
        )
        + r"( \[runner log: \S+; --verbose shows it live\])?",
        line,
    ), line
    common.assert_previous_output_stays(out, previous)
    # the driver gone, the master ends the application: its executors stop
    common.wait_until(lambda: not spark.executor_processes(), 60, "the job's executors to stop")
