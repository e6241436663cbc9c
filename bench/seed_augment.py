"""Contender "seed augment": the hand-written parse/modify/serialize loop of seed 002, in one process.

    python -m bench.seed_augment --input 'in/*.tfrecord' --output_dir out/ [--name label --value 7]

For every input file, reads its records with ``tf.data.TFRecordDataset``, parses each into a
``tf.train.Example``, sets one ``int64_list`` feature (``--name`` = ``--value``), serializes it and
writes it with ``tf.io.TFRecordWriter`` to a file of the same name under ``--output_dir``. It measures
the per-record cost of a full protobuf parse and re-serialization plus TensorFlow's reader and writer:
the baseline of the augmentation "x seed" ratios.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time


def main(argv=None) -> int:
    from bench.common import AUGMENT_NAME, AUGMENT_VALUE

    ap = argparse.ArgumentParser(
        prog="python -m bench.seed_augment", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--input", required=True, help="glob of uncompressed TFRecord files")
    ap.add_argument("--output_dir", required=True)
    ap.add_argument(
        "--compression",
        choices=("none", "gzip"),
        default="none",
        help="gzip: read and write through TensorFlow's GZIP reader and writer",
    )
    ap.add_argument("--name", default=AUGMENT_NAME)
    ap.add_argument("--value", type=int, default=AUGMENT_VALUE)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    paths = sorted(glob.glob(args.input))
    if not paths:
        print(f"seed_augment: no file matches {args.input}", file=sys.stderr)
        return 2
    os.makedirs(args.output_dir, exist_ok=True)
    started = time.perf_counter()
    n = 0
    for path in paths:
        out = os.path.join(args.output_dir, os.path.basename(path))
        tf_comp = "GZIP" if args.compression == "gzip" else ""
        with tf.io.TFRecordWriter(out, options=tf_comp or None) as writer:
            for raw_record in tf.data.TFRecordDataset(path, compression_type=tf_comp):
                example = tf.train.Example()
                example.ParseFromString(raw_record.numpy())
                example.features.feature[args.name].int64_list.value.append(args.value)
                writer.write(example.SerializeToString())
                n += 1
    seconds = time.perf_counter() - started
    print(
        f"seed_augment: {n} records in {seconds:.3f} s ({n / max(seconds, 1e-9):,.0f} records/s, after imports)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
