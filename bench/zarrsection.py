"""The ``zarr`` bench section (``python -m bench.run --only zarr``): one float32 [N, 256] array (1 GB at scale 1),
Blosc zstd, chunks of 4,096 rows, as a Zarr v3 store and as an HDF5 file (``bench.seed_zarr make``); contenders:
the raw copy of the store's bytes, the hand-written xarray + ``TFRecordWriter`` loop (``bench.seed_zarr loop``),
``convert`` of the store and ``convert`` of the HDF5 twin (same compressor), each with the planned writer on 2
workers. Targets: the store within 1.2x of the HDF5 conversion, and at least 5x the loop."""

from __future__ import annotations

import os
import subprocess

ZARR_ROWS = 1_000_000  # x 1,024 bytes: 1 GB raw
ROW_BYTES = 256 * 4


def zarr_section(bench, rows_at, beam_flags) -> None:
    """Adds the section's rows to ``bench`` (a ``bench.run.Bench``); ``rows_at``/``beam_flags`` are bench.run's."""
    py = bench.py
    rows = rows_at(ZARR_ROWS, bench.args.scale)
    directory = os.path.join(bench.data_dir, f"zarr_{rows}")
    if not os.path.isdir(directory):
        subprocess.run(
            [py, "-m", "bench.seed_zarr", "make", "--output", directory + ".tmp", "--rows", str(rows)], check=True
        )
        os.rename(directory + ".tmp", directory)
    store, h5 = os.path.join(directory, "data.zarr"), os.path.join(directory, "data.h5")
    bench.say(f"[zarr] {rows:,} rows x {ROW_BYTES:,} bytes = {rows * ROW_BYTES / 1e6:,.1f} MB raw (Blosc zstd)")
    bench.section_info["zarr"] = {"rows": rows, "row_bytes": ROW_BYTES, "raw_bytes": rows * ROW_BYTES, "input": store}
    bench.contender(
        "zarr",
        "raw",
        "raw copy of the store",
        "raw",
        rows,
        ROW_BYTES,
        lambda i, o: [
            py,
            "-m",
            "bench.raw_copy",
            "--records",
            os.path.join(i, "x", "c", "*", "*"),
            "--output",
            os.path.join(o, "raw.bin"),
        ],
        None,
        check="none",
    )
    bench.contender(
        "zarr",
        "seed",
        "xarray + hand-written loop",
        "seed",
        rows,
        ROW_BYTES,
        lambda i, o: [py, "-m", "bench.seed_zarr", "loop", "--input", i, "--output", os.path.join(o, "data.tfrecord")],
        None,
    )
    for key, name, path in (
        ("convert_zarr_2w", "convert the Zarr store (2 workers)", store),
        ("convert_hdf5_2w", "convert the HDF5 twin (2 workers)", h5),
    ):
        bench.contender(
            "zarr",
            key,
            name,
            "other",
            rows,
            ROW_BYTES,
            lambda i, o, path=path: [
                py,
                "-m",
                "pipelines.convert",
                "--input",
                path,
                "--output_dir",
                o,
                "--overwrite",
                "--writer",
                "planned",
                *beam_flags(2),
            ],
            None,
            expect_writer="planned",
            check="metadata",
        )
