"""MATLAB sparse matrices, converted as their dense twin ``full(S)`` from v4-v7 and v7.3 files alike.

A sparse matrix of MATLAB size ``m x n`` converts as ``m`` rows of ``n`` values (rows mode) or one ``(m, n)`` array
(datasets mode), in its class's dtype: float64 (double), complex128 (complex double), uint8 (logical); MATLAB has
no other sparse class. Its dense size (``m * n *`` the dtype's bytes) is checked against ``--max_mat_variable_mb``
before anything is read, for both kinds of file, with the same message (:func:`too_dense`).

* v4-v7 (SciPy): ``loadmat`` returns a ``scipy.sparse`` matrix; :func:`dense` makes it full.
* v7.3 (HDF5): the variable is a group with attributes ``MATLAB_class`` (``double`` or ``logical``) and
  ``MATLAB_sparse`` (the number of rows, ``m``) holding MATLAB's compressed-column arrays: ``data`` (the nonzeros;
  a ``real``/``imag`` compound when complex), ``ir`` (their 0-based rows) and ``jc`` (``n + 1`` column starts); an
  all-zero matrix has no ``data`` and ``ir``. :class:`SparseView` presents such a group as the HDF5 path's
  dataset of a MATLAB variable (HDF5's reversed dimensions ``(n, m)``, read with ``[...]``), so the walk, the row
  groups, row ranges and datasets mode treat it as the dense matrix; :func:`parts` gives its stored datasets for
  the storage and filter checks.

References: MathWorks, "Sparse Matrices" (compressed-column storage) and "MAT-File Versions"; SciPy's
``csc_matrix((data, indices, indptr), shape)``.
"""

from __future__ import annotations

import math

import numpy as np

from tfrecord_etl.transforms.errors import SourceError

SPARSE_NOTE = "converted dense: full(S)"  # inspect's note on a sparse variable (v4-v7 and v7.3)


def sparse_class(logical: bool) -> str:
    """The class of a MATLAB sparse matrix's values: ``logical`` or ``double`` (MATLAB has no other sparse class). A
    sparse matrix converts as its dense twin, ``full(S)``: rows are MATLAB's first dimension, the values exactly
    those of ``scipy.io.loadmat(...).toarray()``, in the class's dtype (float64, complex128, or uint8 for logical)."""
    return "logical" if logical else "double"


def dense(value, logical: bool | None = None) -> np.ndarray:
    """The dense array of a loaded sparse matrix (``full(S)``) in its MATLAB class's dtype: bool for logical,
    complex128 when complex, else float64 (SciPy returns the stored type, e.g. uint8 for a double matrix of small
    integers that MATLAB stored as bytes, and for a logical one that ``scipy.io.savemat`` wrote). ``logical``: the
    header's class when known (True: bool), else told by the loaded dtype. The caller has checked its size
    (``--max_mat_variable_mb``)."""
    a = value.toarray()
    if logical:
        return a.astype(bool)
    return a if a.dtype.kind in "bc" else a.astype(np.float64)


def too_dense(shape, dtype, limit: int, path: str, name: str) -> SourceError | None:
    """The SourceError of a sparse matrix of MATLAB ``shape`` and converted ``dtype`` whose dense form is over
    ``limit`` bytes (``--max_mat_variable_mb``), naming the file and variable with the ways out; None when it fits."""
    declared = math.prod(shape) * np.dtype(dtype).itemsize
    if declared <= limit:
        return None
    return SourceError(
        f"The sparse matrix converts dense (full(S), {' x '.join(map(str, shape))} "
        f"{np.dtype(dtype)}): {declared:,} bytes ({declared / 2**20:,.1f} MiB), over the limit of "
        f"{limit / 2**20:g} MiB for one variable",
        file=path,
        dataset=name,
        hint="save its [i, j, v] = find(S) triplets as three variables (rows of nonzeros) and convert "
        "those, raise --max_mat_variable_mb if the memory is there, or choose other variables with "
        "--datasets",
    )


def is_sparse(obj) -> bool:
    """True for a MATLAB v7.3 sparse matrix: an HDF5 group with ``MATLAB_class`` and ``MATLAB_sparse``."""
    import h5py

    return isinstance(obj, h5py.Group) and "MATLAB_sparse" in obj.attrs and "MATLAB_class" in obj.attrs


def as_dataset(obj):
    """``obj`` when it is an h5py Dataset, a :class:`SparseView` of a v7.3 sparse matrix group, else None."""
    import h5py

    if isinstance(obj, h5py.Dataset):
        return obj
    return SparseView(obj) if is_sparse(obj) else None


def parts(dset) -> list:
    """The stored datasets behind ``dset``: a :class:`SparseView`'s ``data``, ``ir`` and ``jc``, else ``[dset]``."""
    return dset.parts if isinstance(dset, SparseView) else [dset]


