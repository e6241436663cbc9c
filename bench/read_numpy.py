"""Reading an output back with NumPy, and at random: the NumPy batch reader, RandomAccess and their peers.

One function per contender, each reading an output directory of ``bench.datagen`` rows (``small``: ``x`` float32[16]
and ``id`` int64; ``large``: ``image`` uint8[64,64,3], ``emb`` float32[128] and ``id``) converted with ``--index
--compression none``, checking the values it read, and returning records per second (the floor: bytes per second).
Values are checked against the per-record decoder (``codec.decode_example_lenient`` of the raw records at sampled
indices) and the ids (the row numbers) in the order read.

    python -m bench.read_numpy OUT [--repeats 3] [--only iter_numpy_batched,tf_numpy_iterator]

Contenders needing TensorFlow (``tf_numpy_iterator``), PyTorch (``torch_*``) or the `tfrecord` package are skipped
when it is not importable (PyTorch and the `tfrecord` package run in a venv of their own, bench/.venv-peers-torch:
they cannot share a process with TensorFlow). Timings exclude imports and the first open of the output (metadata).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

BATCH = 256
RANDOM = 20_000  # random records read by the random-access contenders


def _shards(out: str) -> list[str]:
    meta = json.load(open(os.path.join(out, "metadata.json")))
    return [os.path.join(out, s["file"]) for s in meta["shards"]]


def _total(out: str) -> int:
    return sum(s["records"] for s in json.load(open(os.path.join(out, "metadata.json")))["shards"])


def _reference(out: str, indices) -> dict[int, dict]:
    """The per-record decoder's values of the records at ``indices`` (a few hundred)."""
    from tfrecord_etl.transforms.codec import FeatureSpec, decode_example_lenient
    from tfrecord_etl.transforms.output import metadata, tfrecord

    meta = metadata.load(out)
    specs = [FeatureSpec.from_json(f) if isinstance(f, dict) else f for f in meta["features"]]
    want, got, base = sorted({int(i) for i in indices}), {}, 0
    for shard, path in zip(meta["shards"], metadata.shard_paths(out, meta)):
        mine = [i for i in want if base <= i < base + shard["records"]]
        if mine:
            with open(path, "rb") as f:
                for j, _, record in tfrecord.iter_records(f, path):
                    if base + j in mine:
                        got[base + j] = decode_example_lenient(record, specs)
        base += shard["records"]
    return got


class Checker:
    """Checks rows as they stream: every feature of sampled rows against the reference (a row's ``id`` is its row
    number), the ids in order (``ordered``) or, at the end, every id once."""

    def __init__(self, out: str, samples: int = 200, ordered: bool = True):
        self.total = _total(out)
        self.sample = set(np.random.default_rng(1).integers(0, self.total, samples).tolist())
        self.ref = _reference(out, self.sample)
        self.seen, self.ordered, self.ids = 0, ordered, []

    def batch(self, batch: dict) -> None:
        ids = np.asarray(batch["id"]).reshape(-1)
        n = len(ids)
        if self.ordered and not (
            n and ids[0] == self.seen and np.array_equal(ids, np.arange(self.seen, self.seen + n))
        ):
            raise AssertionError(f"ids {ids[:4]}... at row {self.seen}")
        if not self.ordered:
            self.ids.append(ids.copy())
        for r, i in enumerate(ids.tolist()):
            if i in self.sample:
                self._same(i, {name: batch[name][r] for name in self.ref[i]})
        self.seen += n

    def row(self, row: dict) -> None:
        i = int(row["id"])
        if i != self.seen:
            raise AssertionError(f"id {i} at row {self.seen}")
        if i in self.sample:
            self._same(i, row)
        self.seen += 1

    def _same(self, i: int, got: dict) -> None:
        for name, want in self.ref[i].items():
            value = np.asarray(got[name])
            if value.shape != want.shape or not np.array_equal(value, want):
                raise AssertionError(f"{name} of row {i}")

    def done(self) -> int:
        if self.seen != self.total:
            raise AssertionError(f"{self.seen} rows read of {self.total}")
        if not self.ordered and not np.array_equal(np.sort(np.concatenate(self.ids)), np.arange(self.total)):
            raise AssertionError("not every row read once")
        return self.seen


def _timed(fn) -> float:
    start = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - start)


