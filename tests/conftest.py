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
