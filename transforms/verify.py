"""Verification of TFRecord data: framing, CRCs, record counts, decoding, and exact comparison with the source.

The logic behind ``python -m pipelines.verify`` (no argument parsing, no printing). Three kinds of target:

* an **output directory** of tfrecord-etl (``metadata.json`` required, else IncompleteOutputError): every
  shard listed in the metadata is read; every frame's length and data masked CRC32C is checked; every
  record is decoded with the recorded features (:func:`transforms.codec.decode_example`); the record
  counts and file sizes are compared with the metadata. With ``sources``, every array is compared with
  the source exactly (see :class:`SequentialComparer` and :class:`ProvenanceComparer`).
* a **sidecar collection** (an output directory that also holds ``manifest.json``, written by
  ``pipelines.augment --mode sidecar``): as an output directory, plus each sidecar shard's record count
  against the manifest and, when the user names the original collection (``originals``, the ``--original``
  flag), each original shard's record count, size and CRC32C. The paths written in ``manifest.json`` are
  never opened: originals are found by file name among the files the user named, so a manifest cannot
  make verify read a file it was not given.
* a **file pattern** (or one file) of plain TFRecord files without metadata: framing and CRCs, and that
  every record parses as a ``tf.train.Example`` whose features keep one kind; the features are inferred
  (:func:`transforms.codec.infer_feature_specs`) from the first records.

Findings are :class:`Problem` entries of a :class:`Report` (file, record index, byte offset, feature):
the function returns normally. It raises only when the target cannot be verified at all.

Byte offsets are those of a record's frame in the uncompressed stream (as TensorFlow counts them).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import time
from typing import BinaryIO, Iterator, Sequence

import numpy as np

from transforms import codec, fileio, metadata, outdir, tfrecord
from transforms.codec import VLEN_BYTES, FeatureSpec
from transforms.errors import ConfigError, RecordError, SchemaError, SourceError, printable

MANIFEST_FILE = "manifest.json"
PROVENANCE_FILE, PROVENANCE_ROW = "_source/file", "_source/row"
SAMPLE_RECORDS = 1000  # records the features of plain files are inferred from
_KNOWN_FILES = {metadata.METADATA_FILE, metadata.SCHEMA_FILE, MANIFEST_FILE, outdir.MARKER_FILE, outdir.LOCK_FILE}
_CHUNK_ROWS = 4096  # rows compared with the source in one vectorized step
_PROGRESS_STEP = 1 << 20


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Problem:
    """One finding. ``kind`` is one of:

    ``framing`` (truncated frame, CRC mismatch, undecompressable stream: reading the file stops there),
    ``missing`` (a shard in the metadata is absent), ``count`` (record counts differ), ``size`` (file size
    differs from the metadata), ``decode`` (a record does not decode with the recorded features),
    ``not_example`` (a record of a plain file is not a tf.train.Example), ``kind`` (a feature of plain
    files holds different list kinds), ``source`` (a value differs from the source, or rows are missing
    or extra), ``manifest`` (a sidecar pairing does not hold), ``unreadable`` (a shard that is not a regular
    file, e.g. a FIFO or device: never opened), ``features`` (more distinct feature names than the limit).

    ``offset``: byte offset of the record's frame in the uncompressed stream; ``record``: 0-based index
    of the record in its file; ``feature``: the feature name, when one is at fault.
    """

    kind: str
    message: str
    file: str | None = None
    record: int | None = None
    offset: int | None = None
    feature: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: ``[kind] file, record N, byte offset B, feature 'F': message`` (non-printable characters
        of names and messages escaped, see ``errors.printable``)."""
        return printable(self._describe())

    def _describe(self) -> str:
        where = [self.file] if self.file else []
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        if self.feature:
            where.append(f"feature '{self.feature}'")
        return f"[{self.kind}] {', '.join(where)}: {self.message}" if where else f"[{self.kind}] {self.message}"


@dataclasses.dataclass
class FileReport:
    """What was read of one file. ``complete`` is False when reading stopped at a framing error."""

    file: str
    compression: str
    records: int = 0
    expected_records: int | None = None
    bytes: int | None = None
    complete: bool = True


