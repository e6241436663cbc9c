"""The FITS source's options (``--format fits``, ``sources/fits.py``): the header cards carried into each Example."""

from __future__ import annotations

from pydantic import Field, field_validator

from tfrecord_etl.transforms.sources.options import FLAG_SYNTAX, LIST, FlagGroup, FormatOptions, comma_list


class FitsOptions(FormatOptions):
    """``--fits_cards``: header cards carried as features."""

    flag_groups = (
        FlagGroup(
            "FITS files",
            "the header cards of a FITS file carried into each Example",
            "converting/fits.md",
            ("--fits_cards",),
        ),
    )

    fits_cards: list[str] | None = Field(
        None,
        description="fits: header cards (keywords, comma-separated) carried into every Example of the converted "
        "HDU as features header/KEYWORD (the HDU's card, else the primary header's); a file without one is "
        "refused",
        json_schema_extra={FLAG_SYNTAX: LIST},
    )

    _cards_list = field_validator("fits_cards", mode="before")(classmethod(lambda cls, v: comma_list(v)))

    @field_validator("fits_cards")
    @classmethod
    def _keywords(cls, v):
        for card in v or ():
            if card.upper() in ("COMMENT", "HISTORY", ""):
                raise ValueError(f"fits_cards: '{card}' is not a header keyword with a value")
        return [c.upper() for c in v] if v else v
