"""One name per module: the repo's ``transforms/`` and ``pipelines/`` folders are ``tfrecord_etl.transforms`` and
``tfrecord_etl.pipelines`` (setup.py's ``package_dir``) and nothing else, in a checkout too.

Two names would load a file twice as two module objects (two ``ConfigError`` classes, two source registries) and
make Beam pickle a DoFn under a name the workers may not have. Checked in fresh processes, as a checkout's user runs
them (the checkout's root first on ``sys.path``): every module of the library imported, the bare names refused,
``python -m pipelines.X`` (the checkout's alias) handing over to ``tfrecord_etl.pipelines.X``, and
``configs/devlinks.sh`` making a second checkout import its own code in a venv installed from another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.conftest import ROOT

# third-party packages of optional extras, not in the test environment: modules needing them are skipped
OPTIONAL = {"tfx", "torch"}

IMPORT_ALL = r"""
import importlib, json, os, sys
root = os.path.realpath(sys.argv[1])
optional = set(sys.argv[2].split(","))
names, skipped = [], {}
for folder in ("transforms", "pipelines"):
    for top, dirs, files in os.walk(os.path.join(root, folder)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(top, f), root)[:-3].replace(os.sep, ".")
                names.append("tfrecord_etl." + rel.removesuffix(".__init__"))
names += ["tfrecord_etl", "tfrecord_etl._install", "tfrecord_etl.tfx"]
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in optional:
            raise
        skipped[name] = e.name
refused = {}
for bare in ("transforms", "transforms.storage.fileio", "pipelines", "pipelines.common"):
    try:
        importlib.import_module(bare)
    except ImportError as e:
        refused[bare] = str(e)
ours = [os.path.join(root, d) + os.sep for d in ("transforms", "pipelines", "tfrecord_etl")]
files = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and any(os.path.realpath(path).startswith(d) for d in ours):
        files.setdefault(os.path.realpath(path), []).append(name)
print(json.dumps({"names": names, "skipped": skipped, "refused": refused, "files": files}))
"""


def run(args, cwd=ROOT, env=None, **kw):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw)


def test_every_module_of_the_library_loads_under_one_name():
    done = run(["-c", IMPORT_ALL, str(ROOT), ",".join(OPTIONAL)], env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert len(got["names"]) > 80 and set(got["skipped"]) <= {
        "tfrecord_etl.tfx",
        "tfrecord_etl.transforms.tfx.examplegen",
    }, got["skipped"]
    twice = {path: names for path, names in got["files"].items() if len(names) > 1}
    assert twice == {}, twice  # no file loaded as two modules
    assert all(names[0].split(".")[0] == "tfrecord_etl" for names in got["files"].values()), got["files"]
    loaded = {name for names in got["files"].values() for name in names}
    assert set(got["names"]) - set(got["skipped"]) <= loaded
    # the bare names are refused with the name to use (before: transforms.storage.fileio was a second module object)
    assert set(got["refused"]) == {"transforms", "transforms.storage.fileio", "pipelines", "pipelines.common"}
    assert "import tfrecord_etl.transforms.X, not transforms.X" in got["refused"]["transforms.storage.fileio"]
    assert "import tfrecord_etl.pipelines.X, not pipelines.X" in got["refused"]["pipelines.common"]


ATEXIT_PROBE = """
import atexit, json, os, sys
def _dump():
    main = sys.modules["__main__"]
    with open(os.environ["MODULES_LOG"], "w") as f:
        json.dump({"modules": {n: os.path.realpath(m.__file__) for n, m in list(sys.modules.items())
                               if getattr(m, "__file__", None)},
                   "main_defines_main": hasattr(main, "main"),
                   "alias": sys.modules.get("pipelines") is sys.modules.get("tfrecord_etl.pipelines")}, f)
