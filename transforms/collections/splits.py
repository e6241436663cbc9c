"""Named splits of one conversion (train / validation / test): which rows go where, and the shard file names.

Pure functions (no Beam, no TensorFlow). ``--splits train=8,validation=1,test=1`` assigns every row to a split by
a hash, the way TFX ExampleGen's ``SplitConfig(hash_buckets=...)`` does (``tfx/components/example_gen/
base_example_gen_executor.py``, ``_PartitionFn``): ``bucket = int(sha256(key).hexdigest(), 16) % sum(weights)``,
and the split is the first whose cumulative weight is above the bucket. The key is TFX's for
``partition_feature_name``, the serialized ``tf.train.Feature`` of the ``--split_key FEATURE`` value (so TFX with
the same buckets and feature puts each example in the same split), or, without it, the row's global index in the
input (file order, then row order) as decimal digits (TFX hashes the whole serialized record instead, which would
tie the split to the encoding). The assignment depends only on
the key, never on the runner, the shard count or the order of work: a rerun gives the same splits, and a row keeps
its split when rows are added elsewhere (with ``--split_key``).

A plan ``by_record`` (the ExampleGen of ``tfrecord_etl.tfx``, which keeps TFX's assignment exactly) hashes the
records as encoded instead of the columns: without a key, the whole serialized record (TFX's key for a record
given as bytes); with one, the bytes of that feature's ``tf.train.Feature`` inside the record (any feature of
kind ``bytes_list`` or ``int64_list``, as TFX's ``partition_feature_name``: the record is protobuf's
deterministic serialization, so these bytes are ``Feature.SerializeToString(deterministic=True)``).

``--split NAME`` puts every row in one named split (a TFDS directory gets one split per run).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfrecord_etl.transforms.codec import encode_varint, length_delimited_field, split_features
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError

SPLIT_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")  # TFDS split names: letters, digits, underscores
MAX_SPLITS = 32


def check_split_name(name: str, flag: str = "--splits") -> str:
    """``name`` when it is a usable split name (letters, digits, underscores; TFDS parses ``train[:10%]``).

    Raises:
      ConfigError: naming the flag and the name.
    """
    if not isinstance(name, str) or not SPLIT_NAME.match(name):
        raise ConfigError(
            f"{flag}: split name {name!r} must be 1-64 letters, digits or underscores",
            hint="e.g. --splits train=8,validation=1,test=1",
        )
    return name


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """How one run's rows are split.

    Attributes:
      names: the split names, in the order given. weights: their hash-bucket counts (TFX ``hash_buckets``); a
        single split (``--split NAME``) has weight 1 and takes every row. key: the ``--split_key`` feature, or
        None for the global row index. offsets: ``{path: rows before that file}`` for the row-index key.
      by_record: hash the encoded records (:meth:`assign_records`): the whole record, or with ``key`` the
        serialized ``tf.train.Feature`` of that (Example) feature in it.
    """

    names: tuple[str, ...]
    weights: tuple[int, ...]
    key: str | None = None
    offsets: tuple[tuple[str, int], ...] = ()
    by_record: bool = False

    @property
    def hashed(self) -> bool:
        return len(self.names) > 1

    def with_offsets(self, rows_per_file: Sequence[tuple[str, int]]) -> SplitPlan:
        """The plan with the global row offset of each file (``[(path, rows)]`` in input order)."""
        out, acc = [], 0
        for path, rows in rows_per_file:
            out.append((path, acc))
            acc += rows
        return dataclasses.replace(self, offsets=tuple(out))

    def assign_keys(self, keys: Sequence[bytes]) -> np.ndarray:
        """The split number (index into :attr:`names`) of each key: TFX's sha256 hash buckets."""
        if not self.hashed:
            return np.zeros(len(keys), np.int64)
        bounds = list(itertools.accumulate(self.weights))  # Python ints: the sha256 value has 256 bits
        total = bounds[-1]
        return np.array([bisect.bisect(bounds, int(hashlib.sha256(k).hexdigest(), 16) % total) for k in keys], np.int64)

    def assign(
        self, path: str, start: int, num_rows: int, columns: Mapping[str, object], global_start: int | None = None
    ) -> np.ndarray:
        """The split number of each row of a row range (``path`` rows ``start`` to ``start + num_rows``; ``columns``
        its values). ``global_start``: the range's first global row when known (files modes), else from
        :attr:`offsets`.

        Raises:
          SchemaError: a ``--split_key`` value that is not one integer or one byte string.
        """
        if not self.hashed:
            return np.zeros(num_rows, np.int64)
        if self.key is None:
            if global_start is None:
                global_start = dict(self.offsets)[path] + start
            return self.assign_keys([str(i).encode() for i in range(global_start, global_start + num_rows)])
        return self.assign_keys(key_bytes(self.key, columns[self.key], num_rows))

    def assign_records(self, records: Sequence, same_layout: bool = False) -> np.ndarray:
        """The split number of each serialized Example (bytes or a uint8 buffer) of a ``by_record`` plan: TFX's
        ``_PartitionFn`` on the record as bytes (key: the whole record) or, with :attr:`key`, on the parsed
        Example with ``partition_feature_name`` (key: the Feature's bytes, :func:`record_feature_key`).
        ``same_layout``: every record has the same framing (rows of one ``codec.FixedLayout``), so the feature
        is located once.

        Raises:
          RecordError: with :attr:`key`, a record without that feature, or whose Feature has no value kind or is
            a ``float_list`` (TFX refuses them too); ``batch_row`` names the record.
        """
        if not self.hashed:
            return np.zeros(len(records), np.int64)
        if self.key is None:
            return self.assign_keys(records)
        if same_layout and records:
            start, stop = record_feature_span(bytes(records[0]), self.key)
            return self.assign_keys([r[start:stop] for r in records])
        return self.assign_keys([record_feature_key(r, self.key, i) for i, r in enumerate(records)])

    def split_batch(self, batch) -> list[tuple[int, np.ndarray | None, Any]]:
        """A ``codec.EncodedBatch`` as ``[(split number, rows, batch)]`` by :meth:`assign_records`: one entry per
        split that holds rows, ``rows`` their positions in ``batch`` (int64; None: all of them), each batch in row
        order.

        Raises:
          RecordError: as :meth:`assign_records`.
        """
        batch, views = batch.record_views()
        parts = batch.parts if batch.parts is not None else [batch]
        ids, start = [], 0
        for part in parts:  # each part of a joined batch is a layout of its own
            fixed = part.parts is None and part.padded is None and part.tails is None
            ids.append(self.assign_records(views[start : start + part.num_rows], fixed))
            start += part.num_rows
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        out = []
        for k in range(len(self.names)):
            rows = np.flatnonzero(ids == k)
            if rows.size == batch.num_rows:
                return [(k, None, batch)]
            if rows.size:
                out.append((k, rows, batch.take(rows)))
        return out


