"""The commands' flags by topic: the argument groups of ``tfrecord-etl COMMAND --help`` and the generated flag
reference of the documentation (docs/flags.md, written by docs/hooks.py when the site is built).

One table, :data:`GROUPS`, says for each command which flags form which group, in the order ``--help`` lists them,
with a one-line description and the documentation page that explains them; convert's format groups come from the
registered sources' options models (:func:`convert_groups`). :func:`group_flags` arranges a parser
by it and refuses a flag that no group names (or a group naming a flag the parser lacks), so a new flag cannot be
left out of ``--help``'s groups or out of the reference.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator, MutableMapping
from typing import NamedTuple

from tfrecord_etl.transforms import sources

# Where the documentation's pages are: the docs/ folder of the repository (docs/flags.md there is the source of
# the site's Flag reference page). Change this one constant when the site is published at an address.
DOCS = "docs/"

COMMANDS = ("convert", "augment", "verify", "inspect")


class Group(NamedTuple):
    """One topic of a command's flags: its title, a one-line description, the docs page (under :data:`DOCS`)
    that explains the flags, and the flags (option strings, or a positional argument's name) in help order. The
    formats declare theirs with ``sources.FlagGroup``, the same fields (that module needs pydantic, which verify
    and inspect do not)."""

    title: str
    description: str
    page: str
    flags: tuple[str, ...]


_HELP = Group(
    "general",
    "help, logs, progress, planning without writing",
    "converting/index.md",
    ("-h", "--verbose", "--progress", "--dry_run"),
)
_RECORD_LIMITS = ("--max_record_mb", "--max_features")
# the limits of augment, verify and inspect: the bounds on one record they read
_RECORD_LIMITS_GROUP = Group(
    "limits", "bounds on what a hostile record can make the command do", "reliability.md", _RECORD_LIMITS
)

# convert's groups of the flags every format shares: "input" first, then each registered format's own groups
# (sources.option_models: the HDF5 and containers, NumPy, raw, file collections, ...), then these; a format's
# group titled like one of these (limits, safety) adds its flags at the group's end (convert_groups)
_CONVERT_INPUT = Group(
    "input",
    "what to convert: the file pattern, its format, a YAML config of these flags",
    "converting/index.md",
    ("--input", "--format", "--config"),
)
_CONVERT_SHARED = (
    Group(
        "encoding",
        "how each array is stored in its feature",
        "encodings.md",
        ("--encoding", "--feature_encodings", "--allow_lossy", "--provenance"),
    ),
    Group(
        "output",
        "the output directory, its shards and their compression",
        "output.md",
        (
            "--output_dir",
            "--compression",
            "--compression_level",
            "--num_shards",
            "--target_shard_mb",
            "--prefix",
            "--index",
            "--writer",
            "--overwrite",
            "--resume",
        ),
    ),
    Group(
        "splits and TFDS",
        "named splits, shuffling, a directory TFDS loads",
        "output.md",
        ("--splits", "--split_key", "--split", "--shuffle_seed", "--tfds_name"),
    ),
    Group(
        "spans and incremental runs",
        "collections of spans: which span, only the new files",
        "scheduled.md",
        ("--span", "--version", "--incremental", "--reconvert_changed", "--allow_schema_change"),
    ),
    Group(
        "runner",
        "local workers and the size of the work units (Beam's own flags pass through)",
        "scale.md",
        ("--target_range_mb", "--max_local_workers"),
    ),
    Group(
        "limits",
        "bounds on what a hostile or broken input can make the command do",
        "reliability.md",
        ("--max_empty_rows", "--max_row_mb"),
    ),
    Group(
        "safety",
        "what is read beyond the input and what happens to a row that fails",
        "reliability.md",
        ("--follow_symlinks", "--dead_letter_dir"),
    ),
    _HELP,
)


def input_formats() -> str:
    """The input formats as ``tfrecord-etl --help`` and ``convert --help`` name them: each registered source's
    ``help_label`` (its ``format_name`` when it declares none), in registry order, e.g. ``"HDF5, netCDF, ... or ENVI
    image cubes"``; a new source in ``sources.REGISTRY`` is listed with no other change."""
    labels = [cls.help_label or cls.format_name for cls in sources.REGISTRY.values()]
    return " or ".join(filter(None, [", ".join(labels[:-1]), labels[-1]])) if labels else ""


def convert_groups() -> tuple[Group, ...]:
    """convert's ``--help`` groups: ``input``, each registered format's groups (``FormatOptions.flag_groups``, in
    registry order), then the shared ones, a format's flags for a shared group (``limits``, ``safety``) at its end.

    Raises:
      ValueError: two formats declaring groups of one title that is not a shared group's (a programming error).
    """
    return with_format_groups((_CONVERT_INPUT,), _CONVERT_SHARED, sources.option_models())


def augment_groups() -> tuple[Group, ...]:
    """augment's ``--help`` groups: its own up to ``join``, then the groups of the join source's format options
    (the formats a join can read, ``sources.join_option_models``; the options it refuses, ``--datasets`` among
    them, are not shown), then the shared ones (``limits``, and ``safety`` when a format adds to it)."""
    join = next(i for i, g in enumerate(_AUGMENT) if g.title == "join") + 1
    shared = (*_AUGMENT[join:-1], _AUGMENT_SAFETY, _AUGMENT[-1])  # safety before general
    groups = with_format_groups(_AUGMENT[:join], shared, sources.join_option_models())
    refused = {f"--{name}" for name in sources.join_refused_options()}
    shown = (g._replace(flags=tuple(f for f in g.flags if f not in refused)) for g in groups)
    return tuple(g for g in shown if g.flags)


def with_format_groups(head: tuple[Group, ...], shared: tuple[Group, ...], models) -> tuple[Group, ...]:
    """``head``, each of ``models``' groups (``FormatOptions.flag_groups``, in their order), then ``shared``, a
    format's flags for a shared group (a group of the same title: ``limits``, ``safety``) at its end.

    Raises:
      ValueError: two formats declaring groups of one title that is not a shared group's (a programming error).
    """
    by_title = {g.title: g for g in shared}
    added: dict[str, tuple[str, ...]] = dict.fromkeys(by_title, ())
    own: list[Group] = []
    for model in models:
        for group in model.flag_groups:
            if group.title in by_title:
                added[group.title] += group.flags
            elif any(g.title == group.title for g in (*own, *head)):
                raise ValueError(f"{model.__name__}: a second flag group titled {group.title!r}")
            else:
                own.append(Group(*group))
    return (*head, *own, *(g._replace(flags=g.flags + added[g.title]) for g in shared))


class CommandGroups(MutableMapping):
    """The commands' groups, :data:`GROUPS`: a mapping of command to its groups whose ``convert`` and ``augment``
    entries are built from the source registry (:func:`convert_groups`, :func:`augment_groups`) when first read, so
    that verify and inspect, which run without the pipeline dependencies, never import the sources."""

    def __init__(self, groups: dict[str, tuple[Group, ...]]):
        self._groups = dict(groups)

    def __getitem__(self, command: str) -> tuple[Group, ...]:
        if command in _BUILT and command not in self._groups:
            self._groups[command] = _BUILT[command]()
        return self._groups[command]

    def __setitem__(self, command: str, groups: tuple[Group, ...]) -> None:
        self._groups[command] = groups

    def __delitem__(self, command: str) -> None:
        del self._groups[command]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*_BUILT, *self._groups]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*_BUILT, *self._groups]))


