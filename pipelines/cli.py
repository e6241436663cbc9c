"""The ``tfrecord-etl`` console command (installed by ``pip install``): ``tfrecord-etl convert|augment|verify|inspect
[flags]`` runs the ``main`` of the module ``tfrecord_etl.pipelines.<command>``. ``python -m
tfrecord_etl.pipelines.<command>``, and its alias from a checkout's root, ``pipelines.<command>`` run with
``python -m``, run the same (:func:`run_command`), with the same flags, exit codes and one-line errors."""

from __future__ import annotations

import importlib
import sys
import textwrap

from tfrecord_etl.pipelines import common, flaghelp, pause_gc

# each command's summary; {formats}: the registered input formats (flaghelp.input_formats, when --help is asked)
COMMANDS = {
    "convert": "arrays in {formats} -> sharded TFRecord files of tf.train.Example",
    "augment": "add features to an existing TFRecord collection (rewrite or sidecar)",
    "verify": "check an output directory, a sidecar collection or TFRecord files (framing, counts, values)",
    "inspect": "print the features, shards and one decoded example of an output",
}

USAGE = "usage: tfrecord-etl {" + ",".join(COMMANDS) + "} [flags]   (tfrecord-etl COMMAND --help lists its flags)"
# the documentation page of each command (under flaghelp.DOCS)
PAGES = {"convert": "converting/index.md", "augment": "augment.md", "verify": "verify.md", "inspect": "verify.md"}


def summary(command: str) -> str:
    """``command``'s one-line summary in ``tfrecord-etl --help`` (convert's names the registered input formats)."""
    text = COMMANDS[command]
    return text.format(formats=flaghelp.input_formats()) if "{formats}" in text else text


def help_text() -> str:
    """``tfrecord-etl --help``: the commands, each with its documentation page, and where the flags are listed."""
    lines = [USAGE, "", "commands:"]
    for name in COMMANDS:
        lines += textwrap.wrap(summary(name), 100, initial_indent=f"  {name:<8} ", subsequent_indent=" " * 11)
        lines.append(f"  {'':<8} see {flaghelp.DOCS}{PAGES[name]}")
    lines += ["", "flags: tfrecord-etl COMMAND --help lists them by topic, each topic with its documentation page:"]
    for name in COMMANDS:
        topics = ", ".join(dict.fromkeys(g.title for g in flaghelp.GROUPS[name]))
        lines += textwrap.wrap(topics, 100, initial_indent=f"  {name:<8} ", subsequent_indent=" " * 11)
    lines += [
        "",
        f"every flag of every command: {flaghelp.DOCS}flags.md (the documentation's Flag reference)",
        f"documentation: {flaghelp.DOCS}index.md (the site: mkdocs serve, see {flaghelp.DOCS}development.md)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs ``tfrecord-etl COMMAND [flags]``; returns the exit code (2 for an unknown or missing command)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(help_text(), file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}. Hint: {USAGE}", file=sys.stderr)
        return 2

    try:
        module = importlib.import_module(f"tfrecord_etl.pipelines.{command}")
    except ImportError as e:
        line = common.missing_pipelines_line(e, f"tfrecord-etl {command}")
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    return common.run_main(module.main, rest)


def console(argv: list[str] | None = None) -> None:
    """The ``tfrecord-etl`` console script: :func:`main`, then the process ends by ``common.exit_process`` (no
    interpreter teardown after Beam's import)."""
    pause_gc()  # resumed by common.run_main once the command's imports are done
    common.exit_process(main(argv))


def run_command(command: str) -> None:
    """``python -m tfrecord_etl.pipelines.COMMAND [flags]`` (or ``pipelines.COMMAND`` run with ``python -m`` from a
    checkout's root): the command's file, run as ``__main__``, calls this before its own imports; this runs
    ``tfrecord-etl COMMAND [flags]``, i.e. the module under its one name ``tfrecord_etl.pipelines.COMMAND``, so its
    functions and DoFns are defined (and pickled by Beam) once, under that name. Never returns."""
    console([command, *sys.argv[1:]])


if __name__ == "__main__":
    console()
