"""Expected values, exact comparison, and the comparers of an output against its convert source."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.errors import ConfigError, SchemaError, SourceError
from tfrecord_etl.transforms.renamed_flags import current_names  # options recorded under a flag's old name
from tfrecord_etl.transforms.storage import fileio
from tfrecord_etl.transforms.verify.report import CHUNK_ROWS, PROVENANCE_FILE, PROVENANCE_ROW, Problem, Progress, Report


def expected_value(spec: FeatureSpec, value, allow_lossy: Sequence[str] = ()) -> np.ndarray:
    """What :func:`codec.decode_example` returns for one source row ``value`` of ``spec``.

    Little-endian, C order; ``'bytes'`` features are object arrays of bytes (str as UTF-8); an allowed
    lossy list cast (float64 -> float32) is applied and cast back.
    """
    if spec.dtype == VLEN_BYTES:
        arr = np.asarray(value, dtype=object)
        out = np.empty(arr.size, dtype=object)
        out[:] = [codec.as_bytes(v) for v in arr.reshape(-1).tolist()]
        return out.reshape(arr.shape)
    arr = np.asarray(value)
    arr = codec.to_little_endian(arr).reshape(arr.shape)  # keeps 0-d rows 0-d
    return codec.encoding_of(spec).stored(spec, arr, allow_lossy)


def _row_bytes(arr: np.ndarray) -> np.ndarray:
    """``(elements, itemsize)`` uint8 view of an array's little-endian bytes."""
    arr = np.ascontiguousarray(arr)
    return np.frombuffer(arr.tobytes(), np.uint8).reshape(arr.size, arr.dtype.itemsize)


def compare_value(spec: FeatureSpec, expected: np.ndarray, got) -> str | None:
    """None when ``got`` (decoded from a record) equals ``expected`` (from the source) exactly, else what differs.

    Exact means same shape, dtype and bytes; the tolerances are NaN against NaN in floats (a list
    encoding's float32 round trip may change a NaN's payload bits) and bools compared as truth values.
    """
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"shape {got.shape} in the output, {expected.shape} in the source"
    if expected.dtype == object or got.dtype == object:
        for i, (a, b) in enumerate(zip(expected.reshape(-1).tolist(), got.reshape(-1).tolist())):
            if a != b:
                return f"differs at index {_index(i, expected.shape)}: {b!r} in the output, {a!r} in the source"
        return None
    if got.dtype.str != expected.dtype.str:
        return f"dtype {got.dtype.str} in the output, {expected.dtype.str} in the source"
    if got.tobytes() == expected.tobytes():
        return None
    diff = np.any(_row_bytes(got) != _row_bytes(expected), axis=1)
    if got.dtype.kind == "b":  # a bool's byte may be any non-zero value; list encodings write 1
        diff = (got != expected).reshape(-1)
    if got.dtype.kind in "fc":
        diff &= ~(np.isnan(got) & np.isnan(expected)).reshape(-1)
    bad = np.flatnonzero(diff)
    if not bad.size:
        return None
    i = int(bad[0])
    return (
        f"differs at index {_index(i, expected.shape)}: {got.reshape(-1)[i]} in the output, "
        f"{expected.reshape(-1)[i]} in the source ({bad.size} of {expected.size} elements differ)"
    )


def _index(flat: int, shape: tuple) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _digest(values: Sequence[np.ndarray]) -> bytes:
    """A 16-byte digest of a row's arrays: dtype, shape and bytes (length-prefixed elements for objects)."""
    h = hashlib.blake2b(digest_size=16)
    for v in values:
        v = np.asarray(v)
        h.update(f"{v.dtype.str}{v.shape}|".encode())
        if v.dtype == object:
            for x in v.reshape(-1).tolist():
                h.update(len(x).to_bytes(8, "little"))
                h.update(x)
        else:
            h.update(np.ascontiguousarray(v).tobytes())
    return h.digest()


def _row(column, i: int):
    """Row ``i`` of a column; ``[i, ...]`` keeps a 0-d row an array with its bytes (a scalar would not:
    NumPy normalizes a bool's byte)."""
    return column[i, ...] if isinstance(column, np.ndarray) else column[i]


def _same_spec(a: FeatureSpec, b: FeatureSpec) -> bool:
    return (a.name, a.dtype, a.shape) == (b.name, b.dtype, b.shape)


def plan_sources(meta: dict, patterns: Sequence[str], where: str = ""):
    """Plans ``patterns`` with the convert options recorded in ``meta["options"]``.

    Returns a list of ``transforms.planning.InputPlan``, one per pattern, in the order given.

    Raises:
      ConfigError: the metadata holds no convert options (not written by tfrecord-etl convert).
      SourceError, SchemaError: a pattern matches nothing or a source file cannot be indexed.
    """
    from pydantic import ValidationError

    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.config import ConvertConfig

    opts = meta.get("options")
    if not isinstance(opts, dict) or not isinstance(opts.get("input"), str):
        raise ConfigError(
            "--source needs the convert options in metadata.json ('options.input' is missing): "
            "this output was not written by tfrecord-etl convert",
            file=where or None,
        )
    try:  # the convert's own source options (planning.source_options is their one home)
        cfg = ConvertConfig.model_validate(
            {k: v for k, v in current_names(opts).items() if k in ConvertConfig.model_fields}
        )
        options = planning.source_options(cfg)
    except (TypeError, ValueError, ValidationError) as e:
        raise ConfigError(
            f"Invalid convert options in metadata.json: {str(e).splitlines()[0]}", file=where or None
        ) from None
    return [planning.plan_inputs(p, options) for p in patterns]


