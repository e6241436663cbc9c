"""One reader of the ``read`` section, run once over an output directory, its values checked against the source.

    python -m bench.read_contenders KEY --output_dir OUT --expected DIR [--batch 256] [--random 20000] [--seed 0]

Imports what the contender needs, then times one pass (building the reader or pipeline included, imports not),
keeping what the reader hands over (``bench.read_check.Collected``), then checks it against the source arrays
(``DIR/<feature>.npy``, saved by the driver) outside the timed pass. Prints ``read: N records, B bytes in S s``
and ``read_check: ok`` (exit 0), or ``read_check: WHAT DIFFERS`` (exit 1); ``read_skip: WHY`` (exit 3) when the
contender cannot run here (a reader option this checkout does not have, a package not installed).
``B``: the bytes of the shard files as stored (for the floor, the bytes it read).

The contenders (:data:`CONTENDERS`): the plain read of the shard files (the floor); the hand-written tf.data
pipeline of TensorFlow's performance guide, over tensors and ``.as_numpy_iterator()``; ``reader.to_tf_dataset``
batched and unbatched; TFDS ``as_dataset`` on a ``--tfds_name`` output; ``reader.iter_numpy`` per example and in
batches; ``reader.RandomAccess``: ``ra[i]``, ``ra.__getitems__`` and ``ra.batch`` (when the reader has them) for
``--random`` random indices, a PyTorch ``DataLoader`` (2 workers, shuffled) and Grain over it; the ``tfrecord``
package's indexed ``TFRecordDataset`` in a ``DataLoader``. Batches of ``--batch`` (256) records everywhere.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import sys
import time
from typing import NamedTuple

import numpy as np

from bench.read_check import Collected, check, load_expected

BATCH = 256
RANDOM_READS = 20_000
CHUNK = 16 * 2**20


class Contender(NamedTuple):
    label: str
    env: str  # "tf": the project's .venv (TensorFlow); "light": the reader-only environment when built
    torch: bool  # needs PyTorch
    inputs: tuple  # compressions it reads: "none", "gzip"; "tfds": a --tfds_name output
    mode: str  # the check: "ordered", "any" (every row once, any order), "indices", "bytes"


CONTENDERS = {
    "floor": Contender("plain read of the shard files (the floor)", "light", False, ("none", "gzip"), "bytes"),
    "tf_hand": Contender(
        "hand-written tf.data: `TFRecordDataset(shards, num_parallel_reads=2).batch(256)"
        ".map(parse_example [+ decode_raw], AUTOTUNE).prefetch(2)`",
        "tf",
        False,
        ("none", "gzip"),
        "any",
    ),
    "tf_hand_numpy": Contender("the same, `.as_numpy_iterator()`", "tf", False, ("none", "gzip"), "any"),
    "tf_reader": Contender("`reader.to_tf_dataset(out, batch_size=256)`", "tf", False, ("none", "gzip"), "ordered"),
    "tf_reader_unbatched": Contender(
        "`reader.to_tf_dataset(out).batch(256)` (unbatched, batched by the consumer)",
        "tf",
        False,
        ("none", "gzip"),
        "ordered",
    ),
    "tfds": Contender(
        "TFDS `builder_from_directory(out).as_dataset(split='train', batch_size=256)` on a `--tfds_name` output",
        "tf",
        False,
        ("tfds",),
        "any",
    ),
    "numpy_iter": Contender(
        "`reader.iter_numpy(out)` (one example at a time)", "light", False, ("none", "gzip"), "ordered"
    ),
    "numpy_batched": Contender("`reader.iter_numpy(out, batch_size=256)`", "light", False, ("none", "gzip"), "ordered"),
    "ra_random": Contender("`reader.RandomAccess(out)[i]`, 20,000 random i", "light", False, ("none",), "indices"),
    "ra_getitems": Contender(
        "`RandomAccess(out).__getitems__(256 random i)`, 20,000 random i", "light", False, ("none",), "indices"
    ),
    "ra_batch": Contender(
        "`RandomAccess(out).batch(256 random i)` (a dict of arrays), 20,000 random i",
        "light",
        False,
        ("none",),
        "indices",
    ),
    "torch_ra": Contender(
        "PyTorch `DataLoader(RandomAccess(out), batch_size=256, shuffle=True, num_workers=2)`",
        "light",
        True,
        ("none",),
        "any",
    ),
    "torch_tfrecord": Contender(
        "PyTorch `DataLoader` (2 workers, batch 256) over the `tfrecord` package's indexed "
        "`TFRecordDataset` per shard (shuffle queue 1,024)",
        "light",
        True,
        ("none",),
        "any",
    ),
    "grain": Contender(
        "Grain `MapDataset.source(RandomAccess(out)).shuffle().batch(256)`, 2 worker processes (`mp_prefetch`)",
        "light",
        False,
        ("none",),
        "any",
    ),
}


class Skip(Exception):
    """The contender cannot run in this checkout or environment (why, one line)."""


def _meta(out: str) -> dict:
    with open(os.path.join(out, "metadata.json"), encoding="utf-8") as f:
        return json.load(f)


def _paths(out: str, meta: dict) -> list[str]:
    return [os.path.join(out, s["file"]) for s in meta["shards"]]


def _reader(a):
    """Our reader module, its first-use imports done (not timed): with Beam installed (the project's .venv),
    ``fileio`` reads local files through Beam's FileSystems, imported on first use; without Beam (the reader-only
    environment) through ``lightfs``."""
    from tfrecord_etl.transforms import reader
    from tfrecord_etl.transforms.storage import fileio

    started = time.perf_counter()
    fileio.exists(os.path.join(a.output_dir, "metadata.json"))
    print(f"reader first-use imports: {time.perf_counter() - started:.3f} s (not timed)", flush=True)
    return reader


def _need(module: str):
    try:
        return __import__(module)
    except ImportError as e:
        raise Skip(f"{module} is not installed here ({e})") from None


# ------------------------------------------------------------------------------------------ contenders
# Each one imports what it needs and returns run(collected) -> records handed over (or bytes, for the floor).


def floor(a):
    paths = _paths(a.output_dir, _meta(a.output_dir))
    view = memoryview(bytearray(CHUNK))  # allocated (and its pages touched) before the timed pass
    view[::4096] = b"\0" * len(view[::4096])

    def run(col):
        total = 0
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                while k := f.readinto(view):
                    total += k
        col.bytes_read = total
        return total

    return run


def check_floor(out: str, bytes_read: int) -> str | None:
    """The floor read every byte of every shard: its count against metadata.json, then each shard's CRC32C."""
    import google_crc32c

    meta = _meta(out)
    want = sum(s["bytes"] for s in meta["shards"])
    if bytes_read != want:
        return f"read {bytes_read} bytes, the shards hold {want}"
    for shard, path in zip(meta["shards"], _paths(out, meta)):
        c = google_crc32c.Checksum()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                c.update(chunk)
        if shard.get("crc32c") and c.hexdigest().decode() != shard["crc32c"]:
            return f"{shard['file']}: CRC32C {c.hexdigest().decode()}, metadata.json says {shard['crc32c']}"
    return None


