"""The runnable snippets of the documentation (README.md and docs/**/*.md): find them, run them, say what failed.

Marking, in a page's Markdown (nothing of it is rendered but the visible blocks):

- ``<!-- test -->`` on the line right before a python or bash code fence: the block is run.
- ``<!-- test: requires MODULE[,MODULE] -->`` there instead: run only when every MODULE imports, else reported as
  skipped with the reason.
- Hidden setup, run in order with the others (e.g. to write the small input files the visible blocks read)::

      <!-- test-setup python
      import numpy as np; np.save("a.npy", np.arange(10))
      -->

  (or ``<!-- test-setup bash``).

Running (:func:`run_page`): a page's blocks in document order, in one fresh empty temporary directory as the
working directory, by one Python subprocess per page (TensorFlow and Beam are never imported into pytest). Python
blocks share one namespace; bash blocks run with ``bash -euo pipefail`` in that directory, with the venv's ``bin``
first on PATH, PYTHONPATH at this checkout (so ``tfrecord-etl`` and ``python`` run this code) and
TFRECORD_ETL_FIXTURES exported. A page passes when every block ends with status 0 (a python block checks its
results with ``assert``); a failure names the page, the block's first line and its output. A python block's
traceback gives the page's own line numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent

_MARK = re.compile(r"^\s*<!--\s*test(?::\s*requires\s+(?P<mods>[\w.,\s]+?))?\s*-->\s*$")
_SETUP = re.compile(r"^\s*<!--\s*test-setup\s+(?P<lang>python|bash)\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*\{?\s*\.?(?P<lang>[\w+-]*)")
_ANY_MARK = re.compile(r"<!--\s*test")
LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash", "console": None}
MARKER = "@@docsnippet@@"  # the driver's line before each block's output: MARKER <index>


class SnippetError(ValueError):
    """A page's test markers are malformed (a marker with no code fence after it, an unterminated setup)."""


@dataclasses.dataclass(frozen=True)
class Block:
    """One runnable block: ``language`` python or bash, its ``code``, the page's 1-based ``line`` of its first
    code line, the modules it ``requires``, and whether it is hidden setup."""

    language: str
    code: str
    line: int
    requires: tuple[str, ...] = ()
    hidden: bool = False


def parse(text: str, page: str = "<page>") -> list[Block]:
    """The runnable blocks of Markdown ``text``, in document order.

    Raises:
      SnippetError: ``page:line: ...`` for a marker not followed by a python/bash fence, a fence never closed, a
        setup comment never closed, or a line mentioning ``<!-- test`` that is not a marker.
    """
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        line = lines[i]
        setup = _SETUP.match(line)
        mark = _MARK.match(line)
        if setup:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->"), None)
            if end is None:
                raise SnippetError(f"{page}:{i + 1}: test-setup comment is never closed by a line holding only -->")
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            blocks.append(Block(setup.group("lang"), code + "\n", i + 2, (), True))
            i = end + 1
            continue
        if mark:
            fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            language = LANGUAGES.get(fence.group("lang")) if fence else None
            if language is None:
                raise SnippetError(
                    f"{page}:{i + 1}: a test marker must be followed, on the next line, by a "
                    "```python or ```bash code fence"
                )
            indent, ticks = fence.group("indent"), fence.group("fence")
            end = next(
                (
                    j
                    for j in range(i + 2, len(lines))
                    if lines[j].strip().startswith(ticks) and not lines[j].strip().strip(ticks[0])
                ),
                None,
            )
            if end is None:
                raise SnippetError(f"{page}:{i + 2}: code fence {ticks} is never closed")
            body = [ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 2 : end]]
            mods = tuple(m.strip() for m in (mark.group("mods") or "").split(",") if m.strip())
            blocks.append(Block(language, "\n".join(body) + "\n", i + 3, mods))
            i = end + 1
            continue
        if _ANY_MARK.search(line):
            raise SnippetError(
                f"{page}:{i + 1}: not a test marker: {line.strip()!r} (use <!-- test -->, "
                "<!-- test: requires MODULE -->, or <!-- test-setup python|bash ... -->)"
            )
        i += 1
    return blocks


@dataclasses.dataclass
class PageResult:
    """What running a page's blocks gave: ``failure`` (None when every block passed: else the page, the block's
    first line and its output), the ``skipped`` blocks with their reasons, and how many blocks ``ran``."""

    page: str
    ran: int
    skipped: list[str]
    failure: str | None


