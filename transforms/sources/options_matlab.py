"""The options of the MATLAB v4-v7 reader: the bounds checked before SciPy loads a variable."""

from __future__ import annotations

from pydantic import Field

from tfrecord_etl.transforms.sources.base import DEFAULT_MAX_MAT_NESTING, DEFAULT_MAX_VARIABLE_BYTES
from tfrecord_etl.transforms.sources.options import FlagGroup, FormatOptions


class MatlabOptions(FormatOptions):
    """``--max_mat_variable_mb``, ``--max_mat_nesting`` (limits)."""

    flag_groups = (FlagGroup("limits", flags=("--max_mat_variable_mb", "--max_mat_nesting")),)

    max_mat_variable_mb: float = Field(
        DEFAULT_MAX_VARIABLE_BYTES / 2**20,
        gt=0,
        allow_inf_nan=False,
        description="matlab (v4-v7 .mat): refuse "
        "a variable over this many MiB before loading it (SciPy's loadmat reads a "
        "variable whole: about twice this at peak); a sparse matrix (v7.3 too): its dense size",
    )
    max_mat_nesting: int = Field(
        DEFAULT_MAX_MAT_NESTING,
        ge=1,
        le=1000,
        description="matlab (v5-v7 .mat): refuse "
        "a variable whose arrays nest deeper than this (cells or structs inside cells or "
        "structs), checked before SciPy loads it (its reader recurses in C)",
    )

    @property
    def max_variable_bytes(self) -> int:
        """``--max_mat_variable_mb`` in bytes: the largest variable loaded whole."""
        return int(self.max_mat_variable_mb * 2**20)