def _hand_pipeline(a, tf):
    """TensorFlow's performance-guide pipeline, written from metadata.json as a user who knows the schema would."""
    meta = _meta(a.output_dir)
    paths = _paths(a.output_dir, meta)
    compression = {"gzip": "GZIP", "zlib": "ZLIB"}.get(meta["compression"], "")
    spec, raw = {}, {}
    for f in meta["features"]:
        dtype = np.dtype(f["dtype"])
        if f["encoding"] == "tensor":
            spec[f["name"]] = tf.io.FixedLenFeature([], tf.string)
            raw[f["name"]] = (tf.as_dtype(dtype), list(f["shape"]))
        else:
            spec[f["name"]] = tf.io.FixedLenFeature(list(f["shape"]), tf.float32 if dtype.kind == "f" else tf.int64)

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        for name, (dtype, shape) in raw.items():
            parsed[name] = tf.reshape(tf.io.decode_raw(parsed[name], dtype), [-1, *shape])
        return parsed

    ds = tf.data.TFRecordDataset(paths, compression_type=compression, num_parallel_reads=2)
    return ds.batch(a.batch).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)


def _tf_loop(ds, col, numpy_iter: bool) -> int:
    n = 0
    for b in ds.as_numpy_iterator() if numpy_iter else ds:
        col.batch(b)
        n += len(b["id"])
    return n


