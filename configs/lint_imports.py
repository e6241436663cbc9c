"""The library's layers, checked: import-linter's contracts in ``.importlinter`` over ``tfrecord_etl``.

    .venv/bin/python configs/lint_imports.py [lint-imports options, e.g. --verbose]

import-linter (through grimp) reads a package's files from its folder alone. In a checkout, ``tfrecord_etl``'s
``transforms`` and ``pipelines`` subpackages are the repository's top-level folders, not folders inside
``tfrecord_etl/``, so this script shows import-linter a view of the package as it is installed: a temporary folder
``tfrecord_etl/`` of symbolic links to ``tfrecord_etl/*``, ``transforms/`` and ``pipelines/`` (nothing is copied
or imported). When ``tfrecord_etl/transforms`` is a folder already (an installed layout), the checkout is checked
as it is. Exits with lint-imports' status: 0 when every contract is kept.
"""

from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, ".importlinter")


def package_view(tmp: str) -> str:
    """A folder holding ``tfrecord_etl/`` as installed (symbolic links into the checkout); its path."""
    package = os.path.join(tmp, "tfrecord_etl")
    os.mkdir(package)
    for name in os.listdir(os.path.join(ROOT, "tfrecord_etl")):
        if name != "__pycache__":
            os.symlink(os.path.join(ROOT, "tfrecord_etl", name), os.path.join(package, name))
    for name in ("transforms", "pipelines"):
        if not os.path.exists(os.path.join(package, name)):
            os.symlink(os.path.join(ROOT, name), os.path.join(package, name))
    return tmp


def main(argv: list[str]) -> int:
    from importlinter.cli import lint_imports

    with tempfile.TemporaryDirectory(prefix="lint-imports-") as tmp:
        installed = os.path.isdir(os.path.join(ROOT, "tfrecord_etl", "transforms"))
        where = ROOT if installed else package_view(tmp)
        # lint-imports puts the working directory first on sys.path: the view's, so tfrecord_etl is found there
        sys.path = [where] + [p for p in sys.path if os.path.abspath(p or ".") != ROOT]
        os.chdir(where)
        return lint_imports(
            config_filename=CONFIG, no_cache=True, verbose="--verbose" in argv, show_timings="--show-timings" in argv
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
