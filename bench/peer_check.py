"""Checks a contender's TFRecord output against its HDF5 input, value for value.

    python -m bench.peer_check --input data.h5 --output_dir out/

Reads every uncompressed TFRecord file under ``--output_dir`` (``*.tfrecord``, ``*.tfrecords``,
``*.tfrecord-*``: ours, the seed loop's and TFDS's names; ``*.tar``: Ray 2.60's ``write_tfrecords`` names its
TFRecord files so) with plain TensorFlow (``tf.data`` and
``tf.io.parse_example``, batches of 8,192), decodes each feature in the benchmark's forms (``uint8`` arrays as one
``bytes`` value, floats as a ``float_list``, integers as an ``int64_list``; ``bench.common.seed_form``), orders
the records by ``id`` (the row number: writers that run in parallel need not keep the input order) and compares
every feature with the HDF5 datasets exactly (``np.array_equal``; floats bit for bit). Exit 0 and one line
``peer_check: ok N records`` when equal; exit 1 and what differs (feature, first differing row) otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def output_files(out_dir: str) -> list[str]:
    """The TFRecord files a contender wrote under ``out_dir``, sorted (see the module docstring for the names)."""
    import glob

    from bench.common import tfrecord_files

    return sorted(set(tfrecord_files(out_dir)) | set(glob.glob(os.path.join(out_dir, "**", "*.tar"), recursive=True)))


def check(h5_path: str, out_dir: str) -> str | None:
    """None when the records under ``out_dir`` hold exactly the rows of ``h5_path`` (each once), else why not."""
    import h5py
    import tensorflow as tf

    from bench.common import seed_form

    files = output_files(out_dir)
    if not files:
        return "no TFRecord files in the output"
    with h5py.File(h5_path, "r") as f:
        want = {k: f[k][()] for k in sorted(f.keys()) if isinstance(f[k], h5py.Dataset)}
    spec = {}
    for name, col in want.items():
        form = seed_form(col.dtype)
        shape = list(col.shape[1:])
        spec[name] = (
            tf.io.FixedLenFeature([], tf.string)
            if form == "bytes"
            else tf.io.FixedLenFeature(shape, tf.float32 if form == "float" else tf.int64)
        )
    got = {name: [] for name in want}
    ds = tf.data.TFRecordDataset(files).batch(8192).map(lambda b: tf.io.parse_example(b, spec))
    for batch in ds.as_numpy_iterator():
        for name, values in batch.items():
            got[name].append(values)
    n = sum(len(v) for v in got["id"])
    rows = len(want["id"])
    if n != rows:
        return f"{n} records, expected {rows}"
    ids = np.concatenate(got["id"])
    order = np.argsort(ids, kind="stable")
    if not np.array_equal(ids[order], np.arange(rows)):
        return "the ids are not each row number once"
    for name, col in want.items():
        values = np.concatenate(got[name])[order]
        if seed_form(col.dtype) == "bytes":
            values = (
                np.frombuffer(b"".join(values), col.dtype).reshape(col.shape)
                if all(len(v) == col[0].nbytes for v in values)
                else None
            )
            if values is None:
                return f"{name}: a bytes value of the wrong length"
        values = values.astype(col.dtype) if values.dtype != col.dtype else values
        if not np.array_equal(
            values.view(np.uint8) if col.dtype.kind == "f" else values,
            col.view(np.uint8) if col.dtype.kind == "f" else col,
        ):
            bad = np.nonzero(values.reshape(rows, -1) != col.reshape(rows, -1))[0]
            return f"{name}: values differ from row {int(bad[0]) if len(bad) else '?'}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.peer_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--input", required=True)
    ap.add_argument("--output_dir", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    why = check(args.input, args.output_dir)
    if why is not None:
        print(f"peer_check: {why}", file=sys.stderr)
        return 1
    with __import__("h5py").File(args.input, "r") as f:
        print(f"peer_check: ok {f['id'].shape[0]} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
