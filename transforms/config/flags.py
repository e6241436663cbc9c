"""The command line of a config model: one ``--NAME`` per field (help text with the default), the parser, and
:func:`parse_args`, which merges the flags over the YAML ``--config`` and hands every other flag to Beam."""

from __future__ import annotations

import argparse
import re
import types
import typing
from typing import Literal

from apache_beam.options.pipeline_options import PipelineOptions
from pydantic import BaseModel

from tfrecord_etl.transforms.config.beamflags import check_beam_flags, check_local_workers, check_not_a_template
from tfrecord_etl.transforms.config.localpaths import absolute_paths
from tfrecord_etl.transforms.config.model import DEFAULT_MAX_LOCAL_WORKERS, ConvertConfig
from tfrecord_etl.transforms.config.yamlfile import load_yaml, validate
from tfrecord_etl.transforms.localmode import without_auto
from tfrecord_etl.transforms.renamed_flags import add_renamed_flags
from tfrecord_etl.transforms.sources.options import LIST, NEGATIVE, flags_of

# comma-separated flags: allow_lossy, and the formats' fields marked so (sources/options.py: LIST)
_LIST_FIELDS = {"allow_lossy"} | flags_of(ConvertConfig, LIST)
# values that may start with '-' (--shape -1,28,28), which argparse takes for a flag (sources/options.py: NEGATIVE)
_NEGATIVE_VALUE_FLAGS = tuple(f"--{name}" for name in sorted(flags_of(ConvertConfig, NEGATIVE)))
_DICT_FIELDS = {"feature_encodings", "splits"}
_YAML_ONLY = {"pipeline_options"}


def flag_type(name: str, annotation):
    """The argparse ``type`` of the flag of field ``name`` (its ``annotation``): a comma list, a NAME=VALUE mapping,
    an int or float, else the string (the model converts and checks it)."""
    if name in _LIST_FIELDS:
        return lambda s: [v.strip() for v in s.split(",") if v.strip()]
    if name in _DICT_FIELDS:

        def parse(s):
            try:
                pairs = [kv.split("=", 1) for kv in s.split(",") if kv.strip()]
                out = dict(pairs)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected NAME=VALUE,..., got {s!r}") from None
            if len(out) != len(pairs):  # dict() keeps the last of a repeated name: its first value would be lost
                twice = next(k for i, (k, _) in enumerate(pairs) if k in (n for n, _ in pairs[:i]))
                raise argparse.ArgumentTypeError(f"{twice!r} is named twice in {s!r}: give each name once")
            return out

        return parse
    base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if base[0] in (int, float):
        return base[0]
    return str


