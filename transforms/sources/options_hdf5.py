"""The options of the HDF5 reader (and of Zarr's, which shares its storage checks): external storage, fill values,
the number of datasets walked."""

from __future__ import annotations

from pydantic import Field

from tfrecord_etl.transforms.sources.base import DEFAULT_MAX_DATASETS
from tfrecord_etl.transforms.sources.options import FlagGroup, FormatOptions


class Hdf5Options(FormatOptions):
    """``--max_datasets`` (limits), ``--allow_external_storage`` and ``--allow_fill_value`` (safety)."""

    flag_groups = (
        FlagGroup("limits", flags=("--max_datasets",)),
        FlagGroup("safety", flags=("--allow_external_storage", "--allow_fill_value")),
    )

    allow_external_storage: bool = Field(
        False,
        description="hdf5: read datasets stored in external raw files, and "
        "follow external links, when those files lie in the input file's own "
        "directory; default: refuse",
    )
    allow_fill_value: bool = Field(
        False,
        description="hdf5: read storage that was never written (unallocated chunks) as the fill value; default: refuse",
    )
    max_datasets: int = Field(
        DEFAULT_MAX_DATASETS,
        ge=1,
        description="hdf5: most datasets walked in one file, and Examples of "
        "one file in datasets mode (cells count); more is refused at planning",
    )

    def source_fields(self) -> dict:
        return {
            "allow_external_storage": self.allow_external_storage,
            "allow_fill_value": self.allow_fill_value,
            "max_datasets": self.max_datasets,
        }
