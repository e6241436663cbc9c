"""What a newcomer copies from the documentation, the help and our messages works as written: the installs name
the clone or the wheel (the project is not on a package index), the commands are the installed ``tfrecord-etl
COMMAND`` (``python -m pipelines.X`` works only from the repo root), shell blocks pasted in order never write into
an output directory an earlier command wrote, and every input format is on the home page and in the README."""

from __future__ import annotations

import posixpath
import re
import shlex
import subprocess
import sys

import pytest

from tests import docsnippets
from tests.conftest import ROOT
from tests.test_help import command_help
from tfrecord_etl import __version__, _install
from tfrecord_etl.pipelines import common, flaghelp
from tfrecord_etl.transforms import sources

# what users read: the README, the docs site, the code (messages, hints, --help, docstrings rendered in the API
# page), setup.py and the configs; not the CHANGELOG (history), the tests, bench/ or configs/engines/ (developer
# tools run from the checkout)
USER_TOP_FILES = ("README.md", "mkdocs.yml", "setup.py")
USER_DIRS = ("docs", "transforms", "pipelines", "tfrecord_etl", "configs")
DEVELOPER_DIRS = ("configs/engines",)
USER_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".txt", ".sh", ".cfg"}

# "pip install tfrecord-etl", "pip install 'tfrecord-etl[beam]'", "pip install tfrecord_etl torch": the project's
# name from a package index; not a wheel's file name (tfrecord_etl-0.1.0-...) nor a path ('.[beam]', dist/...)
INDEX_INSTALL = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?tfrecord[-_]etl(?![-\w./])")
CHECKOUT_ALIAS = re.compile(r"-m\s+pipelines\.")


def user_files(root=ROOT):
    """(path relative to ``root``, text) of every file users read (see USER_DIRS)."""
    files = [root / name for name in USER_TOP_FILES if (root / name).is_file()]
    for folder in USER_DIRS:
        files += sorted(
            p
            for p in (root / folder).rglob("*")
            if p.is_file() and p.suffix in USER_SUFFIXES and "__pycache__" not in p.parts
        )
    out = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        if not rel.startswith(DEVELOPER_DIRS):
            out.append((rel, path.read_text(encoding="utf-8")))
    return out


def lines_matching(pattern, root=ROOT):
    """``file:line: text`` of every match of ``pattern`` in the user files (a match may span lines)."""
    found = []
    for rel, text in user_files(root):
        for match in pattern.finditer(text):
            n = text.count("\n", 0, match.start())
            found.append(f"{rel}:{n + 1}: {text.splitlines()[n].strip()[:120]}")
    return found


# --- installing ------------------------------------------------------------------------------------------------


def test_no_page_readme_help_or_message_installs_the_project_from_a_package_index():
    found = lines_matching(INDEX_INSTALL)
    assert not found, (
        "tfrecord-etl is not on a package index: install from the clone (pip install '.[beam]') or "
        "the wheel (" + _install.pip_install("beam") + "):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "line, found",
    [
        ("pip install tfrecord-etl              # the reader", True),
        ("pip install 'tfrecord-etl[beam]'", True),
        ("``pip install tfrecord-etl[tfx]``", True),
        ("pip install -U tfrecord_etl torch", True),
        ("pip install '.[beam]'", False),
        ("pip install 'dist/tfrecord_etl-0.1.0-py3-none-any.whl[beam]'", False),
        ("pip install tfrecord_etl-0.1.0-py3-none-any.whl", False),
    ],
)
def test_the_index_install_pattern(line, found):
    assert bool(INDEX_INSTALL.search(line)) is found


def test_the_install_hint_names_the_clone_and_the_wheel_setup_py_builds():
    version = re.search(r'^\s*version="([^"]+)"', (ROOT / "setup.py").read_text(encoding="utf-8"), re.M).group(1)
    assert version == __version__
    assert f"tfrecord_etl-{version}-py3-none-any.whl" == _install.WHEEL
    assert _install.pip_install("beam") == (
        "pip install '.[beam]' in a clone of tfrecord-etl, or pip install "
        f"'dist/tfrecord_etl-{version}-py3-none-any.whl[beam]'"
    )
    error = ImportError("No module named 'apache_beam'", name="apache_beam")
    assert common.missing_pipelines_line(error, "tfrecord-etl convert") == (
        "tfrecord-etl convert needs the pipeline dependencies (apache_beam is not installed): "
        + _install.pip_install("beam")
    )


