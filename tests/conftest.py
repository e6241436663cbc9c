"""Shared test helpers: run a command in-process, locate the real third-party files."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(os.environ.get("TFRECORD_ETL_FIXTURES", ROOT / ".fixtures" / "site"))
# In-process DirectRunner: fast start, no Prism download attempt, deterministic order of work.
BEAM_FLAGS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def _this_checkouts_code() -> None:
    """The tests test this checkout's code, or stop: in a venv whose editable install came from another checkout,
    ``tfrecord_etl.transforms`` would silently be that checkout's folder (docs/development.md, "Several
    checkouts, one venv")."""
    import tfrecord_etl.pipelines
    import tfrecord_etl.transforms

    for package, folder in ((tfrecord_etl.transforms, "transforms"), (tfrecord_etl.pipelines, "pipelines")):
        found = pathlib.Path(list(package.__path__)[0]).resolve()
        if found != ROOT / folder:
            raise pytest.UsageError(
                f"{package.__name__} is {found}, not this checkout's {ROOT / folder}. Hint: run "
                f"configs/devlinks.sh once in {ROOT} and put it first on PYTHONPATH"
            )


_this_checkouts_code()

# A shell without job control starts a background command (`./run_tests.sh &`) with SIGINT ignored, and an ignored
# signal stays ignored in every process it starts: the Ctrl-C tests (test_killed_runs.py) would see no Ctrl-C.
# Python's own handler here, so the launchers the tests start get SIGINT's default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Parallel runs (`./run_tests.sh`: pytest-xdist, `-n 2 --dist loadgroup`; docs/development.md, "Tests"). The tests
# that start pools of worker processes (DirectRunner multi_processing, a Dask LocalCluster, PortableRunner, the
# benchmark's 2-worker contenders, SIGKILL and Ctrl-C runs) share one group, `processes`, that one xdist worker runs
# from start to end, first: never two pools at once on a 2-core machine (and the kill tests keep their timing).
# Module -> its test functions in the group (their parametrizations included), or "*" for all of the module's.
PROCESS_POOLS: dict[str, set[str] | str] = {
    "test_runners.py": "*",
    "test_killed_runs.py": "*",
    "test_hostile_workers.py": "*",
    "test_reliability.py": "*",
    "test_bench.py": {"test_bench_runs_small_at_tiny_scale", "test_bench_raw_and_files_sections_at_tiny_scale"},
    "test_hdf5_filters.py": {
        "test_every_plugin_filter_converts_exactly_in_two_worker_processes_and_verifies",
        "test_virtual_dataset_over_plugin_filtered_sources_converts_in_fresh_worker_processes",
    },
    "test_pinned_inputs.py": {"test_a_change_seen_by_a_worker_process_is_one_line"},
    "test_s3.py": {"test_s3_input_and_output_equal_a_local_run"},
    "test_packaging.py": {"test_installed_package_converts_from_outside_the_repo"},
}
POOLS_GROUP = "processes"


def xdist_group(nodeid: str) -> str:
    """The group of a test, from its node id: :data:`POOLS_GROUP` for :data:`PROCESS_POOLS`, else its module (or its
    class), so that a module's ``scope="module"`` fixtures (inputs, DirectRunner references, servers) are built
    once, on one worker, and its tests run in their file's order."""
    module, _, rest = nodeid.partition("::")
    function = rest.rsplit("::", 1)[-1].split("[", 1)[0]
    pools = PROCESS_POOLS.get(module.rsplit("/", 1)[-1], ())
    return POOLS_GROUP if pools == "*" or function in pools else nodeid.split("[", 1)[0].rsplit("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # xdist's hook: the reader stage's venv runs these tests without pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with the groups of :func:`xdist_group`, the ``processes`` group sent out first (it is
    the longest). pytest-xdist 3.8's own loadgroup cannot group under pytest 9.2 (it renames the tests' node ids,
    which pytest 9.2 ignores), so the groups are computed here, from the node ids, on the controller."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _assign_work_unit(self, node) -> None:
            if POOLS_GROUP in self.workqueue:
                self.workqueue.move_to_end(POOLS_GROUP, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def _beam_home(tmp_path_factory):
    """Beam writes ~/.apache_beam; keep it out of the real home."""
    home = tmp_path_factory.mktemp("home")
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    yield
    if old is not None:
        os.environ["HOME"] = old


def fixture_file(relative: str) -> pathlib.Path:
    """A real third-party file installed by run_tests.sh (pip --no-deps --target .fixtures/site)."""
    path = FIXTURES / relative
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run ./run_tests.sh, which installs the fixture packages")
    return path


def run_command(module_main, argv, capsys=None):
    """Runs a pipeline's ``main`` like the command line does; returns (exit code, stdout, stderr)."""
    from tfrecord_etl.pipelines import common

    code = common.run_main(module_main, [str(a) for a in argv])
    if capsys is None:
        return code, "", ""
    out = capsys.readouterr()
    return code, out.out, out.err


def convert(input_pattern, output_dir, *flags, capsys=None, beam=True):
    """Runs ``python -m pipelines.convert`` in-process with the in-memory DirectRunner."""
    from tfrecord_etl.pipelines import convert as convert_module

    argv = ["--input", input_pattern, "--output_dir", output_dir, *flags] + (BEAM_FLAGS if beam else [])
    return run_command(convert_module.main, argv, capsys)
