"""Beam's own flags: every ``--flag`` Beam's registered ``PipelineOptions`` know, checked (a misspelled flag is
refused, since Beam silently drops what it does not know), split from ours, and the flags refused outright
(``--template_location``, too many local workers)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
from collections.abc import Iterable

from apache_beam.options.pipeline_options import PipelineOptions

from tfrecord_etl.transforms.errors import ConfigError


def check_not_a_template(beam_argv: list[str]) -> None:
    """Refuses Beam's ``--template_location`` (DataflowRunner writes a classic template there instead of running
    the job): the commands plan the job when they run (the input files matched, the row ranges, the shard names)
    and hold the output directory's lock while it runs, so a template would replay the plan of the day it was built
    into a directory nobody checked or locked. Refused before anything is read or written, so a template build
    leaves nothing behind (no run marker, no lock). Run the command itself on a schedule instead, or a Flex
    Template, whose launcher container runs the command.

    Raises:
      ConfigError: ``--template_location`` is given (command line or the YAML ``pipeline_options``).
    """
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

    location = PipelineOptions(beam_argv).view_as(GoogleCloudOptions).template_location
    if location:
        raise ConfigError(
            f"--template_location {location}: a Dataflow classic template of this command cannot "
            "be built: the command plans the job (input files, row ranges, shards) and locks the "
            "output directory when it runs, and a template would replay that plan later unchecked",
            hint="run the command itself on a schedule (see the Airflow DAGs in configs/airflow/), or "
            "package it as a Dataflow Flex Template whose launcher runs the command",
        )


# Runner modules that register their own PipelineOptions subclasses when imported.
_RUNNER_MODULES = (
    "apache_beam.runners.dataflow.dataflow_runner",
    "apache_beam.runners.portability.flink_runner",
    "apache_beam.runners.portability.spark_runner",
    "apache_beam.runners.portability.prism_runner",
    "apache_beam.runners.dask.dask_runner",
)


class _RaisingParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a one-line ConfigError instead of usage text and SystemExit."""

    def error(self, message):
        raise ConfigError(f"Invalid Beam option: {message}", hint="see Beam's PipelineOptions for its flags")


def beam_flag_parser(import_runners: bool = False) -> argparse.ArgumentParser:
    """A parser of every ``--flag`` Beam knows (all registered ``PipelineOptions`` subclasses, recursively).

    With ``import_runners``, the runner modules that declare their own options (Dataflow, Flink, Spark,
    Prism, Dask) are imported first, where installed.
    """
    if import_runners:
        for name in _RUNNER_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a runner whose dependencies are missing declares nothing
                pass
    parser = _RaisingParser(add_help=False, allow_abbrev=False, conflict_handler="resolve")
    seen, stack = set(), list(PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack += cls.__subclasses__()
        try:
            cls._add_argparse_args(parser)
        except Exception:  # noqa: BLE001 - a foreign subclass that conflicts; Beam would fail on it too
            continue
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def check_beam_flags(beam_argv: list[str], ours: Iterable[str] = ()) -> None:
    """Refuses a flag that is neither ours (``ours``: option strings) nor Beam's, with a suggestion.

    Accepts ``--flag=value``, ``--flag value``, boolean ``--flag`` and ``--noflag`` (from a YAML ``false``).

    Raises:
      ConfigError: ``unknown flag --compresion (did you mean --compression?)``, a stray argument, or a
        value Beam's parser refuses (``--direct_num_workers abc``).
    """
    parser = beam_flag_parser()
    actions = _actions(parser)
    names = [str(a) for a in beam_argv]
    if any(_flag_name(n) and _lookup(actions, _flag_name(n)) is None for n in names):
        parser = beam_flag_parser(import_runners=True)
        actions = _actions(parser)
    i = 0
    while i < len(names):
        token = names[i]
        if token == "--":
            break
        name = _flag_name(token)
        if name is None:
            raise ConfigError(
                f"unexpected argument {token!r}", hint="every value belongs to a --flag; quote patterns with spaces"
            )
        action = _lookup(actions, name)
        if action is None:
            candidates = sorted(set(actions) | {o for o in ours if o.startswith("--")})
            close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
            did = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(
                f"unknown flag {name}{did}", hint="see --help for our flags; Beam's are listed in its PipelineOptions"
            )
        i = _flag_end(names, i, action, actions)
    parser.parse_known_args([n for n in names if not (n.startswith("--no") and n.split("=")[0] not in actions)])


def split_beam_flags(argv: list[str], ours: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """``(the other arguments, Beam's flags)``: ``argv`` split into the flags Beam's ``PipelineOptions`` know
    that are not ours (``ours``: option strings), each with its value, and everything else, in order.

    For a command that is not a Beam pipeline (verify) but is started by a Beam launcher such as Airflow's
    ``BeamRunPythonPipelineOperator``, which always adds ``--runner=...`` and ``--labels=...``: it ignores
    Beam's flags and parses the rest strictly, so a misspelled flag of its own is still refused.
    """
    names, ours = [str(a) for a in argv], set(ours)
    parsers, rest, beam, i = {}, list[str](), list[str](), 0
    while i < len(names):
        token, name = names[i], _flag_name(names[i])
        if token == "--":
            rest += names[i:]
            break
        if name is None or name in ours:
            rest.append(token)
            i += 1
            continue
        for import_runners in (False, True):  # the runners' modules are imported only for a flag of theirs
            if import_runners not in parsers:
                parsers[import_runners] = _actions(beam_flag_parser(import_runners))
            actions = parsers[import_runners]
            action = _lookup(actions, name)
            if action is not None:
                break
        end = i + 1 if action is None else _flag_end(names, i, action, actions)
        (rest if action is None else beam).extend(names[i:end])
        i = end
    return rest, beam


def _flag_end(names: list[str], i: int, action: argparse.Action, actions: dict) -> int:
    """The index after Beam flag ``names[i]`` and its values (``--flag=v``, ``--flag v``, ``--flag v1 v2``,
    boolean ``--flag`` / ``--noflag``)."""
    name = _flag_name(names[i])
    i += 1
    if "=" in names[i - 1] or action.nargs == 0 or (name.startswith("--no") and name not in actions):
        return i
    if action.nargs in ("+", "*"):
        while i < len(names) and not names[i].startswith("-"):
            i += 1
    elif i < len(names):
        i += 1  # the flag's value, whatever it looks like (e.g. -1)
    return i


def _flag_name(token: str) -> str | None:
    if not token.startswith("-") or token in ("-", "--") or token[1:2].isdigit():
        return None
    return token.split("=", 1)[0]


def _lookup(actions: dict, name: str):
    if name in actions:
        return actions[name]
    if name.startswith("--no"):  # --noflag: a boolean flag set false (pipeline_options: {flag: false})
        action = actions.get("--" + name[4:])
        if action is not None and action.nargs == 0:
            return action
    return None


def check_local_workers(beam_argv: list[str], limit: int, has_flag: bool = True) -> None:
    """Refuses ``--direct_num_workers`` above ``limit`` (each is a process, or a thread, of its own).

    Raises:
      ConfigError: too many workers (with the limit and the CPU count).
    """
    from apache_beam.options.pipeline_options import DirectOptions

    workers = PipelineOptions([str(a) for a in beam_argv]).view_as(DirectOptions).direct_num_workers
    if workers is not None and workers > limit:
        raise ConfigError(
            f"--direct_num_workers {workers} is more than the limit of {limit} local workers",
            hint=f"this machine has {os.cpu_count()} CPUs: use at most a few per CPU"
            + (", or raise the limit with --max_local_workers" if has_flag else ""),
        )
