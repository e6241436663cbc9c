"""What the engine tests share across modules (session-scoped, so Flink's and Spark's tests build each input and
each DirectRunner reference once): the small inputs, the larger input of the lost-worker tests and the DirectRunner
references of the commands they run; and, module-scoped (each module that uses them starts its own, so that
modules can run on separate pytest-xdist workers), the object stores (SeaweedFS, fake-gcs-server), the private mount
namespace and the worker pool and clusters in it (test_stores.py, test_stores_clusters*.py; storecases.py).

TFRECORD_ETL_ENGINES_FULL=1 runs the whole set (more parallelism, inputs and failure variants: the tests marked
with ``common.full_only``); by default the stage runs one test per deliverable. TFRECORD_ETL_ENGINES_BIG=1 makes
the lost-worker input >= 500 MB (the manual run)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from configs.engines import common, flinkmemory, stores
from configs.engines.engines import ENGINES, FlinkCluster, Processes, SparkCluster, worker_pool
from configs.engines.storecases import ENGINE_ON, GCS, S3, cluster_dir, setup, store_env
from tests.test_runners import make_inputs

BIG = os.environ.get("TFRECORD_ETL_ENGINES_BIG") == "1"
# the modules, longest first (measured in the stage: seconds of each module's tests, fixtures included):
# run_engines_test.sh passes --no-loadscope-reorder, so pytest-xdist's --dist loadfile hands modules to its workers
# in this order (by default it reorders them by their number of tests), one module ahead of the one a worker runs
# (a worker gets the next once 2 or fewer of its tests are left): the longest start first, the short ones fill in
MODULE_ORDER = (
    "test_stores_clusters.py",  # ~345 (Flink and Spark on s3://)
    "test_flink.py",  # ~305
    "test_stores.py",  # ~260
    "test_stores_clusters_gs.py",  # ~165
    "test_jobcontrol.py",  # ~145
    "test_spark.py",  # ~125
    "test_flink_jobs.py",  # ~60
    "test_prism.py",  # ~15
)


def pytest_collection_modifyitems(items):
    """The engine tests, their modules ordered by :data:`MODULE_ORDER` (others after them), each module's own order
    kept."""
    rank = {name: i for i, name in enumerate(MODULE_ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# the small input's convert flags (Flink's and Spark's tests; here, so that a module skipped as a whole, e.g.
# TFRECORD_ETL_FLINK=0, does not take the other engine's tests with it)
CONVERT_FLAGS = ["--num_shards", "3", "--target_range_mb", "0.004", "--compression", "gzip", "--provenance"]
# the lost-worker tests' flags: 8 shards of row ranges of 1 MB, so a shard is still being written when one is done
KILL_FLAGS = ["--num_shards", "8", "--target_range_mb", "1", "--compression", "gzip"]
KILL_AUGMENT = ["--fn", "tests.augment_fns:add_one", "--fn_inputs", "id", "--constants", "w=0.5:float32"]


@pytest.fixture(scope="session")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine_inputs")
    return d, make_inputs(d)


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """``reference(module, args)``: the output directory of ``python -m pipelines.MODULE ARGS`` on DirectRunner
    (``OUT`` in ``args`` stands for it), run once per session and arguments. Read it, never write it."""
    done: dict = {}

    def get(module: str, args):
        key = (module, tuple(map(str, args)))
        if key not in done:
            out = tmp_path_factory.mktemp("reference") / "out"
            common.ok(common.run(module, [out if a == "OUT" else a for a in args], common.DIRECT, timeout=1800))
            done[key] = out
        return done[key]

    return get


@pytest.fixture(scope="session")
def big_input(tmp_path_factory):
    """HDF5 rows of 12,808 bytes (bench.datagen's ``large`` layout): 600 MB with TFRECORD_ETL_ENGINES_BIG=1,
    else 40 MB (CI)."""
    from bench import datagen

    path = tmp_path_factory.mktemp("big") / "large.h5"
    datagen.generate("large", str(path), rows=48_000 if BIG else 3_200)
    return path


@pytest.fixture(scope="session")
def big_reference(big_input, reference):
    """The DirectRunner output of the lost-worker tests' convert."""
    return reference("convert", ["--input", big_input, "--output_dir", "OUT", *KILL_FLAGS])


@pytest.fixture(scope="session")
def big_augment_reference(big_reference, reference):
    """The DirectRunner output of the lost-worker tests' augment (of ``big_reference``)."""
    return reference("augment", ["--input", big_reference, "--output_dir", "OUT", *KILL_AUGMENT])


# ----------------------------------------------------------------------------------------------------------------
# The object stores, the private mount namespace and the clusters in it (test_stores*.py; module-scoped: each
# module that uses them starts its own, so the modules can run on separate pytest-xdist workers)
# ----------------------------------------------------------------------------------------------------------------


def _running(on: bool, script: str, make):
    """Yields the store ``make()`` gives, started after ``setup(script)`` and stopped afterwards; None when ``on`` is
    false (the store's tests skipped)."""
    if not on:
        yield None
        return
    setup(script)
    store = make().start()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    yield from _running(S3, "setup_s3.sh", lambda: stores.SeaweedFS(tmp_path_factory.mktemp("seaweedfs")))


@pytest.fixture
def own_seaweed(seaweed, tmp_path_factory):
    """A SeaweedFS of the test's own (a test that kills a part of it), with the module store's credentials (the
    worker pool's environment has them); the command's --s3_endpoint_url names it."""
    if not S3:
        pytest.skip("TFRECORD_ETL_S3=0")
    yield from _running(
        True,
        "setup_s3.sh",
        lambda: stores.SeaweedFS(
            tmp_path_factory.mktemp("seaweedfs-own"), access_key=seaweed.access_key, secret_key=seaweed.secret_key
        ),
    )


@pytest.fixture(scope="module")
def fakegcs(tmp_path_factory):
    yield from _running(GCS, "setup_gcs.sh", lambda: stores.FakeGCS(tmp_path_factory.mktemp("fakegcs")))


@pytest.fixture(scope="module")
def isolation():
    reason = stores.Isolation.unavailable()
    if reason:
        pytest.skip(f"SKIP no shared disk: cannot make a private mount namespace here: {reason}")
    iso = stores.Isolation().start()
    try:
        yield iso
    finally:
        iso.stop()


@pytest.fixture(scope="module")
def pool(isolation, seaweed, fakegcs):
    """A worker pool (Prism's EXTERNAL environment) in the private mount namespace; its address."""
    work = cluster_dir("pool")
    procs = Processes(work / "logs", wrap=isolation.wrap)
    try:
        proc, port = worker_pool(procs, env=store_env(seaweed, fakegcs))
        yield f"127.0.0.1:{port}", proc
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def prism_bin():
    setup("setup_prism.sh")
    return str(ENGINES / "prism" / "prism")


@pytest.fixture(scope="module")
def isolated_flink(isolation, seaweed, fakegcs):
    if not ENGINE_ON["flink"]:
        pytest.skip("TFRECORD_ETL_FLINK=0")
    work = cluster_dir("flink")
    cluster = FlinkCluster(
        work, taskmanagers=2, slots=1, restarts=(3, 10), pool_env=store_env(seaweed, fakegcs), wrap=isolation.wrap
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def isolated_spark(isolation, seaweed, fakegcs):
    if not ENGINE_ON["spark"]:
        pytest.skip("TFRECORD_ETL_SPARK=0")
    work = cluster_dir("spark")
    cluster = SparkCluster(work, workers=2, cores=1, pool_env=store_env(seaweed, fakegcs), wrap=isolation.wrap)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def store_inputs(tmp_path_factory):
    """The inputs as local files: ``in.h5`` (chunked + gzip), ``npy/`` (4 .npy files), ``s.zarr`` (a Zarr store)."""
    import zarr

    d = tmp_path_factory.mktemp("store_inputs")
    data = make_inputs(d)
    (d / "npy").mkdir()
    for i in range(4):
        np.save(d / "npy" / f"part{i}.npy", np.arange(i * 600, (i + 1) * 600, dtype="<f4").reshape(300, 2))
    g = zarr.open_group(str(d / "s.zarr"), mode="w", zarr_format=2)
    g.create_array("img", shape=(256, 8, 8), chunks=(32, 8, 8), dtype="f4")[:] = (
        np.random.default_rng(5).standard_normal((256, 8, 8)).astype("f4")
    )
    g.create_array("label", shape=(256,), chunks=(32,), dtype="i8")[:] = np.arange(256)
    zarr.consolidate_metadata(str(d / "s.zarr"))
    return d, data


@pytest.fixture(scope="session")
def small_converted(inputs, reference):
    """The small input's DirectRunner convert (240 examples, 3 shards): the input of the tests that stop a job, and
    the previous output they must leave intact."""
    directory, _ = inputs
    return reference("convert", ["--input", directory / "in.h5", "--output_dir", "OUT", *CONVERT_FLAGS])


@pytest.fixture(scope="session")
def flink(tmp_path_factory):
    """The session's Flink cluster (test_flink.py, test_flink_jobs.py): 2 TaskManagers of 2 slots, 3 restarts."""
    # the restart delay (10 s) is longer than the heartbeat timeout (8 s): with 1 s, the restarts after a killed
    # TaskManager were all deployed to its slots before Flink noticed it was gone and the 3 attempts ran out in 4 s
    cluster = FlinkCluster(tmp_path_factory.mktemp("flink"), taskmanagers=2, slots=2, restarts=(3, 10))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def fresh_taskmanagers(request):
    """Before each test, the TaskManagers of the Flink clusters it uses replaced by fresh ones once one has used half
    of its metaspace (Beam's classes, loaded again by every job, fill it: ``flinkmemory``)."""
    for name in ("flink", "flink_no_restarts"):
        if name in request.fixturenames:
            flinkmemory.recycle(request.getfixturevalue(name))