def tf_hand(a, numpy_iter=False):
    tf = _need("tensorflow")
    return lambda col: _tf_loop(_hand_pipeline(a, tf), col, numpy_iter)


def tf_hand_numpy(a):
    return tf_hand(a, numpy_iter=True)


def tf_reader(a, batched=True):
    _need("tensorflow")
    reader = _reader(a)

    def run(col):
        ds = (
            reader.to_tf_dataset(a.output_dir, batch_size=a.batch)
            if batched
            else reader.to_tf_dataset(a.output_dir).batch(a.batch)
        )
        return _tf_loop(ds, col, numpy_iter=False)

    return run


def tf_reader_unbatched(a):
    return tf_reader(a, batched=False)


def tfds(a):
    _need("tensorflow")
    tfds_mod = _need("tensorflow_datasets")

    def run(col):
        ds = tfds_mod.builder_from_directory(a.output_dir).as_dataset(
            split="train", shuffle_files=False, batch_size=a.batch
        )
        return _tf_loop(tfds_mod.as_numpy(ds), col, numpy_iter=False)

    return run


def numpy_iter(a):
    reader = _reader(a)

    def run(col):
        n = 0
        for example in reader.iter_numpy(a.output_dir):
            col.row(example)
            n += 1
        return n

    return run


def numpy_batched(a):
    reader = _reader(a)
    if "batch_size" not in inspect.signature(reader.iter_numpy).parameters:
        raise Skip("reader.iter_numpy has no batch_size in this checkout")

    def run(col):
        n = 0
        for batch in reader.iter_numpy(a.output_dir, batch_size=a.batch):
            col.batch(batch)
            n += len(batch["id"])
        return n

    return run


def random_indices(rows: int, n: int, seed: int) -> np.ndarray:
    """``n`` random record indices of ``[0, rows)``: distinct when ``n <= rows``."""
    rng = np.random.default_rng(seed)
    return rng.permutation(rows)[:n] if n <= rows else rng.integers(0, rows, n)


def ra_random(a):
    reader = _reader(a)

    def run(col):
        ra = reader.RandomAccess(a.output_dir)
        for i in a.indices.tolist():
            col.row(ra[i])
        return len(a.indices)

    return run


def ra_getitems(a):
    reader = _reader(a)
    if not hasattr(reader.RandomAccess, "__getitems__"):
        raise Skip("reader.RandomAccess has no __getitems__ in this checkout")

    def run(col):
        ra = reader.RandomAccess(a.output_dir)
        for k in range(0, len(a.indices), a.batch):
            got = ra.__getitems__(a.indices[k : k + a.batch].tolist())
            if isinstance(got, dict):  # {name: array of rows}
                col.batch(got)
            else:  # PyTorch's convention: a list of examples
                col.rows.extend(got)
        return len(a.indices)

    return run


def ra_batch(a):
    reader = _reader(a)
    if not callable(getattr(reader.RandomAccess, "batch", None)):
        raise Skip("reader.RandomAccess has no batch in this checkout")

    def run(col):
        ra = reader.RandomAccess(a.output_dir)
        for k in range(0, len(a.indices), a.batch):
            col.batch(ra.batch(a.indices[k : k + a.batch].tolist()))
        return len(a.indices)

    return run


