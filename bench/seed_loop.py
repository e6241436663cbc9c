"""Contender "seed loop": the hand-written per-row loop of seed 000, in one process.

    python -m bench.seed_loop --input data.h5 --output out/data.tfrecord [--chunk_rows N]

Reads every dataset of the HDF5 file a chunk of rows at a time (about 16 MB), builds one
``tf.train.Example`` per row in Python (``uint8`` arrays as one ``bytes`` value of ``array.tobytes()``,
floats as a ``float_list``, integers as an ``int64_list``), serializes it and writes it with
``tf.io.TFRecordWriter`` to one uncompressed file (``--compression gzip``: through TensorFlow's GZIP writer,
``options="GZIP"``, zlib at level 6). This is the baseline of the "x seed" ratios: it measures the per-row cost
of Python protobuf construction plus TensorFlow's record writer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.seed_loop", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--input", required=True, help="HDF5 file")
    ap.add_argument("--output", required=True, help="TFRecord file to write")
    ap.add_argument(
        "--compression",
        choices=("none", "gzip"),
        default="none",
        help="gzip: write with TensorFlow's GZIP writer (the hand loop of compressed output)",
    )
    ap.add_argument("--chunk_rows", type=int, default=None, help="rows read at a time (default: about 16 MB)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    from bench.common import iter_h5_chunks, make_row_example_fn

    to_example = make_row_example_fn()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    started = time.perf_counter()
    n = 0
    with tf.io.TFRecordWriter(args.output, options="GZIP" if args.compression == "gzip" else None) as writer:
        for columns in iter_h5_chunks(args.input, args.chunk_rows):
            rows = len(next(iter(columns.values())))
            for i in range(rows):
                writer.write(to_example(columns, i))
            n += rows
    seconds = time.perf_counter() - started
    print(
        f"seed_loop: {n} examples in {seconds:.3f} s ({n / max(seconds, 1e-9):,.0f} examples/s, after imports)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
