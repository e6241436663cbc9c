"""The options of the NumPy formats (``.npz``, ``.npy``): rows or whole arrays, members left out, the zip-bomb
limit."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from tfrecord_etl.transforms.sources.options import FLAG_SYNTAX, LIST, FlagGroup, FormatOptions, comma_list


class NumpyOptions(FormatOptions):
    """``--npz_mode``, ``--npy_mode``, ``--exclude_datasets``; ``--max_compression_ratio`` (limits)."""

    flag_groups = (
        FlagGroup(
            "NumPy files",
            "rows or whole arrays of .npz and .npy files",
            "converting/numpy.md",
            ("--npz_mode", "--npy_mode", "--exclude_datasets"),
        ),
        FlagGroup("limits", flags=("--max_compression_ratio",)),
    )

    exclude_datasets: list[str] | None = Field(
        None,
        description="npz: members to leave out (comma-separated); they are never read",
        json_schema_extra={FLAG_SYNTAX: LIST},
    )
    npz_mode: Literal["rows", "arrays"] = Field(
        "rows", description="npz: row i of each member -> one Example (rows), or each member -> one Example (arrays)"
    )
    npy_mode: Literal["rows", "files"] = Field(
        "rows", description="npy: rows of one array (rows), or each file -> one Example (files)"
    )
    max_compression_ratio: float = Field(
        500.0,
        gt=0,
        allow_inf_nan=False,
        description="refuse compressed data (of more than 1 MiB) whose uncompressed size, as declared or as it is "
        "decompressed, exceeds this many times its compressed size (compression bombs): an npz member or archive, "
        "and the compressed data of every other format that reads this limit (its docs page says which)",
    )

    _exclude_list = field_validator("exclude_datasets", mode="before")(classmethod(lambda cls, v: comma_list(v)))
