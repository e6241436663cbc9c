"""Deployment: what Dataflow workers do with ``--setup_file ./setup.py``, and the cluster configs.

Beam's launcher builds an sdist of this project from setup.py (the Stager's own code is used here), the
workers install it and import ``pipelines`` / ``transforms`` from it, never from a checkout. Here: the
sdist goes into a fresh venv (the heavy dependencies come from .venv's site-packages through a .pth
file, so nothing is downloaded) and ``python -m pipelines.convert`` runs from a temp dir outside the repo,
on DirectRunner with worker processes that import the installed copy too.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import numpy as np
import pytest

from tests.conftest import ROOT, convert

NOT_SHIPPED = (".venv*", ".git", ".fixtures", "out", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
               ".pytest_cache", "tests", "bench")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """The sdist Beam's Stager builds from setup.py, as for --setup_file (from a copy of the checkout)."""
    from apache_beam.runners.portability.stager import Stager
    tmp = tmp_path_factory.mktemp("sdist")
    shutil.copytree(ROOT, tmp / "src", ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    (tmp / "staged").mkdir()
    return Stager._build_setup_package(str(tmp / "src" / "setup.py"), str(tmp / "staged"))


def test_sdist_holds_every_module(sdist):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for package in ("pipelines", "transforms"):
        modules = {f"{package}/{p}" for p in os.listdir(ROOT / package) if p.endswith(".py")}
        assert modules <= names, sorted(modules - names)
    assert "setup.py" in names


@pytest.fixture(scope="module")
def installed(sdist, tmp_path_factory):
    """A fresh venv with only the sdist installed (--no-deps); .venv's site-packages on its path by .pth."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # a plain path line: .venv's own .pth files (the editable install of this checkout) are NOT processed
    with open(os.path.join(site, "_tfrecord_etl_deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", sdist], check=True, capture_output=True)
    return python, site


def clean_env(home) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HOME=str(home), TF_CPP_MIN_LOG_LEVEL="3")
    return env


def test_installed_package_converts_from_outside_the_repo(installed, tmp_path):
    python, site = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import pipelines, transforms; print(pipelines.__file__); "
                            "print(transforms.__file__)"], cwd=work, env=clean_env(tmp_path),
                           check=True, capture_output=True, text=True).stdout.split()
    assert all(w.startswith(site) for w in where), where  # the installed copy, not the checkout

    ids = np.arange(400, dtype="<i8")
    np.savez(work / "in.npz", id=ids, x=np.stack([ids, -ids], axis=1).astype(">f4"))
    flags = ["--num_shards", "2", "--compression", "gzip", "--target_range_mb", "0.002"]
    result = subprocess.run([str(python), "-m", "pipelines.convert", "--input", "in.npz", "--output_dir", "out",
                             *flags, "--runner=DirectRunner", "--direct_running_mode=multi_processing",
                             "--direct_num_workers=2"],
                            cwd=work, env=clean_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 400 examples in 2 shards" in result.stdout

    # the same bytes as the checkout's own run
    code, _, _ = convert(work / "in.npz", tmp_path / "here", *flags)
    assert code == 0
    for name in ("data-00000-of-00002.tfrecord.gz", "data-00001-of-00002.tfrecord.gz", "schema.pbtxt"):
        assert (work / "out" / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name
    assert json.loads((work / "out" / "metadata.json").read_text())["num_records"] == 400


# ----------------------------------------------------------------------------------------------
# configs/dataflow.yaml and configs/flink.yaml: valid convert configs whose pipeline_options Beam knows
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,runner,checks", [
    ("dataflow.yaml", "DataflowRunner", {"GoogleCloudOptions": {"region": "us-central1"},
                                         "SetupOptions": {"setup_file": "./setup.py"},
                                         "WorkerOptions": {"machine_type": "n2-standard-4", "max_num_workers": 20},
                                         "DebugOptions": {"experiments": ["use_runner_v2"]}}),
    ("flink.yaml", "FlinkRunner", {"FlinkRunnerOptions": {"flink_version": "1.20", "parallelism": 8},
                                   "PortableOptions": {"environment_type": "DOCKER"}}),
])
def test_cluster_configs_parse(name, runner, checks, caplog):
    from apache_beam.options import pipeline_options as po
    from transforms.config import ConvertConfig, load_yaml, validate
    values = load_yaml(str(ROOT / "configs" / name))
    cfg = validate(ConvertConfig, {**values, "input": "gs://b/in/*.h5", "output_dir": "gs://b/out"})
    assert cfg.writer == "planned"
    argv = cfg.beam_argv(["--job_name=from-the-command-line"])
    options = po.PipelineOptions(argv)
    with caplog.at_level(logging.WARNING, logger="apache_beam.options.pipeline_options"):
        everything = options.get_all_options()
    assert "unparseable" not in caplog.text, caplog.text  # every key is a Beam flag
    assert everything["runner"] == runner
    for view, expected in checks.items():
        got = options.view_as(getattr(po, view))
        for key, value in expected.items():
            assert getattr(got, key) == value, (view, key)
    if name == "dataflow.yaml":
        assert everything["job_name"] == "from-the-command-line"  # the command line wins
        assert everything["temp_location"].startswith("gs://") and everything["staging_location"].startswith("gs://")
