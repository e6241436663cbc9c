"""An input collection's shards (:class:`InputShard`) and reading their records: a shard streamed a record at a
time (CRCs, record sizes and the shard's planned identity checked), the first records of a collection (the sample
that infers features), batches."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Generator, Iterable, Iterator, Sequence

from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.storage import fileio


@dataclasses.dataclass(frozen=True)
class InputShard:
    """One input shard and where its output goes.

    Attributes:
      index: position in the collection's shard order (metadata order, else sorted paths).
      path: the input file. compression: ``none``, ``gzip`` or ``zlib``.
      output_file: the output shard's file name (the input's, compression suffix adjusted).
      records: record count from the input metadata, or None when unknown.
      offset: index of the shard's first record in the collection (position join), or None.
      split: the shard's split (``--splits`` / ``--split`` / TFDS outputs), kept in the output's metadata.
      pin: what planning recorded of the file (``fileio.pin``: size in bytes (the metadata's, when it records
        one), and a local file's modification time), checked when the shard is read; None: not checked.
      crc32c: the shard's CRC32C from the input metadata (8 hex digits), compared with the bytes read; None when
        the metadata records none (older outputs, collections without metadata).
    """

    index: int
    path: str
    compression: str
    output_file: str
    records: int | None = None
    offset: int | None = None
    split: str | None = None
    pin: tuple[int, int | None] | None = None
    crc32c: str | None = None


def read_sample(shards: Sequence[InputShard], size: int, max_record_bytes: int | None = None) -> list[bytes]:
    """Up to ``size`` first records of the collection, in shard order (CRCs and record sizes checked)."""
    sample: list[bytes] = []
    for shard in shards:
        if len(sample) >= size:
            break
        if shard.records == 0:
            continue
        records = iter_shard(shard, max_record_bytes=max_record_bytes)
        sample += [r for _, r in itertools.islice(records, size - len(sample))]
        records.close()
    return sample


def iter_shard(
    shard: InputShard, tally: dict | None = None, max_record_bytes: int | None = None
) -> Generator[tuple[int, bytes], None, None]:
    """``(record index, record bytes)`` of one input shard, streamed a record at a time, CRCs checked.

    The shard is checked against what planning recorded (``shard.pin``, ``shard.crc32c``): its size (and a local
    file's modification time) before it is opened, so a shard of another size fails before a record is read; and,
    once it is read to its end, the CRC32C of the bytes read against the metadata's, and the pin again (a file
    rewritten while read). With ``tally`` (a dict), sets ``tally["bytes"]`` and ``tally["crc32c"]`` (8 hex digits)
    of the stored (compressed) file bytes once the shard is read to its end.

    Raises:
      RecordError: a truncated or corrupt frame, the wrong compression, or a length header over
        ``max_record_bytes`` (default ``tfrecord.record_limit()``), checked before reading the record
        (file, record, offset).
      InputChangedError: the shard changed during this run (``... changed while it was read: run again``): its
        size, or a local file's modification time, is not the one planned.
      RecordError: the shard's bytes are not the ones its metadata.json records (CRC32C) although, locally, it did
        not change during this run: it was corrupted or replaced at rest (running again cannot help).
    """
    tfrecord.check_regular(shard.path)
    if shard.pin is not None:
        fileio.check_pin(shard.path, shard.pin, "Input shard")
    with fileio.open_read(shard.path) as raw:
        stream = tfrecord.ChecksumReader(raw)
        for index, _, record in tfrecord.iter_records(
            tfrecord.open_decompressed(stream, shard.compression), shard.path, max_record_bytes=max_record_bytes
        ):
            yield index, record
        stream.drain()
    planned = shard.pin[0] if shard.pin is not None else stream.bytes
    if shard.crc32c is not None and (stream.bytes, stream.crc32c) != (planned, shard.crc32c):
        local = shard.pin is not None and shard.pin[1] is not None
        if local:  # rewritten during this run (size or modification time moved): InputChangedError, run again
            fileio.check_pin(shard.path, shard.pin, "Input shard")
        raise RecordError(
            f"Input shard differs from its metadata.json ({stream.bytes} bytes with CRC32C "
            f"{stream.crc32c}; metadata.json says {planned} bytes, {shard.crc32c})"
            + (
                " and did not change during this run: it was corrupted or replaced after it was written"
                if local
                else ": it was corrupted or replaced after it was written, or rewritten since this run planned"
            ),
            file=shard.path,
            hint=differs_hint(shard.path),
        )
    if shard.pin is not None:
        fileio.check_pin(shard.path, shard.pin, "Input shard")
    if tally is not None:
        tally["bytes"], tally["crc32c"] = stream.bytes, stream.crc32c


def batches(records: Iterable[tuple[int, bytes]], size: int) -> Iterator[tuple[int, list[bytes]]]:
    """``(index of the first record, records)`` batches of up to ``size`` records."""
    it = iter(records)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk[0][0], [r for _, r in chunk]


def differs_hint(path: str) -> str:
    """The hint of an input shard whose bytes are not the ones its metadata.json records."""
    where = path[: len(path) - len(fileio.basename(path))].rstrip("/") or "."
    return (
        f"check the input with tfrecord-etl verify {where}, then restore the shard or convert the input "
        "again; running augment again reads the same bytes"
    )
