"""The base of the source comparers: the source's files and rows, their expected values, the dead letters and
the summary (``sequential.py`` and ``provenance.py`` hold the two ways of pairing records with rows)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms import codec, planning
from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import RowRange
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.report import PROVENANCE_FILE, Problem, Report
from tfrecord_etl.transforms.verify.values import compare_value, expected_value


class Comparer:
    """Base of the source comparers; ``report`` collects problems, ``compared`` counts rows compared.

    ``dead_letters``: the rows the convert dead-lettered (metadata.json's ``dead_letters``), expected to have
    no record and never read; None when the output does not say which rows they were (only how many).
    """

    mode = ""

    def __init__(
        self,
        plans,
        specs: Sequence[FeatureSpec],
        allow_lossy: Sequence[str],
        report: Report,
        same_paths: bool,
        dead_letters: Sequence[dict] | None = None,
    ):
        self.plans, self.report, self.lossy, self.same_paths = list(plans), report, tuple(allow_lossy), same_paths
        self.specs = list(specs)
        self.compared = 0
        self.rows = sum(p.num_rows for p in self.plans)
        self._indexes = [(plan, index) for plan in self.plans for index in plan.indexes]
        self._slots = {(id(plan), index.path): k for k, (plan, index) in enumerate(self._indexes)}
        self._by_path: dict[str, int] = {}
        names: dict[str, list[int]] = {}
        for k, (_, index) in enumerate(self._indexes):
            for path in index.items if index.item_files else (index.path,):
                self._by_path[path] = k
                names.setdefault(fileio.basename(path), []).append(k)
        self._by_name = {n: ks[0] for n, ks in names.items() if len(set(ks)) == 1}
        self.dead = None if dead_letters is None else self._dead_masks(dead_letters)

    def locate(self, path: str) -> int | None:
        """The index (position in ``self._indexes``) holding ``path`` (an input file, or a file of a files-mode
        collection); by file name when the source moved and the name is unique; None when none does."""
        return self._by_path.get(path, self._by_name.get(fileio.basename(path)))

    def _dead_masks(self, letters: Sequence[dict]) -> list[np.ndarray]:
        """One bool mask per index of its dead-lettered rows; a letter that names no row of the source (or a
        file other than the source's at that row) is a problem."""
        masks = [np.zeros(index.num_rows, bool) for _, index in self._indexes]
        for d in letters:
            start, stop, files = d["start"], d["stop"], d.get("files") or ()
            rows = [(self.locate(f), start + i, f) for i, f in enumerate(files)] or [
                (self.locate(d["file"]), r, None) for r in range(start, stop)
            ]
            for k, row, f in rows:
                index = None if k is None else self._indexes[k][1]
                if (
                    index is None
                    or row >= index.num_rows
                    or (f is not None and fileio.basename(index.items[row]) != fileio.basename(f))
                ):
                    self.report.add(
                        Problem(
                            "source",
                            f"The output's dead letter for rows {start}-{stop - 1} of "
                            f"{d['file']!r} names no such row of the source",
                            file=d["file"],
                        )
                    )
                    break
                masks[k][row] = True
        return masks

    @property
    def dead_rows(self) -> int:
        """Source rows expected to have no record (dead-lettered), when known."""
        return 0 if self.dead is None else int(sum(m.sum() for m in self.dead))

    def live_ranges(self, plan, rr) -> list:
        """``rr`` without its dead-lettered rows: the row ranges of the rows that have records, in order."""
        k = self._slots[(id(plan), rr.path)]
        dead = None if self.dead is None else self.dead[k][rr.start : rr.stop]
        if dead is None or not dead.any():
            return [rr]
        fi = self._indexes[k][1]
        live = np.flatnonzero(np.diff(np.concatenate(([0], (~dead).astype(np.int8), [0]))))
        return [
            RowRange(
                rr.path,
                rr.start + a,
                rr.start + b,
                fi.items[rr.start + a : rr.start + b] if fi.sizes else rr.items,
                rr.item_files,
            )
            for a, b in zip(live[::2], live[1::2])
        ]

    def expected_columns(self, plan, rr, specs: Sequence[FeatureSpec], report_errors: bool = True) -> dict | None:
        """``{name: array (rows, *shape) | list of per-row arrays}`` as decode_example returns them, or None
        when the range cannot be read (a problem when ``report_errors``; the error in ``self.read_error``)."""
        try:
            columns = planning.add_provenance(rr, plan.source.read(rr))
        except (SourceError, SchemaError) as e:
            self.read_error = f"Cannot read the source ({rr.describe()}): {e}"
            if report_errors:
                self.report.add(Problem("source", self.read_error, file=rr.path))
            return None
        out = {}
        for spec in specs:
            col = columns.get(spec.name)
            if col is None:
                self.report.add(
                    Problem(
                        "source",
                        f"The source has no column '{spec.name}' ({rr.describe()})",
                        file=rr.path,
                        feature=spec.name,
                    )
                )
                return None
            if spec.is_fixed and spec.dtype != VLEN_BYTES and isinstance(col, np.ndarray) and col.dtype != object:
                out[spec.name] = codec.encoding_of(spec).stored(spec, codec.to_little_endian(col), self.lossy)
            else:
                out[spec.name] = [expected_value(spec, v, self.lossy) for v in col]
        return out

    def compare_row(self, spec, expected, got, file, index, offset) -> bool:
        if spec.name == PROVENANCE_FILE and not self.same_paths:  # the source moved: compare file names
            expected = np.asarray(fileio.basename(expected.item().decode(errors="replace")).encode(), object)
            got = np.asarray(fileio.basename(np.asarray(got).item().decode(errors="replace")).encode(), object)
        message = compare_value(spec, expected, got)
        if message:
            self.report.add(
                Problem("source", f"Value differs from the source: {message}", file, index, offset, spec.name)
            )
        return message is None

    def begin_shard(self, expected_records: int) -> None:
        pass

    def feed(self, file: str, index: int, offset: int, decoded: dict | None) -> None:
        raise NotImplementedError

    def end_shard(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def summary(self, patterns) -> dict:
        return {
            "patterns": list(patterns),
            "mode": self.mode,
            "rows": self.rows,
            "compared": self.compared,
            "dead_lettered": self.dead_rows,
        }
