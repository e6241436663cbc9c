"""MATLAB v7.3 variables as HDF5 stores them, for the HDF5 source, its walk (``hdf5layout``) and inspect.

A MATLAB v7.3 ``.mat`` file is an HDF5 file behind a 512-byte user block: every variable carries a ``MATLAB_class``
attribute and is stored column-major, so HDF5 sees its dimensions reversed (a MATLAB 1000x20 matrix is an HDF5
(20, 1000) dataset): :func:`matlab_order` transposes it back. Cell arrays are datasets of object references into
``/#refs#`` (:func:`cells`, :func:`string_cells`); empty arrays (``MATLAB_empty``) store their dimensions, not data
(:func:`is_empty`); complex arrays are compounds of ``real`` and ``imag`` (:func:`complex_dtype`); character arrays
(``MATLAB_class`` ``char``) become strings, one per row (:mod:`mattext`). Source: MathWorks, "MAT-File Versions"
(v7.3 uses HDF5), and the files MATLAB and ``hdf5storage`` write.
"""

from __future__ import annotations

import numpy as np

from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import mattext


def is_matlab(dset) -> bool:
    """True for a MATLAB v7.3 variable (a ``MATLAB_class`` attribute): stored column-major, read transposed."""
    return "MATLAB_class" in dset.attrs


def is_empty(dset, path: str | None = None) -> bool:
    """True for an empty MATLAB array (``MATLAB_empty``, or MATLAB's shared ``canonical empty``): its stored
    values are its dimensions, not data.

    Raises:
      SourceError: a ``MATLAB_class`` that is not one string or a ``MATLAB_empty`` that is not one integer (MATLAB
        writes a fixed-length ASCII string and a uint8), naming the dataset (``path``, default ``dset.name``).
    """
    attrs = dset.attrs
    if "MATLAB_class" not in attrs:
        return False
    return bool(_matlab_attr(dset, "MATLAB_empty", path)) or _matlab_attr(dset, "MATLAB_class", path) in (
        b"canonical empty",
        "canonical empty",
    )


def _matlab_attr(dset, name: str, path: str | None):
    """The attribute ``name`` of a MATLAB variable: a string (``MATLAB_class``) or one integer (``MATLAB_empty``,
    0 when absent); anything else is a SourceError naming the dataset, never a NumPy truth-value traceback."""
    try:
        value = dset.attrs.get(name, 0)
    except Exception as e:  # noqa: BLE001 - an attribute of a type h5py cannot read
        value = e
    if name == "MATLAB_class":
        ok = isinstance(value, (bytes, str))
        want = "a class name string (double, char, cell, ...)"
    else:
        ok = isinstance(value, (int, np.integer, np.bool_)) or (
            isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iub"
        )
        want = "one integer"
    if not ok:
        kind = getattr(value, "dtype", type(value).__name__)
        what = (
            f"unreadable ({type(value).__name__}: {value})"
            if isinstance(value, Exception)
            else f"the value {value!r} ({kind})"
            if np.ndim(value) == 0
            else f"an array of {kind}, shape {list(np.shape(value))}"
        )
        raise SourceError(
            f"The dataset's {name} attribute is {what}, not {want}: the file is not a valid MATLAB v7.3 file",
            dataset=path or dset.name,
            hint=f"remove or fix the {name} attribute (h5py: del dset.attrs['{name}']), or "
            "choose other datasets with --datasets",
        )
    return value.item() if isinstance(value, np.ndarray) else value


def complex_dtype(dset):
    """The complex dtype of a MATLAB complex array (a compound of ``real`` and ``imag`` floats of one type), else
    None."""
    dtype = dset.dtype
    if (
        is_matlab(dset)
        and dtype.names == ("real", "imag")
        and dtype["real"] == dtype["imag"]
        and dtype["real"].kind == "f"
        and dtype["real"].itemsize in (4, 8)
    ):
        return np.dtype(
            f"{dtype['real'].byteorder if dtype['real'].byteorder != '=' else ''}c{2 * dtype['real'].itemsize}"
        )
    return None


def is_char(dset) -> bool:
    """True for a MATLAB v7.3 char array (``MATLAB_class`` ``char``): its uint16 code units convert to strings
    (:mod:`mattext`)."""
    return is_matlab(dset) and dset.attrs.get("MATLAB_class") in (b"char", "char") and dset.ndim >= 1