atexit.register(_dump)
"""


def test_python_m_pipelines_x_runs_the_module_under_its_one_name(tmp_path):
    """``python -m pipelines.inspect`` from the checkout's root: the file runs as ``__main__`` only up to its hand-
    over, the command runs ``tfrecord_etl.pipelines.inspect`` (before: the whole command ran as ``__main__``, beside
    a second ``pipelines`` package)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ATEXIT_PROBE)
    log = tmp_path / "modules.json"
    for module in ("pipelines.inspect", "tfrecord_etl.pipelines.inspect"):
        done = run(
            ["-m", module, "--help"],
            env={"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "MODULES_LOG": str(log)},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.startswith("usage: tfrecord-etl inspect")
        got = json.loads(log.read_text())
        assert not got["main_defines_main"]  # the command's body did not run as __main__
        assert got["alias"] == (module == "pipelines.inspect")
        inspect = str(ROOT / "pipelines" / "inspect.py")
        # (multiprocessing's __mp_main__ is __main__ under another key)
        assert [n for n, f in got["modules"].items() if f == inspect and n != "__mp_main__"] == [
            "__main__",
            "tfrecord_etl.pipelines.inspect",
        ]
        bare = [n for n in got["modules"] if n.split(".")[0] in ("transforms", "pipelines")]
        assert bare == (["pipelines"] if module == "pipelines.inspect" else []), bare


def second_checkout(tmp_path):
    """A copy of the library's folders and configs/devlinks.sh: another checkout, not installed in this venv."""
    other = tmp_path / "other"
    for folder in ("tfrecord_etl", "transforms", "pipelines"):
        shutil.copytree(
            ROOT / folder,
            other / folder,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", "transforms", "pipelines")
            if folder == "tfrecord_etl"
            else shutil.ignore_patterns("__pycache__"),
        )
    (other / "configs").mkdir()
    shutil.copy2(ROOT / "configs" / "devlinks.sh", other / "configs" / "devlinks.sh")
    return other


WHERE = "import tfrecord_etl.transforms.reader as r, os; print(os.path.realpath(r.__file__))"


def test_devlinks_makes_a_second_checkout_import_its_own_code(tmp_path):
    other = second_checkout(tmp_path)
    no_path = {"PYTHONPATH": None}
    # without the links the venv's install would answer for tfrecord_etl.transforms with another checkout's code:
    # refused, naming both folders and the fix
    before = run(["-c", WHERE], cwd=other, env=no_path)
    last = before.stderr.strip().splitlines()[-1]
    assert before.returncode == 1 and last.startswith(
        f"ImportError: tfrecord_etl is imported from the checkout {other}, but tfrecord_etl.transforms would be /"
    ), last
    assert last.split(" would be ")[1].split(" (")[0] != str(other / "transforms"), last
    assert "Hint: run configs/devlinks.sh once in that checkout" in before.stderr
    # the checkout's alias says it in one line
    mixed = run(["-m", "pipelines.inspect", "--help"], cwd=other, env=no_path)
    assert mixed.returncode == 2 and "Traceback" not in mixed.stderr, mixed.stderr
    assert mixed.stderr.startswith("error: tfrecord_etl is imported from the checkout")
    assert "configs/devlinks.sh" in mixed.stderr

    script = ["bash", str(other / "configs" / "devlinks.sh")]
    made = subprocess.run(script, capture_output=True, text=True, check=True)
    assert made.stdout.splitlines() == [
        "linked tfrecord_etl/transforms -> ../transforms",
        "linked tfrecord_etl/pipelines -> ../pipelines",
    ]
    assert os.readlink(other / "tfrecord_etl" / "transforms") == "../transforms"
    assert subprocess.run(script, capture_output=True, text=True, check=True).stdout == ""  # once is enough
    for cwd, env in ((other, no_path), (tmp_path, {"PYTHONPATH": str(other)})):  # the root, or on PYTHONPATH
        after = run(["-c", WHERE], cwd=cwd, env=env)
        assert after.stdout.strip() == str((other / "transforms" / "reader.py").resolve()), after.stdout + after.stderr
    alias = run(["-m", "pipelines.inspect", "--help"], cwd=other, env=no_path)
    assert alias.returncode == 0 and alias.stdout.startswith("usage: tfrecord-etl inspect"), alias.stderr

    removed = subprocess.run([*script, "--remove"], capture_output=True, text=True, check=True)
    assert removed.stdout.splitlines() == ["removed tfrecord_etl/transforms", "removed tfrecord_etl/pipelines"]
    assert not os.path.lexists(other / "tfrecord_etl" / "transforms")
    # never replaces what it did not write
    (other / "tfrecord_etl" / "pipelines").mkdir()
    (other / "tfrecord_etl" / "pipelines" / "mine.txt").write_text("kept")
    refused = subprocess.run(script, capture_output=True, text=True)
    assert refused.returncode == 2 and "exists and is not the link ../pipelines" in refused.stderr
    assert (other / "tfrecord_etl" / "pipelines" / "mine.txt").read_text() == "kept"
