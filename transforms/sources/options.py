"""What a source declares about its options: a pydantic model of its flags (:class:`FormatOptions`: names, types,
defaults, the ``--help`` text, the checks) and the groups ``--help`` and the flag reference list them in
(:class:`FlagGroup`).

A :class:`~tfrecord_etl.transforms.sources.base.Source` subclass names its models in ``options_models``; the
registry (``sources.option_models``) collects them, and from there the convert command's config model
(``config.ConvertConfig``), its flags, ``--help``'s groups, the flag reference and the :class:`SourceOptions` a
source receives (``planning.source_options``) are built. A format's options are written once, in its model.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict

# A field's flag syntax, in its json_schema_extra: "list": comma-separated values (YAML may use a list or the same
# string); NEGATIVE: its value may start with '-' (--shape -1,28,28), which argparse would take for a flag
FLAG_SYNTAX, LIST = "flag_syntax", "list"
NEGATIVE = "negative_values"


class FlagGroup(NamedTuple):
    """One topic of a command's flags: its title, a one-line description, the docs page (under ``docs/``) that
    explains the flags, and the flags (option strings, or a positional argument's name) in ``--help`` order.

    A format's group whose title is one of the command's shared groups (``limits``, ``safety``) adds its flags at
    the end of that group; description and page are then the shared group's."""

    title: str
    description: str = ""
    page: str = ""
    flags: tuple[str, ...] = ()


class FormatOptions(BaseModel):
    """The options of one format (or of formats sharing them): each field is a ``convert`` flag ``--NAME`` and a
    YAML key ``NAME``; its ``description`` is the flag's help. ``flag_groups`` places every field's flag in a
    ``--help`` group.

    :meth:`source_fields` says how the values reach the source: the keyword arguments of
    :class:`~tfrecord_etl.transforms.sources.base.SourceOptions` they set (the formats whose readers read its
    named fields), or None: the model itself travels in ``SourceOptions.formats`` and the source reads it with
    ``self.options.of(Model)``, so a new format needs no field anywhere else.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    flag_groups: ClassVar[tuple[FlagGroup, ...]] = ()

    def source_fields(self) -> dict[str, Any] | None:
        """``SourceOptions`` keyword arguments from these values, or None (the model is carried whole)."""
        return None


def comma_list(value):
    """A YAML value in the flags' comma syntax (``"/X,/obs"``) as a list; anything else as it is."""
    return [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value


def flags_of(model: type[BaseModel], syntax: str) -> set[str]:
    """The fields of ``model`` whose ``json_schema_extra`` marks them with ``syntax`` (``LIST`` or ``NEGATIVE``)."""
    out = set()
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get(FLAG_SYNTAX) == syntax or (syntax == NEGATIVE and extra.get(NEGATIVE)):
            out.add(name)
    return out