@dataclasses.dataclass
class Report:
    """The result of :func:`verify`. ``ok`` only when no problem was found.

    ``problems`` holds the first ``max_problems`` findings; ``num_problems`` counts them all.
    ``source``: None, or ``{"patterns", "mode" ('sequential' | 'provenance'), "rows", "compared"}``.
    ``manifest``: None, or ``{"shards", "originals_checked", "originals_unreachable", "originals_not_named"}``
    for sidecars (``originals_not_named``: shards whose original was not checked because no ``originals``
    were given).
    """

    target: str
    kind: str  # "output", "sidecar" or "files"
    compression: str | None = None
    features: list[FeatureSpec] = dataclasses.field(default_factory=list)
    inferred: bool = False
    files: list[FileReport] = dataclasses.field(default_factory=list)
    expected_records: int | None = None
    problems: list[Problem] = dataclasses.field(default_factory=list)
    num_problems: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)
    source: dict | None = None
    manifest: dict | None = None
    seconds: float = 0.0
    max_problems: int = 100

    @property
    def ok(self) -> bool:
        return self.num_problems == 0

    @property
    def num_records(self) -> int:
        return sum(f.records for f in self.files)

    def add(self, problem: Problem) -> None:
        self.num_problems += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)

    def to_json(self) -> dict:
        return {
            "target": self.target, "kind": self.kind, "ok": self.ok, "num_records": self.num_records,
            "expected_records": self.expected_records, "compression": self.compression,
            "features": [s.to_json() for s in self.features], "inferred": self.inferred,
            "files": [dataclasses.asdict(f) for f in self.files], "source": self.source, "manifest": self.manifest,
            "num_problems": self.num_problems, "problems": [p.to_json() for p in self.problems],
            "warnings": list(self.warnings), "seconds": round(self.seconds, 3),
        }


class Progress:
    """Progress sink: ``start(label, total, unit)`` (unit ``'B'`` bytes or ``'rows'``), ``update(n)``,
    ``close()``. This one does nothing."""

    def start(self, label: str, total: int | None, unit: str = "B") -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------
# Files, compression and records
# ----------------------------------------------------------------------------------------------

class _CountingReader(io.RawIOBase):
    """A read-only stream that reports the bytes read from ``raw`` to a Progress (and a CRC32C)."""

    def __init__(self, raw: BinaryIO, progress: Progress, checksum=None):
        self._raw, self._progress, self._checksum = raw, progress, checksum
        self.bytes, self._unreported = 0, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        data = self._raw.read() if n is None or n < 0 else self._raw.read(n)
        self._count(data)
        return data

    def readinto(self, b) -> int:
        data = self._raw.read(len(b))
        b[:len(data)] = data
        self._count(data)
        return len(data)

    def _count(self, data: bytes) -> None:
        self.bytes += len(data)
        self._unreported += len(data)
        if self._checksum is not None:
            self._checksum.update(data)
        if self._unreported >= _PROGRESS_STEP:
            self.flush_progress()

    def flush_progress(self) -> None:
        if self._unreported:
            self._progress.update(self._unreported)
            self._unreported = 0

    def drain(self) -> None:
        """Reads (and counts) the rest of the raw stream, e.g. the bytes after a gzip stream's end."""
        while self.read(1 << 22):
            pass


def file_size(path: str) -> int | None:
    """Size in bytes of ``path``, or None when it does not exist."""
    try:
        found = fileio.FileSystems.match([path])[0].metadata_list
    except Exception:  # noqa: BLE001 - Beam raises BeamIOError for a missing path on some filesystems
        return None
    return found[0].size_in_bytes if found else None


def file_compression(path: str) -> str:
    """The compression of a TFRecord file: from its suffix (``.gz``, ``.zlib``/``.zz``), else its first bytes."""
    compression = tfrecord.compression_from_path(path)
    if compression == "none":
        with fileio.open_read(path) as raw:
            compression = tfrecord.detect_compression(raw.read(12))
    return compression


