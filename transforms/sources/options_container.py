"""The options of the container formats (HDF5, NetCDF-3, MATLAB, Zarr; ``--datasets`` names npz members too):
which arrays become Examples, which row group, which mode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tfrecord_etl.transforms.sources.options import FLAG_SYNTAX, LIST, FlagGroup, FormatOptions, comma_list


class ContainerOptions(FormatOptions):
    """``--datasets``, ``--row_group``, ``--container_mode``."""

    flag_groups = (
        FlagGroup(
            "HDF5 and containers",
            "which arrays of an HDF5, netCDF, MATLAB or Zarr container become Examples",
            "converting/hdf5.md",
            ("--datasets", "--row_group", "--container_mode", "--categoricals"),
        ),
    )

    datasets: list[str] | None = Field(
        None,
        description="HDF5 dataset paths or npz members (comma-separated); "
        "default: the largest row group (datasets sharing their leading "
        "dimension), every npz member",
        json_schema_extra={FLAG_SYNTAX: LIST},
    )
    row_group: int | None = Field(
        None,
        ge=1,
        description="hdf5/netcdf3/matlab/zarr rows mode: convert row "
        "group N (datasets sharing their leading length; 1 = the default, inspect FILE "
        "lists them) instead of the default; old name --hdf5_group",
    )
    container_mode: Literal["auto", "rows", "datasets"] = Field(
        "auto",
        description="hdf5/netcdf3/matlab/zarr: row i of the datasets -> one Example (rows), each dataset / "
        "MATLAB cell -> one Example (datasets), or auto: rows, and datasets for a file with no dataset with rows; "
        "old name --hdf5_mode",
    )

    categoricals: Literal["strings", "codes"] = Field(
        "strings",
        description="hdf5/netcdf3: a categorical column (AnnData and pandas HDFStore categories, CF "
        "flag_values with flag_meanings) is written as its category names, UTF-8 bytes, a missing value as the empty string "
        "(strings), or as its integer codes as stored (codes); metadata.json and schema.pbtxt keep the names "
        "either way",
    )

    _datasets_list = field_validator("datasets", mode="before")(classmethod(lambda cls, v: comma_list(v)))

    @model_validator(mode="after")
    def _container_choice(self):
        if self.row_group is not None and (self.datasets or self.container_mode == "datasets"):
            raise ValueError(
                "row_group chooses a row group in rows mode: it cannot be combined with datasets or "
                "container_mode datasets"
            )
        return self

    def source_fields(self) -> dict:
        return {
            "datasets": tuple(self.datasets) if self.datasets else None,
            "row_group": self.row_group,
            "container_mode": self.container_mode,
            "categoricals": self.categoricals,
        }
