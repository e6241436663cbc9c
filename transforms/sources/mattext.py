"""MATLAB text as strings, for both MATLAB readers (v4-v7 through SciPy, v7.3 through h5py), so a file and its
v7.3 twin give the same records.

MATLAB's ``char`` is an array of UTF-16 code units; a char matrix is one string per row (``['ab'; 'cd']``), its
rows padded to one length with spaces, which are kept: the text is converted exactly. A char array of MATLAB shape
``(m, n, *rest)`` becomes a NumPy ``'<U{n}'`` array of shape ``(m, *rest)``: element ``i`` is the ``n`` code units
of ``A(i, :, ...)`` decoded from UTF-16 (a surrogate pair is one character). Refused, since a string could not
hold them exactly: an unpaired surrogate, and U+0000 (NumPy's ``U`` drops trailing NULs).

Row groups and shard sizes count the stored bytes (2 per code unit) on both paths: :func:`stored_nbytes`.

References: MathWorks, "MAT-File Format" (miUTF16 / mxCHAR_CLASS); "Represent Text with Character and String
Arrays" (char matrices pad rows).
"""

from __future__ import annotations

import math

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError


def matlab_shape(shape) -> tuple[int, ...]:
    """``shape`` as MATLAB's ``size`` reports it: trailing singleton dimensions beyond the second dropped (a writer
    such as ``scipy.io.savemat`` may store a 1x2 char array as 1x2x1; MATLAB and a v7.3 file say 1x2)."""
    shape = tuple(int(d) for d in shape)
    while len(shape) > 2 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def as_codes(value, where: str) -> np.ndarray:
    """The UTF-16 code units (uint16, MATLAB's shape) of a char array SciPy loaded (one ``U1`` per code unit).

    Raises:
      SchemaError: a character beyond U+FFFF (MATLAB's char is one UTF-16 code unit; only a foreign writer
        stores more).
    """
    a = np.asarray(value)
    a = a.reshape(matlab_shape(a.shape))
    codes = (
        np.ascontiguousarray(a).view(np.uint32).reshape(a.shape + (-1,))[..., 0]
        if a.size
        else np.zeros(a.shape, np.uint32)
    )
    if codes.size and int(codes.max()) > 0xFFFF:
        raise SchemaError("A char array holds characters beyond U+FFFF, which MATLAB's UTF-16 chars cannot", file=where)
    return codes.astype("<u2")


def _char_rows(value) -> bool:
    """True for a loaded char row vector (MATLAB ``1 x n``) or an empty char array: one string of a cell list."""
    if type(value) is not np.ndarray or value.dtype.kind != "U":
        return False
    shape = matlab_shape(value.shape)
    return value.size == 0 or (len(shape) == 2 and shape[0] == 1)


def string_cells(value) -> list | None:
    """The cells of a loaded cell array in MATLAB's linear order when every cell is a char row vector (or empty
    text), else None: such a cell converts to one list of strings (:func:`mattext.strings_list`)."""
    if type(value) is not np.ndarray or value.dtype != object or not value.size:
        return None
    cells = list(value.ravel(order="F"))
    return cells if all(_char_rows(c) for c in cells) else None


def char_spec(shape) -> tuple[np.dtype, tuple[int, ...]]:
    """``(dtype, shape)`` of the strings of a char array of MATLAB shape ``shape`` (at least 2-D)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2:
        shape = (1,) + shape if shape else (1, 1)
    return np.dtype(f"<U{max(1, shape[1])}"), (shape[0],) + shape[2:]


def stored_nbytes(dtype: np.dtype, shape) -> int:
    """Bytes of a converted array as the file stores it: a string array from a char array counts 2 bytes per code
    unit (its ``'<U{n}'`` strings of shape ``(m, *rest)`` were ``m * n * rest`` code units)."""
    if dtype.kind == "U":
        return math.prod(shape) * (dtype.itemsize // 4) * 2
    return math.prod(shape) * dtype.itemsize


def char_strings(codes: np.ndarray, where: str) -> np.ndarray:
    """The strings of a char array given as its UTF-16 code units of MATLAB shape ``(m, n, *rest)``.

    Returns:
      A ``'<U{n}'`` array of shape ``(m, *rest)`` (see the module docstring).

    Raises:
      SchemaError: an unpaired surrogate or a U+0000 code unit (naming ``where``).
    """
    codes = np.asarray(codes)
    dtype, shape = char_spec(codes.shape)
    if codes.ndim < 2:
        codes = codes.reshape((1, -1) if codes.ndim == 1 else (1, 1))
    units = np.ascontiguousarray(np.moveaxis(codes, 1, -1), dtype="<u2").reshape(-1, codes.shape[1])
    if units.size and not units.all():
        raise SchemaError(
            "A char array holds U+0000, which a string cannot keep exactly",
            file=where,
            hint="save the text without NUL characters, or choose other variables with --datasets",
        )
    out = []
    for row in units:
        try:
            out.append(row.tobytes().decode("utf-16-le"))
        except UnicodeDecodeError:
            raise SchemaError(
                "A char array holds an unpaired UTF-16 surrogate, which is no text",
                file=where,
                hint="choose other variables with --datasets",
            ) from None
    return np.array(out, dtype=dtype).reshape(shape)


def strings_list(elements, where: str) -> np.ndarray:
    """The strings of a cell array of char row vectors (MATLAB ``{'Fp1', 'Fz'}``), in MATLAB's linear order.

    Args:
      elements: each cell's UTF-16 code units of MATLAB shape ``(1, n)``, or an empty array for ``''``.
      where: named in errors.

    Returns:
      A 1-D ``'<U{w}'`` array, ``w`` the most code units of a cell (at least 1).

    Raises:
      SchemaError: as :func:`char_strings`.
    """
    texts, width = [], 1
    for codes in elements:
        codes = np.asarray(codes)
        if codes.size == 0:
            texts.append("")
            continue
        texts.append(str(char_strings(codes, where).reshape(-1)[0]))
        width = max(width, int(codes.shape[-1]) if codes.ndim else 1)
    return np.array(texts, dtype=f"<U{width}")


def list_spec(widths) -> tuple[np.dtype, tuple[int, ...]]:
    """``(dtype, shape)`` of :func:`strings_list` of cells of ``widths`` code units."""
    widths = list(widths)
    return np.dtype(f"<U{max([1, *widths])}"), (len(widths),)
