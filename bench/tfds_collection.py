"""TFDS over a collection: one builder per span (``tfds.builder_from_directory``) against one builder over all span
directories (``tfds.builder_from_directories``, through ``collection_reader.tfds_builder``).

    python -m bench.tfds_collection --dir /tmp/tfds-coll [--spans 10] [--records 20000] [--repeats 2]

Writes (once; kept for later runs) a collection of ``--spans`` spans of ``--records`` records each (an 8x8 uint8
``image`` and an int64 ``label``), each span converted with ``--tfds_name toy --split train`` and committed in
``collection.json``; then, per repeat, times loading the builders and reading every record of the ``train``
split in file order (``shuffle_files=False``, ``interleave_cycle_length=1``, batches of 4,096), and checks that
both read the same labels in the same order. One line per repeat.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def build(directory: str, spans: int, records: int) -> str:
    """The collection ``directory/coll`` (written when it lacks ``collection.json``)."""
    from tfrecord_etl.pipelines import common, convert
    from tfrecord_etl.transforms.collections import collection

    coll = os.path.join(directory, "coll")
    if collection.is_collection(coll):
        return coll
    for span in range(spans):
        raw = os.path.join(directory, "raw", f"span-{span}")
        os.makedirs(raw, exist_ok=True)
        path = os.path.join(raw, "part.npz")
        rng = np.random.default_rng(span)
        np.savez(
            path,
            image=rng.integers(0, 255, (records, 8, 8), dtype=np.uint8),
            label=np.arange(records, dtype=np.int64) + 1_000_000 * span,
        )
        code = common.run_main(
            convert.main,
            [
                "--input",
                path,
                "--output_dir",
                os.path.join(coll, f"span-{span}"),
                "--tfds_name",
                "toy",
                "--split",
                "train",
                "--num_shards",
                "2",
                "--runner=DirectRunner",
                "--direct_running_mode=in_memory",
            ],
        )
        if code:
            raise SystemExit(f"convert failed for span {span}")
        st = os.stat(path)
        entry = collection.span_entry(
            coll, span, None, [{"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "version": None}]
        )
        collection.commit(coll, collection.add_span(entry))
    return coll


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.tfds_collection",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dir", required=True, help="working directory (the collection is kept there)")
    ap.add_argument("--spans", type=int, default=10, help="spans (default: 10)")
    ap.add_argument("--records", type=int, default=20000, help="records per span (default: 20000)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats (default: 2)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    coll = build(args.dir, args.spans, args.records)
    from tfrecord_etl.pipelines import common
    from tfrecord_etl.transforms.collections import collection
    from tfrecord_etl.transforms.reading import collection_reader

    common.preload_tensorflow()
    import tensorflow_datasets as tfds

    dirs = collection.span_dirs(coll)
    in_order = tfds.ReadConfig(interleave_cycle_length=1)

    def labels(builder):
        ds = builder.as_dataset(split="train", shuffle_files=False, read_config=in_order).batch(4096)
        return np.concatenate([b["label"] for b in tfds.as_numpy(ds)])

    labels(tfds.builder_from_directory(dirs[0]))  # warm-up: TensorFlow's first dataset
    for _ in range(args.repeats):
        t = time.perf_counter()
        builders = [tfds.builder_from_directory(d) for d in dirs]
        load_each = time.perf_counter() - t
        t = time.perf_counter()
        each = np.concatenate([labels(b) for b in builders])
        read_each = time.perf_counter() - t
        t = time.perf_counter()
        one = collection_reader.tfds_builder(coll)
        load_one = time.perf_counter() - t
        t = time.perf_counter()
        together = labels(one)
        read_one = time.perf_counter() - t
        print(
            f"{len(dirs)} spans | per span (builder_from_directory): {len(each)} records, load {load_each:.2f} s, "
            f"read {read_each:.2f} s | one dataset (builder_from_directories): "
            f"{one.info.splits['train'].num_examples} listed, {len(together)} records, load {load_one:.2f} s, "
            f"read {read_one:.2f} s | same labels in order: {np.array_equal(each, together)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