_FEATURE_KINDS = {0x0A: "bytes_list", 0x12: "float_list", 0x1A: "int64_list"}  # Feature's oneof tags (wire type 2)


def record_feature_span(record: bytes, name: str, row: int = 0) -> tuple[int, int]:
    """The ``(start, stop)`` byte slice of feature ``name``'s ``tf.train.Feature`` in a serialized Example, checked
    as TFX's ``_GeneratePartitionKey`` checks it.

    Raises:
      RecordError: no such feature, a Feature with no value kind, or a ``float_list`` one (naming ``batch_row``).
    """
    spans = split_features(record)
    if name not in spans:
        raise RecordError(
            f"Partition feature '{name}' is not in the record",
            feature=name,
            batch_row=row,
            hint=f"the record's features are {sorted(spans)}",
        )
    start, stop = spans[name]
    kind = _FEATURE_KINDS.get(record[start]) if stop > start else None
    if kind not in ("bytes_list", "int64_list"):
        raise RecordError(
            f"Partition feature '{name}' must be a bytes_list or int64_list with a value, not "
            f"{kind or 'a Feature with no value'}",
            feature=name,
            batch_row=row,
        )
    return start, stop


def record_feature_key(record, name: str, row: int = 0) -> bytes:
    """TFX's partition key of a serialized Example (bytes or a uint8 buffer) for ``partition_feature_name``
    ``name``: the bytes of that feature's ``tf.train.Feature`` (see :func:`record_feature_span`)."""
    record = bytes(record)
    start, stop = record_feature_span(record, name, row)
    return record[start:stop]


