"""The NIfTI source's options (``--format nifti``, ``sources/nifti.py``): the stored voxel values, or nibabel's scaled
ones."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tfrecord_etl.transforms.sources.options import FlagGroup, FormatOptions


class NiftiOptions(FormatOptions):
    """``--nifti_scaling``: the voxels as stored, or scaled by the header's slope and intercept."""

    flag_groups = (
        FlagGroup(
            "NIfTI images",
            "the voxel values of a NIfTI image",
            "converting/nifti.md",
            ("--nifti_scaling",),
        ),
    )

    nifti_scaling: Literal["raw", "apply"] = Field(
        "raw",
        description="nifti: raw: the voxels as stored (nibabel's dataobj.get_unscaled()), the header's scl_slope "
        "and scl_inter as features of every Example; apply: nibabel's scaled values (np.asanyarray(img.dataobj): "
        "slope * stored + intercept, in the float type nibabel chooses)",
    )
