"""Deterministic benchmark inputs: HDF5 files written with h5py a block of rows at a time.

Every block of ``BLOCK_ROWS`` rows is drawn from its own generator, ``numpy.random.default_rng((seed,
block))``, so a file's bytes depend only on its layout, its row count and its seed, never on memory or
chunk sizes; generation holds one block (at most about 64 MB) in memory.

* ``small``: ``/x`` float32[16] (standard normal) and ``/id`` int64 (the row number): 72 bytes a row;
* ``large``: ``/image`` uint8[64,64,3] (uniform random), ``/emb`` float32[128] (standard normal) and
  ``/id`` int64: 12,808 bytes a row.

Datasets are contiguous and unfiltered (reads are not limited by decompression). A JSON stamp beside
each file records its parameters, so ``--keep`` reuses a file only when it is what was asked for.

    python -m bench.datagen small out.h5 --rows 1000
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from bench.common import LAYOUTS, row_bytes

VERSION = 1
BLOCK_BYTES = 64 * 2**20
SEEDS = {"small": 1234, "large": 5678}


def block_rows(layout: dict) -> int:
    return max(1, BLOCK_BYTES // row_bytes(layout))


def _fill(rng: np.random.Generator, name: str, dtype: str, shape: tuple, start: int, stop: int) -> np.ndarray:
    n = stop - start
    if name == "/id":
        return np.arange(start, stop, dtype=dtype)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((n, *shape), dtype=np.float32).astype(dtype, copy=False)
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def _stamp_path(path: str) -> str:
    return path + ".json"


def stamp(kind: str, rows: int, seed: int) -> dict:
    return {"kind": kind, "rows": int(rows), "seed": int(seed), "version": VERSION}


def is_current(path: str, kind: str, rows: int, seed: int | None = None) -> bool:
    """True when ``path`` exists with the stamp of ``(kind, rows, seed)``."""
    seed = SEEDS[kind] if seed is None else seed
    try:
        with open(_stamp_path(path), encoding="utf-8") as f:
            return os.path.exists(path) and json.load(f) == stamp(kind, rows, seed)
    except (OSError, ValueError):
        return False


def generate(kind: str, path: str, rows: int, seed: int | None = None) -> dict:
    """Writes the ``kind`` layout with ``rows`` rows to ``path`` (replacing it); returns its stamp."""
    import h5py

    layout = LAYOUTS[kind]
    seed = SEEDS[kind] if seed is None else seed
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for p in (path, _stamp_path(path)):
        if os.path.exists(p):
            os.remove(p)
    tmp = path + ".partial"
    step = block_rows(layout)
    with h5py.File(tmp, "w") as f:
        dsets = {
            name: f.create_dataset(name, shape=(rows, *shape), dtype=dtype) for name, (dtype, shape) in layout.items()
        }
        for block, start in enumerate(range(0, rows, step)):
            stop = min(start + step, rows)
            rng = np.random.default_rng((seed, block))
            for name, (dtype, shape) in layout.items():
                dsets[name][start:stop] = _fill(rng, name, dtype, shape, start, stop)
    os.replace(tmp, path)
    st = stamp(kind, rows, seed)
    with open(_stamp_path(path), "w", encoding="utf-8") as f:
        json.dump(st, f)
    return st


def ensure(kind: str, path: str, rows: int, keep: bool, seed: int | None = None) -> bool:
    """Generates ``path`` unless ``keep`` and it is already current; returns True when it generated."""
    if keep and is_current(path, kind, rows, seed):
        return False
    generate(kind, path, rows, seed)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.datagen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("kind", choices=sorted(LAYOUTS))
    ap.add_argument("path")
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    generate(args.kind, args.path, args.rows, args.seed)
    print(f"wrote {args.rows} rows ({args.rows * row_bytes(LAYOUTS[args.kind]):,} raw bytes) to {args.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