def test_every_wheel_the_docs_name_is_the_one_setup_py_builds():
    named = {m for _, text in user_files() for m in re.findall(r"tfrecord_etl-[\w.]+-py3-none-any\.whl", text)}
    assert named == {_install.WHEEL}


# --- command names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", flaghelp.COMMANDS)
def test_help_usage_names_the_console_command(command, capsys):
    text = command_help(command, capsys)
    assert text.startswith(f"usage: tfrecord-etl {command} "), text[:200]
    assert not CHECKOUT_ALIAS.search(text), text


def test_no_page_help_or_message_names_the_checkout_alias_but_the_development_page_once():
    found = [line for line in lines_matching(CHECKOUT_ALIAS) if not line.startswith("docs/development.md:")]
    assert not found, "python -m pipelines.X works only from the repo root; write tfrecord-etl X:\n" + "\n".join(found)
    development = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert len(CHECKOUT_ALIAS.findall(development)) == 1


def test_the_checkout_alias_still_runs_from_the_repo_root():
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.inspect", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: tfrecord-etl inspect ")


# --- shell blocks pasted in order --------------------------------------------------------------------------------

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(bash|sh|shell)\s*$")
_WRITER = re.compile(r"(?:\btfrecord-etl|-m\s+tfrecord_etl|-m\s+(?:tfrecord_etl\.)?pipelines\.)\s*(convert|augment)\b")
# flags with which writing into an existing output is what the command is for
_ADDS_TO_OUTPUT = {"--overwrite", "--span", "--incremental", "--split"}


