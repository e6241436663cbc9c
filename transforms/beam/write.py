"""Writing: shard files, committed each through ``transforms.output.sink`` (the planned writer, the shuffled writer),
or by Beam's ``WriteToTFRecord`` and counted after; the settings of the files written (:class:`ShardOutput`)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics import Metrics

from tfrecord_etl.transforms.beam import encode as beam_encode
from tfrecord_etl.transforms.beam.deadletters import dead_range, write_dead_letters
from tfrecord_etl.transforms.beam.metrics import NAMESPACE, ShardClock
from tfrecord_etl.transforms.codec import EncodedBatch
from tfrecord_etl.transforms.collections import sharding, splits
from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import resume, sink, tfrecord
from tfrecord_etl.transforms.output.runlock import CarriesRun, failpoint
from tfrecord_etl.transforms.planning import shard_suffix
from tfrecord_etl.transforms.sources import RowRange, Source
from tfrecord_etl.transforms.storage import fileio


@dataclasses.dataclass(frozen=True)
class ShardOutput:
    """Where and how the shard files of a run are written (pickled with the DoFns that write them).

    Attributes:
      output_dir: the output directory (local path, s3:// or gs:// URI).
      prefix: the shard files' name prefix (``data``; the generation's name when an output is replaced).
      compression: ``none``, ``gzip`` or ``zlib`` (``--compression``).
      index: write each shard's ``tfrecord2idx`` index file with it (``--index``).
      codec: ``compression.settings()``: the gzip/zlib backend, its version and level, or None.
      dead_letter_dir: where the planned writer writes its dead letters (``--dead_letter_dir``), or None.
      progress: print one line per shard written to stderr (``--progress``).
      receipt_key: the planned writer leaves a receipt per shard committed under it (``resume.write_receipt``).

    Raises:
      ValueError: an unknown ``compression``, found at construction rather than on a worker.
    """

    output_dir: str
    prefix: str
    compression: str
    index: bool = False
    codec: dict | None = None
    dead_letter_dir: str | None = None
    progress: bool = False
    receipt_key: str | None = None  # the run identity's digest: a receipt per shard committed (resume)

    def __post_init__(self):
        if self.compression not in tfrecord.SUFFIXES:
            raise ValueError(
                f"Unknown shard compression {self.compression!r}; choose one of {', '.join(tfrecord.SUFFIXES)}"
            )

    def path(self, name: str) -> str:
        """The path of the file ``name`` in the output directory."""
        return fileio.join(self.output_dir, name)


_BEAM_COMPRESSION = {
    "none": CompressionTypes.UNCOMPRESSED,
    "gzip": CompressionTypes.GZIP,
    "zlib": CompressionTypes.DEFLATE,
}  # Beam's DEFLATE is a zlib stream with header: TF's ZLIB


class WriteToShards(beam.PTransform):
    """Writes records with Beam's ``WriteToTFRecord`` as ``<prefix>-SSSSS-of-NNNNN.tfrecord[.gz]``.

    Returns the PCollection of final shard paths.
    """

    def __init__(self, output_dir: str, prefix: str, num_shards: int, compression: str):
        super().__init__()
        self._prefix = fileio.join(output_dir, prefix)
        self._num_shards, self._compression = num_shards, compression

    def expand(self, records):
        return records | "WriteToTFRecord" >> beam.io.WriteToTFRecord(
            self._prefix,
            file_name_suffix=shard_suffix(self._compression),
            num_shards=self._num_shards,
            shard_name_template="-SSSSS-of-NNNNN",
            compression_type=_BEAM_COMPRESSION[self._compression],
        )


class WriteShardFn(CarriesRun, beam.DoFn):
    """Writes one planned shard: reads its row ranges in order, encodes each in one call, frames the batch
    (google-crc32c) into a temporary file, and commits it under its final name when the records written plus
    the rows dead-lettered equal the rows planned (``sink.shard_writer``). Yields ``{"file", "records", "bytes",
    "crc32c", "dead_rows", "dead_letters"[, "index"]}`` (``crc32c``: of the file's bytes, computed while they are
    written; ``dead_letters``: :func:`dead_range` of each letter); with
    ``index`` the shard's ``tfrecord2idx`` index file is written with it.

    ``encode``: how the rows become Examples (``dead_letters`` with ``out.dead_letter_dir`` and only with it);
    ``out``: where the files go. With ``encode.split_plan`` the shard's rows go to one file per split, written side by side by the same worker
    (``<prefix>-<split>.tfrecord-SSSSS-of-NNNNN``, ``splits.shard_name``), all committed only when their records
    together plus the rows dead-lettered equal the rows planned; one dict per file, with ``"split"``.
    """

    def __init__(self, source: Source, encode: beam_encode.EncodeSettings, out: ShardOutput):
        if encode.dead_letters != (out.dead_letter_dir is not None):
            raise ValueError(
                f"EncodeSettings.dead_letters ({encode.dead_letters}) and ShardOutput.dead_letter_dir "
                f"({out.dead_letter_dir!r}) disagree: dead letters need a directory to go to"
            )
        self._source, self._encode, self._out = source, encode, out
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._written = Metrics.counter(NAMESPACE, "examples_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._dead = Metrics.counter(NAMESPACE, "rows_dead_lettered")
        self._clock = ShardClock()

    def _encoded(self, rr: RowRange, letters: list) -> list[tuple[int, np.ndarray | None, EncodedBatch]]:
        """The encoded rows of one range, by split; with a dead-letter dir, what fails becomes letters."""
        try:
            batches, dead = beam_encode.read_and_encode(self._source, rr, self._encode)
        finally:
            self._rows.inc(rr.num_rows)
        letters += dead
        return batches

    def file_names(self, shard: sharding.ShardPlan) -> list[tuple[str | None, str]]:
        """``[(split or None, file name)]`` of the files one shard plan writes."""
        out, split_plan = self._out, self._encode.split_plan
        if split_plan is None:
            return [(None, shard.file_name(out.prefix, shard_suffix(out.compression)))]
        suffix = tfrecord.SUFFIXES[out.compression]
        return [
            (split, splits.shard_name(out.prefix, split, shard.index, shard.num_shards, suffix))
            for split in split_plan.names
        ]

    def process(self, shards: sharding.ShardPlan | tuple[sharding.ShardPlan, ...]):
        """Writes one shard plan, or a group of them in order (``sharding.group_sequential``: the source's files
        stay open from one shard of the group to the next, so a deflated member is streamed once)."""
        try:
            for shard in (shards,) if isinstance(shards, sharding.ShardPlan) else shards:
                yield from self._write(shard)
        finally:
            self._source.close()  # files stay open between the ranges of a shard (group), not after it

    def _write(self, shard: sharding.ShardPlan) -> list[dict]:
        self._clock.start()
        out, files = self._out, self.file_names(shard)
        name = shard.file_name(out.prefix, shard_suffix(out.compression))  # the shard plan's own name
        letters: list[dict] = []
        with contextlib.ExitStack() as stack:
            writers = [
                stack.enter_context(sink.shard_writer(out.path(f), out.compression, out.index, out.codec))
                for _, f in files
            ]
            for rr in shard.ranges:
                for split, _, batch in self._encoded(rr, letters):
                    writers[split].write_encoded(batch)
            dead_rows = sum(d["rows"] for d in letters)
            records = sum(w.records for w in writers)
            if records + dead_rows != shard.num_rows:
                raise RecordError(
                    f"Shard {name}: {shard.num_rows} rows planned but {records} records "
                    f"written and {dead_rows} rows dead-lettered",
                    file=out.path(files[0][1]),
                )
            if letters:
                write_dead_letters(out.dead_letter_dir, name, letters)
        entries = self._entries(files, writers)
        entries[0]["dead_rows"] = dead_rows
        entries[0]["dead_letters"] = [dead_range(d) for d in letters]
        if out.receipt_key is not None:  # every file of the shard committed: its receipt, for --resume
            resume.write_receipt(out.output_dir, shard.index, entries, out.receipt_key)
            failpoint("shard-recorded")
        size = sum(e["bytes"] for e in entries)
        self._written.inc(records)
        self._bytes.inc(size)
        self._shards.inc(len(entries))
        self._dead.inc(dead_rows)
        self._clock.end()
        if out.progress:
            print(
                f"[tfrecord-etl] shard {shard.index + 1}/{shard.num_shards} done: "
                f"{', '.join(f for _, f in files)}, {records} records, {size} bytes",
                file=sys.stderr,
                flush=True,
            )
        return entries

    def _entries(self, files: list[tuple[str | None, str]], writers: list) -> list[dict[str, Any]]:
        """One ``{"file", "records", "bytes", "crc32c", "dead_rows"[, "split", "index"]}`` per committed file."""
        entries: list[dict[str, Any]] = []
        for (split_name, f), writer in zip(files, writers):
            entry: dict[str, Any] = {
                "file": f,
                "records": writer.records,
                "bytes": fileio.size(self._out.path(f)),
                "crc32c": writer.crc32c,
                "dead_rows": 0,
            }
            if split_name is not None:
                entry["split"] = split_name
            if self._out.index:
                entry["index"] = tfrecord.index_name(f)
            entries.append(entry)
        return entries


class WriteShuffledShardFn(CarriesRun, beam.DoFn):
    """``--shuffle_seed``: one shard's grouped ``(key, record)`` values (and a ``None`` per shard, so an empty shard
    is written too) -> the shard file, records in key order, committed through ``sink.shard_writer``. Holds the
    shard's records in memory (about ``--target_shard_mb``). Yields ``{"file", "records", "bytes", "crc32c"[,
    "split", "index"]}``. ``out``: where the files go (its ``dead_letter_dir`` and ``progress`` are not used
    here); ``split_names``: the splits' names in order, or none."""

    def __init__(self, out: ShardOutput, num_shards: int, split_names: Sequence[str] = ()):
        self._out, self._n, self._names = out, num_shards, tuple(split_names)
        self._written = Metrics.counter(NAMESPACE, "examples_written")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._clock = ShardClock()

    def process(self, element):
        (split, shard), values = element
        self._clock.start()
        records = sorted((v for v in values if v is not None), key=lambda kv: kv[0])
        name = splits.shard_name(
            self._out.prefix,
            self._names[split] if self._names else None,
            shard,
            self._n,
            tfrecord.SUFFIXES[self._out.compression],
        )
        final = self._out.path(name)
        with sink.shard_writer(final, self._out.compression, self._out.index, self._out.codec) as writer:
            for i in range(0, len(records), 4096):
                writer.write_batch([r for _, r in records[i : i + 4096]])
        out = {
            "file": name,
            "records": writer.records,
            "bytes": fileio.size(final),
            "crc32c": writer.crc32c,
            "dead_rows": 0,
        }
        if self._names:
            out["split"] = self._names[split]
        if self._out.index:
            out["index"] = tfrecord.index_name(name)
        self._written.inc(writer.records)
        self._bytes.inc(out["bytes"])
        self._shards.inc()
        self._clock.end()
        yield out


