"""Contenders of the new sources: the hand-written loops of seed 003 (a raw ``np.memmap`` file) and seed 001 (a
folder of image files with class sub-folders), in one process, and the generators of their inputs.

    python -m bench.seed_files raw --input data.raw --shape 64,64,3 --output out/data.tfrecord
    python -m bench.seed_files files --input DIR --output out/data.tfrecord
    python -m bench.seed_files make-raw --output data.raw --rows N            (uint8 [64, 64, 3], seeded)
    python -m bench.seed_files make-files --output DIR --files N              (PNG 64x64 RGB in 4 classes)

raw: ``np.memmap`` the file as uint8 rows of ``--shape``, one ``tf.train.Example`` per row (``array``: the row's
bytes), ``tf.io.TFRecordWriter``. files: walk the class folders in sorted order, read each file, one Example per
file (``image`` bytes, ``label`` int64 = the class's index), ``TFRecordWriter``. Both print their record count.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

SHAPE = (64, 64, 3)
CLASSES = 4


def make_raw(path: str, rows: int, seed: int = 14) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        for start in range(0, rows, 4096):
            f.write(rng.integers(0, 256, (min(4096, rows - start), *SHAPE), dtype=np.uint8).tobytes())


def make_files(directory: str, files: int, seed: int = 14) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(CLASSES):
        os.makedirs(os.path.join(directory, f"class{c}"), exist_ok=True)
    base = rng.integers(0, 256, (SHAPE[0] * 2, SHAPE[1] * 2, 3), dtype=np.uint8)
    for i in range(files):  # smooth-ish images (crops of one noise field, blurred by a box) so PNG compresses
        y, x = rng.integers(0, SHAPE[0], 2)
        crop = base[y : y + SHAPE[0], x : x + SHAPE[1]].astype(np.uint16)
        crop = ((crop + np.roll(crop, 1, 0) + np.roll(crop, 1, 1) + np.roll(crop, 1, (0, 1))) // 4).astype(np.uint8)
        Image.fromarray(crop).save(os.path.join(directory, f"class{i % CLASSES}", f"{i:07d}.png"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.seed_files", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", choices=["raw", "files", "make-raw", "make-files"])
    ap.add_argument("--input")
    ap.add_argument("--output", required=True)
    ap.add_argument("--shape", default="64,64,3")
    ap.add_argument("--rows", type=int, default=0)
    ap.add_argument("--files", type=int, default=0)
    args = ap.parse_args(argv)
    if args.what == "make-raw":
        make_raw(args.output, args.rows)
        return 0
    if args.what == "make-files":
        make_files(args.output, args.files)
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    n = 0
    with tf.io.TFRecordWriter(args.output) as w:
        if args.what == "raw":
            shape = tuple(int(d) for d in args.shape.split(","))
            rows = np.memmap(args.input, dtype=np.uint8, mode="r").reshape(-1, *shape)
            for row in rows:
                ex = tf.train.Example(
                    features=tf.train.Features(
                        feature={"array": tf.train.Feature(bytes_list=tf.train.BytesList(value=[row.tobytes()]))}
                    )
                )
                w.write(ex.SerializeToString())
                n += 1
        else:
            for label, c in enumerate(sorted(os.listdir(args.input))):
                for name in sorted(os.listdir(os.path.join(args.input, c))):
                    with open(os.path.join(args.input, c, name), "rb") as f:
                        data = f.read()
                    ex = tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                            }
                        )
                    )
                    w.write(ex.SerializeToString())
                    n += 1
    print(f"wrote {n} records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