def shell_commands(text):
    """(line number, command line) of every bash block of a Markdown page, run or not, in order; continuation lines
    joined. Hidden setup (inside an HTML comment) is not pasted by anyone and is left out."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        j, pending, start = i + 1, "", None
        while j < len(lines) and not lines[j].strip().startswith(fence.group(2)):
            line = lines[j].strip()
            start = j + 1 if not pending else start
            if line.endswith("\\"):
                pending += line[:-1] + " "
            else:
                out.append((start, pending + line))
                pending = ""
            j += 1
        i = j + 1
    return out


def _tokens(command):
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split("#")[0].split()


def _holds(a, b):
    """Whether directory ``a`` is ``b`` or holds it."""
    return a == b or b.startswith(a + "/")


def output_dir_reuse(page, text):
    """``page:line: command`` of every convert/augment command that writes into an output directory an earlier
    command of the page wrote, or into a directory holding one, without a flag that adds to an existing output."""
    written, found = [], []
    for line, command in shell_commands(text):
        tokens = _tokens(command)
        if tokens[:2] in (["rm", "-r"], ["rm", "-rf"]):
            removed = [posixpath.normpath(t) for t in tokens[2:]]
            written = [w for w in written if not any(_holds(r, w) for r in removed)]
            continue
        if not _WRITER.search(command):
            continue
        flags = {t.split("=")[0] for t in tokens if t.startswith("--")}
        if "--dry_run" in flags or re.search(r"\[--", command):  # writes nothing; a usage form, not a command
            continue
        if re.search(r"\{(?:SPAN|YYYY)\}", command):  # an input with span placeholders: a collection's next span
            flags.add("--span")
        target = next(
            (tokens[k + 1] for k, t in enumerate(tokens[:-1]) if t == "--output_dir"),
            next((t.split("=", 1)[1] for t in tokens if t.startswith("--output_dir=")), None),
        )
        if target is None:
            continue
        target = posixpath.normpath(target.rstrip("/"))
        # the same directory, or one holding an earlier output (a directory it did not write); an output inside an
        # earlier one is a new directory
        if any(_holds(target, w) for w in written) and not flags & _ADDS_TO_OUTPUT:
            found.append(f"{page}:{line}: {command.strip()[:110]}")
        written.append(target)
    return found


def test_no_shell_block_writes_into_an_output_an_earlier_command_of_its_page_wrote():
    found = []
    for path in docsnippets.pages(ROOT):
        found += output_dir_reuse(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
    assert not found, (
        "pasted in order, these commands exit 2 (the output directory exists); give each alternative "
        "its own --output_dir:\n" + "\n".join(found)
    )


def test_the_reuse_check_finds_alternatives_sharing_an_output_dir():
    page = (
        "```bash\n"
        "tfrecord-etl convert --input a.h5 --output_dir out/cells\n"
        "tfrecord-etl convert --input 'run*.h5' --output_dir out --datasets /x   # above out/cells\n"
        "tfrecord-etl convert --input a.h5 --output_dir b/ --compression gzip\n"
        "```\n\nprose\n\n```bash\n"
        "tfrecord-etl convert --input a.h5 \\\n    --output_dir b --index\n"
        "tfrecord-etl convert --input a.h5 --output_dir b --overwrite\n"
        "tfrecord-etl convert --input 'raw/*.h5' --output_dir coll/ --incremental\n"
        "tfrecord-etl convert --input 'raw/*.h5' --output_dir coll/ --incremental\n"
        "tfrecord-etl augment --input b --output_dir c\n"
        "rm -r c\n"
        "python -m pipelines.augment --input b --output_dir=c\n"
        "```\n"
    )
    assert output_dir_reuse("p.md", page) == [
        "p.md:3: tfrecord-etl convert --input 'run*.h5' --output_dir out --datasets /x   # above out/cells",
        "p.md:10: tfrecord-etl convert --input a.h5  --output_dir b --index",
    ]


# the pages whose blocks list alternative commands: each such block runs in the docs tests, in order
RUN_PAGES = ("docs/converting/hdf5.md", "docs/converting/zarr.md", "docs/output.md")


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_blocks_listing_alternatives_run_in_the_docs_tests(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    marked = {b.line for b in docsnippets.parse(text, page) if not b.hidden and b.language == "bash"}
    writers = {line for line, command in shell_commands(text) if _WRITER.search(command)}
    # a block's commands run when the block's first code line is marked; map each command to its block's start
    starts, lines = [], text.splitlines()
    for n, line in enumerate(lines, 1):
        if _FENCE.match(line):
            starts.append(n + 1)
    unmarked = sorted(
        w for w in writers if max(s for s in starts if s <= w) not in marked and "://" not in lines[w - 1]
    )
    assert not unmarked, f"{page}: commands in blocks the docs tests do not run: lines {unmarked}"


# --- formats -----------------------------------------------------------------------------------------------------

# each source format: how the README and the home page name it
FORMAT_NAMES = {
    "hdf5": "HDF5",
    "netcdf3": "NetCDF-3",
    "npz": ".npz",
    "npy": ".npy",
    "raw": "raw",
    "files": "image",
    "matlab": "MATLAB",
    "zarr": "Zarr",
    "envi": "ENVI",
    "nifti": "NIfTI",
    "parquet": "Parquet",
    "fits": "FITS",
}


def test_every_format_is_on_the_home_pages_task_table_and_in_the_readme():
    assert set(FORMAT_NAMES) == set(sources.FORMATS)
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in index.splitlines() if line.startswith("| convert my files"))
    pages = sorted(p.name for p in (ROOT / "docs" / "converting").glob("*.md") if p.name != "index.md")
    assert [p for p in pages if f"(converting/{p})" not in row] == []
    for name, text in (("docs/index.md", index), ("README.md", readme)):
        intro = text.split("\n\n")[1]  # the paragraph under the title: what goes in, what comes out
        assert [f for f in FORMAT_NAMES.values() if f not in intro] == [], name
    sources_row = next(line for line in readme.splitlines() if line.startswith("| Sources |"))
    assert [f for f in FORMAT_NAMES.values() if f not in sources_row] == []