# -- contenders ------------------------------------------------------------------------------------------------
def plain_read(out: str) -> float:
    """Bytes per second of reading the shard files (16 MiB reads; the floor of any reader)."""
    paths = _shards(out)

    def run():
        total = 0
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                buf = bytearray(16 << 20)
                while n := f.readinto(buf):
                    total += n
        return total

    return _timed(run)


def iter_numpy_batched(out: str, batch_size: int = BATCH) -> float:
    from tfrecord_etl.transforms import reader

    check = Checker(out)
    next(reader.iter_numpy(out, batch_size=1))  # imports, metadata

    def run():
        for batch in reader.iter_numpy(out, batch_size=batch_size):
            check.batch(batch)
        return check.done()

    return _timed(run)


def iter_numpy_unchecked(out: str, batch_size: int = BATCH) -> float:
    """As :func:`iter_numpy_batched` with ``check_checksums=False``: the cost of the shard checks."""
    from tfrecord_etl.transforms import reader

    check = Checker(out)
    next(reader.iter_numpy(out, batch_size=1))

    def run():
        for batch in reader.iter_numpy(out, batch_size=batch_size, check_checksums=False):
            check.batch(batch)
        return check.done()

    return _timed(run)


def iter_numpy_first_epoch(out: str, batch_size: int = BATCH) -> float:
    """As :func:`iter_numpy_batched`, with the per-process memory of checked shards cleared first: the first epoch
    of a process, which reads each shard's CRC32C before its rows."""
    from tfrecord_etl.transforms import reader
    from tfrecord_etl.transforms.reading import shardcheck

    check = Checker(out)
    next(reader.iter_numpy(out, batch_size=1))

    def run():
        shardcheck.CHECKED.clear()
        for batch in reader.iter_numpy(out, batch_size=batch_size):
            check.batch(batch)
        return check.done()

    return _timed(run)


def iter_numpy_rows(out: str) -> float:
    from tfrecord_etl.transforms import reader

    check = Checker(out)
    next(reader.iter_numpy(out))

    def run():
        for row in reader.iter_numpy(out):
            check.row(row)
        return check.done()

    return _timed(run)


def tf_numpy_iterator(out: str, batch_size: int = BATCH) -> float:
    """The hand-written tf.data pipeline: TFRecordDataset(shards, num_parallel_reads=2).batch(256).map(parse_example
    [+ decode_raw], AUTOTUNE).prefetch(2).as_numpy_iterator(), deterministic order."""
    import tensorflow as tf

    from tfrecord_etl.transforms.output import metadata

    meta = metadata.load(out)
    features = {f.name: f for f in meta["features"]}
    spec = {}
    for name, f in features.items():
        kind = {"<f4": tf.float32}.get(f.dtype, tf.int64)
        spec[name] = (
            tf.io.FixedLenFeature([], tf.string)
            if f.encoding == "tensor"
            else tf.io.FixedLenFeature(list(f.shape), kind)
        )

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        for name, f in features.items():
            if f.encoding == "tensor":
                parsed[name] = tf.reshape(tf.io.decode_raw(parsed[name], tf.uint8), [-1, *f.shape])
        return parsed

    ds = (
        tf.data.TFRecordDataset(_shards(out), num_parallel_reads=2)
        .batch(batch_size)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(2)
    )
    check = Checker(out, ordered=False)  # num_parallel_reads interleaves the shards (a fixed order)
    next(iter(ds))

    def run():
        for batch in ds.as_numpy_iterator():
            check.batch(batch)
        return check.done()

    return _timed(run)