def string_cells(dset):
    """The char datasets of a MATLAB v7.3 cell array ``dset`` (object references) in MATLAB's linear order, each
    ``None`` for empty text, when every cell is a char row vector or empty text; else None. Such a cell converts
    to one list of strings (:mod:`mattext`), as a v4-v7 file's does."""
    import h5py

    try:
        if h5py.check_ref_dtype(dset.dtype) is None or dset.attrs.get("MATLAB_class") not in (b"cell", "cell"):
            return None
        refs = dset[()].ravel()  # HDF5's reversed dimensions: C order is MATLAB's column order
        out = []
        for ref in refs:
            target = dset.file[ref] if ref else None
            if not isinstance(target, h5py.Dataset) or target.attrs.get("MATLAB_class") not in (b"char", "char"):
                return None
            if is_empty(target):
                out.append(None)
                continue
            shape = tuple(int(d) for d in target.shape)[::-1]
            if len(shape) != 2 or shape[0] != 1:
                return None
            out.append(target)
        return out or None
    except Exception:  # noqa: BLE001 - not a readable cell of text: the caller names it as skipped
        return None


def string_list(dset, cells):
    return mattext.strings_list(
        [np.zeros((0,), "<u2") if c is None else matlab_order(c, np.asarray(c[()])) for c in cells], dset.name
    )


def list_spec(cells):

    return mattext.list_spec(0 if c is None else int(c.shape[0]) for c in cells)


def char_spec(dset):

    return mattext.char_spec(tuple(int(d) for d in dset.shape)[::-1])


def char_strings(dset, codes):

    return mattext.char_strings(codes, dset.name)


def converted(dset, data):
    """``data`` read from ``dset`` in the dtype of :func:`dtype_of` (MATLAB complex parts copied bit for bit).

    Decided from the dataset's own dtype, never by comparing it with ``data.dtype``: h5py returns a subarray
    dtype as its base dtype with extra axes, which is no conversion."""
    target = complex_dtype(dset)
    if target is None:
        return data
    out = np.empty(data.shape, target)
    out.real, out.imag = data["real"], data["imag"]
    return out


def matlab_order(dset, data):
    """``data`` read from a MATLAB variable with HDF5's axes reversed back (a subarray dtype's trailing axes stay
    last), C-contiguous; other datasets unchanged."""
    if not (is_matlab(dset) and dset.ndim > 1):
        return data
    axes = tuple(range(dset.ndim))[::-1] + tuple(range(dset.ndim, data.ndim))
    return np.ascontiguousarray(data.transpose(axes))


def cells(f, name: str, dset, path: str, skipped: list | None = None):
    """Yields ``(item, dataset)`` of the cells of a cell array ``dset`` (object references), items ``name{k}`` with
    MATLAB's 1-based linear index (column-major, as MATLAB's ``c{k}``). A cell that is not a numeric/char/logical
    array (a nested cell, a struct, a null reference) is appended to ``skipped``, or refused when it is None.

    Raises:
      SchemaError: such a cell and ``skipped`` is None (naming the cell).
    """
    import h5py

    refs = dset[()].ravel()  # HDF5 stores MATLAB's dimensions reversed: C order here is MATLAB's column order
    for k, ref in enumerate(refs, 1):
        item = f"{name}{{{k}}}"
        try:
            target = f[ref] if ref else None
        except Exception as e:  # noqa: BLE001
            target = e
        if not isinstance(target, h5py.Dataset) or (
            h5py.check_ref_dtype(target.dtype) is not None and string_cells(target) is None
        ):
            if skipped is not None:
                skipped.append(item)
                continue
            what = (
                "a null reference"
                if target is None
                else (
                    "a nested cell array"
                    if isinstance(target, h5py.Dataset)
                    else f"an unreadable reference ({target})"
                    if isinstance(target, Exception)
                    else "a struct or group"
                )
            )
            raise SchemaError(
                f"Cell {item} holds {what}: only cells of arrays are converted",
                file=path,
                dataset=item,
                hint="store the cell's arrays as separate variables, or choose other datasets with --datasets",
            )
        if is_empty(target):
            continue  # an empty MATLAB array stores its dimensions, not data
        if target.is_virtual or target.id.get_create_plist().get_external_count():
            raise SchemaError(
                f"Cell {item} is stored outside the file (external or virtual storage): refused",
                file=path,
                dataset=item,
            )
        yield item, target  # one at a time: a cell array of 20,000 cells held them all open