class WritePlannedShards(beam.PTransform):
    """Planned shards -> TFRecord files, with no shuffle of the data; yields per-shard counts. Shards that
    continue a file of ``sequential`` paths (``FileIndex.sequential``) go to the worker of the shard before them
    (``sharding.group_sequential``)."""

    def __init__(self, shards, write_fn: WriteShardFn, sequential=()):
        super().__init__()
        self._groups, self._fn = sharding.group_sequential(list(shards), sequential), write_fn

    def expand(self, pbegin):
        return (
            pbegin
            # Create spreads its values itself (a Reshuffle inside it): a second one only cost start-up
            | "CreateShardPlans" >> beam.Create(self._groups, reshuffle=True)
            | "WriteShards" >> beam.ParDo(self._fn)
        )


def count_shard(path: str, compression: str, index: bool = False) -> dict:
    """``{"file", "records", "bytes", "crc32c"[, "index"]}`` of one shard written by Beam's ``WriteToTFRecord``, by
    walking its frames (CRCs checked) once: the file's CRC32C is computed in the same pass (Beam's sink gives no
    hook on the bytes it writes); with ``index`` its ``tfrecord2idx`` index file is written from the same walk."""
    tfrecord.check_regular(path)
    with fileio.open_read(path) as raw:
        stream = tfrecord.ChecksumReader(raw)
        lengths = [
            len(record) for _, _, record in tfrecord.iter_records(tfrecord.open_decompressed(stream, compression), path)
        ]
        stream.drain()
    out = {"file": fileio.basename(path), "records": len(lengths), "bytes": stream.bytes, "crc32c": stream.crc32c}
    if index:
        out["index"] = fileio.basename(sink.write_index(path, tfrecord.index_text(np.array(lengths, np.int64))))
    return out
