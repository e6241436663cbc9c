"""Peer contender "Ray Data": ``map_batches`` over h5py row ranges, then ``write_tfrecords``; run in its own venv.

    bench/.venv-peers-ray/bin/python -m bench.peer_ray --input data.h5 --output_dir out/ [--num_cpus 2]

Runs in the environment ``bench.peers`` builds (``ray[data]``, TensorFlow for Ray's ``tf.train.Example``
writer, ``crc32c``), never in the project's. The whole job, as a Ray user writes it: ``ray.init(num_cpus=N)``
(included in the wall time: a local cluster starts), a dataset of row ranges (``ray.data.from_items``), one
``map_batches`` task per range that opens the HDF5 file with h5py and returns the rows as a PyArrow table with
the benchmark's Example forms (``uint8`` arrays as one ``bytes`` value, float arrays as a ``float_list`` through a
fixed-size list column, integers as an ``int64_list``; see ``bench.common.seed_form``), and
``Dataset.write_tfrecords`` (uncompressed ``*.tfrecords`` files). Ranges are about 16 MB of rows, as the
hand-written loop reads them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def read_range(batch: dict, path: str):
    """``{"start": [a], "stop": [b]}`` (one range a batch) -> a PyArrow table of rows ``[a, b)``."""
    import h5py
    import numpy as np
    import pyarrow as pa

    from bench.common import seed_form

    columns = {}
    with h5py.File(path, "r") as f:
        names = sorted(k for k in f if isinstance(f[k], h5py.Dataset))
        for a, b in zip(batch["start"], batch["stop"]):
            for name in names:
                columns.setdefault(name, []).append(f[name][int(a) : int(b)])
    out = {}
    for name, parts in columns.items():
        col = np.concatenate(parts)
        form = seed_form(col.dtype)
        if form == "bytes":
            flat = col.reshape(len(col), -1)
            out[name] = pa.array([r.tobytes() for r in flat], type=pa.binary())
        elif col.ndim == 1:
            out[name] = pa.array(col)
        else:
            flat = np.ascontiguousarray(col.reshape(len(col), -1))
            out[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
    return pa.table(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.peer_ray", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--input", required=True, help="HDF5 file")
    ap.add_argument("--output_dir", required=True, help="directory for the *.tfrecords files")
    ap.add_argument("--num_cpus", type=int, default=2, help="ray.init(num_cpus=N) (default 2)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray

    from bench.common import chunk_rows_for, h5_row_bytes_and_rows

    started = time.perf_counter()
    ray.init(
        num_cpus=args.num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "TF_CPP_MIN_LOG_LEVEL": "3"}},
    )
    rbytes, n = h5_row_bytes_and_rows(args.input)
    step = chunk_rows_for(rbytes)
    ranges = [{"start": a, "stop": min(a + step, n)} for a in range(0, n, step)]
    ds = ray.data.from_items(ranges, override_num_blocks=len(ranges))
    ds = ds.map_batches(read_range, fn_kwargs={"path": os.path.abspath(args.input)}, batch_size=1, batch_format="numpy")
    ds.write_tfrecords(os.path.abspath(args.output_dir))
    seconds = time.perf_counter() - started
    ray.shutdown()
    print(f"peer_ray: {n} examples in {seconds:.3f} s (ray.init to the last file written)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
