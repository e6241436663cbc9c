"""The value check of the ``read`` section: what a reader returned against the source arrays, exactly.

NumPy only (no TensorFlow, no PyTorch), so it runs in every contender's environment. A contender keeps what its
reader hands it (:class:`Collected`: whole batches, or single examples; TensorFlow and PyTorch tensors are turned
into NumPy arrays only after the timed pass) and :func:`check` compares it with the arrays the records were
converted from, saved by the driver as ``EXPECTED_DIR/<feature>.npy`` (:func:`save_expected`). The ``id`` feature
of the benchmark's inputs is the row number, so every record read is matched with its source row by its ``id``:

* a full pass (``indices`` None): every row exactly once, in row order when ``ordered`` (the readers that keep
  shard order), in any order otherwise (interleaved reads, shuffled loaders);
* random access (``indices`` given): record k is row ``indices[k]``, in that order;

then every feature's dtype, shape and values (floats bit for bit) against the source rows. The first difference
comes back as one line (feature, row), None when everything matches.
"""

from __future__ import annotations

import os

import numpy as np

ID = "id"


def save_expected(columns: dict[str, np.ndarray], directory: str) -> None:
    """Writes ``columns`` (feature name -> array of every row) as ``directory/<name>.npy``."""
    os.makedirs(directory, exist_ok=True)
    for name, array in columns.items():
        np.save(os.path.join(directory, f"{name}.npy"), np.ascontiguousarray(array))


def load_expected(directory: str) -> dict[str, np.ndarray]:
    """The arrays of :func:`save_expected` (memory-mapped: the check reads only what it compares)."""
    return {
        name[:-4]: np.load(os.path.join(directory, name), mmap_mode="r")
        for name in sorted(os.listdir(directory))
        if name.endswith(".npy")
    }


class Collected:
    """What a reader handed over during the timed pass: batches (``{name: array of rows}``) or single examples
    (``{name: array}``), kept as they came (references only: no copy, no conversion inside the timed loop)."""

    def __init__(self):
        self.batches: list[dict] = []
        self.rows: list[dict] = []

    def batch(self, batch: dict) -> None:
        self.batches.append(batch)

    def row(self, example: dict) -> None:
        self.rows.append(example)

    def arrays(self) -> dict[str, np.ndarray]:
        """``{name: array of every record}``: the batches concatenated, then the single examples stacked (a
        contender uses one or the other)."""
        names = list((self.batches or self.rows or [{}])[0])
        out = {}
        for name in names:
            parts = [np.asarray(b[name]) for b in self.batches]
            if self.rows:
                parts.append(np.stack([np.asarray(r[name]) for r in self.rows]))
            out[name] = np.concatenate(parts) if parts else np.zeros(0)
        return out


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Row-wise exact equality (floats compared as bytes: -0.0 and NaN payloads count)."""
    n = len(want)
    if want.dtype.kind == "f":
        got, want = got.view(np.uint8), want.view(np.uint8)
    return np.all(got.reshape(n, -1) == want.reshape(n, -1), axis=1)


def check(
    got: dict[str, np.ndarray], expected: dict[str, np.ndarray], indices: np.ndarray | None = None, ordered: bool = True
) -> str | None:
    """None when ``got`` (``{name: array of the records read}``) holds exactly the source rows, else the first
    difference, one line. See the module for what is compared."""
    rows = len(expected[ID])
    missing = sorted(set(expected) - set(got))
    if missing:
        return f"features {missing} not read"
    extra = sorted(set(got) - set(expected))
    if extra:
        return f"features {extra} are not in the source"
    ids = np.asarray(got[ID]).reshape(-1)
    n = len(ids)
    if any(len(np.asarray(v)) != n for v in got.values()):
        return "features of different record counts: " + ", ".join(f"{k} {len(v)}" for k, v in got.items())
    if indices is not None:
        indices = np.asarray(indices, dtype=np.int64)
        if n != len(indices):
            return f"{n} records, expected {len(indices)}"
        wrong = np.nonzero(ids != indices)[0]
        if len(wrong):
            return f"record {int(wrong[0])} read for index {int(indices[wrong[0]])} is row {int(ids[wrong[0]])}"
        order = None
    else:
        if n != rows:
            return f"{n} records, expected {rows}"
        if ordered:
            wrong = np.nonzero(ids != np.arange(rows))[0]
            if len(wrong):
                return f"record {int(wrong[0])} is row {int(ids[wrong[0]])}: rows out of order"
            order = None
        else:
            order = np.argsort(ids, kind="stable")
            if not np.array_equal(ids[order], np.arange(rows)):
                return "the ids are not each row number once"
    for name, want in expected.items():
        value = np.asarray(got[name])
        if order is not None:
            value = value[order]
        want = np.asarray(want if indices is None else want[indices])
        if value.dtype != want.dtype:
            return f"{name}: dtype {value.dtype}, expected {want.dtype}"
        if value.shape != want.shape:
            return f"{name}: shape {value.shape[1:]}, expected {want.shape[1:]}"
        bad = np.nonzero(~_same(value, want))[0]
        if len(bad):
            where = int(bad[0]) if indices is None else int(indices[bad[0]])
            return f"{name}: values differ from row {where}"
    return None