class SparseView:
    """A MATLAB v7.3 sparse matrix group read as the dense HDF5 dataset of a MATLAB variable: ``attrs`` (the
    group's: ``MATLAB_class`` makes the HDF5 path read it transposed), ``shape`` ``(n, m)`` (HDF5's reversed
    dimensions), ``ndim`` 2, ``dtype`` (float64, complex128, or uint8 for logical), no chunks; ``view[...,
    a:b]`` is ``full(S)(a+1:b, :)`` transposed, ``view[()]`` all of it. The compressed columns are read once, at
    the first read, and held as rows (a few bytes per nonzero).

    Raises (at construction):
      SourceError: a ``MATLAB_sparse`` that is not one non-negative integer, ``jc`` missing or not 1-D, ``data``
        and ``ir`` of different lengths, a ``data`` type that is neither numeric nor a complex compound.
    """

    chunks = None
    ndim = 2
    is_virtual = False
    maxshape = None

    def __init__(self, group):
        self.group, self.attrs, self.name, self.file = group, group.attrs, group.name, group.file
        self.parts = [group[k] for k in ("data", "ir", "jc") if k in group]
        self._rows = None
        rows, jc = group.attrs["MATLAB_sparse"], group.get("jc")
        if np.ndim(rows) > 1 or np.size(rows) != 1 or np.asarray(rows).dtype.kind not in "iu" or int(rows) < 0:
            self._refuse(f"its MATLAB_sparse attribute is {rows!r}, not one row count")
        if jc is None or not hasattr(jc, "shape") or jc.size < 1 or jc.size not in jc.shape:
            self._refuse("it has no jc dataset of column starts (a vector)")
        data, ir = group.get("data"), group.get("ir")
        if (data is None) != (ir is None) or (data is not None and data.size != ir.size):
            self._refuse("its data and ir datasets differ in length (one value per row index)")
        self.m, self.n = int(np.asarray(rows).item()), int(jc.size) - 1
        self.shape = (self.n, self.m)
        logical = group.attrs.get("MATLAB_class") in (b"logical", "logical")
        stored = data.dtype if data is not None else np.dtype("<f8")
        if logical:
            self.dtype = np.dtype("|u1")
        elif stored.names == ("real", "imag"):
            self.dtype = np.dtype("<c16")
        elif stored.kind in "biuf":
            self.dtype = np.dtype("<f8")
        else:
            self._refuse(f"its data dataset holds {stored}, not numbers")

    def _refuse(self, why: str) -> None:
        raise SourceError(
            f"The MATLAB sparse matrix cannot be read: {why}",
            dataset=self.name,
            hint="save it again from MATLAB, or choose other datasets with --datasets",
        )

    @property
    def id(self):
        """The ``data`` dataset's HDF5 id (``jc``'s for an all-zero matrix): what a read error's filter check reads."""
        return self.parts[0].id

    @property
    def size(self) -> int:
        return self.n * self.m

    def rows(self):
        """The matrix as ``scipy.sparse`` rows (CSR), built from the stored compressed columns at the first call.

        Raises:
          SourceError: row indices or column starts that do not fit the matrix (SciPy's ``check_format``).
        """
        if self._rows is None:
            import scipy.sparse

            group = self.group
            jc = np.asarray(group["jc"][()]).ravel().astype(np.int64)
            if "data" in group:
                data, ir = np.asarray(group["data"][()]).ravel(), np.asarray(group["ir"][()]).ravel().astype(np.int64)
            else:
                data, ir = np.zeros(0, self.dtype), np.zeros(0, np.int64)
            if data.dtype.names:
                values = np.empty(data.shape, self.dtype)
                values.real, values.imag = data["real"], data["imag"]
                data = values
            try:
                matrix = scipy.sparse.csc_matrix((data.astype(self.dtype), ir, jc), shape=(self.m, self.n))
                matrix.check_format(full_check=True)
            except ValueError as e:
                self._refuse(f"its ir and jc arrays do not describe a {self.m} x {self.n} matrix ({e})")
            self._rows = matrix.tocsr()
        return self._rows

    def __getitem__(self, key) -> np.ndarray:
        """``[()]`` or ``[..., a:b]`` (MATLAB rows ``a`` to ``b - 1``): dense, HDF5's orientation ``(n, rows)``."""
        if key == ():
            picked = self.rows()
        elif isinstance(key, tuple) and len(key) == 2 and key[0] is Ellipsis and isinstance(key[1], slice):
            picked = self.rows()[key[1]]
        else:
            raise TypeError(f"a MATLAB sparse matrix is read whole or by row ranges, not [{key!r}]")
        return np.ascontiguousarray(picked.toarray().T)
