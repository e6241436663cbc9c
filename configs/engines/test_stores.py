"""The terabyte topology on this machine: Prism, Flink and Spark jobs whose inputs AND outputs are on real object
stores (SeaweedFS for ``s3://``, fake-gcs-server for ``gs://``: configs/engines/stores.py), with every worker (the
SDK harnesses, and for Flink and Spark the whole cluster: JobManager, TaskManagers, master, workers, executors and
job server) in a private mount namespace where the launcher's files are not (an empty tmpfs over /tmp and /var/tmp:
stores.Isolation). A worker reaches the data only through the store and the job only through the job server; the
store's credentials reach it only through the worker pool's environment, as a cluster gives them.

Every output must be byte-identical to the DirectRunner's on the same inputs as local files (shards byte for byte;
schema; metadata less its times, with the inputs' paths mapped), read in place by verify --source, inspect and the
three readers, and leave no temporary object behind (the bucket listed). The store's secret key must be nowhere in
what a run wrote or printed. Storage faults (configs/engines/faultproxy.py between the workers and the store, a
volume server SIGKILLed, the store stopped during the commit) end in the same bytes or in one line with the previous
output complete.

    bash configs/engines/setup_s3.sh && bash configs/engines/setup_gcs.sh && bash configs/engines/setup_prism.sh
    PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_stores.py configs/engines/test_stores_clusters*.py

Part of the engines stage (run_engines_test.sh). TFRECORD_ETL_S3=0 / TFRECORD_ETL_GCS=0 skip one store's tests,
TFRECORD_ETL_FLINK=0 / TFRECORD_ETL_SPARK=0 / TFRECORD_ETL_PRISM=0 one engine's. Where no private mount namespace
can be made (not root, no unshare), the tests that need one are skipped with the reason (SKIP no shared disk).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from configs.engines import common
from configs.engines.engines import ROOT
from configs.engines.faultproxy import Fault, FaultProxy
from configs.engines.storecases import (
    CONVERT,
    Bucket,
    assert_same_remote,
    direct_reference,
    needs,
    prism,
    run,
    store_env,
    terabyte_configuration,
    uploaded,
)

pytestmark = pytest.mark.timeout(900)


# ----------------------------------------------------------------------------------------------------------------
# The terabyte configuration on Prism (Flink and Spark: test_stores_clusters*.py)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", [pytest.param(s, marks=needs(s, "prism")) for s in ("s3", "gs")])
def test_the_terabyte_configuration_on_prism_is_byte_identical(
    store, request, isolation, seaweed, fakegcs, store_inputs, reference, tmp_path
):
    """storecases.terabyte_configuration on Prism (its SDK harnesses in the private mount namespace), then the
    outputs read in place by verify --source, inspect and the three readers."""
    terabyte_configuration("prism", store, request, isolation, seaweed, fakegcs, store_inputs, reference, tmp_path)


# ----------------------------------------------------------------------------------------------------------------
# Credentials: the secret key reaches the workers through the pool's environment, and is nowhere a run writes
# ----------------------------------------------------------------------------------------------------------------


@needs("s3", "prism")
def test_the_secret_key_is_nowhere_a_run_wrote(prism_bin, pool, seaweed, fakegcs, store_inputs, reference, tmp_path):
    """Two runs: the credentials in the environment (the launcher's, the worker pool's), and given as pipeline
    options (``--s3_access_key_id``/``--s3_secret_access_key``, which Beam hands to the workers); then everything
    they wrote (every object of the output, the dead letters, the run marker), printed (stdout, stderr, every
    error line) and logged (the runner log the launcher keeps, the worker pool's log) is searched for the key."""
    local_dir, _ = store_inputs
    bucket = Bucket(seaweed, "secrets")
    inputs = uploaded(bucket, local_dir, "inputs")
    secret = seaweed.secret_key.encode()
    printed, logs = [], []
    for name, extra in (
        ("env", []),
        ("flags", [f"--s3_access_key_id={seaweed.access_key}", f"--s3_secret_access_key={seaweed.secret_key}"]),
    ):
        proc = run(
            "convert",
            [
                "--input",
                f"{inputs}/in.h5",
                "--output_dir",
                bucket.url(f"out-{name}"),
                "--dead_letter_dir",
                bucket.url(f"dead-{name}"),
                "--provenance",
                "--verbose",
                *CONVERT,
            ],
            prism(prism_bin, pool),
            seaweed,
            fakegcs,
            [*seaweed.flags(), *extra],
        )
        common.ok(proc)
        printed += [proc.stdout, proc.stderr]
        logs += [
            w.split("[runner log: ", 1)[1].split(";", 1)[0] for w in proc.stderr.splitlines() if "[runner log: " in w
        ]
    # a failing run too: its error line and its runner log
    bad = run(
        "convert",
        ["--input", bucket.url("inputs/missing.h5"), "--output_dir", bucket.url("out-bad"), *CONVERT],
        prism(prism_bin, pool),
        seaweed,
        fakegcs,
        [*seaweed.flags(), f"--s3_secret_access_key={seaweed.secret_key}", f"--s3_access_key_id={seaweed.access_key}"],
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error:"), bad.stderr[-2000:]
    printed += [bad.stdout, bad.stderr]
    written = {key: bucket.get(key) for key in bucket.keys("") if not key.startswith("inputs/")}
    assert any(k.startswith("out-flags/") for k in written) and any(k.endswith("metadata.json") for k in written)
    found = [k for k, data in written.items() if secret in data]
    found += [f"printed #{i}" for i, text in enumerate(printed) if seaweed.secret_key in text]
    for path in [*logs, pool[1].log]:
        if os.path.exists(path) and secret in pathlib.Path(path).read_bytes():
            found.append(str(path))
    assert found == [], f"the secret key is in: {found}"


# ----------------------------------------------------------------------------------------------------------------
# Storage faults
# ----------------------------------------------------------------------------------------------------------------


@needs("s3", "prism")
def test_503s_500s_cut_off_bodies_a_stall_and_latency_between_workers_and_store_are_survived(
    prism_bin, pool, seaweed, fakegcs, store_inputs, reference, tmp_path
):
    """Between the workers (and the launcher) and SeaweedFS: 50 ms on every request, three 503 SlowDown to PUTs,
    two 500 InternalError to GETs, two GET bodies cut off by a connection reset after 512 bytes, one GET held
    10 s. The job retries (botocore the 5xx, our reader the cut-off bodies) and writes the same bytes."""
    local_dir, _ = store_inputs
    bucket = Bucket(seaweed, "faults")
    inputs = uploaded(bucket, local_dir, "inputs")
    proxy = FaultProxy(("127.0.0.1", seaweed.s3_port), latency_ms=50).start()
    try:
        rules = [
            proxy.add(Fault("status", status=503, times=3, method="PUT")),
            proxy.add(Fault("status", status=500, times=2, method="GET")),
            proxy.add(Fault("reset", times=2, method="GET", after_bytes=512, min_body=2048)),
            proxy.add(Fault("stall", times=1, method="GET", seconds=10)),
        ]
        proc = run(
            "convert",
            ["--input", f"{inputs}/in.h5", "--output_dir", bucket.url("out"), *CONVERT],
            prism(prism_bin, pool),
            seaweed,
            fakegcs,
            seaweed.flags(proxy.url),
        )
        common.ok(proc)
        assert [r.applied for r in rules] == [r.times for r in rules], [(r.kind, r.applied) for r in rules]
    finally:
        proxy.stop()
    assert_same_remote(bucket, "out", direct_reference(reference, local_dir, "h5"), tmp_path, local_dir, inputs)


def start_run(args, engine_flags, env: dict, log: pathlib.Path) -> subprocess.Popen:
    full = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", **env)
    with open(log, "wb") as f:
        return subprocess.Popen(
            [common.PYTHON, "-m", "pipelines.convert", *map(str, args), *engine_flags],
            cwd=ROOT,
            env=full,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def one_error_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return lines[-1]


@needs("s3", "prism")
def test_a_volume_server_killed_while_shards_are_written(
    prism_bin, pool, own_seaweed, fakegcs, big_input, big_reference, tmp_path
):
    """SIGKILL to one of SeaweedFS's two volume servers while the shards of an --overwrite run are written over a
    complete output: the run either ends complete and byte-identical, or fails with one line, the previous output
    complete (read back once the volume server is back)."""
    from configs.engines.conftest import KILL_FLAGS

    seaweed = own_seaweed
    bucket = Bucket(seaweed, "volumekill")
    source = bucket.upload(big_input, "in/large.h5")
    args = ["--input", source, "--output_dir", bucket.url("out"), *KILL_FLAGS, *seaweed.flags()]
    env = store_env(seaweed, fakegcs)
    common.ok(run("convert", args[:-2], prism(prism_bin, pool), seaweed, fakegcs, seaweed.flags()))
    previous = bucket.get("out/metadata.json")
    log = tmp_path / "run.log"
    proc = start_run([*args, "--overwrite"], prism(prism_bin, pool), env, log)
    try:
        common.wait_until(
            lambda: any("/.tmp-" in k or "-g1-" in k for k in bucket.keys("out/")), 600, "a shard written", proc
        )
        seaweed.kill_volume(1)
        proc.wait(600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        seaweed.add_volume(1)
    text = log.read_text(errors="replace")
    if proc.returncode == 0:  # the same bytes under the replacing run's names (data-g1-...)
        keys = bucket.keys("out/")
        assert not [k for k in keys if "/.tmp-" in k or ".tf-etl.lock" in k], keys
        got = bucket.download("out", tmp_path / "replaced")
        for path in list(got.iterdir()):
            if "-g1-" in path.name:
                path.rename(got / path.name.replace("-g1-", "-"))
        (got / "metadata.json").write_text((got / "metadata.json").read_text().replace("-g1-", "-"))
        common.assert_same_output_mapped(got, big_reference, {bucket.url("in"): str(big_input.parent)})
    else:
        assert proc.returncode == 2, text[-3000:]
        one_error_line(text)
        assert bucket.get("out/metadata.json") == previous  # the previous output is the committed one
        got = bucket.download("out", tmp_path / "previous")
        common.assert_same_output_mapped(got, big_reference, {bucket.url("in"): str(big_input.parent)})


@needs("s3")
def test_the_store_stopped_during_the_commit_is_one_line_and_the_previous_output_stays(
    own_seaweed, fakegcs, store_inputs, reference, tmp_path
):
    """The S3 gateway SIGKILLed while the commit waits (failpoint ``before-commit:sleep=8``: every shard final, no
    metadata.json yet) in an --overwrite run over a complete output: one line naming the store, exit 2; once the
    gateway is back the previous output is complete and verifies."""
    local_dir, _ = store_inputs
    seaweed = own_seaweed
    bucket = Bucket(seaweed, "commitstop")
    inputs = uploaded(bucket, local_dir, "inputs")
    args = ["--input", f"{inputs}/in.h5", "--output_dir", bucket.url("out"), *CONVERT, *seaweed.flags()]
    common.ok(run("convert", args, common.DIRECT, seaweed, fakegcs))
    previous = bucket.get("out/metadata.json")
    env = {**store_env(seaweed, fakegcs), "TFRECORD_ETL_FAILPOINT": "before-commit:sleep=8"}
    log = tmp_path / "run.log"
    proc = start_run([*args, "--overwrite"], common.DIRECT, env, log)
    try:
        common.wait_until(lambda: sum("-g1-" in k for k in bucket.keys("out/")) == 3, 300, "3 final shards", proc)
        seaweed.kill_gateway()
        proc.wait(600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        seaweed.start_gateway()
    text = log.read_text(errors="replace")
    assert proc.returncode == 2, text[-3000:]
    line = one_error_line(text)
    assert "out" in line and ("s3://" in line or "127.0.0.1" in line), line
    assert bucket.get("out/metadata.json") == previous
    want = direct_reference(reference, local_dir, "h5")
    got = bucket.download("out", tmp_path / "previous")
    # the failed run's shards and temporaries may stay (the store was gone when it cleaned up: metadata.json does
    # not list them, the next run removes them), and so does its lock (the next run takes it over as stale)
    shards = {
        k: v
        for k, v in common.files(got).items()
        if "-g1-" not in k and k != ".tf-etl.lock" and not k.startswith(".tmp-")
    }
    assert shards == common.files(want), "the previous output's shards changed"
    verify = run("verify", [bucket.url("out")], [], seaweed, fakegcs, seaweed.flags())
    assert verify.returncode in (0, 1) and verify.stdout.startswith("OK"), verify.stdout + verify.stderr[-2000:]
    again = run("convert", [*args, "--overwrite"], common.DIRECT, seaweed, fakegcs)
    common.ok(again)
    listed = {shard["file"] for shard in json.loads(bucket.get("out/metadata.json"))["shards"]}
    left = [k for k in bucket.keys("out/") if "/.tmp-" in k or ".tf-etl.lock" in k]
    left += [k for k in bucket.keys("out/") if "/data-" in k and k.rsplit("/", 1)[1] not in listed]
    assert left == [], f"the re-run left what the failed run wrote: {left}"


@needs("s3")
def test_a_store_that_ignores_conditional_writes_is_refused_in_one_line(seaweed, fakegcs, store_inputs, tmp_path):
    """SeaweedFS behind a proxy that answers its 412 to a conditional PUT with 200 (what a store that ignores
    ``If-None-Match`` answers: an older S3-compatible API): the lock could no longer exclude a second launcher, so
    the run stops before anything is written, in one line; the probe object it wrote is gone."""
    local_dir, _ = store_inputs
    bucket = Bucket(seaweed, "noconditions")
    inputs = uploaded(bucket, local_dir, "inputs")
    proxy = FaultProxy(("127.0.0.1", seaweed.s3_port)).start()
    try:
        strip = proxy.add(Fault("accept", times=1000, method="PUT"))
        proc = run(
            "convert",
            ["--input", f"{inputs}/in.h5", "--output_dir", bucket.url("out"), *CONVERT],
            common.DIRECT,
            seaweed,
            fakegcs,
            seaweed.flags(proxy.url),
        )
    finally:
        proxy.stop()
    assert proc.returncode == 2 and strip.applied >= 1, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    assert "ignores conditional writes" in line and "If-None-Match" in line, line
    assert bucket.keys("out/") == []
