"""Random access to the records of an output directory (``reader.RandomAccess``, ``reader.get``): a map-style
dataset for PyTorch's ``DataLoader`` and Grain, with positional reads on file handles kept open per process and a
batched fetch (``__getitems__``) decoded a block at a time (:class:`codec.block.BlockDecoder`). No TensorFlow import.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence

import google_crc32c
import numpy as np

from tfrecord_etl.transforms.codec.block import BlockDecoder, ragged, stack
from tfrecord_etl.transforms.errors import ConfigError, RecordError
from tfrecord_etl.transforms.output import metadata, tfrecord
from tfrecord_etl.transforms.reading import collection_reader, shardcheck
from tfrecord_etl.transforms.reading.indices import is_many, many_indices, one_index
from tfrecord_etl.transforms.reading.torch_io import python_scalars
from tfrecord_etl.transforms.storage import fileio


def _stat_version(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class RandomAccess:
    """Record ``i`` of an output directory (global index, in shard order) by one positional read, with no pass
    over the records before it: the offsets come from the shards' ``tfrecord2idx`` index files (``--index``),
    or, for a shard written without one, from one pass over its 12-byte frame headers on first access.
    A map-style dataset for PyTorch or Grain (``grain.sources.RandomAccessDataSource``: ``__len__`` and
    ``__getitem__``): ``len(ra)``, ``ra[i]`` (``{name: np.ndarray}`` as :func:`reader.iter_numpy` yields:
    values exact, dtype and shape kept, byte order normalised to little-endian; scalar strings as Python values,
    see :meth:`__getitem__`), ``ra.__getitems__(indices)`` (PyTorch 2.x's batched fetch:
    the ``DataLoader`` calls it with the list of a batch's indices; the records are decoded together),
    ``ra.batch(indices)`` (``{name: array of len(indices) rows}``), ``ra.record(i)`` (the serialized Example).
    Over a collection directory, one global index across the spans ``spans`` selects, in span order (``len`` is
    the sum of theirs); each span's shards are checked against that span's metadata.json.

    Local shards are read with ``os.pread`` on a file handle opened once per process and shard: a process forked
    from this one (a ``DataLoader`` worker) opens its own on first use, and a pickled copy (``spawn``) carries none.
    Each handle is checked, when opened, to be the file version whose identity was checked (device, inode, size,
    modification time). Remote shards (``gs://``, ``s3://``) are read with one ranged read per record.

    Each read checks the frame (length against the index, both CRCs); each index file is checked against its
    shard (records as in the metadata, offsets that follow each other and end at the shard's size). Before a
    shard's offsets are used, the shard is checked to be the one metadata.json lists (:func:`shardcheck.check_shard`):
    its size, and with ``check_checksums`` (default) its CRC32C, read once per process and file version, so a shard
    swapped with, or replaced by, another of the same size, or one whose records were reordered or duplicated, is
    refused rather than read at the other's offsets. ``check_checksums=False`` checks the size only.

    Raises (at construction or on access):
      IncompleteOutputError: no metadata.json; a span not the one collection.json lists (unless ``trust_spans``).
      SchemaError: ``schema.pbtxt`` disagrees with ``metadata.json``.
      ConfigError: compressed shards (offsets index the uncompressed stream: re-convert with
      ``--compression none``). IndexError: ``i`` outside ``[-len, len)``, a boolean mask not of ``len`` values.
      TypeError: an index that is not an integer (a float, a bool, a string), indices of 2 or more dimensions
      (see :meth:`__getitem__`: what an index may be).
      RecordError: a shard that is not the one metadata.json lists, an index file that does not match its
      shard, or a corrupt record (file, record, offset).
    """

    def __init__(
        self,
        output_dir: str,
        features: Sequence[str] | None = None,
        max_record_bytes: int | None = None,
        max_features: int | None = None,
        split: str | None = None,
        check_checksums: bool = True,
        spans=None,
        trust_spans: bool = False,
    ):
        self._specs, parts = collection_reader.parts(output_dir, spans, split, features, trust_spans)
        for part in parts:
            if part.meta["compression"] != "none":
                raise ConfigError(
                    f"Random access needs uncompressed shards; these are {part.meta['compression']}",
                    file=part.dir,
                    hint="re-convert with --compression none --index, or read them in order with reader.iter_numpy",
                )
        self._shards = [shard for part in parts for shard in part.meta["shards"]]
        self._paths = [path for part in parts for path in metadata.shard_paths(part.dir, part.meta)]
        self._dirs = [part.dir for part in parts for _ in part.meta["shards"]]  # where each shard's index file is
        self._ends = np.cumsum([s["records"] for s in self._shards], dtype=np.int64)
        self._ends_list = self._ends.tolist()  # bisect over a list: no NumPy call per index
        self._len = int(self._ends[-1]) if len(self._ends) else 0
        self._offsets: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lists: dict[int, tuple[list, list]] = {}  # the same, as lists (per process: not pickled)
        self._headers: dict[int, bytes] = {}  # frame length -> its header bytes, checked once
        self._checked: dict[int, tuple | None] = {}  # shard -> the version (os.stat) whose identity was checked
        self._limit = tfrecord.record_limit() if max_record_bytes is None else max_record_bytes
        self._max_features = max_features
        self._check_checksums = check_checksums
        self._decoder = BlockDecoder(self._specs, max_features)
        self._local = [fileio.is_local(p) for p in self._paths]
        self._pid = os.getpid()
        self._fds: dict[int, int] = {}

    # -- pickling and processes ---------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fds"], state["_pid"] = {}, None  # a copy in another process opens its own handles
        state["_lists"] = {}  # rebuilt from _offsets on first use
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def close(self) -> None:
        """Closes the file handles this process opened (they are opened again on the next read)."""
        if self._pid == os.getpid():
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fds = {}

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self) -> RandomAccess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- offsets ----------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def _locate(self, i: int) -> tuple[int, int]:
        i = one_index(i, self._len)
        shard = bisect.bisect_right(self._ends_list, i)
        return shard, i - (self._ends_list[shard - 1] if shard else 0)

    def _locate_all(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shards, records within them) of global records ``idx`` (``int64``, each in ``[0, len)``: checked by
        :func:`indices.many_indices`), vectorized."""
        shards = np.searchsorted(self._ends, idx, side="right")
        starts = np.concatenate(([0], self._ends))[shards]
        return shards, idx - starts

    def _frames(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, frame lengths) of shard ``k``, from its index file or its headers; checked, then cached."""
        if k not in self._offsets:
            path = self._paths[k]
            before = _version(path) if self._local[k] else None
            offsets, frames = shardcheck.shard_frames(self._shards[k], path, self._dirs[k], self._check_checksums)
            self._checked[k] = before
            self._offsets[k] = offsets, frames
        return self._offsets[k]

    def _fd(self, k: int) -> int:
        """This process's file handle of local shard ``k``, opened on first use and checked to be the version whose
        identity was checked (else the shard is checked again, once)."""
        if self._pid != os.getpid():  # forked: the parent's handles (and their positions) stay the parent's
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(k)
        if fd is not None:
            return fd
        path = self._paths[k]
        for _attempt in (0, 1):
            self._frames(k)
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            if self._checked.get(k) == _stat_version(os.fstat(fd)):
                self._fds[k] = fd
                return fd
            os.close(fd)
            self._offsets.pop(k, None)  # another file is at the path now: check it as a new one
            self._lists.pop(k, None)
        raise RecordError(
            "Shard changed while it was being checked", file=path, hint="read it again once nothing writes the output"
        )

    def _read(self, k: int, offset: int, n: int) -> bytes:
        if self._local[k]:
            return os.pread(self._fd(k), n, offset)
        with fileio.open_read(self._paths[k]) as raw:
            raw.seek(offset)
            return raw.read(n)

    # -- records ----------------------------------------------------------------------------------------------
    def record(self, i: int) -> bytes:
        """The serialized record ``i`` (bytes), its frame checked."""
        return self._record(*self._locate(i))

    def _record(self, k: int, j: int) -> bytes:
        table = self._lists.get(k)
        if table is None:  # the shard's offsets as Python ints: no NumPy scalar per read
            offsets, frames = self._frames(k)
            table = self._lists[k] = (offsets.tolist(), frames.tolist())
        offset, frame = table[0][j], table[1][j]
        if frame - 16 > self._limit:
            tfrecord.check_record_size(frame - 16, self._limit, file=self._paths[k], record=j, offset=offset)
        data = self._read(k, offset, frame)
        # a frame of a length seen before: its 12 header bytes (length and length CRC) are the ones checked then
        header = self._headers.get(frame)
        if (
            header is not None
            and data[:12] == header
            and len(data) == frame
            and tfrecord.masked_crc(data[12:-4]) == int.from_bytes(data[-4:], "little")
        ):
            return data[12:-4]
        record = tfrecord.unframe(data, self._paths[k], j, offset)  # every check, the exact error
        self._headers[frame] = data[:12]
        return record

    def _decode_error(self, e: RecordError, k: int, j: int) -> RecordError:
        return RecordError(
            f"Cannot decode example: {e.message}",
            hint=e.hint,
            file=self._paths[k],
            record=j,
            offset=int(self._frames(k)[0][j]),
            payload_offset=e.context.get("offset"),
        )

    def __getitem__(self, i) -> dict[str, np.ndarray]:
        """Example ``i`` as :func:`reader.iter_numpy` yields it, except scalar strings: Python ``bytes`` (``S``,
        ``bytes`` features) or ``str`` (``U``), the values PyTorch's ``default_collate`` batches
        (``torch_io.python_scalars``; :func:`reader.get` too).

        ``i``: a Python ``int`` or a NumPy integer of any width (a 0-d integer array too), negative from the end as
        in a list. Several records: a list, tuple, ``range`` or 1-D array of integers, a slice (``ra[1:4]``: the
        records a list would give) or a boolean mask of ``len(ra)`` values give their :meth:`batch` (what a
        ``DataLoader`` with ``batch_size=None`` and a ``BatchSampler`` asks for); see :mod:`reading.indices`.

        Raises:
          TypeError: an index that is not an integer (a float is never truncated, ``1.9`` is not record 1; a bool,
            a string, None) or indices of 2 or more dimensions; the message names it and what to pass.
          IndexError: an index outside ``[-len, len)`` (whatever its dtype: a ``uint64`` of ``2**63`` is not
            wrapped around), or a boolean mask of another length than ``len(ra)``.
          RecordError: as :meth:`record`, or a record that does not decode.
        """
        if is_many(i):
            return self.batch(i)
        k, j = self._locate(i)
        record = self._record(k, j)
        try:
            return python_scalars(self._decoder.decode_one(record))
        except RecordError as e:
            raise self._decode_error(e, k, j) from None

    def batch(self, indices: Sequence[int] | np.ndarray | slice) -> dict[str, np.ndarray]:
        """``{name: array of len(indices) rows}``, row ``r`` being example ``indices[r]`` (as ``iter_numpy(...,
        batch_size=...)`` batches: fixed features stacked, features whose shape varies as object arrays of rows).
        ``indices``: a list, tuple, ``range`` or 1-D array of integers (negative from the end), a slice, or a
        boolean mask of ``len(ra)`` values (the records where it is True, in order), checked before anything is
        read (:func:`indices.many_indices`).
        One positional read per record; the frames are checked together (records of one length share a length
        header: one CRC of it; a data CRC per record) and decoded a block per record length.

        Raises:
          TypeError, IndexError, RecordError: as :meth:`__getitem__` (an index's position in ``indices`` named).
        """
        return self._batch(many_indices(indices, self._len))

    def _batch(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`batch` of checked records ``idx`` (``int64`` in ``[0, len)``)."""
        shards, within = self._locate_all(idx)
        count = len(shards)
        offsets, frames = self._frames_at(shards, within)
        fds = {k: (self._fd(k) if self._local[k] else None) for k in np.unique(shards).tolist()}
        pread = os.pread
        data = [
            pread(fds[k], n, o) if fds[k] is not None else self._read(k, o, n)
            for k, o, n in zip(shards.tolist(), offsets.tolist(), frames.tolist())
        ]
        groups = (
            [np.arange(count)]
            if count and (frames == frames[0]).all()
            else [np.flatnonzero(frames == n) for n in np.unique(frames)]
        )
        out: dict[str, np.ndarray] = {}
        for rows in groups:
            frame = int(frames[rows[0]])
            part = data if len(groups) == 1 else [data[r] for r in rows.tolist()]
            block = self._checked_frames(part, frame, shards[rows], within[rows], offsets[rows])
            try:
                decoded = self._decoder.decode(block[:, 12 : frame - 4])
            except RecordError as e:
                r = int(rows[e.context.get("record", 0)])
                raise self._decode_error(e, int(shards[r]), int(within[r])) from None
            if len(groups) == 1:
                return decoded
            for spec in self._specs:
                value = decoded[spec.name]
                if spec.name not in out:
                    shape = (count,) if ragged(spec) else (count, *value.shape[1:])
                    out[spec.name] = np.empty(shape, value.dtype)
                out[spec.name][rows] = value
        if not out:
            return {s.name: stack(s, []) for s in self._specs}
        return out

    def _frames_at(self, shards: np.ndarray, within: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, frame lengths)`` of the records ``within`` their ``shards``; RecordError for a record over
        the size limit (before anything is read)."""
        offsets = np.empty(len(shards), np.int64)
        frames = np.empty(len(shards), np.int64)
        for k in np.unique(shards).tolist():
            mine = shards == k
            o, f = self._frames(k)
            offsets[mine], frames[mine] = o[within[mine]], f[within[mine]]
        big = np.flatnonzero(frames - 16 > self._limit)
        if big.size:
            r = int(big[0])
            tfrecord.check_record_size(
                int(frames[r]) - 16,
                self._limit,
                file=self._paths[int(shards[r])],
                record=int(within[r]),
                offset=int(offsets[r]),
            )
        return offsets, frames

    def _checked_frames(self, part: list[bytes], frame: int, shards, within, offsets) -> np.ndarray:
        """``(rows, frame)`` uint8 of frames read (each ``frame`` bytes long), their length headers and data CRCs
        checked; RecordError naming the first bad one."""
        block = np.frombuffer(b"".join(part), np.uint8)
        if len(block) != frame * len(part):
            r = next(r for r, d in enumerate(part) if len(d) != frame)
            raise RecordError(
                f"Truncated record: {len(part[r])} bytes at the indexed offset",
                file=self._paths[int(shards[r])],
                record=int(within[r]),
                offset=int(offsets[r]),
            )
        block = block.reshape(len(part), frame)
        header = part[0][:12]
        same = block[:, 0] == block[0, 0]
        for c in range(1, 12):
            same &= block[:, c] == block[0, c]
        bad = np.flatnonzero(~same)
        first = int(bad[0]) if bad.size else None
        if first is None and (
            tfrecord.masked_crc(header[:8]) != int.from_bytes(header[8:], "little")
            or int.from_bytes(header[:8], "little") != frame - 16
        ):
            first = 0
        if first is None:
            value = google_crc32c.value
            crcs = np.fromiter((value(d[12 : frame - 4]) for d in part), np.uint64, len(part))
            masked = (((crcs >> 15) | (crcs << 17)) + 0xA282EAD8) & 0xFFFFFFFF
            wrong = np.flatnonzero(masked != np.ascontiguousarray(block[:, frame - 4 :]).view("<u4")[:, 0])
            first = int(wrong[0]) if wrong.size else None
        if first is not None:  # the exact error, from the one-record check
            tfrecord.unframe(part[first], self._paths[int(shards[first])], int(within[first]), int(offsets[first]))
        return block

    def __getitems__(self, indices: Sequence[int] | np.ndarray | slice) -> list[dict]:
        """The examples ``indices`` (as :meth:`batch` takes them) as a list of :meth:`__getitem__`'s dicts,
        decoded together (:meth:`batch`): PyTorch 2.x's ``DataLoader`` fetches a batch with it (then
        ``collate_fn`` stacks the list).

        Raises:
          TypeError, IndexError, RecordError: as :meth:`batch`.
        """
        idx = many_indices(indices, self._len)
        batch = self._batch(idx)
        columns = []
        for spec in self._specs:
            arr = batch[spec.name]
            if ragged(spec):
                columns.append((spec.name, list(arr)))
            elif arr.ndim == 1 and arr.dtype.kind in "SUO":  # 0-d strings: Python bytes/str (python_scalars)
                values = arr.tolist()
                columns.append(
                    (spec.name, [v if isinstance(v, (bytes, str)) else arr[r, ...] for r, v in enumerate(values)])
                )
            else:
                columns.append((spec.name, [arr[r, ...] for r in range(len(arr))]))
        names = [name for name, _ in columns]
        return (
            [dict(zip(names, row)) for row in zip(*(values for _, values in columns))]
            if columns
            else [{} for _ in range(len(idx))]
        )


def _version(path: str) -> tuple | None:
    try:
        return _stat_version(os.stat(path))
    except OSError:
        return None
