"""The commands' start-up: the garbage collector is paused while a command imports Beam and resumed (after
``gc.freeze``) when the command starts its work; a library import changes nothing.

The commands run as real processes with a ``sitecustomize`` that logs every ``gc.disable`` / ``gc.enable`` /
``gc.freeze`` call with whether Beam was imported yet, so the order is checked, not assumed.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT

SITECUSTOMIZE = """
import gc, json, os, sys
_log = os.environ["GC_CALLS_LOG"]
def _wrap(name):
    real = getattr(gc, name)
    def call(*a):
        with open(_log, "a") as f:
            f.write(json.dumps([name, "apache_beam" in sys.modules]) + "\\n")
        return real(*a)
    setattr(gc, name, call)
for _name in ("disable", "enable", "freeze"):
    _wrap(_name)
"""


@pytest.fixture
def traced(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "gc.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        "GC_CALLS_LOG": str(log),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    data = tmp_path / "in.h5"
    with h5py.File(data, "w") as f:
        f["x"] = np.arange(12, dtype="<f4").reshape(6, 2)

    def run(args):
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return [tuple(json.loads(line)) for line in log.read_text().splitlines()] if log.exists() else []

    return run, data, tmp_path


@pytest.mark.parametrize("module", ["pipelines.convert", "tfrecord_etl.pipelines.convert"])
def test_a_command_pauses_the_collector_for_its_imports_and_resumes_it_before_the_work(traced, module):
    run, data, tmp = traced
    calls = run(["-m", module, "--input", str(data), "--output_dir", str(tmp / "out")])
    # paused before Beam was imported; frozen, then enabled, once it was
    assert calls[:3] == [("disable", False), ("freeze", True), ("enable", True)], calls
    assert (tmp / "out" / "metadata.json").exists()


def test_the_console_command_pauses_and_resumes_too(traced):
    run, data, tmp = traced
    calls = run(
        [
            "-c",
            "import sys; sys.argv = ['tfrecord-etl', 'convert', '--input', sys.argv[1], '--output_dir', "
            "sys.argv[2]]; from tfrecord_etl.pipelines.cli import console; console()",
            str(data),
            str(tmp / "out"),
        ]
    )
    assert calls[:3] == [("disable", False), ("freeze", True), ("enable", True)], calls
    assert (tmp / "out" / "metadata.json").exists()


def test_importing_the_pipelines_as_a_library_leaves_the_collector_alone(traced):
    run, _, _ = traced
    assert (
        run(["-c", "import gc, tfrecord_etl.pipelines.convert, tfrecord_etl.pipelines.common; assert gc.isenabled()"])
        == []
    )
    assert gc.isenabled()
