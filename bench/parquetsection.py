"""The ``parquet`` bench section (``python -m bench.run --only parquet``): a table of ``N`` rows (1 GB of values at
scale 1), ``x`` a float32 fixed-size list of 256 values and ``label`` an int64, zstd, row groups of 4,096 rows, as a
Parquet file and as an HDF5 file (the same two arrays, chunks of 4,096 rows, hdf5plugin's Zstd); contenders: the raw
copy of the Parquet file's bytes, the hand-written pyarrow + ``TFRecordWriter`` loop, ``convert`` of the Parquet file
and ``convert`` of the HDF5 twin, each with the planned writer on 2 workers.

    python -m bench.parquetsection make --output DIR --rows N   (DIR/data.parquet and DIR/data.h5)
    python -m bench.parquetsection loop --input DIR/data.parquet --output out/data.tfrecord

loop: the straightforward conversion a pyarrow user writes: ``pq.ParquetFile(...).iter_batches()``, one
``tf.train.Example`` per row (``x`` a FloatList, ``label`` an Int64List), ``tf.io.TFRecordWriter``; prints its
record count.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

PARQUET_ROWS = 1_000_000  # x (256 x 4 + 8) bytes: about 1 GB raw
COLUMNS = 256
ROW_BYTES = COLUMNS * 4 + 8
GROUP_ROWS = 4096


def make(directory: str, rows: int, seed: int = 15) -> None:
    """``directory``/data.parquet and data.h5: the same ``x`` (noise rounded to 2 decimals, about 2x compressible)
    and ``label``, zstd level 3 in both."""
    import h5py
    import hdf5plugin
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    schema = pa.schema([("x", pa.list_(pa.float32(), COLUMNS)), ("label", pa.int64())])
    chunk = min(GROUP_ROWS, rows)
    with (
        pq.ParquetWriter(os.path.join(directory, "data.parquet"), schema, compression="zstd") as writer,
        h5py.File(os.path.join(directory, "data.h5"), "w") as f,
    ):
        x = f.create_dataset("x", (rows, COLUMNS), "f4", chunks=(chunk, COLUMNS), **hdf5plugin.Zstd(clevel=3))
        label = f.create_dataset("label", (rows,), "i8", chunks=(chunk,), **hdf5plugin.Zstd(clevel=3))
        for start in range(0, rows, GROUP_ROWS):
            stop = min(rows, start + GROUP_ROWS)
            block = np.round(rng.standard_normal((stop - start, COLUMNS)), 2).astype("f4")
            labels = rng.integers(0, 10, stop - start)
            x[start:stop], label[start:stop] = block, labels
            column = pa.FixedSizeListArray.from_arrays(pa.array(block.ravel()), COLUMNS)
            writer.write_table(pa.table({"x": column, "label": labels}, schema=schema), row_group_size=GROUP_ROWS)


def loop(path: str, output: str) -> int:
    import pyarrow.parquet as pq
    import tensorflow as tf

    t = time.perf_counter()
    os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
    n = 0
    with tf.io.TFRecordWriter(output) as w:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=GROUP_ROWS):
            xs = batch.column("x").flatten().to_numpy().reshape(-1, COLUMNS)
            for row, label in zip(xs, batch.column("label").to_numpy()):
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
                n += 1
    print(f"parquetsection loop: {n} records in {time.perf_counter() - t:.3f} s")
    return n


def parquet_section(bench, rows_at, beam_flags) -> None:
    """Adds the section's rows to ``bench`` (a ``bench.run.Bench``); ``rows_at``/``beam_flags`` are bench.run's."""
    py = bench.py
    rows = rows_at(PARQUET_ROWS, bench.args.scale)
    directory = os.path.join(bench.data_dir, f"parquet_{rows}")
    if not os.path.isdir(directory):
        make_cmd = [py, "-m", "bench.parquetsection", "make", "--output", directory + ".tmp", "--rows", str(rows)]
        subprocess.run(make_cmd, check=True)
        os.rename(directory + ".tmp", directory)
    table, h5 = os.path.join(directory, "data.parquet"), os.path.join(directory, "data.h5")
    bench.say(f"[parquet] {rows:,} rows x {ROW_BYTES:,} bytes = {rows * ROW_BYTES / 1e6:,.1f} MB raw (zstd)")
    bench.section_info["parquet"] = {
        "rows": rows,
        "row_bytes": ROW_BYTES,
        "raw_bytes": rows * ROW_BYTES,
        "input": table,
    }
    bench.contender(
        "parquet",
        "raw",
        "raw copy of the Parquet file",
        "raw",
        rows,
        ROW_BYTES,
        lambda i, o: [py, "-m", "bench.raw_copy", "--records", i, "--output", os.path.join(o, "raw.bin")],
        None,
        check="none",
    )
    bench.contender(
        "parquet",
        "seed",
        "pyarrow + hand-written loop",
        "seed",
        rows,
        ROW_BYTES,
        lambda i, o: [py, "-m", "bench.parquetsection", "loop", "--input", i, "--output", f"{o}/data.tfrecord"],
        None,
    )
    for key, name, path in (
        ("convert_parquet_2w", "convert the Parquet file (2 workers)", table),
        ("convert_hdf5_2w", "convert the HDF5 twin (2 workers)", h5),
    ):
        bench.contender(
            "parquet",
            key,
            name,
            "other",
            rows,
            ROW_BYTES,
            lambda i, o, path=path: [
                *(py, "-m", "pipelines.convert", "--input", path, "--output_dir", o, "--overwrite"),
                *("--writer", "planned", *beam_flags(2)),
            ],
            None,
            expect_writer="planned",
            check="metadata",
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("make", "loop"))
    ap.add_argument("--input")
    ap.add_argument("--output", required=True)
    ap.add_argument("--rows", type=int, default=1000)
    args = ap.parse_args(argv)
    if args.command == "make":
        make(args.output, args.rows)
    else:
        loop(args.input, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
