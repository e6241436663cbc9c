"""The documentation's runnable snippets (README.md, docs/**/*.md) run and pass: one case per page that has any
(tests/docsnippets.py says how blocks are marked and run); then the marker parser and the runner themselves."""

from __future__ import annotations

import pathlib
import sys
import warnings

import pytest

from tests import docsnippets
from tests.conftest import ROOT


class SnippetSkipped(Warning):
    """A marked block that did not run here: a module it requires does not import."""


def _marked_pages():
    """(page, its blocks or the SnippetError of its markers) for every page with a test marker."""
    out = []
    for path in docsnippets.pages(ROOT):
        text = path.read_text(encoding="utf-8")
        if "<!-- test" not in text:
            continue
        page = str(path.relative_to(ROOT))
        try:
            out.append(pytest.param(path, docsnippets.parse(text, page), id=page))
        except docsnippets.SnippetError as e:
            out.append(pytest.param(path, e, id=page))
    return out


@pytest.mark.parametrize("path, blocks", _marked_pages())
def test_page_snippets_run(path, blocks):
    if isinstance(blocks, docsnippets.SnippetError):
        pytest.fail(str(blocks), pytrace=False)
    result = docsnippets.run_page(path, blocks)
    if result.failure:
        pytest.fail(result.failure, pytrace=False)
    for reason in result.skipped:
        warnings.warn(reason, SnippetSkipped, stacklevel=1)
    if not result.ran:
        pytest.skip("every block skipped: " + "; ".join(result.skipped))


# --- the parser and the runner --------------------------------------------------------------------------------

PAGE = """# A page

Not run:

```python
raise SystemExit(3)
```

<!-- test-setup python
import numpy as np
np.save("a.npy", np.arange(4))
-->

<!-- test -->
```python
import numpy as np
a = np.load("a.npy")
assert a.tolist() == [0, 1, 2, 3]
```

<!-- test: requires numpy, surely_not_a_module_xyz -->
```python
import surely_not_a_module_xyz
```

!!! note
    <!-- test -->
    ```bash
    test -f a.npy && echo "bash sees $(ls)"
    python -c "assert a_name_from_python_blocks" 2>/dev/null && exit 9 || true
    ```
"""


def test_parse_finds_hidden_visible_and_requires_blocks_with_their_lines():
    blocks = docsnippets.parse(PAGE, "p.md")
    assert [(b.language, b.line, b.requires, b.hidden) for b in blocks] == [
        ("python", 10, (), True),
        ("python", 16, (), False),
        ("python", 23, ("numpy", "surely_not_a_module_xyz"), False),
        ("bash", 29, (), False),
    ]
    assert blocks[0].code == 'import numpy as np\nnp.save("a.npy", np.arange(4))\n'
    assert blocks[3].code.startswith('test -f a.npy && echo "bash sees $(ls)"\n')  # the admonition's indent is gone


@pytest.mark.parametrize(
    "text, message",
    [
        ("<!-- test -->\n\n```python\nx = 1\n```\n", "p.md:1: a test marker must be followed"),
        ("<!-- test -->\n```text\nx\n```\n", "p.md:1: a test marker must be followed"),
        ("a\n<!-- test -->\n```python\nx = 1\n", "p.md:3: code fence ``` is never closed"),
        ("<!-- test-setup python\nx = 1\n", "p.md:1: test-setup comment is never closed"),
        ("<!-- tests -->\n```python\nx = 1\n```\n", "p.md:1: not a test marker"),
        ("<!-- test: needs numpy -->\n```python\nx = 1\n```\n", "p.md:1: not a test marker"),
    ],
)
def test_malformed_markers_are_refused_with_page_and_line(text, message):
    with pytest.raises(docsnippets.SnippetError) as info:
        docsnippets.parse(text, "p.md")
    assert str(info.value).startswith(message)


def test_run_page_runs_setup_visible_and_bash_blocks_and_skips_a_missing_module(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    result = docsnippets.run_page(page)
    assert result.failure is None
    assert result.ran == 3
    assert result.skipped == [
        f"{page}:23: cannot import surely_not_a_module_xyz (ModuleNotFoundError: No module "
        "named 'surely_not_a_module_xyz')"
    ]


def test_a_failing_block_is_reported_with_page_line_and_output(tmp_path):
    page = tmp_path / "docs" / "bad.md"
    page.parent.mkdir()
    page.write_text(
        "# Bad\n\n<!-- test -->\n```python\nx = 2\nprint('computed', x)\nassert x == 3, 'x is not 3'\n"
        "```\n\n<!-- test -->\n```python\nraise SystemExit('never reached')\n```\n"
    )
    result = docsnippets.run_page(page, root=tmp_path)
    assert result.failure.startswith("docs/bad.md:5: python block failed with status 1; its output:\ncomputed 2\n")
    # the traceback names the page and its own line number
    assert 'File "docs/bad.md", line 7, in <module>' in result.failure
    assert "AssertionError: x is not 3" in result.failure
    assert "never reached" not in result.failure
    assert result.ran == 1


def test_a_failing_bash_block_stops_at_its_first_failing_command(tmp_path):
    page = tmp_path / "b.md"
    page.write_text("<!-- test -->\n```bash\necho one\nfalse\necho two\n```\n")
    result = docsnippets.run_page(page, root=tmp_path)
    assert result.failure == "b.md:3: bash block failed with status 1; its output:\none\n"


def test_blocks_run_in_a_fresh_empty_directory_with_the_checkouts_command(tmp_path):
    page = tmp_path / "c.md"
    page.write_text(
        '<!-- test -->\n```bash\ntest -z "$(ls -A)"\ntouch made\n'
        f'test "$(command -v python)" = {sys.executable!r}\n'
        f"test \"$(python -c 'import tfrecord_etl; print(tfrecord_etl.__file__)')\" = "
        f"{str(ROOT / 'tfrecord_etl' / '__init__.py')!r}\n"
        'test -n "$TFRECORD_ETL_FIXTURES"\n```\n'
        "<!-- test -->\n```python\nimport os\nassert os.listdir('.') == ['made'], os.listdir('.')\n```\n"
    )
    result = docsnippets.run_page(page, root=tmp_path)
    assert result.failure is None
    blocks = docsnippets.parse(page.read_text(), "c.md")
    # the same page again starts from an empty directory (the first block checks it)
    assert docsnippets.run_page(page, blocks, root=tmp_path).failure is None


def test_pages_lists_the_readme_and_every_docs_page_there_is(tmp_path):
    assert docsnippets.pages(tmp_path) == []
    (tmp_path / "README.md").write_text("x")
    (tmp_path / "docs" / "converting").mkdir(parents=True)
    (tmp_path / "docs" / "converting" / "raw.md").write_text("x")
    (tmp_path / "docs" / "index.md").write_text("x")
    assert docsnippets.pages(tmp_path) == [
        tmp_path / "README.md",
        tmp_path / "docs" / "converting" / "raw.md",
        tmp_path / "docs" / "index.md",
    ]
    assert pathlib.Path(ROOT / "README.md") in docsnippets.pages(ROOT)