# augment's own groups; the join source's format groups follow "join" (augment_groups)
_AUGMENT = (
    Group(
        "input",
        "the collection to add fields to and how to read it",
        "augment.md",
        ("--input", "--spans", "--compression", "--schema", "--config"),
    ),
    Group(
        "output",
        "where the new collection goes, whole records or a sidecar",
        "augment.md",
        ("--output_dir", "--mode", "--output_compression", "--compression_level", "--overwrite"),
    ),
    Group(
        "new fields",
        "fields computed by a function of yours, or constants",
        "augment.md",
        ("--fn", "--fn_inputs", "--fn_batch", "--constants", "--replace_fields"),
    ),
    Group(
        "join",
        "fields from another file, matched by position or by key",
        "augment.md",
        (
            "--join_input",
            "--join_by",
            "--key_feature",
            "--join_key",
            "--join_fields",
            "--join_datasets",
            "--missing",
            "--defaults",
        ),
    ),
    Group(
        "encoding",
        "how each new array is stored in its feature",
        "encodings.md",
        ("--encoding", "--feature_encodings", "--allow_lossy"),
    ),
    Group(
        "runner",
        "local workers and batch size (Beam's own flags pass through)",
        "scale.md",
        ("--batch_size", "--max_local_workers"),
    ),
    _RECORD_LIMITS_GROUP,
    Group("general", "help, logs and progress", "augment.md", ("-h", "--verbose", "--progress")),
)
_AUGMENT_SAFETY = Group("safety", "what the join source may read beyond its files", "reliability.md", ())
# the commands whose groups are built from the source registry when first read
_BUILT = {"convert": convert_groups, "augment": augment_groups}

GROUPS = CommandGroups(
    {
        "verify": (
            Group(
                "target",
                "what to verify: an output, a collection, a sidecar or TFRecord files",
                "verify.md",
                ("target", "--target", "--spans"),
            ),
            Group(
                "comparison",
                "the inputs and originals to compare with, exactly",
                "verify.md",
                ("--source", "--original"),
            ),
            Group("report", "the report's form and length", "verify.md", ("--json", "--max_problems", "--verbose")),
            _RECORD_LIMITS_GROUP,
            Group("general", "help", "verify.md", ("-h",)),
        ),
        "inspect": (
            Group(
                "target",
                "what to inspect: an output, a collection, TFRecord files or an HDF5/netCDF/MATLAB file",
                "verify.md",
                ("output_dir", "--spans"),
            ),
            Group("report", "what is read and how it is printed", "verify.md", ("--tf_read", "--json", "--verbose")),
            _RECORD_LIMITS_GROUP,
            Group("general", "help", "verify.md", ("-h",)),
        ),
    }
)


