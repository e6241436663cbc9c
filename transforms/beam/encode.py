"""Encoding: the columns of a row range -> serialized ``tf.train.Example`` records, as one vectorized call per
range, with the settings every encoding step shares (:class:`EncodeSettings`)."""

from __future__ import annotations

import dataclasses
import logging

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from tfrecord_etl.transforms.beam.deadletters import DEAD_LETTERS, dead_letter
from tfrecord_etl.transforms.beam.metrics import NAMESPACE
from tfrecord_etl.transforms.codec import EncodedBatch, FeatureSpec, encode_columns
from tfrecord_etl.transforms.collections import sharding
from tfrecord_etl.transforms.collections.splits import SplitPlan
from tfrecord_etl.transforms.errors import InputChangedError, RecordError, SchemaError
from tfrecord_etl.transforms.output.runlock import CarriesRun
from tfrecord_etl.transforms.planning import add_provenance
from tfrecord_etl.transforms.sources import RowRange, Source

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """How the rows of a range become Examples, the same for every range of a run (pickled with the DoFns that
    encode: ``ReadAndEncodeFn``, ``KeyShuffledRecordsFn``, ``write.WriteShardFn``).

    Attributes:
      specs: one ``FeatureSpec`` per feature, in the order of the Examples' features.
      allow_lossy: the feature names whose narrowing casts are allowed (``--allow_lossy``).
      provenance: add the ``_source/file`` / ``_source/row`` features (``--provenance``).
      dead_letters: a range that fails becomes a dead letter instead of failing the run (``--dead_letter_dir``).
      split_plan: the rows' splits (``--splits``), or None: one output.

    Raises:
      TypeError: a spec that is not a ``FeatureSpec``, or ``allow_lossy`` given as one string (a sequence of names
        is expected), found at construction rather than on a worker.
    """

    specs: tuple[FeatureSpec, ...]
    allow_lossy: tuple[str, ...] = ()
    provenance: bool = False
    dead_letters: bool = False
    split_plan: SplitPlan | None = None

    def __post_init__(self):
        if isinstance(self.allow_lossy, str):
            raise TypeError(f"allow_lossy is a sequence of feature names, not the string {self.allow_lossy!r}")
        object.__setattr__(self, "specs", tuple(self.specs))
        object.__setattr__(self, "allow_lossy", tuple(self.allow_lossy))
        bad = [s for s in self.specs if not isinstance(s, FeatureSpec)]
        if bad:
            raise TypeError(f"specs must be FeatureSpecs; got {type(bad[0]).__name__}: {bad[0]!r}")

    @classmethod
    def of(cls, plan, cfg, splits: bool = True) -> EncodeSettings:
        """The settings of a convert run: ``plan`` a ``planning.ConvertPlan``, ``cfg`` its ``ConvertConfig``;
        ``splits=False``: without the plan's splits (one stream of records, as ``ReadAndEncodeFn`` yields)."""
        split_plan = plan.split_plan if splits else None
        return cls(plan.specs, cfg.allow_lossy, cfg.provenance, cfg.dead_letter_dir is not None, split_plan)


def encode_range(rr: RowRange, columns: dict, settings: EncodeSettings) -> EncodedBatch:
    """Encodes the columns of one row range (``{name: (rows, *shape)}``) in one vectorized call; a RecordError
    gets the range's file and rows. With ``provenance`` the ``_source/file`` / ``_source/row`` columns are added."""
    if settings.provenance:
        columns = add_provenance(rr, columns)
    try:
        return encode_columns(columns, settings.specs, rr.num_rows, settings.allow_lossy)
    except RecordError as e:
        raise e.with_context(file=rr.path, rows=f"{rr.start}-{rr.stop - 1}") from None


class EncodeExamplesFn(CarriesRun, beam.DoFn):
    """Encodes a batch of columns into serialized Examples, one vectorized call per batch; yields one record
    (bytes) per row."""

    def __init__(self, settings: EncodeSettings):
        self._settings = settings
        self._examples = Metrics.counter(NAMESPACE, "examples_encoded")

    def process(self, element):
        rr, columns = element
        batch = encode_range(rr, columns, self._settings)
        self._examples.inc(rr.num_rows)
        yield from batch.records()


class EncodeExamples(beam.PTransform):
    """``(RowRange, columns)`` batches -> serialized ``tf.train.Example`` records (bytes)."""

    def __init__(self, specs, allow_lossy=(), provenance=False):
        super().__init__()
        self._fn = EncodeExamplesFn(EncodeSettings(specs, allow_lossy, provenance))

    def expand(self, batches):
        return batches | "EncodeBatches" >> beam.ParDo(self._fn)


