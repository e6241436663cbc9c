"""What ``reader.RandomAccess`` takes as a record index (``ra[i]``, ``ra.batch``, ``ra.__getitems__``,
``reader.get``), checked before anything is read, so an index is never silently taken for another record.

- One record: a Python ``int`` or a NumPy integer of any width, signed or unsigned (a 0-d integer array too),
  negative from the end as in a Python list: ``-n <= i < n``.
- Several records, in the order given: a list, tuple, ``range`` or 1-D array of such integers, or a slice
  (``ra[1:4]``, ``ra[::-1]``: the records a list of ``n`` items would give); a boolean mask of exactly ``n``
  values selects the records where it is True (NumPy's ``a[mask]``).

Anything else is refused, as a Python sequence (``TypeError``) or NumPy (``IndexError``) would: a float (``1.9``
is not record 1), a bool scalar, a string, ``None``, a 2-D array or a list of lists: ``TypeError``; an integer
outside ``[-n, n)`` (whatever its dtype: a ``uint64`` of ``2**63`` is not wrapped to a negative one) or a mask of
another length: ``IndexError``. Each message names the index, its type and what to pass.
"""

from __future__ import annotations

import operator

import numpy as np

#: what a caller may pass, said in every TypeError
ACCEPTED = (
    "pass an int (negative from the end), a list, range or 1-D array of ints, a slice, or a boolean mask of one "
    "value per record"
)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _outside(value, kind: str, n: int, where: str = "") -> IndexError:
    return IndexError(
        f"RandomAccess index {value} ({kind}){where} is out of range: record {value} of an output of {n} records "
        f"(pass -{n} <= i < {n})"
    )


def is_many(index) -> bool:
    """Whether ``index`` asks for several records (a batch): a list, tuple, range, slice or an array of 1 or more
    dimensions (a 0-d array is one index, as in NumPy)."""
    return isinstance(index, (list, tuple, range, slice)) or (isinstance(index, np.ndarray) and index.ndim > 0)


def one_index(index, n: int, where: str = "") -> int:
    """The record ``0 <= i < n`` that the single index ``index`` names, for an output of ``n`` records
    (``where``: its position in a list of indices, for the messages).

    Raises:
      TypeError: ``index`` is not an integer (a float, a bool, a string, None, ...).
      IndexError: ``index`` outside ``[-n, n)``.
    """
    kind = type(index).__name__
    if isinstance(index, np.ndarray):
        kind = f"0-d {index.dtype} array"
    if isinstance(index, (bool, np.bool_)) or (isinstance(index, np.ndarray) and index.dtype == bool):
        raise TypeError(
            f"RandomAccess index {_shown(index)} ({kind}){where} is a bool, not a record number: {ACCEPTED}"
        )
    try:
        value = operator.index(index)  # Python ints, NumPy integers and 0-d integer arrays; never a float
    except TypeError:
        raise TypeError(f"RandomAccess index {_shown(index)} ({kind}){where} is not an integer: {ACCEPTED}") from None
    if not -n <= value < n:
        raise _outside(value, kind, n, where)
    return value % n


def many_indices(indices, n: int) -> np.ndarray:
    """The records (``int64``, shape ``(k,)``, each in ``[0, n)``, in the order given) that ``indices`` names:
    a list, tuple, range or 1-D array of integers, a slice, or a boolean mask of ``n`` values.

    Raises:
      TypeError: values that are not integers (floats, strings, ...), or an array of 2 or more dimensions.
      IndexError: an integer outside ``[-n, n)`` (the first, with its position), or a mask of another length.
    """
    if isinstance(indices, slice):
        return np.arange(n, dtype=np.int64)[indices]
    try:
        arr = np.asarray(indices)
    except (ValueError, TypeError):  # a ragged list
        raise TypeError(f"RandomAccess indices {_shown(indices)} are not a flat list of ints: {ACCEPTED}") from None
    if arr.ndim != 1:
        raise TypeError(
            f"RandomAccess indices of shape {arr.shape} ({type(indices).__name__}): a batch takes a 1-D list of "
            f"indices, its rows in that order; pass np.ravel(indices) for one batch of them all, or one row at a time"
        )
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype == bool:
        if len(arr) != n:
            raise IndexError(
                f"RandomAccess boolean mask of {len(arr)} values for an output of {n} records: a mask takes one "
                f"value per record (len(ra) = {n}); for some records, pass their integer indices"
            )
        return np.flatnonzero(arr).astype(np.int64)
    if arr.dtype.kind == "O":  # Python ints beyond uint64, None, a mix of types: each checked as one index
        values = arr.tolist()
        return np.fromiter((one_index(v, n, f" at position {r}") for r, v in enumerate(values)), np.int64, len(arr))
    if arr.dtype.kind not in "iu":
        r = 0
        if arr.dtype.kind in "fc":  # show the first value that is not a whole number
            r = int(next(iter(np.flatnonzero(arr != np.round(arr.real))), 0))
        raise TypeError(
            f"RandomAccess indices of dtype {arr.dtype} ({_shown(arr.tolist()[r])} at position {r}) are not "
            f"integers: an index is never rounded or truncated to a record; {ACCEPTED}"
        )
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8:
        big = np.flatnonzero(arr >= np.uint64(2**63))  # would wrap to a negative int64
        if big.size:
            raise _outside(int(arr[big[0]]), str(arr.dtype), n, f" at position {int(big[0])}")
    idx = arr.astype(np.int64)
    bad = np.flatnonzero((idx < -n) | (idx >= n))
    if bad.size:
        raise _outside(int(idx[bad[0]]), str(arr.dtype), n, f" at position {int(bad[0])}")
    return idx % n if n else idx
