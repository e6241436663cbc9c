"""The pipelines on a real standalone Spark cluster on this machine: a master and two workers (separate JVMs, the
Spark 3.3.4 that the pyspark wheel bundles), Beam's Spark job server (Beam 2.50.0's beam-runners-spark-3: the
newest Maven Central serves here) and the Python SDK harness (Beam 2.77) as an EXTERNAL worker pool. Outputs are
byte-identical to the DirectRunner's, also after a worker (and its executor) is killed mid-job.

    bash configs/engines/setup_spark.sh && PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_spark.py

TFRECORD_ETL_SPARK=0 skips the module.
"""
from __future__ import annotations

import os
import signal

import pytest

from configs.engines import common
from configs.engines.engines import SparkCluster
from configs.engines.test_flink import CONVERT_FLAGS, KILL_FLAGS, big_input, big_reference, inputs  # noqa: F401

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


def test_convert_is_byte_identical(spark, inputs, tmp_path):  # noqa: F811
    directory, _ = inputs
    want, got = tmp_path / "direct", tmp_path / "spark"
    args = ["--input", directory / "in.h5", *CONVERT_FLAGS]
    common.ok(common.run("convert", [*args, "--output_dir", want], common.DIRECT))
    stdout = common.ok(common.run("convert", [*args, "--output_dir", got], spark.flags()))
    assert "wrote 240 examples in 3 shards" in stdout
    common.assert_same_output(got, want)
    assert common.leftovers(got) == [] and len(common.tf_read(got)) == 240


@pytest.mark.timeout(1500)
def test_augment_is_byte_identical(spark, inputs, tmp_path):  # noqa: F811
    directory, _ = inputs
    src = tmp_path / "converted"
    common.ok(common.run("convert", ["--input", directory / "in.h5", *CONVERT_FLAGS, "--output_dir", src],
                         common.DIRECT))
    aug = ["--fn", "tests.augment_fns:add_one", "--fn_inputs", "id", "--join_input", directory / "labels.npy",
           "--join_fields", "array=label", "--constants", "w=0.5:float32"]
    common.ok(common.run("augment", ["--input", src, "--output_dir", tmp_path / "a-direct", *aug], common.DIRECT))
    common.ok(common.run("augment", ["--input", src, "--output_dir", tmp_path / "a-spark", *aug], spark.flags(),
                         timeout=1400))
    common.assert_same_output(tmp_path / "a-spark", tmp_path / "a-direct")


def test_a_worker_killed_mid_job_the_output_is_identical(spark, big_input, big_reference, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    victim = spark.workers[0]

    def kill():
        os.killpg(victim.pid, signal.SIGKILL)  # the worker JVM and its executor (same process group)
        victim.popen.wait(30)
        spark.procs.procs.remove(victim)
        spark.workers.remove(victim)

    proc = common.start("convert", ["--input", big_input, "--output_dir", out, *KILL_FLAGS], spark.flags(),
                        tmp_path / "launcher.log")
    try:
        common.wait_until(lambda: out.exists() and any(p.name.startswith(".tmp-") or p.name.startswith("data-")
                                                       for p in out.iterdir()), 600, "the first shard temporary",
                          proc)
        kill()
        code = proc.wait(900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        spark.add_worker()
    log = (tmp_path / "launcher.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    common.assert_same_output(out, big_reference)
    assert common.leftovers(out) == []
