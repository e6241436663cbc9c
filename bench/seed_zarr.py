"""The ``zarr`` bench section's inputs and its hand-written contender.

    python -m bench.seed_zarr make --output DIR --rows N   (DIR/data.zarr and DIR/data.h5: the same float32 [N, 256])
    python -m bench.seed_zarr loop --input DIR/data.zarr --output out/data.tfrecord

make: one float32 array of ``N`` rows of 256 values (noise rounded to 2 decimals, so it compresses about 2x),
chunks of 4,096 rows (or N), written twice with the same compressor (Blosc zstd level 3, byte shuffle): a Zarr v3 store
with consolidated metadata through zarr, and an HDF5 dataset through h5py and hdf5plugin's Blosc filter.
loop: the straightforward hand-written conversion: ``xarray.open_zarr``, then chunk by chunk (``.values`` of
4,096 rows) one ``tf.train.Example`` per row (``x``: a FloatList of the row), ``tf.io.TFRecordWriter``; prints its
record count.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

COLUMNS = 256
CHUNK_ROWS = 4096


def make(directory: str, rows: int, seed: int = 14) -> None:
    import h5py
    import hdf5plugin
    import zarr

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    chunk = min(CHUNK_ROWS, rows)  # (HDF5 refuses a chunk longer than the dataset)
    store = zarr.open_group(os.path.join(directory, "data.zarr"), mode="w", zarr_format=3)
    arr = store.create_array(
        "x",
        shape=(rows, COLUMNS),
        chunks=(chunk, COLUMNS),
        dtype="f4",
        dimension_names=["row", "col"],
        compressors=[zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")],
    )
    with h5py.File(os.path.join(directory, "data.h5"), "w") as f:
        dset = f.create_dataset(
            "x",
            shape=(rows, COLUMNS),
            chunks=(chunk, COLUMNS),
            dtype="f4",
            **hdf5plugin.Blosc(cname="zstd", clevel=3, shuffle=hdf5plugin.Blosc.SHUFFLE),
        )
        for start in range(0, rows, CHUNK_ROWS):
            stop = min(rows, start + CHUNK_ROWS)
            block = np.round(rng.standard_normal((stop - start, COLUMNS)), 2).astype("f4")
            arr[start:stop] = block
            dset[start:stop] = block
    zarr.consolidate_metadata(os.path.join(directory, "data.zarr"))


def loop(store: str, output: str) -> int:
    import tensorflow as tf
    import xarray as xr

    t = time.perf_counter()
    ds = xr.open_zarr(store, consolidated=True)
    x = ds["x"]
    os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
    n = 0
    with tf.io.TFRecordWriter(output) as w:
        for start in range(0, x.shape[0], CHUNK_ROWS):
            block = x[start : start + CHUNK_ROWS].values
            for row in block:
                ex = tf.train.Example(
                    features=tf.train.Features(
                        feature={"x": tf.train.Feature(float_list=tf.train.FloatList(value=row))}
                    )
                )
                w.write(ex.SerializeToString())
                n += 1
    print(f"seed_zarr: {n} records in {time.perf_counter() - t:.3f} s")
    return n


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
