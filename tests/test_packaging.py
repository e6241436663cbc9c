"""Deployment: what Dataflow workers do with ``--setup_file ./setup.py``, the wheel next to the PyPI distributions
that install top-level ``transforms`` / ``pipelines`` packages of their own, and the cluster configs.

Beam's launcher builds an sdist of this project from setup.py (the Stager's own code is used here), the
workers install it and import ``tfrecord_etl.transforms`` / ``tfrecord_etl.pipelines`` from it, never from a
checkout. Here: the sdist goes into a fresh venv (the heavy dependencies come from .venv's site-packages through
a .pth file, so nothing is downloaded) and ``python -m tfrecord_etl.pipelines.convert`` runs from a temp dir
outside the repo, on DirectRunner with worker processes that import the installed copy too. The wheel goes into
another fresh venv that already holds PyPI's ``transforms`` 0.2.1 and ``pipelines`` 0.0.14 (fetched by
run_tests.sh into .fixtures/clash), and the ``tfrecord-etl`` console command converts there.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import numpy as np
import pytest

from tests.conftest import FIXTURES, ROOT, convert
from tfrecord_etl._install import WHEEL

CLASH = FIXTURES.parent / "clash"  # PyPI's transforms and pipelines distributions (see .ci/env.sh)

NOT_SHIPPED = (
    ".venv*",
    ".git",
    ".fixtures",
    "out",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".hypothesis",
    ".pytest_cache",
    "tests",
    "bench",
)


def build_sdist(tmp, for_workers: bool) -> str:
    """The sdist Beam's Stager builds from setup.py for --setup_file (from a copy of the checkout), in the
    launcher's environment (``for_workers``: pipelines.common.run_main has set WORKER_SDIST_ENV) or another."""
    from apache_beam.runners.portability.stager import Stager

    from tfrecord_etl.pipelines.common import WORKER_SDIST_ENV

    shutil.copytree(ROOT, tmp / "src", symlinks=True, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    (tmp / "staged").mkdir()
    saved = os.environ.pop(WORKER_SDIST_ENV, None)
    if for_workers:
        os.environ[WORKER_SDIST_ENV] = "1"
    try:
        return Stager._build_setup_package(str(tmp / "src" / "setup.py"), str(tmp / "staged"))
    finally:
        os.environ.pop(WORKER_SDIST_ENV, None)
        if saved is not None:
            os.environ[WORKER_SDIST_ENV] = saved


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """The sdist Beam's Stager builds from setup.py for --setup_file in our launcher."""
    return build_sdist(tmp_path_factory.mktemp("sdist"), for_workers=True)


def base_requirements(python) -> list[str]:
    """The installed tfrecord-etl's requirements without an extra marker (what ``pip install`` installs), names
    only, as ``python`` sees them."""
    probe = (
        "import importlib.metadata as m, re; print(' '.join(sorted(re.match(r'[A-Za-z0-9_.-]+', r).group(0)"
        ".lower() for r in m.requires('tfrecord-etl') if 'extra ==' not in r)))"
    )
    # run outside the checkout: `python -c` puts the working directory first on sys.path, where an editable
    # install's tfrecord_etl.egg-info would answer instead of the installed copy
    return subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True, cwd=pathlib.Path(python).parent
    ).stdout.split()


PIPELINES = [
    "apache-beam",
    "google-crc32c",
    "h5py",
    "hdf5plugin",
    "isal",
    "numpy",
    "pydantic",
    "pyyaml",
    "scipy",
    "tensorflow",
    "tensorflow-metadata",
    "tfx-bsl",
    "tqdm",
    "zlib-ng",
]


def library_files(folder: str) -> set[str]:
    """The .py files of one of the repo's folders, relative to it (``codec/spec.py``, ...)."""
    return {
        p.relative_to(ROOT / folder).as_posix() for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts
    }


def test_sdist_holds_every_module(sdist):
    """The sdist is the repo's layout (setup.py maps the folders when it is installed); configs/devlinks.sh's links
    in a checkout add nothing to it."""
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for package in ("pipelines", "transforms", "tfrecord_etl"):
        modules = {f"{package}/{p}" for p in library_files(package)}
        assert modules <= names, sorted(modules - names)
    assert not any(n.startswith(("tfrecord_etl/transforms", "tfrecord_etl/pipelines")) for n in names)
    assert "setup.py" in names


def test_the_workers_sdist_installs_the_pipelines_without_extras(installed):
    """Dataflow workers ``pip install`` the staged sdist without extras: the one our launcher builds carries the
    pipelines' requirements (PIPELINE-REQUIREMENTS.txt) as base requirements."""
    assert base_requirements(installed[0]) == PIPELINES


