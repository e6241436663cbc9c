"""Shard planning for the planned writer: contiguous row ranges per shard, decided before data moves.

Pure functions (no Beam). A shard is a contiguous list of row ranges of about the target size, so
the writer needs no shuffle: each shard is written by one worker straight to a temporary file, and a
rerun on the same input and config gives byte-identical shards (the idea of TFDS's deterministic
writer, without its shuffle).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.sources import FileIndex, RowRange, plan_row_ranges

MAX_SHARDS = 99999  # file_name writes the index and count with 5 digits: PREFIX-NNNNN-of-NNNNN


def check_num_shards(num_shards: int, num_rows: int) -> int:
    """``num_shards`` if it is a usable shard count for ``num_rows`` rows; else a one-line ConfigError.

    Limits: at least 1; at most :data:`MAX_SHARDS` (the file-name format's 5 digits); at most one shard per
    row (``max(1, num_rows)``: more shards than rows would only write empty files; 10^8 shards of 10 rows
    planned 2 GB of empty shard plans before writing anything).

    Raises:
      ConfigError: naming the count, the rows and the limit.
    """
    if num_shards < 1:
        raise ConfigError(f"--num_shards {num_shards} must be at least 1")
    if num_shards > MAX_SHARDS:
        raise ConfigError(
            f"--num_shards {num_shards} is more than {MAX_SHARDS}, the most the shard file names "
            f"(PREFIX-NNNNN-of-NNNNN) can count",
            hint="write fewer, larger shards",
        )
    if num_shards > max(1, num_rows):
        raise ConfigError(
            f"--num_shards {num_shards} is more than the {num_rows} rows of the input (at most one shard per row)",
            hint=f"pass --num_shards {max(1, num_rows)} or fewer",
        )
    return num_shards


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Shard ``index`` of ``num_shards``: the rows of ``ranges``, in order; ``num_bytes`` estimated."""

    index: int
    num_shards: int
    ranges: tuple[RowRange, ...]
    num_bytes: int

    @property
    def num_rows(self) -> int:
        return sum(r.num_rows for r in self.ranges)

    def file_name(self, prefix: str, suffix: str) -> str:
        return f"{prefix}-{self.index:05d}-of-{self.num_shards:05d}{suffix}"


def range_bytes(rr: RowRange, index: FileIndex) -> int:
    """Estimated bytes of a row range (array bytes, before encoding)."""
    if index.sizes:
        return sum(index.sizes[rr.start : rr.stop])
    return rr.num_rows * index.row_bytes


def plan_shards(ranges: Sequence[RowRange], sizes: Sequence[int], num_shards: int) -> list[ShardPlan]:
    """Splits ``ranges`` (in order; ``sizes`` their bytes) into ``num_shards`` contiguous groups of
    about equal bytes. A range whose middle byte lies in the k-th ``1/num_shards`` of all bytes goes to
    shard k, so shards may be empty when there are fewer ranges than shards (an empty shard is a valid file).
    """
    total = sum(sizes)
    groups: list[list[int]] = [[] for _ in range(num_shards)]
    acc = 0
    for i, size in enumerate(sizes):
        if total:
            k = min(num_shards - 1, ((2 * acc + size) * num_shards) // (2 * total))
        else:
            k = i * num_shards // max(1, len(sizes))
        groups[k].append(i)
        acc += size
    return [
        ShardPlan(k, num_shards, tuple(ranges[i] for i in g), sum(sizes[i] for i in g)) for k, g in enumerate(groups)
    ]


def plan_balanced_shards(
    indexes: Sequence[FileIndex], num_shards: int, target_range_bytes: int
) -> list[ShardPlan] | None:
    """Splits the rows of ``indexes`` (in order) into ``num_shards`` contiguous shards of equal bytes,
    cutting at shard boundaries first and only then into row ranges of about ``target_range_bytes``,
    so shards differ by at most a chunk of rows (whole ranges per shard, as :func:`plan_shards` does,
    leave shards up to a range apart: 2 vs 3 ranges is a 1.5x spread, and on a few workers the largest
    shard sets the wall time).

    Boundaries are rounded to the nearest multiple of a file's HDF5 chunk rows, so no chunk is read by
    two shards. Returns None when a file's rows differ in size (``sizes``: npz arrays mode, npy files
    mode); use :func:`plan_shards` on its ranges then.
    """
    if any(i.sizes or i.item_files for i in indexes):
        return None
    sizes = [i.num_rows * max(1, i.row_bytes) for i in indexes]
    total = sum(sizes)
    # boundary k (0..num_shards) as (file number, row); shard k spans boundary k to boundary k+1
    bounds = [(0, 0)]
    for k in range(1, num_shards):
        target = total * k // num_shards
        f, before = 0, 0
        while f < len(indexes) - 1 and before + sizes[f] <= target:
            before += sizes[f]
            f += 1
        idx = indexes[f]
        row = round((target - before) / max(1, idx.row_bytes))
        if idx.chunk_rows > 1:
            row = round(row / idx.chunk_rows) * idx.chunk_rows
        bounds.append(max(bounds[-1], (f, min(max(row, 0), idx.num_rows))))
    bounds.append((len(indexes) - 1, indexes[-1].num_rows) if indexes else (0, 0))
    plans = []
    for k in range(num_shards):
        (f0, r0), (f1, r1) = bounds[k], bounds[k + 1]
        ranges: list[RowRange] = []
        for f in range(f0, f1 + 1):
            start = r0 if f == f0 else 0
            stop = r1 if f == f1 else indexes[f].num_rows
            if stop > start:
                ranges += plan_row_ranges(indexes[f], target_range_bytes, start, stop)
        row_bytes = {i.path: max(1, i.row_bytes) for i in indexes}
        plans.append(ShardPlan(k, num_shards, tuple(ranges), sum(r.num_rows * row_bytes[r.path] for r in ranges)))
    return plans


def group_sequential(shards: Sequence[ShardPlan], sequential: Iterable[str]) -> list[tuple[ShardPlan, ...]]:
    """The planned writer's units of work: ``shards`` in order, consecutive shards joined into one group when the
    next one starts inside a file of ``sequential`` (paths whose rows are decompressed from the file's start: a
    deflated ``.npz`` member, ``FileIndex.sequential``) that the previous one read. One worker writes a group's
    shards one after another through the same open stream, so every compressed byte is read (and decompressed)
    once: split over two workers, the second shard would read the file from its start again (egress measured
    1.75x on a deflated .npz in 2 shards from s3://). Every other shard is a group of its own.
    """
    sequential = set(sequential)
    groups: list[list[ShardPlan]] = []
    last: RowRange | None = None
    for shard in shards:
        first = shard.ranges[0] if shard.ranges else None
        if (
            groups
            and last is not None
            and first is not None
            and first.path == last.path
            and first.path in sequential
            and first.start > 0
        ):
            groups[-1].append(shard)
        else:
            groups.append([shard])
        if shard.ranges:
            last = shard.ranges[-1]
    return [tuple(g) for g in groups]


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014), a
    bijection of uint64, vectorized."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def shuffle_keys(seed: int, rows: np.ndarray) -> np.ndarray:
    """The shuffle key (uint64) of each global row index in ``rows`` for ``--shuffle_seed seed``: distinct rows get
    distinct keys (a bijection for a fixed seed), the same seed gives the same keys on every runner. A row's shard
    is ``key % num_shards`` and shards are written in key order (:func:`shuffled_shards`), the idea of TFDS's
    shuffled writer (``tensorflow_datasets/core/shuffle.py``: records keyed by a hash, then sorted by key)."""
    with np.errstate(over="ignore"):
        return _mix64(np.asarray(rows, np.uint64) ^ _mix64(np.array([seed], np.uint64))[0])


def shuffled_shards(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """The shard (int64) of each shuffle key: ``key % num_shards``, so every shard gets a uniform random share."""
    return (keys % np.uint64(num_shards)).astype(np.int64)
