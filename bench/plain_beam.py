"""Contender "plain Beam": the pipeline one writes with Beam's own pieces, one serialized Example per element.

    python -m bench.plain_beam --input data.h5 --output_dir out/ [--range_mb 16] [--num_shards N] \\
        --runner=DirectRunner --direct_running_mode=multi_processing --direct_num_workers=2

``Create(row ranges of about --range_mb) | Reshuffle | FlatMap(read the range with h5py, build one
tf.train.Example per row in Python, yield its serialization) | WriteToTFRecord`` (uncompressed,
``--num_shards`` shards, default ``ceil(raw bytes / 192 MiB)`` like convert's default). The Examples
have the same features and forms as the seed loop's. It measures Beam's per-element cost (the DoFn
output, the sink's per-record write) on top of the seed loop's per-row protobuf work.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


class _ReadAndEncode:
    """Reads one row range and yields one serialized Example per row (built lazily on the worker)."""

    def __init__(self, path: str):
        self._path = path
        self._to_example = None

    def __call__(self, bounds):
        from bench.common import iter_h5_chunks, make_row_example_fn

        if self._to_example is None:
            self._to_example = make_row_example_fn()
        start, stop = bounds
        for columns in iter_h5_chunks(self._path, stop - start, start, stop):
            rows = len(next(iter(columns.values())))
            for i in range(rows):
                yield self._to_example(columns, i)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.plain_beam", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--input", required=True, help="HDF5 file")
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--range_mb", type=float, default=16.0, help="raw MB of one row range (one element of Create)")
    ap.add_argument("--num_shards", type=int, default=None)
    args, beam_argv = ap.parse_known_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import logging

    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    import apache_beam as beam
    import h5py
    import numpy as np
    from apache_beam.options.pipeline_options import PipelineOptions

    with h5py.File(args.input, "r") as f:
        names = [k for k in f if isinstance(f[k], h5py.Dataset)]
        rows = f[names[0]].shape[0]
        rbytes = sum(f[k].dtype.itemsize * int(np.prod(f[k].shape[1:], dtype=np.int64)) for k in names)
    step = max(1, int(args.range_mb * 1e6) // max(1, rbytes))
    ranges = [(a, min(a + step, rows)) for a in range(0, rows, step)]
    num_shards = args.num_shards or max(1, math.ceil(rows * rbytes / (192 * 2**20)))
    os.makedirs(args.output_dir, exist_ok=True)
    # Referenced through the importable module (not __main__), so workers unpickle it by name.
    from bench.plain_beam import _ReadAndEncode as read_and_encode

    started = time.perf_counter()
    with beam.Pipeline(options=PipelineOptions(beam_argv)) as p:
        _ = (
            p
            | "Ranges" >> beam.Create(ranges)
            | "Spread" >> beam.Reshuffle()
            | "ReadAndEncode" >> beam.FlatMap(read_and_encode(args.input))
            | "Write"
            >> beam.io.WriteToTFRecord(
                os.path.join(args.output_dir, "data"),
                file_name_suffix=".tfrecord",
                num_shards=num_shards,
                shard_name_template="-SSSSS-of-NNNNN",
            )
        )
    seconds = time.perf_counter() - started
    print(
        f"plain_beam: {rows} examples in {seconds:.2f} s ({rows / max(seconds, 1e-9):,.0f} examples/s, after imports)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
