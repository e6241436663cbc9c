"""The ENVI source's options (``--format envi``, ``sources/envi.py``): what one Example of an image cube holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tfrecord_etl.transforms.sources.options import FlagGroup, FormatOptions


class EnviOptions(FormatOptions):
    """``--envi_rows``: what one Example holds."""

    flag_groups = (
        FlagGroup(
            "ENVI files",
            "what one Example of an ENVI image cube holds",
            "converting/envi.md",
            ("--envi_rows",),
        ),
    )

    envi_rows: Literal["storage", "pixels"] = Field(
        "storage",
        description="envi: storage: one Example per band (bsq) or per image line (bil, bip), as the file stores "
        "them; pixels: one Example per pixel, its spectrum of every band (bsq and bip files)",
    )
