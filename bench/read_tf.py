"""Reading an output back with tf.data: ``reader.to_tf_dataset`` against the hand-written batched pipeline.

Self-contained: one function per contender, each taking an output directory (converted from a ``bench.datagen``
input with ``tfrecord-etl convert``) and the expected arrays, reading every record once, and returning
``{"records": n, "seconds": s, "rate": records/s}`` after checking every value read against the expected arrays
(outside the timed loop: the loop only keeps the NumPy arrays it is handed).

* ``hand_batched``: ``TFRecordDataset(shards, num_parallel_reads=2).batch(256).map(parse_example + decode_raw,
  AUTOTUNE).prefetch(2)``, the pattern of TensorFlow's performance guide (rows in the order of its two
  interleaved readers; the check sorts by ``id``);
* ``reader_batched``: ``reader.to_tf_dataset(out, batch_size=256)``;
* ``reader_unbatched``: ``reader.to_tf_dataset(out)`` (one example per element), batched by the consumer with
  ``.batch(256)``, as a training input pipeline does after its shuffle buffer;
* ``reader_unchecked``: ``reader_batched`` with ``check_checksums=False`` (the cost of the shard checks on a
  first read);
* ``reader_unordered``: ``reader_batched`` with ``deterministic=False``: two shards read at once, as the
  hand-written pipeline's ``num_parallel_reads=2`` does (rows not in shard order; the check sorts by ``id``).

    python -m bench.read_tf --input /tmp/small.h5 --output_dir /tmp/small-none [--repeats 3]

Prints one line per contender and round, then the medians and each contender's ratio to ``hand_batched``
measured in the same run (contenders alternate within each round).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

BATCH = 256


def expected_arrays(h5_path: str) -> dict[str, np.ndarray]:
    """``{feature name: array of every row}`` of a ``bench.datagen`` input (the names convert gives them)."""
    import h5py

    with h5py.File(h5_path, "r") as f:
        return {k: f[k][:] for k in f}


def _shards(out: str) -> tuple[list[str], str, list[dict]]:
    with open(os.path.join(out, "metadata.json"), encoding="utf-8") as f:
        meta = json.load(f)
    paths = [os.path.join(out, s["file"]) for s in meta["shards"]]
    return paths, {"gzip": "GZIP", "zlib": "ZLIB"}.get(meta["compression"], ""), meta["features"]


def _check(batches: list[dict], expected: dict[str, np.ndarray], ordered: bool) -> int:
    """Every value of ``batches`` equals the expected row of its ``id``; every id once (and in order when
    ``ordered``). Returns the number of rows. Raises AssertionError."""
    ids = np.concatenate([b["id"] for b in batches])
    n = len(expected["id"])
    if ordered:
        assert np.array_equal(ids, expected["id"]), "rows out of order or missing"
    else:
        assert np.array_equal(np.sort(ids), expected["id"]), "rows missing or repeated"
    for name, want in expected.items():
        got = np.concatenate([b[name] for b in batches])
        got = got if ordered else got[np.argsort(ids, kind="stable")]
        assert got.dtype == want.dtype and np.array_equal(got, want), f"feature {name} differs"
    return n


def _time(ds, expected: dict, ordered: bool) -> dict:
    start = time.perf_counter()
    batches = list(ds.as_numpy_iterator())
    seconds = time.perf_counter() - start
    n = _check(batches, expected, ordered)
    return {"records": n, "seconds": seconds, "rate": n / seconds}


def hand_batched(out: str, expected: dict) -> dict:
    """The hand-written pipeline (see the module)."""
    import tensorflow as tf

    paths, compression, features = _shards(out)
    spec, raw = {}, {}
    for f in features:
        if f["encoding"] == "tensor":
            spec[f["name"]] = tf.io.FixedLenFeature([], tf.string)
            raw[f["name"]] = (tf.as_dtype(np.dtype(f["dtype"]).name), f["shape"])
        else:
            kind = tf.float32 if np.dtype(f["dtype"]).kind == "f" else tf.int64
            spec[f["name"]] = tf.io.FixedLenFeature(f["shape"], kind)

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        for name, (dtype, shape) in raw.items():
            parsed[name] = tf.reshape(tf.io.decode_raw(parsed[name], dtype), [-1, *shape])
        return parsed

    ds = tf.data.TFRecordDataset(paths, compression_type=compression, num_parallel_reads=2)
    ds = ds.batch(BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
    return _time(ds, expected, ordered=False)


def reader_batched(out: str, expected: dict, **kwargs) -> dict:
    from tfrecord_etl.transforms import reader

    return _time(
        reader.to_tf_dataset(out, batch_size=BATCH, **kwargs), expected, ordered=kwargs.get("deterministic", True)
    )


def reader_unordered(out: str, expected: dict) -> dict:
    return reader_batched(out, expected, deterministic=False)


def reader_unchecked(out: str, expected: dict) -> dict:
    return reader_batched(out, expected, check_checksums=False)


def reader_unbatched(out: str, expected: dict) -> dict:
    from tfrecord_etl.transforms import reader

    return _time(reader.to_tf_dataset(out).batch(BATCH), expected, ordered=True)


CONTENDERS = {
    "hand_batched": hand_batched,
    "reader_batched": reader_batched,
    "reader_unbatched": reader_unbatched,
    "reader_unchecked": reader_unchecked,
    "reader_unordered": reader_unordered,
}


def run(out: str, expected: dict, names: list[str], repeats: int, say=print) -> dict[str, dict]:
    """``{name: {"median": records/s, "ratio": median / hand_batched's median, "rates": [...]}}``."""
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate who goes first
            if name.startswith("reader_"):
                from tfrecord_etl.transforms.reading import shardcheck

                shardcheck.CHECKED.clear()  # every round a first read: the shard checks are paid each time
            got = CONTENDERS[name](out, expected)
            rates[name].append(got["rate"])
            say(f"round {r + 1} {name}: {got['records']} records in {got['seconds']:.3f} s, {got['rate']:,.0f} rec/s")
    base = statistics.median(rates["hand_batched"]) if "hand_batched" in rates else None
    return {
        name: {"median": statistics.median(v), "ratio": statistics.median(v) / base if base else None, "rates": v}
        for name, v in rates.items()
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="the bench.datagen HDF5 file the output was converted from")
    p.add_argument("--output_dir", required=True, help="the converted output directory")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    expected = expected_arrays(args.input)
    result = run(args.output_dir, expected, args.contenders.split(","), args.repeats)
    for name, r in result.items():
        ratio = f", {r['ratio']:.2f}x hand_batched" if r["ratio"] is not None else ""
        print(f"median {name}: {r['median']:,.0f} rec/s{ratio}")


if __name__ == "__main__":
    main()