def list_record_files(target: str) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of the TFRecord files of a directory (not recursive) or a file pattern.

    Hidden files (``.*``, e.g. ``.tmp-`` files of a killed run) and ``metadata.json``, ``schema.pbtxt``
    and ``manifest.json`` are left out. Sorted by path.

    Raises:
      SourceError: nothing matches (naming the pattern), or a match is not a regular file (a FIFO or a
        device is never opened).
    """
    pattern = fileio.join(target, "*") if fileio.is_dir(target) else target
    files = [(p, s) for p, s in fileio.match(pattern)
             if not fileio.basename(p).startswith(".") and fileio.basename(p) not in _KNOWN_FILES]
    if not files:
        raise SourceError("No TFRecord file matches (hidden files and metadata are left out)", file=target,
                          hint="pass a file, a directory of TFRecord files, or a glob such as 'dir/*.gz'")
    for path, _ in files:
        tfrecord.check_regular(path)
    return files


def _records(path: str, compression: str, progress: Progress, checksum=None, max_record_bytes: int | None = None
             ) -> Iterator[tuple[int, int, bytes]]:
    """``(index, offset, record)`` of one file, CRCs and record sizes checked (``max_record_bytes``, default
    ``tfrecord.record_limit()``); reports the stored bytes read to ``progress``. A file that is not regular
    raises SourceError before it is opened."""
    tfrecord.check_regular(path)
    with fileio.open_read(path) as raw:
        counting = _CountingReader(raw, progress, checksum)
        try:
            yield from tfrecord.iter_records(tfrecord.open_decompressed(counting, compression), path,
                                             max_record_bytes=max_record_bytes)
            if checksum is not None:
                counting.drain()
        finally:
            counting.flush_progress()


def not_example_reason(record: bytes) -> str | None:
    """Why a record that is no ``tf.train.Example`` is something else, when it can tell: a record whose
    fields are ``1: Features`` and ``2: FeatureLists`` is a ``tf.train.SequenceExample``. Else None."""
    try:
        fields = list(codec._fields(record, 0, len(record)))
        if not fields or not any(f == 2 for f, _, _ in fields) or any(w != 2 or f not in (1, 2)
                                                                       for f, w, _ in fields):
            return None
        for f, _, (start, stop) in fields:
            if f == 2:  # FeatureLists{1: repeated {1: key, 2: FeatureList}}
                for f2, w2, _ in codec._fields(record, start, stop):
                    if f2 != 1 or w2 != 2:
                        return None
    except RecordError:
        return None
    return ("it is a tf.train.SequenceExample (context and feature_lists); read it with "
            "tf.io.parse_single_sequence_example")


def check_example(record: bytes, max_features: int | None = None) -> dict:
    """``codec.parse_example(record, max_features)``, with the RecordError saying what the payload is when it can."""
    try:
        return codec.parse_example(record, max_features)
    except RecordError:
        reason = not_example_reason(record)
        if reason is None:
            raise
        raise RecordError(f"Not a tf.train.Example: {reason}") from None


def infer_specs(records: Sequence[bytes], path: str = "", max_features: int | None = None
                ) -> tuple[FeatureSpec, ...]:
    """The features of serialized Examples without metadata (:func:`codec.infer_feature_specs`).

    Raises:
      RecordError: a record is not a tf.train.Example (naming ``path``, the record index and, for a
        ``tf.train.SequenceExample``, what it is instead); more than ``max_features`` features in a record
        or distinct names in all (default ``codec.MAX_FEATURES``). SchemaError: a feature has two kinds.
    """
    for i, record in enumerate(records):
        try:
            check_example(record, max_features)
        except RecordError as e:
            raise RecordError(f"Cannot infer the features: {e.message}", file=path or None, record=i,
                              payload_offset=e.context.get("offset"), hint=e.hint) from None
    try:
        return codec.infer_feature_specs(records, max_features)
    except (SchemaError, RecordError) as e:
        raise e.with_context(file=path or None) from None


# ----------------------------------------------------------------------------------------------
# Expected values and exact comparison
# ----------------------------------------------------------------------------------------------

def expected_value(spec: FeatureSpec, value, allow_lossy: Sequence[str] = ()) -> np.ndarray:
    """What :func:`codec.decode_example` returns for one source row ``value`` of ``spec``.

    Little-endian, C order; ``'bytes'`` features are object arrays of bytes (str as UTF-8); an allowed
    lossy list cast (float64 -> float32) is applied and cast back.
    """
    if spec.dtype == VLEN_BYTES:
        arr = np.asarray(value, dtype=object)
        out = np.empty(arr.size, dtype=object)
        out[:] = [codec._as_bytes(v) for v in arr.reshape(-1).tolist()]
        return out.reshape(arr.shape)
    arr = np.asarray(value)
    arr = codec.to_little_endian(arr).reshape(arr.shape)  # keeps 0-d rows 0-d
    return _lossy(spec, arr, allow_lossy)


def _lossy(spec: FeatureSpec, arr: np.ndarray, allow_lossy: Sequence[str]) -> np.ndarray:
    if spec.encoding == "list" and spec.name in allow_lossy and arr.dtype.kind == "f" and arr.dtype.itemsize == 8:
        return arr.astype("<f4").astype("<f8")
    return arr


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
    return (f"differs at index {_index(i, expected.shape)}: {got.reshape(-1)[i]} in the output, "
            f"{expected.reshape(-1)[i]} in the source ({bad.size} of {expected.size} elements differ)")


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


# ----------------------------------------------------------------------------------------------
# Comparing with the source
# ----------------------------------------------------------------------------------------------

def plan_sources(meta: dict, patterns: Sequence[str], where: str = ""):
    """Plans ``patterns`` with the convert options recorded in ``meta["options"]``.

    Returns a list of ``transforms.beam_io.InputPlan``, one per pattern, in the order given.

    Raises:
      ConfigError: the metadata holds no convert options (not written by pipelines.convert).
      SourceError, SchemaError: a pattern matches nothing or a source file cannot be indexed.
    """
    from transforms import beam_io
    from transforms.sources import DEFAULT_RANGE_BYTES, SourceOptions
    opts = meta.get("options")
    if not isinstance(opts, dict) or not isinstance(opts.get("input"), str):
        raise ConfigError("--source needs the convert options in metadata.json ('options.input' is missing): "
                          "this output was not written by pipelines.convert", file=where or None)
    try:
        datasets = opts.get("datasets")
        range_mb = float(opts.get("target_range_mb") or DEFAULT_RANGE_BYTES / 2**20)  # the convert's own ranges
        options = SourceOptions(opts.get("format"), tuple(datasets) if datasets else None,
                                opts.get("npz_mode") or "rows", opts.get("npy_mode") or "rows",
                                max(1, int(range_mb * 2**20)),
                                **{k: opts[k] for k in ("max_compression_ratio", "max_empty_rows", "allow_external_storage",
                                                       "allow_fill_value") if k in opts})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"Invalid convert options in metadata.json: {e}", file=where or None) from None
    return [beam_io.plan_inputs(p, options) for p in patterns]


class _Comparer:
    """Base of the source comparers; ``report`` collects problems, ``compared`` counts rows compared."""

    mode = ""

    def __init__(self, plans, specs: Sequence[FeatureSpec], allow_lossy: Sequence[str], report: Report,
                 same_paths: bool):
        self.plans, self.report, self.lossy, self.same_paths = list(plans), report, tuple(allow_lossy), same_paths
        self.specs = list(specs)
        self.compared = 0
        self.rows = sum(p.num_rows for p in self.plans)

    def expected_columns(self, plan, rr, specs: Sequence[FeatureSpec], report_errors: bool = True) -> dict | None:
        """``{name: array (rows, *shape) | list of per-row arrays}`` as decode_example returns them, or None
        when the range cannot be read (a problem when ``report_errors``; the error in ``self.read_error``)."""
        from transforms import beam_io
        try:
            columns = beam_io.add_provenance(rr, plan.source.read(rr))
        except (SourceError, SchemaError) as e:
            self.read_error = f"Cannot read the source ({rr.describe()}): {e}"
            if report_errors:
                self.report.add(Problem("source", self.read_error, file=rr.path))
            return None
        out = {}
        for spec in specs:
            col = columns.get(spec.name)
            if col is None:
                self.report.add(Problem("source", f"The source has no column '{spec.name}' ({rr.describe()})",
                                        file=rr.path, feature=spec.name))
                return None
            if spec.is_fixed and spec.dtype != VLEN_BYTES and isinstance(col, np.ndarray) and col.dtype != object:
                out[spec.name] = _lossy(spec, codec.to_little_endian(col), self.lossy)
            else:
                out[spec.name] = [expected_value(spec, v, self.lossy) for v in col]
        return out

    def compare_row(self, spec, expected, got, file, index, offset) -> bool:
        if spec.name == PROVENANCE_FILE and not self.same_paths:  # the source moved: compare file names
            expected = np.asarray(fileio.basename(expected.item().decode(errors="replace")).encode(), object)
            got = np.asarray(fileio.basename(np.asarray(got).item().decode(errors="replace")).encode(), object)
        message = compare_value(spec, expected, got)
        if message:
            self.report.add(Problem("source", f"Value differs from the source: {message}", file, index, offset,
                                    spec.name))
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
        return {"patterns": list(patterns), "mode": self.mode, "rows": self.rows, "compared": self.compared}


class SequentialComparer(_Comparer):
    """Compares records with source rows in order: the planned writer writes shards in row order.

    Rows are read one planned row range at a time and compared in vectorized chunks of up to 4096 rows.
    A shard with fewer records than its metadata count (cut short) skips the rest of its rows; records
    beyond its count are not compared (the count problem is reported), so later shards stay aligned.
    """

    mode = "sequential"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ranges = ((plan, rr) for plan in self.plans for rr in plan.ranges)
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
        if len(self._pending) >= _CHUNK_ROWS:
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

    The source is read once first, one row range at a time, keeping a 16-byte digest per row; each
    record's digest is then looked up by its provenance. A row whose digest differs is read again alone
    and compared feature by feature, for a precise report. Rows without a record (beyond the
    dead-lettered count) and duplicated rows are problems.
    """

    mode = "provenance"

    def __init__(self, plans, specs, allow_lossy, report, same_paths, dead_rows: int, progress: Progress):
        super().__init__(plans, specs, allow_lossy, report, same_paths)
        self.data_specs = [s for s in self.specs if s.name not in (PROVENANCE_FILE, PROVENANCE_ROW)]
        self.dead_rows = dead_rows
        self._indexes = [(plan, index) for plan in self.plans for index in plan.indexes]
        self._digests = [np.zeros((index.num_rows, 16), np.uint8) for _, index in self._indexes]
        self._seen = [np.zeros(index.num_rows, bool) for _, index in self._indexes]
        self._unreadable: dict[int, tuple[np.ndarray, str]] = {}  # index -> (rows mask, error): dead letters?
        self._by_path: dict[str, int] = {}
        names: dict[str, list[int]] = {}
        for k, (_, index) in enumerate(self._indexes):
            for path in (index.items if index.item_files else (index.path,)):
                self._by_path[path] = k
                names.setdefault(fileio.basename(path), []).append(k)
        self._by_name = {n: ks[0] for n, ks in names.items() if len(set(ks)) == 1}
        progress.start("reading the source", self.rows, "rows")
        index_rows = [index.num_rows for _, index in self._indexes]
        for plan in self.plans:
            slots = {index.path: k for k, (p, index) in enumerate(self._indexes) if p is plan}
            for rr in plan.ranges:
                k = slots[rr.path]
                columns = self.expected_columns(plan, rr, self.data_specs, report_errors=False)
                if columns is None:  # a problem only if a record claims one of its rows
                    mask, _ = self._unreadable.setdefault(k, (np.zeros(index_rows[k], bool), self.read_error))
                    mask[rr.start:rr.stop] = True
                else:
                    for i in range(rr.num_rows):
                        self._digests[k][rr.start + i] = np.frombuffer(
                            _digest([_row(columns[s.name], i) for s in self.data_specs]), np.uint8)
                progress.update(rr.num_rows)
        progress.close()

    def feed(self, file, index, offset, decoded) -> None:
        if decoded is None:
            return
        source_file = bytes(np.asarray(decoded[PROVENANCE_FILE]).item()).decode("utf-8", errors="replace")
        row = int(np.asarray(decoded[PROVENANCE_ROW]).reshape(-1)[0])
        k = self._by_path.get(source_file, self._by_name.get(fileio.basename(source_file)))
        if k is None or not 0 <= row < len(self._seen[k]):
            self.report.add(Problem("source", f"The record's provenance ({source_file!r}, row {row}) is not a "
                                    "row of the source", file, index, offset, PROVENANCE_FILE))
            return
        if self._seen[k][row]:
            self.report.add(Problem("source", f"Row {row} of {source_file!r} appears in more than one record",
                                    file, index, offset, PROVENANCE_ROW))
            return
        self._seen[k][row] = True
        if k in self._unreadable and self._unreadable[k][0][row]:
            self.report.add(Problem("source", f"Not compared: {self._unreadable[k][1]}", file, index, offset))
            return
        self.compared += 1
        got = _digest([decoded[s.name] for s in self.data_specs])
        if got != self._digests[k][row].tobytes():
            self._compare_one(k, row, file, index, offset, decoded)

    def _compare_one(self, k, row, file, index, offset, decoded) -> None:
        from transforms.sources import RowRange
        plan, fi = self._indexes[k]
        items = fi.items[row:row + 1] if fi.sizes else fi.items
        columns = self.expected_columns(plan, RowRange(fi.path, row, row + 1, items, fi.item_files), self.data_specs)
        if columns is None:
            return
        for spec in self.data_specs:
            self.compare_row(spec, np.asarray(_row(columns[spec.name], 0)), decoded[spec.name], file, index, offset)

    def finish(self) -> None:
        unseen = int(sum((~s).sum() for s in self._seen))
        if self.dead_rows:
            self.report.warnings.append(f"{self.dead_rows} source rows were dead-lettered when converting: they "
                                        "have no record")
        if unseen != self.dead_rows:
            first = next(((self._indexes[k][1], int(np.flatnonzero(~s)[0])) for k, s in enumerate(self._seen)
                          if (~s).any()), None)
            where = f" (first: row {first[1]} of '{first[0].path}')" if first else ""
            self.report.add(Problem("source", f"{unseen} source rows have no record in the output{where}, "
                                    f"{self.dead_rows} were dead-lettered"))