class ConvertOptions(PipelineOptions):
    """The convert pipeline's flags, declared the Beam way; defaults are None so the config file can fill them."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_model_flags(parser, ConvertConfig, skip=BEAM_CLASHES)
        parser.add_argument("--config", default=None, help="YAML config file (keys as the flags)")
        add_renamed_flags(parser, ConvertConfig, flag_type)


# Our flags that a Beam PipelineOptions class declares too (TestOptions' --dry_run): Beam builds one parser of every
# registered options class, so these are added only to our own parser (config.parse_args), never to Beam's.
BEAM_CLASHES = frozenset({"dry_run"})


def flag_help(field) -> str:
    """A flag's help: its description, then ``(required)``, or ``(default: VALUE)`` when the default is a value
    the description does not state already (no ``(default: None)``, ``[]`` or ``{}``: such a flag is simply off,
    and its description says what happens without it)."""
    if field.is_required():
        return f"{field.description} (required)"
    default = field.get_default(call_default_factory=True)
    if (
        default is None
        or (isinstance(default, (list, dict, tuple)) and not default)
        or re.search(r"\(default[ :]|\bdefault: ", field.description or "")
    ):
        return field.description
    return f"{field.description} (default: {default!r})"


def add_model_flags(parser, model: type[BaseModel], skip=frozenset(), hidden=frozenset()) -> None:
    """Adds ``--NAME`` for every field of ``model`` but those in ``skip`` (``--ALIAS`` for a field with an alias,
    e.g. augment's ``--schema``, whose field cannot be named ``schema`` in a pydantic model; help text with the
    default). The fields in ``hidden`` are parsed but not shown in ``--help`` (e.g. augment's refused options, so
    that their use gets the model's message)."""
    for name, field in model.model_fields.items():
        flag = f"--{field.alias or name}"
        if name in _YAML_ONLY or name in skip:
            continue
        help_text = argparse.SUPPRESS if name in hidden else flag_help(field)
        choices = None
        if typing.get_origin(field.annotation) is Literal:
            choices = list(typing.get_args(field.annotation))
        elif typing.get_origin(field.annotation) in (typing.Union, types.UnionType):  # Optional[X] or X | None
            lit = [typing.get_args(a) for a in typing.get_args(field.annotation) if typing.get_origin(a) is Literal]
            choices = list(lit[0]) if lit else None
        if field.annotation is bool or field.annotation == (bool | None):  # equal to Optional[bool] too
            parser.add_argument(flag, dest=name, default=None, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(
                flag, dest=name, default=None, type=flag_type(name, field.annotation), choices=choices, help=help_text
            )


def build_parser(
    model: type[BaseModel], options_cls: type[PipelineOptions], prog: str, description: str
) -> argparse.ArgumentParser:
    """The argument parser of ``model``'s flags (declared by ``options_cls``), as :func:`parse_args` uses it."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every other flag (--runner, --direct_num_workers, --temp_location, "
        "Dataflow/Flink options) is passed to Beam.",
    )
    options_cls._add_argparse_args(parser)
    for name in BEAM_CLASHES & set(model.model_fields):
        parser.add_argument(
            f"--{name}",
            dest=name,
            default=None,
            action=argparse.BooleanOptionalAction,
            help=f"{model.model_fields[name].description} (default: False)",
        )
    return parser


def parse_args(
    argv: list[str],
    model: type[BaseModel],
    options_cls: type[PipelineOptions],
    prog: str,
    description: str,
    parser: argparse.ArgumentParser | None = None,
):
    """Parses our flags and the config file; returns ``(config, beam_argv)``. ``parser``: the command's parser
    (its flags grouped for ``--help``), else :func:`build_parser`'s. The config's local paths (``--input``,
    ``--output_dir``, ``--dead_letter_dir``, ``--join_input``, ...) are made absolute against the working directory
    (:func:`localpaths.absolute_paths`), so a worker that runs elsewhere names the same files.

    Every flag that is neither ours nor a registered Beam pipeline option (on the command line or in the
    YAML ``pipeline_options``) is refused, since Beam silently drops what it does not know.

    Raises:
      ConfigError: invalid YAML, unknown key or flag, wrong type, missing input, too many local workers
        (one line each).
    """
    parser = parser if parser is not None else build_parser(model, options_cls, prog, description)
    argv = list(argv)
    for i in range(len(argv) - 2, -1, -1):
        if argv[i] in _NEGATIVE_VALUE_FLAGS and i + 1 < len(argv):
            argv[i : i + 2] = [f"{argv[i]}={argv[i + 1]}"]
    known, beam_argv = parser.parse_known_args(argv)
    values = load_yaml(known.config) if known.config else {}
    for key, value in vars(known).items():
        if key != "config" and value is not None:
            values[key] = value
    cfg = validate(model, values, f"config ({known.config})" if known.config else "flags")
    cfg = absolute_paths(cfg)  # the workers' working directory is not the launcher's
    beam_argv = cfg.beam_argv(beam_argv) if hasattr(cfg, "beam_argv") else beam_argv

    beam_argv = without_auto(beam_argv)  # --direct_running_mode auto: ours, resolved after planning
    check_beam_flags(beam_argv, [o for a in parser._actions for o in a.option_strings])
    check_not_a_template(beam_argv)
    check_local_workers(
        beam_argv, getattr(cfg, "max_local_workers", DEFAULT_MAX_LOCAL_WORKERS), hasattr(cfg, "max_local_workers")
    )
    return cfg, beam_argv
