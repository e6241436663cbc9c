"""Code, docs and help speak to users: no references to this project's tracker (an issue number) in the README, the
docs site (docs/**/*.md, mkdocs.yml) or the code, configs, benchmark and tests; the history of the work lives in CHANGELOG.md. A reference to another
project's tracker is written as its address (``github.com/apache/beam/issues/...``, ``tensorflow/tfx#5811``), which
this check does not match.
"""

from __future__ import annotations

import os
import pathlib
import re

from tests.conftest import ROOT
from tests.hostile_groups import HOSTILE_GROUPS

# the word, a space and a number ("#" allowed), any case, singular or plural; not "issues/5811" (an address)
TRACKER_REFERENCE = re.compile(r"\bissues?\s+#?\d", re.IGNORECASE)
CHECKED_DIRS = ("docs", "transforms", "pipelines", "bench", "configs", "tests", "tfrecord_etl", ".ci")
CHECKED_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".md", ".cfg", ".ini", ".txt", ".pbtxt", ""}
CHECKED_TOP_FILES = ("README.md", "mkdocs.yml", "setup.py", "run_tests.sh", "run_local.sh", "pytest.ini")
SKIPPED_PARTS = {"__pycache__", ".hypothesis", ".pytest_cache"}


def _skipped_dir(name: str) -> bool:
    """Folders that are not ours to word: caches, and virtual environments (the benchmark's peer environments,
    ``bench/.venv-peers-*``, hold other projects' code)."""
    return name in SKIPPED_PARTS or name.startswith(".venv")


def checked_files(root: pathlib.Path) -> list[pathlib.Path]:
    """README.md, mkdocs.yml, the top-level scripts and every text file of the docs, code, config, benchmark and
    test folders (CHANGELOG.md is the history and is not checked; docs/changelog.md only includes it)."""
    files = [root / name for name in CHECKED_TOP_FILES if (root / name).is_file()]
    for folder in CHECKED_DIRS:
        found = []
        for directory, dirs, names in os.walk(root / folder):
            dirs[:] = [d for d in dirs if not _skipped_dir(d)]
            found += [pathlib.Path(directory) / n for n in names]
        files += [path for path in sorted(found) if path.suffix in CHECKED_SUFFIXES and path.name != "CHANGELOG.md"]
    return files


def tracker_references(root: pathlib.Path) -> list[str]:
    """``file:line: text`` of every line that cites this project's tracker by number."""
    found = []
    for path in checked_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file (a chart, a fixture) holds no prose
        for number, line in enumerate(text.splitlines(), 1):
            if TRACKER_REFERENCE.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:100]}")
    return found


def test_no_tracker_references_in_readme_docs_code_configs_bench_and_tests():
    found = tracker_references(ROOT)
    assert not found, (
        f"{len(found)} line(s) cite the project's tracker; say what the reference meant (what was "
        "measured, which case) and put history in CHANGELOG.md:\n" + "\n".join(found)
    )


def test_the_check_finds_a_reference_and_names_its_file_and_line(tmp_path):
    (tmp_path / "README.md").write_text("# t\nMeasured on 500 files.\n")
    (tmp_path / "transforms").mkdir()
    word = "Issue"  # spelled apart so that this file passes its own check
    (tmp_path / "transforms" / "a.py").write_text(
        f"x = 1\n# see tensorflow/tfx#5811 and apache/beam/issues/123\ny = 2  # faster ({word} 13, item 2)\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text(f'"""{word.lower()}s 12 and 13: splits"""\n')
    (tmp_path / "CHANGELOG.md").write_text(f"- {word} 13: object storage\n")
    (tmp_path / "docs" / "converting").mkdir(parents=True)
    (tmp_path / "docs" / "converting" / "hdf5.md").write_text(f"# HDF5\n\nGroups ({word} #7) are read.\n")
    venv = tmp_path / "bench" / ".venv-peers-ray" / "lib"  # another project's code in a benchmark environment
    venv.mkdir(parents=True)
    (venv / "theirs.py").write_text(f"# see {word} 16116\n")
    assert tracker_references(tmp_path) == [
        f"docs/converting/hdf5.md:3: Groups ({word} #7) are read.",
        f"transforms/a.py:3: y = 2  # faster ({word} 13, item 2)",
        f'tests/t.py:1: """{word.lower()}s 12 and 13: splits"""',
    ]


def test_hostile_group_numbers_in_test_docstrings_are_defined():
    """The hostile-input tests name their group ("Hostile group 13: ..."); each number has a definition."""
    used = set()
    for path in sorted((ROOT / "tests").glob("test_hostile_*.py")):
        used |= {int(n) for n in re.findall(r"[Hh]ostile groups? (\d+)", path.read_text(encoding="utf-8"))}
    assert used, "no hostile group named in tests/test_hostile_*.py"
    assert used <= set(HOSTILE_GROUPS), sorted(used - set(HOSTILE_GROUPS))


BYTE_ORDER = "values exact, dtype and shape kept, byte order normalised to little-endian"


def test_the_byte_order_promise_is_one_sentence_everywhere():
    """The README promised "exactly (dtype, shape, byte order)" while the converting page said the output is always
    little-endian (a ``>f8`` source reads back ``<f8``): every page and reader docstring that states it says the same
    words, and no page promises the source's byte order."""
    pages = ["README.md", "docs/index.md", "docs/converting/index.md", "docs/output.md", "docs/reading.md"]
    code = ["transforms/reading/reader.py", "transforms/reading/random_access.py", "transforms/codec/spec.py"]
    for name in pages + code:
        text = " ".join((ROOT / name).read_text().split())  # across line breaks and docstring indents
        assert BYTE_ORDER in text, name
    for path in checked_files(ROOT):
        if path.suffix == ".md" or path.name == "README.md":
            assert "exactly (dtype, shape, byte order)" not in path.read_text(), path
