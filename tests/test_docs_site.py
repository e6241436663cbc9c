"""The documentation site (mkdocs.yml, docs/) builds in strict mode, its API page documents every public name, and
its generated flag reference lists every flag of every command."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

import pytest

import tfrecord_etl
from tests.conftest import ROOT
from tfrecord_etl.pipelines import flaghelp


def build(root, site_dir, timeout=300):
    """``mkdocs build --strict`` of the site at ``root`` into ``site_dir``; returns (exit status, output)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site_dir = tmp_path_factory.mktemp("site")
    code, output = build(ROOT, site_dir)
    assert code == 0, f"mkdocs build --strict failed:\n{output}"
    return site_dir


def api_identifiers() -> list[str]:
    """The ``::: identifier`` lines of docs/api.md, in order."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    return re.findall(r"^::: (\S+)\s*$", text, re.M)


def public_identifiers() -> dict[str, str]:
    """Public name -> the object mkdocstrings documents for it (its defining module's path)."""
    out = {}
    for name, module in tfrecord_etl._PUBLIC.items():
        out[name] = module if module.rpartition(".")[2] == name else f"{module}.{tfrecord_etl._RENAMED.get(name, name)}"
    return out


def test_site_builds_in_strict_mode_with_every_page(site):
    for page in (
        "index.html",
        "api/index.html",
        "flags/index.html",
        "changelog/index.html",
        "converting/hdf5/index.html",
    ):
        assert (site / page).is_file(), page
    assert not (site / "hooks.py").exists()  # the build's hook is not published


def test_api_page_documents_every_public_name_exactly_once():
    identifiers = api_identifiers()
    public = public_identifiers()
    assert len(identifiers) == len(set(identifiers)), "an object is documented twice in docs/api.md"
    missing = {name: ident for name, ident in public.items() if ident not in identifiers}
    assert not missing, f"public names missing from docs/api.md (add a '::: identifier' line): {missing}"
    extra = set(identifiers) - set(public.values())
    assert not extra, f"docs/api.md documents objects that are not in tfrecord_etl.__all__: {sorted(extra)}"
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert set(tfrecord_etl.__all__) - set(public) == {"__version__"}
    assert "__version__" in text


def test_api_page_renders_every_public_object(site):
    html = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name, ident in public_identifiers().items():
        assert f'id="{ident}"' in html, (name, ident)
    # the docstrings are there, not only the headings
    assert "sharded TFRecord files" in html and "IncompleteOutputError" in html


def test_flag_reference_lists_every_flag_of_every_command(site):
    html = (site / "flags" / "index.html").read_text(encoding="utf-8")
    assert "<!-- flag-reference" not in html and "convert: input" in html  # the placeholder was replaced
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    assert 'id="convert-row_group"' in html and 'id="convert-topic-hdf5-and-containers"' in html
    for command in flaghelp.COMMANDS:
        parser = flaghelp.command_parser(command)
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:  # an old name of a renamed flag: accepted, not listed
                assert f'id="{flaghelp.anchor(command, action)}"' not in html, action.option_strings
                continue
            assert f'id="{flaghelp.anchor(command, action)}"' in html, (command, action.option_strings)
            for option in action.option_strings:
                assert f"<code>{option}</code>" in html, (command, option)


def test_changelog_page_is_the_changelog(site):
    html = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings
    for heading in headings:
        assert heading.split(" (")[0].replace("&", "&amp;") in html, heading


def test_a_broken_link_or_missing_page_fails_the_build(tmp_path):
    """Strict mode: a link to a missing page, heading or flag is an error (a copy of the site, API page emptied)."""
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for name in ("tfrecord_etl", "transforms", "pipelines"):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "docs" / "api.md").write_text("# Python API\n")
    (tmp_path / "docs" / "reading.md").write_text(
        "# Reading\n\nSee [the shards](output.md#no-such-heading), "
        "[the tour](no-such-page.md), [a flag](flags.md#convert-index) "
        "and [no flag](flags.md#convert-no_such_flag).\n"
    )
    code, output = build(tmp_path, tmp_path / "site")
    assert code != 0
    assert "no-such-page.md" in output and "no-such-heading" in output, output
    assert "convert-no_such_flag" in output and "convert-index" not in output, output  # flag anchors are checked