def encode_splits(
    rr: RowRange, columns: dict, settings: EncodeSettings
) -> list[tuple[int, np.ndarray | None, EncodedBatch]]:
    """Encodes the columns of one row range as ``[(split number, rows, batch)]``: one batch (split 0, ``rows``
    None: all of them) without ``settings.split_plan``, else one per split that holds rows of the range
    (``SplitPlan.assign``), ``rows`` their positions in the range (int64), each in row order and encoded in one
    call; a ``by_record`` plan encodes the range once and splits the encoded records (``SplitPlan.split_batch``)."""
    split_plan = settings.split_plan
    if split_plan is None or not split_plan.hashed:
        return [(0, None, encode_range(rr, columns, settings))]
    if split_plan.by_record:
        try:
            return split_plan.split_batch(encode_range(rr, columns, settings))
        except RecordError as e:
            raise e.with_context(file=rr.path, rows=f"{rr.start}-{rr.stop - 1}") from None
    if settings.provenance:
        columns = add_provenance(rr, columns)
    try:
        ids = split_plan.assign(rr.path, rr.start, rr.num_rows, columns)
        out = []
        for k in range(len(split_plan.names)):
            rows = np.flatnonzero(ids == k)
            if rows.size:
                part = (
                    columns
                    if rows.size == rr.num_rows
                    else {
                        name: col[rows] if isinstance(col, np.ndarray) else [col[i] for i in rows]
                        for name, col in columns.items()
                    }
                )
                out.append(
                    (
                        k,
                        None if rows.size == rr.num_rows else rows,
                        encode_columns(part, settings.specs, int(rows.size), settings.allow_lossy),
                    )
                )
        return out
    except (RecordError, SchemaError) as e:
        raise e.with_context(file=rr.path, rows=f"{rr.start}-{rr.stop - 1}") from None


def read_and_encode(
    source: Source, rr: RowRange, settings: EncodeSettings
) -> tuple[list[tuple[int, np.ndarray | None, EncodedBatch]], list[dict]]:
    """Reads and encodes one row range: ``([(split, rows, batch)...], [])`` (:func:`encode_splits`); with
    ``settings.dead_letters`` a range that fails becomes ``([], [letter])``, except that a range of several files
    (``files`` / npy ``files`` modes: one file per row) is retried file by file, so only the files that fail
    become letters and the others are written.

    Raises:
      Exception: whatever reading or encoding raised, when not ``dead_letters``. InputChangedError: a file changed
        since planning (``Source.read_pinned``), dead letters or not.
    """
    try:
        return encode_splits(rr, source.read_pinned(rr), settings), []
    except Exception as e:  # noqa: BLE001 - any failure of one range is its dead letter
        if not settings.dead_letters or isinstance(e, InputChangedError):  # a changed input stops the run
            raise
        if not (rr.item_files and rr.num_rows > 1):
            log.warning("Dead-lettering %s: %s", rr.describe(), e)
            return [], [dead_letter(rr, e)]
    batches, letters = [], []
    for i in range(rr.num_rows):
        one = RowRange(rr.path, rr.start + i, rr.start + i + 1, rr.items[i : i + 1], True)
        b, d = read_and_encode(source, one, settings)
        batches += [(k, i + (np.arange(batch.num_rows) if rows is None else rows), batch) for k, rows, batch in b]
        letters += d
    return batches, letters


class RangeEncodeFn(CarriesRun, beam.DoFn):
    """What the beam writer's DoFns share: a row range read and encoded (:func:`read_and_encode`) with the counters
    ``rows_read``, ``examples_encoded`` and ``rows_dead_lettered``, its dead letters yielded to the
    ``dead_letters`` output (:meth:`read_range`), and the source's open files closed after each bundle."""

    def __init__(self, source: Source, settings: EncodeSettings):
        self._source, self._settings = source, settings
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._examples = Metrics.counter(NAMESPACE, "examples_encoded")
        self._dead = Metrics.counter(NAMESPACE, "rows_dead_lettered")

    def read_range(self, rr: RowRange):
        """Reads and encodes ``rr``: yields its dead letters (``TaggedOutput(DEAD_LETTERS, letter)``) and returns
        its ``(split, rows, EncodedBatch)`` batches (``batches = yield from self.read_range(rr)``)."""
        batches, letters = read_and_encode(self._source, rr, self._settings)
        self._rows.inc(rr.num_rows)
        for letter in letters:
            self._dead.inc(letter["rows"])
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, letter)
        return batches

    def finish_bundle(self):
        self._source.close()  # files stay open between the ranges of a bundle, not after it


class ReadAndEncodeFn(RangeEncodeFn):
    """Reads and encodes one RowRange, yielding serialized records (one per element, for
    WriteToTFRecord); a failing range goes to the ``dead_letters`` output when ``settings.dead_letters``."""

    def __init__(self, source: Source, settings: EncodeSettings):
        super().__init__(source, settings)
        self._bytes = Metrics.counter(NAMESPACE, "bytes_read")

    def process(self, rr: RowRange):
        batches = yield from self.read_range(rr)
        for _, _, batch in batches:
            self._examples.inc(batch.num_rows)
            yield from batch.records()


class KeyShuffledRecordsFn(RangeEncodeFn):
    """``--shuffle_seed``: reads and encodes one row range and yields each record as ``((split, shard), (key,
    record))``, ``key`` = ``sharding.shuffle_keys(seed, global row)`` and ``shard = key % num_shards``; a failing
    range goes to the ``dead_letters`` output when ``settings.dead_letters``. ``row_offsets``: each input
    file's first global row."""

    def __init__(self, source: Source, settings: EncodeSettings, row_offsets: dict, num_shards: int, seed: int):
        super().__init__(source, settings)
        self._offsets, self._n, self._seed = dict(row_offsets), num_shards, seed

    def process(self, rr: RowRange):
        batches = yield from self.read_range(rr)
        start = self._offsets[rr.path] + rr.start
        for split, rows, batch in batches:
            self._examples.inc(batch.num_rows)
            rows = np.arange(batch.num_rows) if rows is None else rows
            keys = sharding.shuffle_keys(self._seed, start + rows)
            shards = sharding.shuffled_shards(keys, self._n)
            for key, shard, record in zip(keys.tolist(), shards.tolist(), batch.records()):
                yield (split, shard), (key, record)