def test_another_sdist_requires_the_readers_only(tmp_path):
    sdist = build_sdist(tmp_path, for_workers=False)
    with tarfile.open(sdist) as tar:
        assert not any(n.endswith("PIPELINE-REQUIREMENTS.txt") for n in tar.getnames())
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(wheels),
            sdist,
        ],
        check=True,
        capture_output=True,
    )
    import zipfile

    wheel = zipfile.ZipFile(next(wheels.glob("tfrecord_etl-*.whl")))
    meta = wheel.read(next(n for n in wheel.namelist() if n.endswith("METADATA"))).decode()
    base = sorted(
        line.split(":", 1)[1].split("[")[0].split("<")[0].split(">")[0].strip().lower()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    )
    assert base == ["google-crc32c", "numpy"]
    assert 'Requires-Dist: apache-beam[gcp]<2.78,>=2.77; extra == "beam"' in meta


def fresh_venv(parent, *packages) -> tuple:
    """A fresh venv with only ``packages`` installed (--no-deps, no index); .venv's site-packages on its path by
    a .pth file. Returns (its python, its site-packages)."""
    venv = parent / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # a plain path line: .venv's own .pth files (the editable install of this checkout) are NOT processed
    with open(os.path.join(site, "_tfrecord_etl_deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    # without PYTHONPATH: a checkout on it holding a tfrecord_etl.egg-info (left by `pip wheel -w dist .`, as
    # getting-started builds the wheel) is an installed tfrecord-etl 0.1.0 to pip, and the wheel would not be installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            *map(str, packages),
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    return python, site


@pytest.fixture(scope="module")
def installed(sdist, tmp_path_factory):
    """A fresh venv with only the sdist installed, as a Dataflow worker installs --setup_file."""
    return fresh_venv(tmp_path_factory.mktemp("venv"), sdist)


def clean_env(home) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HOME=str(home), TF_CPP_MIN_LOG_LEVEL="3")
    return env


def test_installed_package_converts_from_outside_the_repo(installed, tmp_path):
    python, site = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import tfrecord_etl.pipelines as p, tfrecord_etl.transforms as t; print(p.__file__); print(t.__file__)",
        ],
        cwd=work,
        env=clean_env(tmp_path),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert all(w.startswith(site) for w in where), where  # the installed copy, not the checkout
    assert where == [
        os.path.join(site, "tfrecord_etl", "pipelines", "__init__.py"),
        os.path.join(site, "tfrecord_etl", "transforms", "__init__.py"),
    ]

    ids = np.arange(400, dtype="<i8")
    np.savez(work / "in.npz", id=ids, x=np.stack([ids, -ids], axis=1).astype(">f4"))
    flags = ["--num_shards", "2", "--compression", "gzip", "--target_range_mb", "0.002"]
    result = subprocess.run(
        [
            str(python),
            "-m",
            "tfrecord_etl.pipelines.convert",
            "--input",
            "in.npz",
            "--output_dir",
            "out",
            *flags,
            "--runner=DirectRunner",
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ],
        cwd=work,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 400 examples in 2 shards" in result.stdout

    # the same bytes as the checkout's own run
    code, _, _ = convert(work / "in.npz", tmp_path / "here", *flags)
    assert code == 0
    for name in ("data-00000-of-00002.tfrecord.gz", "data-00001-of-00002.tfrecord.gz", "schema.pbtxt"):
        assert (work / "out" / name).read_bytes() == (tmp_path / "here" / name).read_bytes(), name
    assert json.loads((work / "out" / "metadata.json").read_text())["num_records"] == 400


def test_wheel_installs_next_to_pypi_transforms_and_pipelines_and_the_console_command_converts(tmp_path):
    """Before: the wheel installed top-level ``transforms`` and ``pipelines``, as PyPI's ``transforms`` and
    ``pipelines`` distributions do: installing both shadowed one or the other."""
    clash = sorted(CLASH.glob("transforms-*")) + sorted(CLASH.glob("pipelines-*"))
    if len(clash) != 2:
        pytest.fail(
            f"{CLASH} lacks the PyPI transforms/pipelines distributions: run ./run_tests.sh, which fetches them"
        )
    wheels = tmp_path / "wheels"
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(wheels),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(wheels.glob("tfrecord_etl-*.whl"))
    assert wheel.name == WHEEL  # the file the install hints and the docs name
    import zipfile

    names = [n for n in zipfile.ZipFile(wheel).namelist() if not n.startswith("tfrecord_etl-")]
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tfrecord_etl"}, tops  # one import package, nothing top-level of another name
    # setup.py's package_dir: transforms/X.py is tfrecord_etl/transforms/X.py, every module once
    expected = {f"tfrecord_etl/{folder}/{f}" for folder in ("transforms", "pipelines") for f in library_files(folder)}
    expected |= {f"tfrecord_etl/{p.name}" for p in (ROOT / "tfrecord_etl").glob("*.py")}
    assert sorted(names) == sorted(expected)
    python, site = fresh_venv(tmp_path, *clash, wheel)
    assert base_requirements(python) == ["google-crc32c", "numpy"]  # the reader's: [beam] brings the pipelines
    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = (
        "import importlib.util as u, tfrecord_etl.transforms.codec as c; "
        "print(u.find_spec('transforms').origin); print(u.find_spec('pipelines').origin); print(c.__file__)"
    )
    theirs_t, theirs_p, ours = subprocess.run(
        [str(python), "-c", probe], cwd=work, env=clean_env(tmp_path), check=True, capture_output=True, text=True
    ).stdout.split()
    assert theirs_t == os.path.join(site, "transforms", "__init__.py")  # PyPI's, untouched
    assert os.path.exists(os.path.join(site, "transforms", "safe_html.py"))
    assert theirs_p == os.path.join(site, "pipelines", "__init__.py") and os.path.isdir(
        os.path.join(site, "pipelines", "api")
    )
    assert not os.path.exists(os.path.join(site, "transforms", "codec"))  # ours did not mix into theirs
    assert ours.startswith(os.path.join(site, "tfrecord_etl", "transforms"))

    with __import__("h5py").File(work / "in.h5", "w") as f:
        f["x"] = np.arange(60, dtype=">f8").reshape(20, 3)
        f["mask"] = np.arange(20 * 9).reshape(20, 9) % 3 == 0
    command = os.path.join(os.path.dirname(python), "tfrecord-etl")
    result = subprocess.run(
        [
            command,
            "convert",
            "--input",
            "in.h5",
            "--output_dir",
            "out",
            "--num_shards",
            "2",
            "--feature_encodings",
            "mask=packbits",
            "--runner=DirectRunner",
            "--direct_running_mode=in_memory",
        ],
        cwd=work,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 20 examples in 2 shards" in result.stdout
    result = subprocess.run(
        [command, "verify", "out", "--source", "in.h5"],
        cwd=work,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result = subprocess.run([command, "nope"], cwd=work, env=clean_env(tmp_path), capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("error: unknown command 'nope'")
    from tfrecord_etl.transforms import reader

    got = list(reader.iter_numpy(str(work / "out")))
    assert [e["x"].tolist() for e in got] == np.arange(60, dtype="<f8").reshape(20, 3).tolist()
    assert [e["mask"].tolist() for e in got] == (np.arange(180).reshape(20, 9) % 3 == 0).tolist()


def test_public_surface_loads_lazily_and_names_exist():
    """``import tfrecord_etl`` imports neither Beam nor TensorFlow; every name in __all__ resolves."""
    probe = (
        "import sys, tfrecord_etl as te; print('apache_beam' in sys.modules or 'tensorflow' in sys.modules); "
        "[getattr(te, n) for n in te.__all__]; print(te.ConvertToTFRecord.__module__, te.reader.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout.split()
    assert out == ["False", "tfrecord_etl.transforms.convert", "tfrecord_etl.transforms.reader"]


def test_no_module_imports_the_repo_packages_by_their_bare_names():
    """One import name (tfrecord_etl.*): a bare ``transforms``/``pipelines`` import would load a second copy of
    every module (two identities for each error class) and resolve to another distribution when installed."""
    import re

    bare = re.compile(r"^\s*(from|import)\s+(transforms|pipelines)\b", re.M)
    hits = [
        str(p.relative_to(ROOT))
        for folder in ("transforms", "pipelines", "tests", "bench", "configs", "tfrecord_etl")
        for p in (ROOT / folder).rglob("*.py")
        if bare.search(p.read_text())
    ]
    assert hits == []


# ----------------------------------------------------------------------------------------------
# configs/dataflow.yaml and configs/flink.yaml: valid convert configs whose pipeline_options Beam knows
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,runner,checks",
    [
        (
            "dataflow.yaml",
            "DataflowRunner",
            {
                "GoogleCloudOptions": {"region": "us-central1"},
                "SetupOptions": {"setup_file": "./setup.py"},
                "WorkerOptions": {"machine_type": "n2-standard-4", "max_num_workers": 20},
                "DebugOptions": {"experiments": ["use_runner_v2"]},
            },
        ),
        (
            "flink.yaml",
            "FlinkRunner",
            {
                "FlinkRunnerOptions": {"flink_version": "1.20", "parallelism": 8},
                "PortableOptions": {"environment_type": "DOCKER"},
            },
        ),
    ],
)
def test_cluster_configs_parse(name, runner, checks, caplog):
    from apache_beam.options import pipeline_options as po

    from tfrecord_etl.transforms.config import ConvertConfig, load_yaml, validate

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