def make_comparer(meta: dict, patterns: Sequence[str], report: Report, progress: Progress, where: str = ""):
    """The comparer for an output: sequential for the planned writer (without dead-lettered rows), else
    matched by provenance. Returns None (with a problem) when the source's features differ.

    Raises:
      ConfigError: exact comparison is impossible (records out of row order and no provenance features),
        or the metadata holds no convert options.
    """
    specs = list(meta["features"])
    names = {s.name for s in specs}
    has_provenance = {PROVENANCE_FILE, PROVENANCE_ROW} <= names
    dead = int(meta.get("rows_dead_lettered") or 0)
    sequential = meta.get("writer") == "planned" and not dead
    if not sequential and not has_provenance:
        why = f"{dead} rows were dead-lettered" if dead else \
            f"the records are not in source row order (writer {meta.get('writer')!r})"
        raise ConfigError(f"Exact comparison with the source needs the {PROVENANCE_FILE} and {PROVENANCE_ROW} "
                          f"features: {why} and the output has no provenance", file=where or None,
                          hint="re-convert with --provenance, or with the planned writer (--writer planned)")
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
            report.add(Problem("source", f"The source's features ({have}) differ from the output's ({want}): "
                               "not compared", file=pattern))
            return None
    total = sum(p.num_rows for p in plans)
    expected = int(meta.get("num_records") or 0) + dead
    if total != expected:
        report.add(Problem("source", f"The source holds {total} rows, the output {meta.get('num_records')} records "
                           f"and {dead} dead-lettered rows"))
    same_paths = list(patterns) == [meta["options"].get("input")]
    lossy = tuple(meta["options"].get("allow_lossy") or ())
    if sequential:
        return SequentialComparer(plans, specs, lossy, report, same_paths)
    return ProvenanceComparer(plans, specs, lossy, report, same_paths, dead, progress)