# The driver, run as ``python driver.py BLOCKS.json`` in the page's temporary directory.
_DRIVER = r"""
import importlib, json, os, subprocess, sys, traceback
MARKER = sys.argv[2]
with open(sys.argv[1], encoding="utf-8") as f:
    spec = json.load(f)
namespace = {"__name__": "__main__"}
results = []
for index, block in enumerate(spec["blocks"]):
    missing = []
    for module in block["requires"]:
        try:
            importlib.import_module(module)
        except Exception as e:  # an import that fails in any way: the block cannot run here
            missing.append(f"{module} ({type(e).__name__}: {e})")
    if missing:
        results.append({"status": "skipped", "reason": "cannot import " + ", ".join(missing)})
        continue
    print(f"{MARKER} {index}", flush=True)
    sys.stderr.flush()
    if block["language"] == "python":
        # blank lines first, so a traceback's line numbers are the page's
        code = compile("\n" * (block["line"] - 1) + block["code"], spec["page"], "exec")
        try:
            exec(code, namespace)
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
    else:
        sys.stdout.flush()
        status = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]]).returncode
    sys.stdout.flush()
    sys.stderr.flush()
    results.append({"status": "passed" if status == 0 else "failed", "code": status})
    if status != 0:
        break
with open(sys.argv[1] + ".out", "w", encoding="utf-8") as f:
    json.dump(results, f)
sys.stdout.flush()
os._exit(0)  # no interpreter teardown after a block imported Beam or TensorFlow
"""


def snippet_env(workdir: str) -> dict[str, str]:
    """The blocks' environment: the venv's bin first on PATH, this checkout on PYTHONPATH, the real input files."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TFRECORD_ETL_FIXTURES"] = env.get("TFRECORD_ETL_FIXTURES", str(ROOT / ".fixtures" / "site"))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PWD"] = workdir
    return env


def run_page(
    path: pathlib.Path, blocks: list[Block] | None = None, timeout: float = 300, root: pathlib.Path = ROOT
) -> PageResult:
    """Runs the blocks of the page at ``path`` (``blocks``: already parsed) as described in this module's
    docstring; the page is named relative to ``root`` in the result."""
    path = pathlib.Path(path)
    try:
        page = str(path.resolve().relative_to(root))
    except ValueError:
        page = str(path)
    blocks = parse(path.read_text(encoding="utf-8"), page) if blocks is None else blocks
    with tempfile.TemporaryDirectory(prefix="docsnippet-") as top:
        workdir = os.path.join(top, "work")
        os.mkdir(workdir)
        spec_file = os.path.join(top, "blocks.json")
        with open(spec_file, "w", encoding="utf-8") as f:
            json.dump({"page": page, "blocks": [dataclasses.asdict(b) for b in blocks]}, f)
        driver = os.path.join(top, "driver.py")
        with open(driver, "w", encoding="utf-8") as f:
            f.write(_DRIVER)
        try:
            proc = subprocess.run(
                [sys.executable, driver, spec_file, MARKER],
                cwd=workdir,
                env=snippet_env(workdir),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
            output, returncode = proc.stdout.decode("utf-8", "replace"), proc.returncode
        except subprocess.TimeoutExpired as e:
            output, returncode = (e.stdout or b"").decode("utf-8", "replace"), None
        try:
            with open(spec_file + ".out", encoding="utf-8") as f:
                results = json.load(f)
        except (OSError, ValueError):
            results = None
    outputs = _split_output(output)
    skipped = [
        f"{page}:{blocks[i].line}: {r['reason']}" for i, r in enumerate(results or ()) if r["status"] == "skipped"
    ]
    ran = sum(1 for r in results or () if r["status"] != "skipped")
    failed = next((i for i, r in enumerate(results or ()) if r["status"] == "failed"), None)
    if results is None:  # the driver itself died, or ran out of time: blame the block it was in
        last = max(outputs) if outputs else None
        why = f"timed out after {timeout:g} s" if returncode is None else f"the runner ended with status {returncode}"
        where = f"{page}:{blocks[last].line}: {blocks[last].language} block" if last is not None else page
        return PageResult(page, ran, skipped, f"{where}: {why}\n{outputs.get(last, output)}")
    if failed is not None:
        block = blocks[failed]
        kind = f"hidden {block.language} setup" if block.hidden else f"{block.language} block"
        return PageResult(
            page,
            ran,
            skipped,
            f"{page}:{block.line}: {kind} failed with status "
            f"{results[failed]['code']}; its output:\n{outputs.get(failed, '')}",
        )
    return PageResult(page, ran, skipped, None)


def _split_output(output: str) -> dict[int, str]:
    """The driver's combined output, by block index (the text after each ``MARKER <index>`` line)."""
    parts, current = {}, None
    for line in output.splitlines(keepends=True):
        if line.startswith(MARKER + " "):
            current = int(line.split()[1])
            parts[current] = ""
        elif current is not None:
            parts[current] += line
    return parts


def pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """README.md and every Markdown page under docs/ that exists, sorted."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else found
