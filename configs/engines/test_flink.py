"""The pipelines on a real Flink session cluster on this machine: a JobManager and two TaskManagers (separate
JVMs, Flink 1.16.3), Beam's Flink job server (Beam 2.50.0: the newest Maven Central serves here) and the Python
SDK harness (Beam 2.77) as an EXTERNAL worker pool. Every output must be byte-identical to the DirectRunner's run
of the same command, also after a TaskManager or an SDK harness is killed mid-job (the job restarts), and a job
that cannot restart must fail with our one line and leave the previous output complete.

    bash configs/engines/setup_flink.sh && PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_flink.py

TFRECORD_ETL_FLINK=0 skips the module; TFRECORD_ETL_ENGINES_FULL=1 adds the variants (parallelism 4, a .npy folder,
a sidecar augment, a two-span incremental collection, a killed SDK harness, a lost TaskManager without restarts);
TFRECORD_ETL_ENGINES_BIG=1 makes the killed-worker input >= 500 MB (the manual/benchmark run; CI uses a small one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal

import h5py
import numpy as np
import pytest

from configs.engines import common
from configs.engines.common import full_only
from configs.engines.conftest import CONVERT_FLAGS, KILL_AUGMENT, KILL_FLAGS
from configs.engines.engines import FlinkCluster, harness_pids
from tests.test_files_source import collection  # noqa: F401  (a fixture: an image folder)

if os.environ.get("TFRECORD_ETL_FLINK") == "0":
    pytest.skip("TFRECORD_ETL_FLINK=0", allow_module_level=True)

pytestmark = pytest.mark.timeout(900)


def same_on_flink(module, args, flink, tmp_path, reference, parallelism=2, name="out"):
    """Runs ``args`` (``OUT`` is the output directory) on Flink; asserts it byte-identical to the DirectRunner's."""
    want, got = reference(module, args), tmp_path / f"{name}-flink"
    stdout = common.ok(common.run(module, [got if a == "OUT" else a for a in args], flink.flags(parallelism)))
    common.assert_same_output(got, want)
    assert common.leftovers(got) == []
    return got, stdout


@pytest.mark.parametrize("parallelism", [2, pytest.param(4, marks=full_only)])
def test_convert_hdf5_is_byte_identical(flink, inputs, reference, tmp_path, parallelism):
    """Without --num_shards: the default shard count (3 for 28,800 bytes of 0.01 MiB shards) is the data's, so Flink
    with --parallelism 2 or 4 writes DirectRunner's files (it once wrote 4 shards, a multiple of the parallelism)."""
    directory, _data = inputs
    flags = [*CONVERT_FLAGS]
    flags[flags.index("--num_shards") : flags.index("--num_shards") + 2] = ["--target_shard_mb", "0.01"]
    out, stdout = same_on_flink(
        "convert",
        ["--input", directory / "in.h5", "--output_dir", "OUT", *flags],
        flink,
        tmp_path,
        reference,
        parallelism,
    )
    assert "wrote 240 examples in 3 shards" in stdout
    import tensorflow as tf

    records = common.tf_read(out)
    assert len(records) == 240
    ids = [tf.train.Example.FromString(r).features.feature["id"].int64_list.value[0] for r in records]
    assert ids == list(range(240))


@full_only
def test_convert_npy_folder_is_byte_identical(flink, reference, tmp_path):
    src = tmp_path / "npy"
    src.mkdir()
    for i in range(4):
        np.save(src / f"part{i}.npy", np.arange(i * 500, (i + 1) * 500, dtype="<f4").reshape(250, 2))
    out, _ = same_on_flink(
        "convert",
        ["--input", src / "*.npy", "--output_dir", "OUT", "--num_shards", "2", "--target_range_mb", "0.002"],
        flink,
        tmp_path,
        reference,
    )
    assert len(common.tf_read(out, "")) == 1000