# ----------------------------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------------------------

def verify(target: str, sources: Sequence[str] = (), progress: Progress | None = None,
           max_problems: int = 100, *, originals: Sequence[str] = (), max_record_bytes: int | None = None,
           max_features: int | None = None) -> Report:
    """Verifies an output directory (with ``metadata.json``), a sidecar collection, or plain TFRecord files.

    Args:
      target: an output directory of tfrecord-etl, or a file / glob of TFRecord files without metadata.
      sources: file patterns of the convert input; every array is then compared with it exactly
        (output directories only).
      progress: receives the stored bytes read (default: none).
      max_problems: findings kept in the report (all are counted).
      originals: directories or file patterns of a sidecar's original collection; only these files are
        read as originals (paired by file name with the manifest's entries). Without them the originals
        are not checked (a warning says so).
      max_record_bytes: limit on one record's length header, checked before it is read (default
        ``tfrecord.record_limit()``, 1024 MB). max_features: limit on the features of one record and on
        the distinct names of plain files (default ``codec.MAX_FEATURES``).

    Raises:
      IncompleteOutputError: a directory without ``metadata.json``.
      SchemaError: an invalid ``metadata.json`` (e.g. a shard path leaving the directory).
      ConfigError: ``sources`` for plain files, or an exact comparison that is impossible for this output.
      SourceError: nothing matches ``target`` or a source pattern.
    """
    progress = progress or Progress()
    if fileio.is_dir(target) or fileio.exists(fileio.join(target, metadata.METADATA_FILE)):
        return verify_output(target, sources, progress, max_problems, originals=originals,
                             max_record_bytes=max_record_bytes, max_features=max_features)
    if sources:
        raise ConfigError("--source needs an output directory with metadata.json (it holds the convert options)",
                          file=target)
    if originals:
        raise ConfigError("--original needs a sidecar collection (an output directory with manifest.json)",
                          file=target)
    return verify_files(target, progress, max_problems, max_record_bytes=max_record_bytes,
                        max_features=max_features)


