"""``tfrecord-etl --help`` and each command's ``--help``: flags grouped by topic, each group with a one-line
description and the documentation page that explains it; every flag in exactly one group."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml

from tests.conftest import ROOT
from tfrecord_etl.pipelines import cli, common, flaghelp
from tfrecord_etl.transforms import sources


def nav_pages() -> set[str]:
    """Every page of mkdocs.yml's nav."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    pages, stack = set(), list(config["nav"])
    while stack:
        item = stack.pop()
        for value in item.values() if isinstance(item, dict) else [item]:
            stack += value if isinstance(value, list) else []
            if isinstance(value, str):
                pages.add(value)
    return pages


def command_help(command, capsys) -> str:
    module = __import__(f"tfrecord_etl.pipelines.{command}", fromlist=["main"])
    with pytest.raises(SystemExit) as exit_info:
        common.run_main(module.main, ["--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", flaghelp.COMMANDS)
def test_command_help_lists_its_groups_with_description_and_page_in_order(command, capsys):
    text = command_help(command, capsys)
    groups = flaghelp.GROUPS[command]
    positions = []
    for group in groups:
        heading = f"\n{group.title}:\n  {group.description}; see {flaghelp.DOCS}{group.page}\n"
        assert heading in text, heading
        positions.append(text.index(heading))
    assert positions == sorted(positions)
    assert "\noptions:\n" not in text and "\noptional arguments:\n" not in text  # argparse's catch-all is empty


@pytest.mark.parametrize("command", flaghelp.COMMANDS)
def test_every_flag_is_in_exactly_one_group_and_listed_under_it(command, capsys):
    parser = flaghelp.command_parser(command)
    grouped = [a for _, actions in flaghelp.flag_groups(parser) for a in actions]
    shown = [a for a in parser._actions if a.help != argparse.SUPPRESS]
    assert sorted(map(id, grouped)) == sorted(map(id, shown))
    # old names only, and augment's refused join source options (their use gets the refusal's message)
    hidden = [a.option_strings[0] for a in parser._actions if a.help == argparse.SUPPRESS]
    expected = {"--hdf5_group", "--hdf5_mode"} if command in ("convert", "augment") else set()
    if command == "augment":
        from tfrecord_etl.transforms.sources import join_refused_options

        expected |= {f"--{name}" for name in join_refused_options()}
    assert sorted(hidden) == sorted(expected), hidden
    assert len(grouped) == len(set(map(id, grouped)))
    text = command_help(command, capsys)
    sections = re.split(r"\n(?=\S[^\n]*:\n)", text)  # "title:" lines start the groups
    for group, actions in flaghelp.flag_groups(parser):
        section = next(s for s in sections if s.startswith(f"{group.title}:\n"))
        for action in actions:
            shown = action.option_strings[0] if action.option_strings else action.dest
            assert re.search(rf"^  {re.escape(shown)}\b", section, re.M), (command, group.title, shown)


def test_every_group_names_a_page_of_the_site():
    pages = nav_pages()
    for command, groups in flaghelp.GROUPS.items():
        for group in groups:
            assert group.page in pages, (command, group.title, group.page)
            assert (ROOT / "docs" / group.page).is_file(), group.page
            assert "\n" not in group.description and len(group.description) < 100
    assert set(cli.PAGES.values()) <= pages


def test_a_flag_in_no_group_or_a_group_naming_a_missing_flag_is_refused(monkeypatch):
    def parser():
        p = argparse.ArgumentParser(prog="x")
        p.add_argument("--a")
        p.add_argument("--b")
        return p

    monkeypatch.setitem(flaghelp.GROUPS, "toy", (flaghelp.Group("first", "the a", "index.md", ("-h", "--a")),))
    with pytest.raises(ValueError, match=r"toy: \['--b'\] in no group of flaghelp.GROUPS"):
        flaghelp.group_flags(parser(), "toy")
    monkeypatch.setitem(
        flaghelp.GROUPS, "toy", (flaghelp.Group("first", "the a", "index.md", ("-h", "--a", "--b", "--c")),)
    )
    with pytest.raises(ValueError, match=r"toy: group 'first' names \['--c'\], which the parser does not have"):
        flaghelp.group_flags(parser(), "toy")
    monkeypatch.setitem(
        flaghelp.GROUPS,
        "toy",
        (
            flaghelp.Group("first", "the a", "index.md", ("--a",)),
            flaghelp.Group("second", "the b", "flags.md", ("--b", "-h")),
        ),
    )
    text = flaghelp.group_flags(parser(), "toy").format_help()
    assert (
        "first:\n  the a; see docs/index.md\n\n  --a A\n\nsecond:\n  the b; see docs/flags.md\n\n  --b B\n  -h, --help"
    ) in text


def test_grouped_parsers_parse_as_before():
    """Grouping changes the help only: flags, defaults and positionals parse the same."""
    args = flaghelp.command_parser("verify").parse_args(["out", "--source", "a", "b", "--json", "--max_problems", "3"])
    assert (args.target, args.source, args.json, args.max_problems, args.spans) == ("out", ["a", "b"], True, 3, None)
    args = flaghelp.command_parser("inspect").parse_args(["out", "--tf_read"])
    assert (args.output_dir, args.tf_read, args.json) == ("out", True, False)
    known, rest = flaghelp.command_parser("convert").parse_known_args(
        ["--input", "a.h5", "--output_dir", "o", "--no-index", "--runner", "DirectRunner"]
    )
    assert (known.input, known.output_dir, known.index, known.compression, rest) == (
        "a.h5",
        "o",
        False,
        None,
        ["--runner", "DirectRunner"],
    )


def test_tfrecord_etl_help_lists_commands_with_their_pages_and_topics(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for name in cli.COMMANDS:  # wrapped at 100 columns under the command's name
        assert f"  {name:<8} {' '.join(cli.summary(name).split())} see {flaghelp.DOCS}{cli.PAGES[name]} " in " ".join(
            text.split(" \n")
        ).replace("\n" + " " * 11, " ").replace("\n", " ")
    assert max(map(len, text.splitlines()[2:])) <= 100
    for name in flaghelp.COMMANDS:
        topics = ", ".join(dict.fromkeys(g.title for g in flaghelp.GROUPS[name]))
        assert topics in " ".join(text.split()), name
    assert f"{flaghelp.DOCS}flags.md" in text
    assert cli.main([]) == 2  # no command: the same text on stderr, status 2
    assert "commands:" in capsys.readouterr().err


def formats_phrase(labels) -> str:
    return f"{', '.join(labels[:-1])} or {labels[-1]}"


def test_help_names_every_registered_input_format(capsys):
    """``tfrecord-etl --help`` and ``convert --help`` name every format of the source registry, in its order, by the
    name a reader knows (``help_label``), and ``--format`` takes exactly these formats."""
    labels = [cls.help_label for cls in sources.REGISTRY.values()]
    assert all(labels) and len(set(labels)) == len(labels), labels  # each source its own (EnviSource(RawSource) too)
    fmt = next(a for a in flaghelp.command_parser("convert")._actions if "--format" in a.option_strings)
    assert list(fmt.choices) == list(sources.REGISTRY)
    assert cli.main(["--help"]) == 0
    top = " ".join(capsys.readouterr().out.split())
    assert f"convert arrays in {formats_phrase(labels)} -> sharded TFRecord files of tf.train.Example" in top
    first = " ".join(command_help("convert", capsys).split("\n\n")[1].split())  # the description's first paragraph
    assert first.startswith("Convert array files and folders to TFRecords of tf.train.Example.")
    assert first.endswith(f"Input formats: {formats_phrase(labels)}.")
    for word in ("HDF5", "netCDF", ".npz", ".npy", "MATLAB", "Zarr", "raw binary", "images", "ENVI"):
        assert word in first, word


def test_a_new_source_is_named_in_help_with_no_other_change(capsys, monkeypatch):
    """A source added to the registry is listed by both helps: neither names the formats by hand."""

    class CubeSource(sources.Source):
        format_name = "cube"
        help_label = "toy cubes"

    last = list(sources.REGISTRY.values())[-1].help_label  # the registry's last format, named before the new one
    monkeypatch.setitem(sources.REGISTRY, "cube", CubeSource)
    assert cli.main(["--help"]) == 0
    assert f"{last} or toy cubes -> sharded" in " ".join(capsys.readouterr().out.split())
    first = " ".join(command_help("convert", capsys).split("\n\n")[1].split())
    assert "MATLAB .mat, Zarr, ENVI image cubes" in first and first.endswith(f", {last} or toy cubes.")


def test_format_help_says_the_content_decides(capsys):
    text = " ".join(command_help("convert", capsys).split())
    assert "from the suffix" not in text
    assert sources.FORMATS[:9] == ("hdf5", "netcdf3", "npz", "npy", "raw", "files", "matlab", "zarr", "envi")
    assert (
        "--format {" + ",".join(sources.FORMATS) + "} input format; default: told by each file's "
        "content (its first bytes, a Zarr store by its metadata), else by its suffix; files only when named"
    ) in text


@pytest.mark.parametrize("command", flaghelp.COMMANDS)
def test_no_flag_help_states_an_empty_default(command, capsys):
    """``--help`` and the flag reference: no ``(default: None)``, ``[]`` or ``{}`` (an unset flag's description
    says what happens without it), no default stated twice; a real default is still shown."""
    texts = [" ".join(command_help(command, capsys).split()), flaghelp.reference_markdown([command])]
    for text in texts:
        for empty in ("(default: None)", "(default: [])", "(default: {})", "(default: \\[\\])"):
            assert empty not in text, (command, empty)
    parser = flaghelp.command_parser(command)
    for action in parser._actions:
        assert (action.help or "").count("default") <= 2 or "(default 3)" in action.help, action.help
        assert not re.search(r"default: [^()]*\) \(default: ", action.help or ""), action.help
    if command == "convert":
        assert "--compression {none,gzip,zlib} compression of the shards (default: 'none')" in texts[0]
        assert (
            "--max_local_workers MAX_LOCAL_WORKERS the largest --direct_num_workers accepted (default: 4 per "
            "CPU, at least 16) runner:"
        ) not in texts[0]  # (the group ends the help's line below)
        assert "the largest --direct_num_workers accepted (default: 4 per CPU, at least 16) limits:" in texts[0]
        assert (
            "--num_shards NUM_SHARDS number of shards (at most the number of rows); default: ceil(input bytes / "
            "--target_shard_mb), the same on every runner --target_shard_mb" in texts[0]
        )