def _names(action: argparse.Action) -> tuple[str, ...]:
    return tuple(action.option_strings) or (action.dest,)


def group_flags(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """Moves every argument of ``parser`` into the argument group :data:`GROUPS` gives it for ``command``
    (in the table's order); returns ``parser``. Each group's description is one line and the docs page.

    Raises:
      ValueError: an argument that no group names, or a group naming an argument the parser does not have (a
        programming error, caught by the tests: every flag must be in one group).
    """
    actions = list(parser._actions)
    by_name = {n: a for a in actions for n in _names(a)}
    placed: set[int] = set()
    groups = []
    for group in GROUPS[command]:
        missing = [f for f in group.flags if f not in by_name]
        if missing:
            raise ValueError(f"{command}: group {group.title!r} names {missing}, which the parser does not have")
        arg_group = parser.add_argument_group(group.title, f"{group.description}; see {DOCS}{group.page}")
        for flag in group.flags:
            action = by_name[flag]
            if id(action) not in placed:
                placed.add(id(action))
                groups.append((arg_group, action))
    hidden = {id(a) for a in actions if a.help == argparse.SUPPRESS}  # old names of renamed flags: parsed, not shown
    left = [_names(a)[0] for a in actions if id(a) not in placed and id(a) not in hidden]
    if left:
        raise ValueError(f"{command}: {left} in no group of flaghelp.GROUPS: add each to the group of its topic")
    # argparse lists a group's arguments from its _group_actions: take each out of the group it was added to
    for old in parser._action_groups:
        old._group_actions[:] = [a for a in old._group_actions if id(a) not in placed and id(a) not in hidden]
    for arg_group, action in groups:
        arg_group._group_actions.append(action)
    return parser


def command_parser(command: str) -> argparse.ArgumentParser:
    """``command``'s argument parser, grouped (the parser its ``main`` uses: ``pipelines.<command>.build_parser``)."""
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}: one of {', '.join(COMMANDS)}")
    return importlib.import_module(f"tfrecord_etl.pipelines.{command}").build_parser()


def flag_groups(parser: argparse.ArgumentParser) -> list[tuple[argparse._ArgumentGroup, list[argparse.Action]]]:
    """The non-empty argument groups of ``parser``, in help order, each with its arguments."""
    return [(g, list(g._group_actions)) for g in parser._action_groups if g._group_actions]


def _escape(text: str) -> str:
    """``text`` for a Markdown table cell: no table, emphasis, link or HTML syntax."""
    for ch in "\\`*_[]<>|":
        text = text.replace(ch, "\\" + ch)
    return " ".join(text.split())


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    name = action.metavar or action.dest.upper()
    return f"`{name} ...`" if action.nargs in ("+", "*") else f"`{name}`"


def anchor(command: str, action: argparse.Action) -> str:
    """The id of an argument's row in the reference: ``convert-input`` for convert's ``--input`` (a link to it:
    ``flags.md#convert-input``), ``verify-arg-target`` for verify's positional TARGET; the groups' headings have
    ids ``convert-topic-input``, ..."""
    if not action.option_strings:  # a positional argument: verify's TARGET is not its --target
        return f"{command}-arg-{action.dest}"
    return f"{command}-{action.option_strings[0].lstrip('-')}"


def reference_markdown(commands=COMMANDS, titles: dict[str, str] | None = None) -> str:
    """The flag reference (Markdown) of ``commands``, from their parsers: per command its description, then per
    group its description, a link to the page explaining it (``titles``: page -> link text, else the page's path)
    and a table (flag, value, description with the default)."""
    titles = titles or {}
    out = []
    for command in commands:
        parser = command_parser(command)
        out += [
            f"## {command}",
            "",
            f"`tfrecord-etl {command}`: {_escape(_first_line(parser.description))} "
            f"(`tfrecord-etl {command} --help` prints these groups.)",
            "",
        ]
        info = {g.title: g for g in GROUPS[command]}
        for group, actions in flag_groups(parser):
            about = info[group.title]  # group_flags left no argument outside these groups
            link = f"[{titles.get(about.page, about.page)}]({about.page})"
            # the heading's own id, so that it never takes a flag's (the heading "convert: input" would be
            # #convert-input, the id of convert's --input)
            out += [
                f"### {command}: {about.title} {{#{command}-topic-{'-'.join(about.title.lower().split())}}}",
                "",
                f"{about.description[0].upper()}{about.description[1:]}: see {link}.",
                "",
                "| Flag | Value | Description |",
                "| --- | --- | --- |",
            ]
            for action in actions:
                names = " ".join(f"`{n}`" for n in _names(action))
                help_text = _escape(action.help or "") if action.help != argparse.SUPPRESS else ""
                out.append(f'| <span id="{anchor(command, action)}"></span>{names} | {_value(action)} | {help_text} |')
            out.append("")
    return "\n".join(out)


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""