def feature_key(value) -> bytes:
    """TFX's partition key of a one-value feature: the deterministic serialization of its ``tf.train.Feature``
    (``Feature{int64_list{value: [v]}}`` for an integer, ``Feature{bytes_list{value: [b]}}`` for bytes), built
    here without TensorFlow."""
    if isinstance(value, bytes):
        return length_delimited_field(
            1, length_delimited_field(1, value)
        )  # Feature.bytes_list (1) { BytesList.value (1) }
    return length_delimited_field(
        3, length_delimited_field(1, encode_varint(int(value) & 0xFFFFFFFFFFFFFFFF))
    )  # int64_list (3), packed


def key_bytes(name: str, column, num_rows: int) -> list[bytes]:
    """The hash keys of a ``--split_key`` column (one integer or one byte string per row; str as UTF-8): TFX's
    ``partition_feature_name`` key of each value (:func:`feature_key`), so a TFX pipeline with the same
    ``hash_buckets`` and ``partition_feature_name`` puts every example in the same split.

    Raises:
      SchemaError: a float, multi-valued or otherwise unusable key.
    """
    if isinstance(column, np.ndarray) and column.shape == (num_rows,) and column.dtype.kind in "biuSU":
        values = column.tolist()
    elif not isinstance(column, np.ndarray) or column.dtype == object:
        values = list(column)
    else:
        values = None
    if (
        values is not None
        and len(values) == num_rows
        and all(isinstance(v, (bytes, str)) or (isinstance(v, int) and v < 2**63) for v in values)
    ):
        return [feature_key(v.encode("utf-8") if isinstance(v, str) else v) for v in values]
    raise SchemaError(
        f"--split_key {name}: the key must be one integer or one string per row, not "
        f"{getattr(column, 'dtype', type(column).__name__)} {getattr(column, 'shape', '')}",
        feature=name,
        hint="choose an integer or string feature with one value per example",
    )


def parse_splits(splits: Mapping[str, object]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``{"train": 8, "test": 2}`` (the ``--splits`` mapping, values as given) -> names and positive integer
    weights, in order.

    Raises:
      ConfigError: fewer than 2 or more than :data:`MAX_SPLITS` splits, a bad name, a weight that is not a
        positive integer.
    """
    if len(splits) < 2:
        raise ConfigError(
            f"--splits needs at least two splits, got {dict(splits)}",
            hint="e.g. --splits train=8,validation=1,test=1; one split for all rows is --split NAME",
        )
    if len(splits) > MAX_SPLITS:
        raise ConfigError(f"--splits: at most {MAX_SPLITS} splits")
    names, weights = [], []
    for name, weight in splits.items():
        check_split_name(name)
        try:
            w = int(str(weight).strip())
        except ValueError:
            w = 0
        if w < 1 or str(weight).strip() not in (str(w), f"{w}.0"):
            raise ConfigError(
                f"--splits: the weight of {name!r} must be a positive integer (hash buckets), not {weight!r}",
                hint="e.g. --splits train=8,validation=1,test=1",
            )
        names.append(name)
        weights.append(w)
    return tuple(names), tuple(weights)


def shard_name(prefix: str, split: str | None, index: int, num_shards: int, suffix: str) -> str:
    """A shard's file name. Without a split ``<prefix>-00001-of-00004.tfrecord<suffix>``; with one, TFDS's
    ``{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}`` (``<prefix>-train.tfrecord-00001-of-00004<suffix>``), which
    ``tfds.builder_from_directory`` reads. ``suffix``: the compression's (``.gz``, ``.deflate``, or empty)."""
    if split is None:
        return f"{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord{suffix}"
    return f"{prefix}-{split}.tfrecord-{index:05d}-of-{num_shards:05d}{suffix}"
