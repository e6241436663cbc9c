"""The ``nifti`` bench section (``python -m bench.run --only nifti``): one 4-D int16 fMRI-like run of 64 x 64 x 40
voxels a volume (327,680 bytes) and N volumes (3,000 at scale 1: 983 MB raw), as a ``.nii.gz`` (nibabel, gzip level
6) and as its HDF5 twin ([N, 64, 64, 40], gzip level 6, one volume a chunk). Contenders: the raw copy of the
``.nii.gz``'s bytes, the hand-written nibabel + ``tf.train.Example`` loop (``python -m bench.niftisection loop``:
``np.asanyarray(img.dataobj)`` once, then one Example per volume, its bytes and the affine), ``convert`` of the
``.nii.gz`` and ``convert`` of the HDF5 twin, each with the planned writer on 2 workers.

    python -m bench.niftisection make --output DIR --volumes N   (DIR/run.nii.gz and DIR/run.h5)
    python -m bench.niftisection loop --input DIR/run.nii.gz --output out/data.tfrecord
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

VOLUMES = 3_000
SHAPE = (64, 64, 40)
ROW_BYTES = 64 * 64 * 40 * 2


def make(directory: str, volumes: int, seed: int = 20) -> None:
    """A smooth int16 run (a fixed 'anatomy' plus noise per volume): ``run.nii.gz`` and ``run.h5``."""
    import h5py
    import nibabel

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    anatomy = (1000 + 400 * np.sin(np.indices(SHAPE).sum(axis=0) / 7.0)).astype("f4")
    data = np.empty((*SHAPE, volumes), "<i2", order="F")
    with h5py.File(os.path.join(directory, "run.h5"), "w") as f:
        dset = f.create_dataset("data", (volumes, *SHAPE), "<i2", chunks=(1, *SHAPE), compression="gzip")
        for t in range(volumes):
            volume = np.round(anatomy + rng.normal(0, 20, SHAPE)).astype("<i2")
            data[..., t] = volume
            dset[t] = volume
    image = nibabel.Nifti1Image(data, np.diag([3.0, 3.0, 3.5, 1.0]))
    image.header.set_xyzt_units("mm", "sec")
    image.header["pixdim"][4] = 2.0
    nibabel.save(image, os.path.join(directory, "run.nii.gz"))


def loop(path: str, output: str) -> int:
    """nibabel and ``tf.io.TFRecordWriter``, as by hand: one Example per volume (``data`` its bytes, ``affine``)."""
    import nibabel
    import tensorflow as tf

    t = time.perf_counter()
    image = nibabel.load(path)
    data = np.asanyarray(image.dataobj)
    affine = tf.train.Feature(float_list=tf.train.FloatList(value=image.affine.ravel()))
    os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
    n = 0
    with tf.io.TFRecordWriter(output) as w:
        for i in range(data.shape[3]):
            volume = np.ascontiguousarray(data[..., i])
            feature = {"data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[volume.tobytes()]))}
            feature["affine"] = affine
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            n += 1
    print(f"seed_loop: {n} records in {time.perf_counter() - t:.3f} s")
    return n


def nifti_section(bench, rows_at, beam_flags) -> None:
    """Adds the section's rows to ``bench`` (a ``bench.run.Bench``); ``rows_at``/``beam_flags`` are bench.run's."""
    py = bench.py
    rows = rows_at(VOLUMES, bench.args.scale)
    directory = os.path.join(bench.data_dir, f"nifti_{rows}")
    if not os.path.isdir(directory):
        make_cmd = [py, "-m", "bench.niftisection", "make", "--output", directory + ".tmp", "--volumes", str(rows)]
        subprocess.run(make_cmd, check=True)
        os.rename(directory + ".tmp", directory)
    nii, h5 = os.path.join(directory, "run.nii.gz"), os.path.join(directory, "run.h5")
    bench.say(f"[nifti] {rows:,} volumes x {ROW_BYTES:,} bytes = {rows * ROW_BYTES / 1e6:,.1f} MB raw (.nii.gz)")
    bench.section_info["nifti"] = {"rows": rows, "row_bytes": ROW_BYTES, "raw_bytes": rows * ROW_BYTES, "input": nii}
    bench.contender(
        "nifti",
        "raw",
        "raw copy of the .nii.gz",
        "raw",
        rows,
        ROW_BYTES,
        lambda i, o: [py, "-m", "bench.raw_copy", "--records", i, "--output", os.path.join(o, "raw.bin")],
        None,
        check="none",
    )
    bench.contender(
        "nifti",
        "seed",
        "nibabel + hand-written loop",
        "seed",
        rows,
        ROW_BYTES,
        lambda i, o: [py, "-m", "bench.niftisection", "loop", "--input", i, "--output", os.path.join(o, "d.tfrecord")],
        None,
    )
    for key, name, path in (
        ("convert_nifti_2w", "convert the .nii.gz (2 workers)", nii),
        ("convert_hdf5_2w", "convert the HDF5 twin (2 workers)", h5),
    ):
        bench.contender(
            "nifti",
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("make", "loop"))
    ap.add_argument("--input")
    ap.add_argument("--output", required=True)
    ap.add_argument("--volumes", type=int, default=100)
    args = ap.parse_args(argv)
    if args.command == "make":
        make(args.output, args.volumes)
    else:
        loop(args.input, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
