"""Sequential comparison: records paired with source rows in order (the planned writer's outputs)."""

from __future__ import annotations

import numpy as np

from tfrecord_etl.transforms.verify.comparer import Comparer
from tfrecord_etl.transforms.verify.report import CHUNK_ROWS, Problem


class SequentialComparer(Comparer):
    """Compares records with source rows in order: the planned writer writes shards in row order.

    Rows are read one planned row range at a time and compared in vectorized chunks of up to 4096 rows;
    dead-lettered rows have no record and are skipped, never read. A shard with fewer records than its
    metadata count (cut short) skips the rest of its rows; records beyond its count are not compared (the
    count problem is reported), so later shards stay aligned.
    """

    mode = "sequential"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ranges = (
            (plan, live) for plan in self.plans for rr in plan.ranges for live in self.live_ranges(plan, rr)
        )
        self._cur = None  # (range, expected columns or None, next row position)
        self._pending: list = []  # (row position, file, index, offset, decoded)
        self._shard_left = None
        self._extra = 0

    def _range(self) -> bool:
        while self._cur is None or self._cur[2] >= self._cur[0].num_rows:
            if self._cur is not None:
                self._flush()
            nxt = next(self._ranges, None)
            if nxt is None:
                self._cur = None
                return False
            plan, rr = nxt
            self._cur = [rr, self.expected_columns(plan, rr, self.specs) if rr.num_rows else None, 0]
        return True

    def begin_shard(self, expected_records: int) -> None:
        self._shard_left = expected_records

    def feed(self, file, index, offset, decoded) -> None:
        if self._shard_left is not None:
            if self._shard_left <= 0:
                return
            self._shard_left -= 1
        if not self._range():
            self._extra += 1
            return
        if decoded is not None and self._cur[1] is not None:
            self._pending.append((self._cur[2], file, index, offset, decoded))
        self._cur[2] += 1
        if len(self._pending) >= CHUNK_ROWS:
            self._flush()

    def skip(self, rows: int) -> None:
        """Moves past ``rows`` source rows that have no record (a missing or cut-short shard)."""
        while rows > 0 and self._range():
            take = min(rows, self._cur[0].num_rows - self._cur[2])
            self._cur[2] += take
            rows -= take

    def end_shard(self) -> None:
        if self._shard_left:
            self.skip(self._shard_left)
        self._shard_left = None

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending or self._cur is None or self._cur[1] is None:
            return
        columns = self._cur[1]
        positions = np.array([p[0] for p in pending])
        for spec in self.specs:
            col = columns[spec.name]
            if isinstance(col, np.ndarray):
                expected = col[positions]
                got = [p[4][spec.name] for p in pending]
                try:
                    stacked = np.stack(got)
                except ValueError:
                    stacked = None
                if stacked is not None and stacked.dtype.str == expected.dtype.str and stacked.shape == expected.shape:
                    width = expected.nbytes // len(pending)
                    a = np.frombuffer(np.ascontiguousarray(expected).tobytes(), np.uint8).reshape(len(pending), width)
                    b = np.frombuffer(np.ascontiguousarray(stacked).tobytes(), np.uint8).reshape(len(pending), width)
                    rows = np.flatnonzero(np.any(a != b, axis=1)) if width else []
                else:
                    rows = range(len(pending))
                for k in rows:
                    _, file, index, offset, decoded = pending[k]
                    self.compare_row(spec, expected[k], decoded[spec.name], file, index, offset)
            else:
                for pos, file, index, offset, decoded in pending:
                    self.compare_row(spec, col[pos], decoded[spec.name], file, index, offset)
        self.compared += len(pending)

    def finish(self) -> None:
        self._flush()
        left = 0
        if self._cur is not None:
            left += self._cur[0].num_rows - self._cur[2]
        left += sum(rr.num_rows for _, rr in self._ranges)
        self._cur = None
        if left:
            self.report.add(Problem("source", f"The source holds {left} more rows than the output's records"))
        if self._extra:
            self.report.add(Problem("source", f"The output holds {self._extra} more records than the source rows"))
