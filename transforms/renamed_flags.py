"""Flags (and config keys) that were renamed: the old name still works, as a hidden flag, a YAML key or a keyword
argument, and its first use in a process prints one deprecation line on stderr.

``--hdf5_group`` and ``--hdf5_mode`` became ``--row_group`` and ``--container_mode``: they choose the row group and
the mode of every container format (HDF5, NetCDF-3, MATLAB, Zarr), not of HDF5 alone.
"""

from __future__ import annotations

import argparse
import sys
import typing
from typing import Literal

RENAMED = {"hdf5_group": "row_group", "hdf5_mode": "container_mode"}  # old name -> new: both work, the old warns
_WARNED_RENAMED: set[str] = set()


def renamed_keys(data):
    """``data`` (the values of a ConvertConfig: YAML keys, flags, keyword arguments) with each old name of
    :data:`RENAMED` replaced by its new name; the first use of an old name in a process prints one deprecation
    line on stderr. Any other ``data`` is returned as it is.

    Raises:
      ValueError: an old name and its new name both given (pydantic makes it a one-line ConfigError).
    """
    if not isinstance(data, dict) or not RENAMED.keys() & data.keys():
        return data
    data = dict(data)
    for old, new in RENAMED.items():
        if old not in data:
            continue
        if new in data:
            raise ValueError(f"{old} is the old name of {new}: give only {new}")
        data[new] = data.pop(old)
        if old not in _WARNED_RENAMED:
            _WARNED_RENAMED.add(old)
            print(
                f"tfrecord-etl: --{old} (config key {old}) is deprecated: use --{new} ({new}), which works the same",
                file=sys.stderr,
                flush=True,
            )
    return data


def current_names(options: dict) -> dict:
    """``options`` as recorded by an earlier version (``metadata.json``'s and the run marker's ``options``) with the
    old names of :data:`RENAMED` replaced by the new ones, silently: the user did not write them now."""
    return {RENAMED.get(k, k): v for k, v in options.items()}


def add_renamed_flags(parser, model, flag_type_of) -> None:
    """The old names of :data:`RENAMED` as hidden flags (not in ``--help`` or the flag reference): their value goes
    to the old key, which the model's validator renames with one deprecation line."""
    for old, new in RENAMED.items():
        field = model.model_fields[new]
        flag_type = flag_type_of(new, field.annotation)
        choices = list(typing.get_args(field.annotation)) if typing.get_origin(field.annotation) is Literal else None
        parser.add_argument(f"--{old}", dest=old, default=None, type=flag_type, choices=choices, help=argparse.SUPPRESS)