def test_image_folder_with_a_dead_letter_is_byte_identical(flink, collection, tmp_path):  # noqa: F811
    base, files = collection
    (base / "icons" / "notes.png").write_bytes(b"not an image at all")
    dead_direct, dead_flink = tmp_path / "dead-direct", tmp_path / "dead-flink"
    args = [
        "--input",
        base / "*" / "*",
        "--output_dir",
        "OUT",
        "--format",
        "files",
        "--decode_check",
        "--num_shards",
        "2",
    ]
    want, got = tmp_path / "img-direct", tmp_path / "img-flink"
    common.ok(
        common.run(
            "convert", [want if a == "OUT" else a for a in args] + ["--dead_letter_dir", dead_direct], common.DIRECT
        )
    )
    common.ok(
        common.run(
            "convert", [got if a == "OUT" else a for a in args] + ["--dead_letter_dir", dead_flink], flink.flags(2)
        )
    )
    common.assert_same_output(got, want)
    assert common.metadata(got)["rows_dead_lettered"] == 1
    assert common.files(dead_flink) == common.files(dead_direct) and common.files(dead_flink)
    assert len(common.tf_read(got, "")) == len(files)


@pytest.fixture(scope="module")
def converted(inputs, reference):
    """The DirectRunner convert of the small input (the augment tests' input; the convert test's reference)."""
    directory, _ = inputs
    return reference("convert", ["--input", directory / "in.h5", "--output_dir", "OUT", *CONVERT_FLAGS])


def test_augment_rewrite_is_byte_identical(flink, inputs, converted, reference, tmp_path):
    directory, _ = inputs
    same_on_flink(
        "augment",
        [
            "--input",
            converted,
            "--output_dir",
            "OUT",
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
        ],
        flink,
        tmp_path,
        reference,
    )


@full_only
def test_augment_sidecar_is_byte_identical(flink, converted, reference, tmp_path):
    out, _ = same_on_flink(
        "augment",
        [
            "--input",
            converted,
            "--output_dir",
            "OUT",
            "--mode",
            "sidecar",
            "--fn",
            "tests.augment_fns:add_one",
            "--fn_inputs",
            "id",
        ],
        flink,
        tmp_path,
        reference,
    )
    assert len(common.tf_read(out)) == 240


