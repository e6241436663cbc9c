"""The options of the raw binary format: the array's layout (dtype, shape, offset, order, row count), which a
sidecar file may give instead."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from tfrecord_etl.transforms.sources.options import FLAG_SYNTAX, LIST, NEGATIVE, FlagGroup, FormatOptions, comma_list


class RawOptions(FormatOptions):
    """``--dtype``, ``--shape``, ``--offset``, ``--order``, ``--count``."""

    flag_groups = (
        FlagGroup(
            "raw files",
            "the layout of a headerless binary array",
            "converting/raw.md",
            ("--dtype", "--shape", "--offset", "--order", "--count"),
        ),
    )

    dtype: str | None = Field(
        None, description="raw: the array's NumPy dtype, any byte order (e.g. '>f4'); default: from a sidecar"
    )
    shape: list[int] | None = Field(
        None,
        description="raw: the array's shape, comma-separated; the first "
        "dimension may be -1 (rows from the file size), e.g. -1,28,28",
        json_schema_extra={FLAG_SYNTAX: LIST, NEGATIVE: True},
    )
    offset: int = Field(0, ge=0, description="raw: bytes before the array data (a header to skip)")
    order: Literal["C", "F"] = Field("C", description="raw: C (row-major) or F (Fortran, column-major) order")
    count: int | None = Field(
        None,
        ge=0,
        description="raw: read this many rows after --offset and leave the "
        "bytes after them (e.g. a second array); default: to the end of the file",
    )

    _shape_list = field_validator("shape", mode="before")(classmethod(lambda cls, v: comma_list(v)))