def _framing_problem(report: Report, e: RecordError, path: str, compression: str) -> None:
    message = e.message
    if e.context.get("record") == 0:
        try:
            with fileio.open_read(path) as raw:
                looks = tfrecord.detect_compression(raw.read(12))
        except SourceError:
            looks = compression
        if looks != compression:
            looks = "uncompressed" if looks == "none" else f"{looks}-compressed"
            message += f" (the file looks {looks}, but is read with compression {compression})"
    if e.hint:
        message += f"; {e.hint}"
    report.add(Problem("framing", message, path, e.context.get("record"), e.context.get("offset")))


def _decode_problem(kind: str, e, path: str, index: int, offset: int) -> Problem:
    message = e.message
    if e.context.get("offset") is not None:
        message += f" (at byte {e.context['offset']} of the record's payload)"
    return Problem(kind, message, path, index, offset, e.context.get("feature"))


def verify_output(output_dir: str, sources: Sequence[str] = (), progress: Progress | None = None,
                  max_problems: int = 100, *, originals: Sequence[str] = (), max_record_bytes: int | None = None,
                  max_features: int | None = None) -> Report:
    """Verifies an output directory (see the module docstring); raises as :func:`verify`."""
    started = time.time()
    progress = progress or Progress()
    meta = metadata.load(output_dir)
    if meta.get("compression") not in tfrecord.COMPRESSIONS:
        raise SchemaError(f"Invalid metadata.json: compression {meta.get('compression')!r}",
                          file=fileio.join(output_dir, metadata.METADATA_FILE))
    has_manifest = fileio.exists(fileio.join(output_dir, MANIFEST_FILE))
    report = Report(output_dir, "sidecar" if has_manifest else "output", meta["compression"], list(meta["features"]),
                    expected_records=meta.get("num_records"), max_problems=max_problems)
    comparer = make_comparer(meta, sources, report, progress, output_dir) if sources else None
    specs = list(meta["features"])
    shards = list(zip(meta["shards"], metadata.shard_paths(output_dir, meta)))
    sizes = {path: file_size(path) for _, path in shards}
    progress.start("verifying", sum(s for s in sizes.values() if s))
    for shard, path in shards:
        expected = shard["records"]
        fr = FileReport(path, meta["compression"], 0, expected, sizes[path])
        report.files.append(fr)
        if comparer:
            comparer.begin_shard(expected)
        if sizes[path] is None:
            fr.complete = False
            report.add(Problem("missing", f"Shard listed in metadata.json is missing ({expected} records)", path))
        else:
            if isinstance(shard.get("bytes"), int) and shard["bytes"] != sizes[path]:
                report.add(Problem("size", f"File holds {sizes[path]} bytes, metadata.json says {shard['bytes']}",
                                   path))
            _read_shard(report, fr, path, meta["compression"], specs, comparer, progress, max_record_bytes,
                        max_features)
            if fr.complete and fr.records != expected:
                report.add(Problem("count", f"Shard holds {fr.records} records, metadata.json says {expected}", path))
        if comparer:
            comparer.end_shard()
    progress.close()
    listed = sum(s["records"] for s, _ in shards)
    if meta.get("num_records") != listed:
        report.add(Problem("count", f"metadata.json says num_records {meta.get('num_records')} but its shards "
                           f"hold {listed}", fileio.join(output_dir, metadata.METADATA_FILE)))
    if comparer:
        comparer.finish()
        for plan in comparer.plans:
            plan.source.close()
        report.source = comparer.summary(sources)
    if has_manifest:
        _check_manifest(report, output_dir, {fileio.basename(f.file): f for f in report.files}, progress,
                        originals, max_record_bytes)
    elif originals:
        raise ConfigError("--original needs a sidecar collection: this output has no manifest.json", file=output_dir)
    report.warnings += _unlisted_files(output_dir, {s["file"] for s, _ in shards})
    report.seconds = time.time() - started
    return report


