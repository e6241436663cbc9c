"""Shard planning for the planned writer: contiguous row ranges per shard, decided before data moves.

Pure functions (no Beam). A shard is a contiguous list of row ranges of about the target size, so
the writer needs no shuffle: each shard is written by one worker straight to a temporary file, and a
rerun on the same input and config gives byte-identical shards (the idea of TFDS's deterministic
writer, without its shuffle).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from transforms.sources import FileIndex, RowRange


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
        return sum(index.sizes[rr.start:rr.stop])
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
    return [ShardPlan(k, num_shards, tuple(ranges[i] for i in g), sum(sizes[i] for i in g))
            for k, g in enumerate(groups)]

