"""Comparison by provenance: records paired with source rows by their ``_source/file`` and ``_source/row``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms.sources import RowRange
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.comparer import Comparer
from tfrecord_etl.transforms.verify.report import PROVENANCE_FILE, PROVENANCE_ROW, Problem, Progress
from tfrecord_etl.transforms.verify.values import digest, row_of


class ProvenanceComparer(Comparer):
    """Compares records in any order with source rows, matched by their ``_source/file`` and ``_source/row``.

    The source is read once first, one row range at a time (dead-lettered rows are not read), keeping a
    16-byte digest per row; each record's digest is then looked up by its provenance. A row whose digest
    differs is read again alone and compared feature by feature, for a precise report. Rows without a record
    that were not dead-lettered, records of dead-lettered rows and duplicated rows are problems (when the
    output does not say which rows were dead-lettered, only their count is checked: ``dead_count``).
    """

    mode = "provenance"

    def __init__(
        self,
        plans,
        specs,
        allow_lossy,
        report,
        same_paths,
        dead_count: int,
        progress: Progress,
        dead_letters: Sequence[dict] | None = None,
    ):
        super().__init__(plans, specs, allow_lossy, report, same_paths, dead_letters)
        self.data_specs = [s for s in self.specs if s.name not in (PROVENANCE_FILE, PROVENANCE_ROW)]
        self.dead_count = dead_count
        self._digests = [np.zeros((index.num_rows, 16), np.uint8) for _, index in self._indexes]
        self._seen = [np.zeros(index.num_rows, bool) for _, index in self._indexes]
        self._unreadable: dict[int, tuple[np.ndarray, str]] = {}  # index -> (rows mask, error)
        progress.start("reading the source", self.rows, "rows")
        for plan in self.plans:
            for rr in plan.ranges:
                k = self._slots[(id(plan), rr.path)]
                for live in self.live_ranges(plan, rr):
                    columns = self.expected_columns(plan, live, self.data_specs, report_errors=False)
                    if columns is None:  # a problem only if a record claims one of its rows
                        mask, _ = self._unreadable.setdefault(k, (np.zeros(len(self._seen[k]), bool), self.read_error))
                        mask[live.start : live.stop] = True
                        continue
                    for i in range(live.num_rows):
                        self._digests[k][live.start + i] = np.frombuffer(
                            digest([row_of(columns[s.name], i) for s in self.data_specs]), np.uint8
                        )
                progress.update(rr.num_rows)
        progress.close()

    def feed(self, file, index, offset, decoded) -> None:
        if decoded is None:
            return
        source_file = bytes(np.asarray(decoded[PROVENANCE_FILE]).item()).decode("utf-8", errors="replace")
        row = int(np.asarray(decoded[PROVENANCE_ROW]).reshape(-1)[0])
        k = self._by_path.get(source_file, self._by_name.get(fileio.basename(source_file)))
        if k is None or not 0 <= row < len(self._seen[k]):
            self.report.add(
                Problem(
                    "source",
                    f"The record's provenance ({source_file!r}, row {row}) is not a row of the source",
                    file,
                    index,
                    offset,
                    PROVENANCE_FILE,
                )
            )
            return
        if self._seen[k][row]:
            self.report.add(
                Problem(
                    "source",
                    f"Row {row} of {source_file!r} appears in more than one record",
                    file,
                    index,
                    offset,
                    PROVENANCE_ROW,
                )
            )
            return
        self._seen[k][row] = True
        if self.dead is not None and self.dead[k][row]:
            self.report.add(
                Problem(
                    "source",
                    f"Row {row} of {source_file!r} has a record, but the output's metadata lists it as dead-lettered",
                    file,
                    index,
                    offset,
                    PROVENANCE_ROW,
                )
            )
            return
        if k in self._unreadable and self._unreadable[k][0][row]:
            self.report.add(Problem("source", f"Not compared: {self._unreadable[k][1]}", file, index, offset))
            return
        self.compared += 1
        got = digest([decoded[s.name] for s in self.data_specs])
        if got != self._digests[k][row].tobytes():
            self._compare_one(k, row, file, index, offset, decoded)

    def _compare_one(self, k, row, file, index, offset, decoded) -> None:
        plan, fi = self._indexes[k]
        items = fi.items[row : row + 1] if fi.sizes else fi.items
        columns = self.expected_columns(plan, RowRange(fi.path, row, row + 1, items, fi.item_files), self.data_specs)
        if columns is None:
            return
        for spec in self.data_specs:
            self.compare_row(spec, np.asarray(row_of(columns[spec.name], 0)), decoded[spec.name], file, index, offset)

    def finish(self) -> None:
        if self.dead_count:
            self.report.warnings.append(
                f"{self.dead_count} source rows were dead-lettered when converting: they have no record"
            )
        missing = [~s if self.dead is None else ~s & ~self.dead[k] for k, s in enumerate(self._seen)]
        unseen = int(sum(m.sum() for m in missing))
        if unseen != (self.dead_count if self.dead is None else 0):
            first = next(
                ((self._indexes[k][1], int(np.flatnonzero(m)[0])) for k, m in enumerate(missing) if m.any()), None
            )
            where = f" (first: row {first[1]} of '{first[0].path}')" if first else ""
            self.report.add(
                Problem(
                    "source",
                    f"{unseen} source rows have no record in the output{where}, "
                    + (f"{self.dead_count} were dead-lettered" if self.dead is None else "and were not dead-lettered"),
                )
            )