def _read_shard(report: Report, fr: FileReport, path: str, compression: str, specs, comparer, progress,
                max_record_bytes: int | None = None, max_features: int | None = None) -> None:
    try:
        tfrecord.check_regular(path)
    except SourceError as e:
        fr.complete = False
        report.add(Problem("unreadable", e.message, path))
        return
    try:
        for index, offset, record in _records(path, compression, progress, None, max_record_bytes):
            fr.records += 1
            try:
                decoded = codec.decode_example(record, specs, max_features)
            except (RecordError, SchemaError) as e:
                reason = not_example_reason(record)
                if reason:
                    e = RecordError(f"Not a tf.train.Example: {reason}")
                report.add(_decode_problem("not_example" if reason else "decode", e, path, index, offset))
                decoded = None
            if comparer:
                comparer.feed(path, index, offset, decoded)
    except RecordError as e:
        fr.complete = False
        _framing_problem(report, e, path, compression)


def _unlisted_files(output_dir: str, listed: set) -> list[str]:
    try:
        found = list(outdir.list_names(output_dir))
    except Exception:  # noqa: BLE001 - an unlistable directory only loses the warnings
        return []
    out = []
    for name in sorted(set(found) - listed - _KNOWN_FILES):
        if name.startswith("."):
            out.append(f"{name}: a temporary file (of a killed or retried attempt); the next run removes it")
        else:
            out.append(f"{name}: not listed in metadata.json; readers that glob the directory would read it")
    return out