@full_only
def test_two_span_incremental_collection_is_byte_identical(flink, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()

    def add(i):
        with h5py.File(raw / f"f{i}.h5", "w") as f:
            f["id"] = np.arange(100 * i, 100 * i + 20, dtype="<i8")

    add(0)
    # the default shard count, as on DirectRunner: it follows the data, not the runner's parallelism
    args = ["--input", raw / "*.h5", "--output_dir", "OUT", "--incremental"]
    want, got = tmp_path / "coll-direct", tmp_path / "coll-flink"
    for _ in range(2):
        common.ok(common.run("convert", [want if a == "OUT" else a for a in args], common.DIRECT))
        common.ok(common.run("convert", [got if a == "OUT" else a for a in args], flink.flags(2)))
        add(1)
    spans = sorted(p.name for p in got.iterdir() if p.is_dir())
    assert len(spans) == 2, spans
    for span in spans:
        common.assert_same_output(got / span, want / span)
    assert common.metadata(got, "collection.json") == common.metadata(want, "collection.json")


# ------------------------------------------------------------------------------------------------------------------
# A worker lost mid-job
# ------------------------------------------------------------------------------------------------------------------


def run_and_kill(flink, args, out, kill, tmp_path, engine_flags=None, wait=900, module="convert"):
    """Starts the command on Flink, waits until its first shard is being written (a shard temporary or a final
    shard file in ``out``; not a sleep), calls ``kill()``, and returns (exit code, log text)."""
    before = common.committed_shards(out)
    proc = common.start(module, args, engine_flags or flink.flags(2), tmp_path / "launcher.log")
    try:
        common.wait_until(
            lambda: (
                common.committed_shards(out) > before or any(p.name.startswith(".tmp-") for p in out.iterdir())
                if out.exists()
                else False
            ),
            600,
            "the first shard temporary",
            proc,
        )
        kill()
        code = proc.wait(wait)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, (tmp_path / "launcher.log").read_text(errors="replace")


def test_a_taskmanager_killed_mid_job_is_restarted_and_the_output_is_identical(
    flink, big_input, big_reference, tmp_path
):
    out = tmp_path / "out"
    victim, restarts = flink.tms[0], flink.restarts_logged()
    code, log = run_and_kill(
        flink,
        ["--input", big_input, "--output_dir", out, *KILL_FLAGS],
        out,
        lambda: flink.kill_taskmanager(victim),
        tmp_path,
    )
    flink.add_taskmanager()  # the cluster back at two
    assert code == 0, log[-4000:]
    assert flink.restarts_logged() > restarts  # the kill hit the running job: Flink restarted it
    common.assert_same_output(out, big_reference)
    assert common.leftovers(out) == []


def test_augment_with_a_taskmanager_killed_mid_job_is_restarted_and_the_output_is_identical(
    flink, big_reference, big_augment_reference, tmp_path
):
    out = tmp_path / "out"
    victim, restarts = flink.tms[0], flink.restarts_logged()
    code, log = run_and_kill(
        flink,
        ["--input", big_reference, "--output_dir", out, *KILL_AUGMENT],
        out,
        lambda: flink.kill_taskmanager(victim),
        tmp_path,
        module="augment",
    )
    flink.add_taskmanager()
    assert code == 0, log[-4000:]
    assert flink.restarts_logged() > restarts
    common.assert_same_output(out, big_augment_reference)
    assert common.leftovers(out) == []


@full_only
def test_an_sdk_harness_killed_mid_job_is_restarted_and_the_output_is_identical(
    flink, big_input, big_reference, tmp_path
):
    out = tmp_path / "out"

    def kill_one_harness():
        pids = harness_pids(flink.pool)
        assert pids, "no SDK harness process is running"
        os.kill(pids[0], signal.SIGKILL)

    code, log = run_and_kill(
        flink, ["--input", big_input, "--output_dir", out, *KILL_FLAGS], out, kill_one_harness, tmp_path
    )
    assert code == 0, log[-4000:]
    common.assert_same_output(out, big_reference)
    assert common.leftovers(out) == []


def error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def flink_no_restarts(tmp_path_factory):
    """A second cluster whose restart strategy is ``none`` (Beam 2.77's Python options have no per-job retry
    flag: the strategy is the cluster's)."""
    cluster = FlinkCluster(tmp_path_factory.mktemp("flink_no_restarts"), taskmanagers=2, slots=2, restarts=None)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def previous_output(converted, out):
    """A complete earlier output in ``out`` (a copy of the small input's DirectRunner convert)."""
    shutil.copytree(converted, out)
    return common.files(out), common.metadata(out)


def assert_job_failed_line(line, holds_previous: bool):
    """The runner-failure line, exactly, for the output the directory holds: the previous one (nothing was
    committed) or this run's (its commit ran before the runner reported the job failed)."""
    job = re.match(r"error: OutputError: The runner's job (\S+) ended in state FAILED: (.+?); ", line)
    assert job, line
    if holds_previous:
        holds, hint = "nothing was committed: the previous output is complete", "run again"
    else:
        holds = "its commit ran before the failure: this run's output was committed and is complete"
        hint = "check it with tfrecord-etl verify"
    want = (
        f"error: OutputError: The runner's job {job.group(1)} ended in state FAILED: {job.group(2)}; {holds}. "
        f"Hint: {hint}; on a cluster, give the runner a restart strategy (Flink: restart-strategy: fixed-delay) "
        f"so that a lost worker is retried"
    )
    # (then where the runner's log went, as on every error line of a run)
    assert re.fullmatch(re.escape(want) + r"( \[runner log: \S+; --verbose shows it live\])?", line), line


def assert_failed_cleanly(code, log, out, previous):
    assert code == 2, log[-4000:]
    assert len(error_lines(log)) == 1 and "Traceback" not in log, log[-4000:]
    assert_job_failed_line(error_lines(log)[0], holds_previous=True)
    assert (common.files(out), common.metadata(out)) == previous  # the previous output, complete
    assert common.leftovers(out) == []


def test_a_module_only_the_launcher_has_fails_on_the_workers_in_one_line_naming_it(
    flink_no_restarts, converted, tmp_path
):
    """``--fn`` imports a module when called: the launcher has it (its probe of the first records passes), the
    workers do not. On the cluster without restarts (a restart strategy retries the job 3 times first, 4 minutes
    here). The user's line names the worker's exception (type, message, the record) and says to install
    the module where the workers run; once it was a traceback cut off after 300 characters and a restart hint."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "tfrecord_etl_calibration.py").write_text("SCALE = 3\n")
    out = tmp_path / "out"
    args = ["--input", converted, "--output_dir", out, "--fn", "tests.augment_fns:calibrated", "--fn_inputs", "id"]
    env = {"PYTHONPATH": f"{common.ROOT}{os.pathsep}{tmp_path / 'mods'}"}  # the launcher's path only
    proc = common.run("augment", args, flink_no_restarts.flags(2), env=env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2, log[-4000:]
    assert len(error_lines(log)) == 1 and "Traceback" not in log, log[-4000:]
    (line,) = error_lines(log)
    assert (
        "raised ModuleNotFoundError: No module named 'tfrecord_etl_calibration' (at " in line
        and "Hint: install the module where --fn runs: on a runner, in the workers' Python environment" in line
        and "restart strategy" not in line
    ), line
    assert not out.exists() or common.leftovers(out) == [], sorted(p.name for p in out.iterdir())


@full_only
def test_without_restarts_a_lost_taskmanager_fails_in_one_line_and_the_previous_output_stays(
    flink, flink_no_restarts, converted, big_input, big_reference, tmp_path
):
    out = tmp_path / "out"
    previous = previous_output(converted, out)
    victim = flink_no_restarts.tms[0]
    args = ["--input", big_input, "--output_dir", out, *KILL_FLAGS, "--overwrite"]
    code, log = run_and_kill(
        flink_no_restarts,
        args,
        out,
        lambda: flink_no_restarts.kill_taskmanager(victim),
        tmp_path,
        flink_no_restarts.flags(2),
    )
    flink_no_restarts.add_taskmanager()
    assert_failed_cleanly(code, log, out, previous)
    common.ok(common.run("convert", args, flink.flags(2)))  # the re-run
    common.assert_same_output(out, big_reference)


def test_a_killed_jobmanager_fails_in_one_line_and_a_rerun_works(
    flink, flink_no_restarts, converted, big_input, big_reference, tmp_path
):
    out = tmp_path / "out"
    previous = previous_output(converted, out)
    args = ["--input", big_input, "--output_dir", out, *KILL_FLAGS, "--overwrite"]

    def kill_jobmanager():
        os.killpg(flink_no_restarts.jobmanager.pid, signal.SIGKILL)

    code, log = run_and_kill(
        flink_no_restarts, args, out, kill_jobmanager, tmp_path, flink_no_restarts.flags(2), wait=420
    )
    assert code == 2, log[-4000:]
    assert len(error_lines(log)) == 1 and "Traceback" not in log, log[-4000:]
    # Never less than one whole output, and the line says which. The TaskManagers go on with their tasks until they
    # notice the JobManager is gone, and the job server may report the job FAILED only after they finished it,
    # commit included: the launcher's cleanup checks the commit point (metadata.json listing this run's shards)
    # first. Either this run's output, complete (the files of the output it replaced removed), or the previous
    # output, byte for byte (the failed run's shards removed).
    files, (before, meta) = common.files(out), previous
    (line,) = error_lines(log)
    if common.metadata(out) == meta:
        assert files == before
    else:
        assert common.metadata(out) == common.metadata(big_reference)
        assert files == common.files(big_reference)
    assert_job_failed_line(line, holds_previous=common.metadata(out) == meta)
    assert common.leftovers(out) == []
    common.ok(common.run("convert", args, flink.flags(2)))  # the re-run, on a cluster that has a JobManager
    # the same records in shard order and the same metadata but for the shard names: over a directory that holds
    # this run's output under the plain names, the re-run writes the next generation's (``data-g1-...``)
    meta = json.loads((out / "metadata.json").read_text())
    shards = [str(out / shard["file"]) for shard in meta["shards"]]
    assert sorted(set(common.files(out)) - {"schema.pbtxt"}) == sorted(shard["file"] for shard in meta["shards"])
    import tensorflow as tf

    got = [r.numpy() for r in tf.data.TFRecordDataset(shards, compression_type="GZIP")]
    assert got == common.tf_read(big_reference)
