"""What the engine tests share across modules (session-scoped, so Flink's and Spark's tests build each input and
each DirectRunner reference once): the small inputs, the larger input of the lost-worker tests and the DirectRunner
references of the commands they run.

TFRECORD_ETL_ENGINES_FULL=1 runs the whole set (more parallelism, inputs and failure variants: the tests marked
with ``common.full_only``); by default the stage runs one test per deliverable. TFRECORD_ETL_ENGINES_BIG=1 makes
the lost-worker input >= 500 MB (the manual run)."""

from __future__ import annotations

import os

import pytest

from configs.engines import common, flinkmemory
from configs.engines.engines import FlinkCluster
from tests.test_runners import make_inputs

BIG = os.environ.get("TFRECORD_ETL_ENGINES_BIG") == "1"
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