def torch_ra(a):
    torch = _need("torch")
    reader = _reader(a)

    def run(col):
        loader = torch.utils.data.DataLoader(
            reader.RandomAccess(a.output_dir),
            batch_size=a.batch,
            shuffle=True,
            num_workers=2,
            generator=torch.Generator().manual_seed(a.seed),
        )
        n = 0
        for b in loader:
            col.batch(b)
            n += len(b["id"])
        return n

    return run


def torch_tfrecord(a):
    torch = _need("torch")
    _need("tfrecord")
    from tfrecord.torch.dataset import TFRecordDataset

    meta = _meta(a.output_dir)
    if any("index" not in s for s in meta["shards"]):
        raise Skip("shards without index files (convert with --index)")
    description, decode = {}, {}
    for f in meta["features"]:
        dtype = np.dtype(f["dtype"])
        description[f["name"]] = "byte" if f["encoding"] == "tensor" else "float" if dtype.kind == "f" else "int"
        decode[f["name"]] = (dtype, tuple(f["shape"]), f["encoding"] == "tensor")

    def transform(example):  # the package yields the Example's values as written: give them their dtype and shape
        out = {}
        for name, (dtype, shape, raw) in decode.items():
            value = example[name]
            out[name] = (np.frombuffer(value, dtype) if raw else np.asarray(value).astype(dtype, copy=False)).reshape(
                shape
            )
        return out

    def run(col):
        shards = [
            TFRecordDataset(
                os.path.join(a.output_dir, s["file"]),
                os.path.join(a.output_dir, s["index"]),
                description,
                shuffle_queue_size=1024,
                transform=transform,
            )
            for s in meta["shards"]
        ]
        loader = torch.utils.data.DataLoader(torch.utils.data.ChainDataset(shards), batch_size=a.batch, num_workers=2)
        n = 0
        for b in loader:
            col.batch(b)
            n += len(b["id"])
        return n

    return run


def grain(a):
    grain_mod = _need("grain")
    reader = _reader(a)

    def run(col):
        ds = grain_mod.MapDataset.source(reader.RandomAccess(a.output_dir)).shuffle(seed=a.seed).batch(a.batch)
        n = 0
        for b in ds.to_iter_dataset().mp_prefetch(grain_mod.MultiprocessingOptions(num_workers=2)):
            col.batch(b)
            n += len(b["id"])
        return n

    return run


# ------------------------------------------------------------------------------------------ the process


def stored_bytes(out: str) -> int:
    return sum(s["bytes"] for s in _meta(out)["shards"]) if os.path.exists(os.path.join(out, "metadata.json")) else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.read_contenders",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("contender", choices=sorted(CONTENDERS))
    ap.add_argument("--output_dir", required=True, help="the converted output directory")
    ap.add_argument("--expected", required=True, help="directory of the source arrays, <feature>.npy")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--random", type=int, default=RANDOM_READS, help="random reads (RandomAccess contenders)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    expected = load_expected(a.expected)
    a.indices = random_indices(len(expected["id"]), a.random, a.seed)
    spec = CONTENDERS[a.contender]
    try:
        run = globals()[a.contender](a)
    except Skip as e:
        print(f"read_skip: {e}", flush=True)
        return 3
    col = Collected()
    gc.collect()
    started = time.perf_counter()
    n = run(col)
    seconds = time.perf_counter() - started
    records = len(expected["id"]) if spec.mode == "bytes" else n
    size = n if spec.mode == "bytes" else stored_bytes(a.output_dir)
    print(
        f"read: {records} records, {size} bytes in {seconds:.6f} s "
        f"({records / max(seconds, 1e-9):,.0f} records/s, {size / 1e6 / max(seconds, 1e-9):,.1f} MB/s)",
        flush=True,
    )
    if spec.mode == "bytes":
        why = check_floor(a.output_dir, n)
    else:
        why = check(col.arrays(), expected, a.indices if spec.mode == "indices" else None, spec.mode == "ordered")
    if why is not None:
        print(f"read_check: {why}", file=sys.stderr, flush=True)
        return 1
    print(f"read_check: ok ({records} records)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