def _check_manifest(report: Report, sidecar_dir: str, counted: dict, progress: Progress,
                    originals: Sequence[str] = (), max_record_bytes: int | None = None) -> None:
    """Sidecar shard counts against ``manifest.json``; with ``originals`` (directories or patterns the user
    named), each original shard's count, size and CRC32C.

    The manifest's ``input`` paths are never opened: an original is the file of the same name among the
    files ``originals`` names (regular files only; a FIFO or device is never opened).
    """
    import google_crc32c
    from transforms.reader import _original_files, load_manifest
    try:
        manifest = load_manifest(sidecar_dir)
    except SchemaError as e:
        report.add(Problem("manifest", e.message, fileio.join(sidecar_dir, MANIFEST_FILE)))
        return
    named: dict[str, str] = {}
    for pattern in originals:
        try:
            named.update(_original_files(pattern))
        except SourceError as e:
            report.add(Problem("manifest", f"--original {pattern}: {e.message}", e.context.get("file", pattern)))
    checked, unreachable, not_named = 0, [], 0
    for entry in manifest["shards"]:
        side = counted.get(entry["sidecar"])
        side_path = fileio.join(sidecar_dir, entry["sidecar"])
        if side is None:
            report.add(Problem("manifest", "Sidecar shard of manifest.json is not listed in metadata.json",
                               side_path))
        elif side.complete and side.records != entry["records"]:
            report.add(Problem("manifest", f"Sidecar shard holds {side.records} records, manifest.json says "
                               f"{entry['records']} (its original's count): misaligned pair", side_path))
        if not originals:
            not_named += 1
            continue
        original = named.get(fileio.basename(entry["input"]))
        if original is None:
            unreachable.append(fileio.basename(entry["input"]))
            continue
        size = file_size(original)
        checked += 1
        if size != entry["bytes"]:
            report.add(Problem("manifest", f"Original shard changed after its sidecar was written ({size} bytes, "
                               f"manifest.json: {entry['bytes']})", original))
            continue
        checksum, count = google_crc32c.Checksum(), 0
        try:
            for _ in _records(original, entry["compression"], progress, checksum, max_record_bytes):
                count += 1
        except RecordError as e:
            report.add(Problem("manifest", f"Original shard is corrupt: {e.message}", original,
                               e.context.get("record"), e.context.get("offset")))
            continue
        crc = checksum.hexdigest().decode()
        if count != entry["records"]:
            report.add(Problem("manifest", f"Original shard holds {count} records, manifest.json says "
                               f"{entry['records']}: misaligned pair", original))
        if crc != entry["crc32c"]:
            report.add(Problem("manifest", f"Original shard changed after its sidecar was written (CRC32C {crc}, "
                               f"manifest.json: {entry['crc32c']})", original))
    if not_named:
        report.warnings.append(f"{not_named} original shards were not checked: verify reads only the files it is "
                               "given, never the paths in manifest.json; pass --original DIR_OR_PATTERN (the "
                               "collection the sidecar was written for) to check their counts, sizes and CRC32Cs")
    if unreachable:
        report.warnings.append(f"{len(unreachable)} original shards are not among the --original files (first: "
                               f"{printable(unreachable[0])}): their counts and checksums were not checked")
    report.manifest = {"shards": len(manifest["shards"]), "originals_checked": checked,
                       "originals_unreachable": len(unreachable), "originals_not_named": not_named}


def verify_files(pattern: str, progress: Progress | None = None, max_problems: int = 100,
                 sample_records: int = SAMPLE_RECORDS, *, max_record_bytes: int | None = None,
                 max_features: int | None = None) -> Report:
    """Verifies plain TFRecord files: framing, CRCs, each record a tf.train.Example, one kind per feature.

    The features are inferred from the first ``sample_records`` Examples; a later feature with another
    kind is a ``kind`` problem. Compression is told per file (suffix, else first bytes). A record over
    ``max_record_bytes`` is a ``framing`` problem (reading that file stops there, before the record is
    read); a record with more than ``max_features`` features a ``not_example`` one; names beyond
    ``max_features`` distinct ones one ``features`` problem (they are not tracked further).

    Raises:
      SourceError: nothing matches ``pattern``, or a match is not a regular file.
    """
    feature_limit = codec.MAX_FEATURES if max_features is None else max_features
    started = time.time()
    progress = progress or Progress()
    files = list_record_files(pattern)
    report = Report(pattern, "files", inferred=True, max_problems=max_problems)
    progress.start("verifying", sum(s for _, s in files))
    sample: list[bytes] = []
    kinds: dict[str, str] = {}
    too_many = False
    compressions = set()
    for path, size in files:
        compression = file_compression(path)
        compressions.add(compression)
        fr = FileReport(path, compression, 0, None, size)
        report.files.append(fr)
        try:
            for index, offset, record in _records(path, compression, progress, None, max_record_bytes):
                fr.records += 1
                try:
                    parsed = check_example(record, feature_limit)
                except RecordError as e:
                    report.add(_decode_problem("not_example", e, path, index, offset))
                    continue
                if len(sample) < sample_records:
                    sample.append(record)
                for name, (kind, _) in parsed.items():
                    if kind is None:
                        continue
                    if name not in kinds and len(kinds) >= feature_limit:
                        if not too_many:
                            too_many = True
                            report.add(Problem("features", f"More than {feature_limit} distinct feature names "
                                               f"(--max_features {feature_limit}); later new names are not checked",
                                               path, index, offset))
                        continue
                    seen = kinds.setdefault(name, kind)
                    if seen != kind:
                        report.add(Problem("kind", f"Feature holds a {kind} list here, a {seen} list in earlier "
                                           "records", path, index, offset, name))
        except RecordError as e:
            fr.complete = False
            _framing_problem(report, e, path, compression)
    progress.close()
    report.compression = compressions.pop() if len(compressions) == 1 else "mixed"
    try:
        report.features = list(codec.infer_feature_specs(sample, feature_limit))
    except (SchemaError, RecordError) as e:  # already reported record by record (kind, features)
        report.warnings.append(f"features not inferred: {e.message}")
    report.seconds = time.time() - started
    return report
