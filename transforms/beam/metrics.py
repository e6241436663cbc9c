"""The Beam metrics our DoFns report: the namespace of the counters and the shard writers' clock."""

from __future__ import annotations

import time

from apache_beam.metrics import Metrics

NAMESPACE = "tfrecord_etl"
# Distributions of wall-clock times (ms since the epoch) at which shard writers start and finish: their
# span (last finish - first start) is the run's work time without start-up and tear-down.
SHARD_START_MS, SHARD_END_MS = "shard_start_ms", "shard_end_ms"


class ShardClock:
    """Records a shard writer's start and end times in the SHARD_START_MS/SHARD_END_MS distributions."""

    def __init__(self):
        self._start = Metrics.distribution(NAMESPACE, SHARD_START_MS)
        self._end = Metrics.distribution(NAMESPACE, SHARD_END_MS)

    def start(self) -> None:
        self._start.update(int(time.time() * 1000))

    def end(self) -> None:
        self._end.update(int(time.time() * 1000))
