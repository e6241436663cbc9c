"""The bounds a MATLAB v4-v7 variable is checked against before SciPy loads it: its size (``--max_mat_variable_mb``:
loadmat reads a variable whole) and, for cells, structs and objects, how deep their arrays nest
(``--max_mat_nesting``: SciPy's reader recurses in C). Read from the variable headers (:mod:`matheader`) and a
walk of the stored elements (:mod:`matnesting`); nothing is loaded. ``limits`` is the source's ``MatlabOptions``.
"""

from __future__ import annotations

import math

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources import matheader, matnesting
from tfrecord_etl.transforms.sources.matsparse import too_dense
from tfrecord_etl.transforms.sources.matvalues import Leaf, MatVariable


def check_size(f, var: MatVariable, path: str, limits) -> None:
    """Refuses the variable ``var`` of the open file ``f`` before it is loaded when it is over
    ``limits.max_variable_bytes`` (``--max_mat_variable_mb``): the bytes its header declares (dimensions x class;
    a sparse matrix's dense form, :func:`matsparse.too_dense`), or for a cell, struct or other container its stored
    bytes (a compressed one inflated and counted, nothing kept); a container within the limit is then checked for
    nesting (:func:`check_nesting`).

    Raises:
      SourceError: naming the file and the variable, with the flag to raise.
    """
    limit = limits.max_variable_bytes
    if var.dtype is not None:
        declared = math.prod(var.shape) * (4 if var.mclass == "char" else var.dtype.itemsize)  # char: '<U1'
    elif var.compressed:
        declared = matheader.inflated_bytes(f, var, limit)
    else:
        declared = var.stop - var.start
    if (
        declared <= limit
        and var.dtype is None
        and var.mclass not in ("sparse", "char", "logical")
        and matheader.is_v5(f)
    ):
        check_nesting(f, var, path, limits)
    error = too_dense(var.shape, var.dtype, limit, path, f"/{var.name}") if var.mclass == "sparse" else None
    if error is not None:  # (the message a v7.3 sparse matrix gets too)
        raise error
    if declared > limit:
        raise SourceError(
            f"The variable holds {declared:,} bytes ({declared / 2**20:,.1f} MiB), over the limit "
            f"of {limit / 2**20:g} MiB for one variable (SciPy's loadmat reads a variable whole)",
            file=path,
            dataset=f"/{var.name}",
            hint="raise --max_mat_variable_mb if the file is trusted and the memory is there (about "
            "twice the variable at peak), choose other variables with --datasets, or save "
            "the file with -v7.3 (HDF5, read row range by row range)",
        )


def check_nesting(f, var: MatVariable, path: str, limits) -> None:
    """Refuses a cell, struct, object or function handle whose arrays nest deeper than ``limits.max_mat_nesting``
    (``--max_mat_nesting``) before SciPy loads it (see :mod:`matnesting`: deep nesting crashed the process).

    Raises:
      SourceError: too deep, or elements that end early (damaged), naming the file and the variable.
    """
    limit = limits.max_mat_nesting
    try:
        depth = matnesting.nesting_depth(f, var.start, var.stop, var.compressed, var.byte_order, limit)
    except matnesting.Damaged as e:
        raise SourceError(
            f"Cannot read the variable's arrays: {e}",
            file=path,
            dataset=f"/{var.name}",
            hint="the file may be truncated or damaged (scipy.io.loadmat could not read it either)",
        ) from None
    if depth > limit:
        raise SourceError(
            f"The variable's arrays nest more than {limit} deep (cells or structs inside cells or "
            f"structs), over the limit of --max_mat_nesting {limit}: refused before loading (SciPy "
            f"reads each level by recursion in C)",
            file=path,
            dataset=f"/{var.name}",
            hint="raise --max_mat_nesting if the file is trusted (SciPy and NumPy crash near "
            "5,000 levels), or choose other variables with --datasets",
        )


def check_header_sizes(f, table: list[MatVariable], leaves: list[Leaf], path: str, limits) -> None:
    """Checks the numeric, char and logical variables of ``leaves`` against the limit from their headers (a
    struct or cell was checked before it was loaded: :func:`check_size`)."""
    tops = {leaf.path.strip("/").split("/")[0] for leaf in leaves}
    for var in table:
        if var.name in tops and var.dtype is not None:
            check_size(f, var, path, limits)