def random_getitem(out: str) -> float:
    """``RandomAccess(out)[i]`` for 20,000 random ``i``, one process, page cache warm (shards checked first)."""
    from tfrecord_etl.transforms import reader

    ra = reader.RandomAccess(out)
    idx = np.random.default_rng(2).integers(0, len(ra), RANDOM).tolist()
    ref = _reference(out, idx[:100])
    for s in range(0, len(ra), max(1, len(ra) // 8)):
        ra[s]  # every shard checked and its index loaded before timing

    def run():
        for i in idx:
            row = ra[i]
            if i in ref and not all(np.array_equal(row[k], v) for k, v in ref[i].items()):
                raise AssertionError(i)
        return len(idx)

    return _timed(run)


def random_getitems(out: str, batch_size: int = BATCH) -> float:
    """``RandomAccess(out).__getitems__(256 random indices)`` (what a PyTorch DataLoader calls), 20,000 records."""
    from tfrecord_etl.transforms import reader

    ra = reader.RandomAccess(out)
    idx = np.random.default_rng(2).integers(0, len(ra), RANDOM).tolist()
    ref = _reference(out, idx[:100])
    for s in range(0, len(ra), max(1, len(ra) // 8)):
        ra[s]

    def run():
        for a in range(0, len(idx), batch_size):
            rows = ra.__getitems__(idx[a : a + batch_size])
            for i, row in zip(idx[a : a + batch_size], rows):
                if i in ref and not all(np.array_equal(row[k], v) for k, v in ref[i].items()):
                    raise AssertionError(i)
        return len(idx)

    return _timed(run)


def _torch_epoch(loader, total: int) -> int:
    seen = 0
    ids = []
    for batch in loader:
        ids.append(np.asarray(batch["id"]).reshape(-1))
        seen += len(ids[-1])
    got = np.sort(np.concatenate(ids))
    if not np.array_equal(got, np.arange(total)):
        raise AssertionError("the epoch did not read every row once")
    return seen


def torch_random_access(out: str, workers: int = 2, batch_size: int = BATCH) -> float:
    """PyTorch DataLoader(RandomAccess(out), batch_size=256, shuffle=True, num_workers=2): one epoch."""
    import torch

    from tfrecord_etl.transforms import reader

    ra = reader.RandomAccess(out)
    ra[0]
    loader = torch.utils.data.DataLoader(
        ra, batch_size=batch_size, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(0)
    )
    return _timed(lambda: _torch_epoch(loader, len(ra)))


def torch_random_access_batched(out: str, workers: int = 2, batch_size: int = BATCH) -> float:
    """PyTorch DataLoader(RandomAccess(out), batch_size=None, sampler=BatchSampler(RandomSampler, 256)): each worker
    fetches a whole batch with one ``ra[indices]`` (decoded together, no per-sample collate)."""
    import torch

    from tfrecord_etl.transforms import reader

    ra = reader.RandomAccess(out)
    ra[0]
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(range(len(ra)), generator=torch.Generator().manual_seed(0)), batch_size, False
    )
    loader = torch.utils.data.DataLoader(ra, batch_size=None, sampler=sampler, num_workers=workers)
    return _timed(lambda: _torch_epoch(loader, len(ra)))


def torch_tfrecord_package(out: str, workers: int = 2, batch_size: int = BATCH) -> float:
    """The `tfrecord` package's indexed TFRecordDataset over the same shards (one per shard, chained; its shuffle
    queue of 1,024), DataLoader with 2 workers, batch 256; ``id`` checked."""
    import torch
    from tfrecord.torch.dataset import TFRecordDataset

    from tfrecord_etl.transforms import reader

    meta = json.load(open(os.path.join(out, "metadata.json")))
    description = reader.torch_description(out)
    datasets = [
        TFRecordDataset(
            os.path.join(out, s["file"]), os.path.join(out, s["index"]), description, shuffle_queue_size=1024
        )
        for s in meta["shards"]
    ]
    loader = torch.utils.data.DataLoader(
        torch.utils.data.ChainDataset(datasets), batch_size=batch_size, num_workers=workers
    )
    # each worker reads its share of each shard (the package splits a shard by its index): every row once
    return _timed(lambda: _torch_epoch(loader, _total(out)))


CONTENDERS = {
    f.__name__: f
    for f in (
        plain_read,
        iter_numpy_batched,
        iter_numpy_first_epoch,
        iter_numpy_unchecked,
        iter_numpy_rows,
        tf_numpy_iterator,
        random_getitem,
        random_getitems,
        torch_random_access,
        torch_random_access_batched,
        torch_tfrecord_package,
    )
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated contenders (default: all importable)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(CONTENDERS)
    results = {}
    for r in range(args.repeats):  # alternated: each repeat runs every contender once
        for name in names:
            try:
                rate = CONTENDERS[name](args.out)
            except ImportError as e:
                print(f"{name}: skipped ({e})", file=sys.stderr)
                continue
            results.setdefault(name, []).append(rate)
            print(
                f"repeat {r + 1} {name}: {rate:,.0f} {'bytes' if name == 'plain_read' else 'records'}/s",
                file=sys.stderr,
                flush=True,
            )
    summary = {name: statistics.median(v) for name, v in results.items()}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
