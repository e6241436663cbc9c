"""MkDocs hook (mkdocs.yml ``hooks:``): the two generated parts of the site.

- docs/flags.md: the flag reference, generated from the commands' own argument parsers
  (``pipelines.flaghelp.reference_markdown``), so it lists exactly the flags the commands accept, grouped as their
  ``--help`` groups them, and cannot drift.
- docs/api.md: mkdocstrings reads the docstrings statically (griffe; nothing is imported) under the package's
  installed names, ``tfrecord_etl.transforms.*``. In a checkout those modules are the repository's ``transforms/``
  and ``pipelines/`` folders, which setup.py's ``package_dir`` maps (configs/devlinks.sh's links may be missing);
  so this hook lays the installed layout out in a temporary directory (a copy of
  ``tfrecord_etl/__init__.py``, symbolic links ``tfrecord_etl/transforms`` and ``tfrecord_etl/pipelines``) and
  puts it first on the handler's search path. The docstrings' Sphinx roles (``:func:``, ``:class:``, ...) are
  shown as plain code.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = "flags.md"
PLACEHOLDER = "<!-- flag-reference"
_LAYOUT: list[str] = []  # the temporary directory of the installed layout, made once per process


def installed_layout() -> str:
    """A directory holding ``tfrecord_etl/`` as ``pip install`` lays it out, as links into this checkout."""
    if not _LAYOUT:
        top = tempfile.mkdtemp(prefix="tfrecord-etl-api-")
        atexit.register(shutil.rmtree, top, True)
        package = os.path.join(top, "tfrecord_etl")
        os.mkdir(package)
        # a copy: griffe lists a package's modules beside the real path of its __init__.py
        shutil.copyfile(os.path.join(ROOT, "tfrecord_etl", "__init__.py"), os.path.join(package, "__init__.py"))
        for folder in ("transforms", "pipelines"):
            os.symlink(os.path.join(ROOT, folder), os.path.join(package, folder))
        _LAYOUT.append(top)
    return _LAYOUT[0]


@event_priority(100)  # before mkdocstrings' on_config, which creates the handler
def on_config(config, **kwargs):
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [installed_layout()] + [p for p in python.get("paths", []) if p != "."]
    return config


def on_page_markdown(markdown: str, page, config, **kwargs) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    start = markdown.find(PLACEHOLDER)
    if start < 0:
        raise PluginError(
            f"docs/{PAGE} lost its placeholder line {PLACEHOLDER!r} ... -->: the flag reference has nowhere to go"
        )
    end = markdown.index("-->", start) + 3
    if ROOT not in sys.path:  # this checkout's code, ahead of any installed copy of the package
        sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tfrecord_etl.pipelines import flaghelp

    return markdown[:start] + flaghelp.reference_markdown(titles=dict(_nav_titles(config["nav"]))) + markdown[end:]


def _nav_titles(nav):
    """(page, title) of every page of mkdocs.yml's nav."""
    for item in nav or ():
        for title, value in item.items() if isinstance(item, dict) else [(None, item)]:
            if isinstance(value, list):
                yield from _nav_titles(value)
            elif title is not None:
                yield value, title


_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(?=<code>)")


def on_page_content(html: str, page, **kwargs) -> str:
    """The API page: the docstrings' Sphinx roles (``:func:`iter_numpy```) rendered as plain code, without the
    role's name in front."""
    return _ROLE.sub("", html) if page.file.src_uri == "api.md" else html