class _Comparer:
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
        from tfrecord_etl.transforms.sources import RowRange

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
        from tfrecord_etl.transforms import planning

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


class SequentialComparer(_Comparer):
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


class ProvenanceComparer(_Comparer):
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
                            _digest([_row(columns[s.name], i) for s in self.data_specs]), np.uint8
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
        got = _digest([decoded[s.name] for s in self.data_specs])
        if got != self._digests[k][row].tobytes():
            self._compare_one(k, row, file, index, offset, decoded)

    def _compare_one(self, k, row, file, index, offset, decoded) -> None:
        from tfrecord_etl.transforms.sources import RowRange

        plan, fi = self._indexes[k]
        items = fi.items[row : row + 1] if fi.sizes else fi.items
        columns = self.expected_columns(plan, RowRange(fi.path, row, row + 1, items, fi.item_files), self.data_specs)
        if columns is None:
            return
        for spec in self.data_specs:
            self.compare_row(spec, np.asarray(_row(columns[spec.name], 0)), decoded[spec.name], file, index, offset)

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


def dead_letters_of(meta: dict, where: str = "") -> list[dict] | None:
    """The row ranges metadata.json lists as dead-lettered (``dead_letters``, written by convert with
    ``--dead_letter_dir``), or None when it does not say which rows they were (an output written before the list
    was kept, or one whose list does not add up to ``rows_dead_lettered``).

    Raises:
      ConfigError: a ``dead_letters`` entry that is not ``{"file": str, "start": int, "stop": int, ...}`` with
        ``0 <= start < stop``.
    """
    letters = meta.get("dead_letters")
    dead = int(meta.get("rows_dead_lettered") or 0)
    if letters is None:
        return [] if not dead else None
    ok = isinstance(letters, list) and all(
        isinstance(d, dict)
        and isinstance(d.get("file"), str)
        and type(d.get("start")) is int
        and type(d.get("stop")) is int
        and 0 <= d["start"] < d["stop"]
        and isinstance(d.get("files") or [], list)
        and len(d.get("files") or ()) in (0, d["stop"] - d["start"])
        for d in letters
    )
    if not ok:
        raise ConfigError(
            "Invalid 'dead_letters' in metadata.json: expected a list of {file, start, stop} row ranges",
            file=where or None,
            hint="re-convert the output",
        )
    return letters if sum(d["stop"] - d["start"] for d in letters) == dead else None


def make_comparer(meta: dict, patterns: Sequence[str], report: Report, progress: Progress, where: str = ""):
    """The comparer for an output: sequential for the planned writer (skipping the rows metadata.json lists as
    dead-lettered), else matched by provenance. Returns None (with a problem) when the source's features differ.

    Raises:
      ConfigError: exact comparison is impossible (records out of row order, or dead-lettered rows that the
        metadata does not list, and no provenance features), or the metadata holds no convert options.
    """
    specs = list(meta["features"])
    names = {s.name for s in specs}
    has_provenance = {PROVENANCE_FILE, PROVENANCE_ROW} <= names
    dead = int(meta.get("rows_dead_lettered") or 0)
    letters = dead_letters_of(meta, where)
    split = len(meta.get("splits") or {}) > 1 or len(meta.get("runs") or ()) > 1
    sequential = meta.get("writer") == "planned" and letters is not None and not split
    if not sequential and not has_provenance:
        why = (
            f"{dead} rows were dead-lettered and metadata.json does not list them"
            if letters is None
            else "the rows are spread over splits"
            if split
            else f"the records are not in source row order (writer {meta.get('writer')!r})"
        )
        raise ConfigError(
            f"Exact comparison with the source needs the {PROVENANCE_FILE} and {PROVENANCE_ROW} "
            f"features: {why} and the output has no provenance",
            file=where or None,
            hint=("re-convert (with --dead_letter_dir, metadata.json lists the rows) or with --provenance")
            if letters is None
            else "re-convert with --provenance" + ("" if split else ", or with the planned writer (--writer planned)"),
        )
    plans = plan_sources(meta, patterns, where)
    num_shards = len(meta.get("shards") or ())
    if meta.get("writer") == "planned" and len(plans) == 1 and num_shards:
        # the writer's own row ranges (shards are cut at chunk-aligned byte boundaries, then split into
        # ranges): its dead letters are whole ranges, so unreadable rows must be counted by the same ranges
        plans = [plans[0].as_written(num_shards)]
    data_specs = [s for s in specs if s.name not in (PROVENANCE_FILE, PROVENANCE_ROW)]
    for pattern, plan in zip(patterns, plans):
        if len(plan.specs) != len(data_specs) or not all(_same_spec(a, b) for a, b in zip(plan.specs, data_specs)):
            have = ", ".join(f"{s.name} {s.dtype} {s.shape}" for s in plan.specs)
            want = ", ".join(f"{s.name} {s.dtype} {s.shape}" for s in data_specs)
            report.add(
                Problem(
                    "source",
                    f"The source's features ({have}) differ from the output's ({want}): not compared",
                    file=pattern,
                )
            )
            return None
    total = sum(p.num_rows for p in plans)
    expected = int(meta.get("num_records") or 0) + dead
    if total != expected:
        report.add(
            Problem(
                "source",
                f"The source holds {total} rows, the output {meta.get('num_records')} records "
                f"and {dead} dead-lettered rows",
            )
        )
    same_paths = list(patterns) == [meta["options"].get("input")]
    lossy = tuple(meta["options"].get("allow_lossy") or ())
    if sequential:
        return SequentialComparer(plans, specs, lossy, report, same_paths, letters)
    return ProvenanceComparer(plans, specs, lossy, report, same_paths, dead, progress, letters)
