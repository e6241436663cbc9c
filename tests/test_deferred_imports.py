"""Imports inside functions: a module of ours, of the standard library or NumPy is imported at the top of the module
that uses it, unless importing it there would load a heavy or optional package (Beam, TensorFlow, pydantic, zarr,
...) or the source registry into a module that must stay light (``import tfrecord_etl``, the reader, ``verify``
and ``inspect``), or it exists on some platforms only. Such an import says so: ``deferred:`` and what it defers,
on its line or in the comments just above it (docs/development.md, "Layers"). Third-party packages other than
NumPy are imported where they are used."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import ROOT

FOLDERS = ("transforms", "pipelines")
SKIP = {"try:", "else:"}  # lines that may stand between a deferred import and its comment
LIGHT = {"tfrecord_etl", "numpy", *sys.stdlib_module_names}  # packages imported at the top unless deferred


def light_imports_in_functions(tree: ast.AST):
    """Every import of our modules, the standard library's or NumPy inside a function body."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                if any(name.split(".")[0] in LIGHT for name in names):
                    yield node


def says_why(lines: list[str], node: ast.stmt) -> bool:
    """``deferred:`` on the import's lines, or above it through comments, blank lines and the imports beside it."""
    if any("deferred:" in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    i = node.lineno - 2
    while i >= 0:
        text = lines[i].strip()
        if "deferred:" in text:
            return True
        if not (text == "" or text.startswith(("#", "from ", "import ")) or text.split("#")[0].strip() in SKIP):
            return False
        i -= 1
    return False


def test_every_light_import_inside_a_function_says_what_it_defers():
    bare = []
    for path in sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        bare += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            for node in light_imports_in_functions(ast.parse(text))
            if not says_why(lines, node)
        ]
    assert not bare, "import these at the top of the module, or say '# deferred: PACKAGE ...':\n" + "\n".join(bare)


def test_the_check_finds_an_import_that_does_not_say_why():
    source = (
        "def f():\n"
        "    x = 1\n"
        "    from tfrecord_etl.transforms import codec\n"
        "def g():\n"
        "    # deferred: the source registry\n"
        "    from tfrecord_etl.transforms import sources\n\n"
        "    from tfrecord_etl.transforms.sources import base\n"
        "def h():\n"
        "    try:  # deferred: zarr\n"
        "        from tfrecord_etl.transforms.sources import zarrbounded\n"
        "    except ImportError:\n"
        "        pass\n"
        "def k():\n"
        "    import json\n"
        "    import h5py\n"
        "    import numpy as np\n"
    )
    lines = source.splitlines()
    found = {n.lineno: says_why(lines, n) for n in light_imports_in_functions(ast.parse(source))}
    assert found == {3: False, 6: True, 8: True, 11: True, 15: False, 17: False}


FORMAT_MODULES = ("hdf5", "netcdf3", "npz", "npy", "raw", "files", "matlab", "zarrsrc", "envi", "registry")


def test_the_source_registry_loads_on_first_use():
    """``import tfrecord_etl.transforms.sources`` (and the reader, verify, inspect and planning, which import it at
    their top) loads ``base`` and ``signatures`` only; the first use of ``sources.REGISTRY`` or a format's class
    loads the registry and every format's module. Before, any import of the package loaded all of them."""
    code = (
        "import sys\n"
        "import tfrecord_etl.transforms.reader, tfrecord_etl.pipelines.verify, tfrecord_etl.pipelines.inspect\n"
        "import tfrecord_etl.transforms.planning\n"
        "from tfrecord_etl.transforms import sources\n"
        "from tfrecord_etl.transforms.sources import RowRange, SourceOptions\n"
        f"formats = {FORMAT_MODULES!r}\n"
        "def loaded():\n"
        "    return sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
        "                  if m.startswith('tfrecord_etl.transforms.sources.') and m.rsplit('.', 1)[1] in formats)\n"
        "print(loaded())\n"
        "print(sources.REGISTRY['hdf5'] is sources.Hdf5Source, sources.FORMATS[0], len(loaded()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.splitlines() == ["[]", f"True hdf5 {len(FORMAT_MODULES)}"]


def test_a_format_module_imported_alone_still_tells_other_formats():
    """A format's module imported on its own (not through the registry) names another format in its hints: the
    signatures' lookup loads the registry first."""
    code = (
        "from tfrecord_etl.transforms.sources.hdf5 import Hdf5Source\n"
        "from tfrecord_etl.transforms.sources import signatures\n"
        "print(signatures.SIGNED == {})\n"
        "print(signatures.content_format(b'CDF\\x01' + bytes(100)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.splitlines() == ["True", "netcdf3"]
