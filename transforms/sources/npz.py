"""``.npz`` source (``np.savez``/``np.savez_compressed``): members checked against the zip directory (sizes,
duplicates, compression ratio), streamed so that a shard's row ranges decompress each byte once."""

from __future__ import annotations

import dataclasses
import functools
import math
import zipfile
import zlib

import numpy as np

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec, flatten_fields
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    KEY,
    Columns,
    FileIndex,
    RowRange,
    Source,
    SourceOptions,
    check_empty_rows,
    check_names,
    leaf_specs,
    refuse_special_file,
    row_bytes,
)
from tfrecord_etl.transforms.sources.members import select_members
from tfrecord_etl.transforms.sources.npyformat import (
    NpyHeader,
    check_declared,
    data_bytes,
    merged_array_specs,
    read_npy_header,
    read_rows,
)
from tfrecord_etl.transforms.sources.zipmember import Inflater, member_data_start
from tfrecord_etl.transforms.storage import fileio

RATIO_CHECK_MIN_BYTES = 2**20  # npz members of at most this many uncompressed bytes are never refused by ratio


class _OpenArchive:
    """One worker thread's open ``.npz``: the archive stream, its ZipFile and the open member streams.

    Member streams are kept open between row ranges, so ranges read in order (a planned shard)
    decompress each byte once: a range after the stream's position skips forward, one before it
    makes zipfile rewind and decompress from the member's start.
    """

    def __init__(self, path: str, stream, zf: zipfile.ZipFile):
        self.path, self.stream, self.zf = path, stream, zf
        self.members: dict = {}  # (member, column or -1) -> ZipExtFile
        self.headers: dict = {}  # member -> (NpyHeader, ZipInfo, archive offset of its data or None)

    def close(self) -> None:
        for m in self.members.values():
            m.close()
        self.zf.close()
        self.stream.close()


#: who reads an ``--npz_mode arrays`` output of members of different shapes or dtypes (said in the hint that
#: proposes it)
ARRAYS_READERS = (
    "read with reader.iter_numpy or reader.RandomAccess (each member's own shape and dtype); "
    "reader.to_tf_dataset needs one dtype per feature, and fixed shapes to batch"
)
MAX_COLUMN_STREAMS = 256  # Fortran-order compressed members: one decompressor per column up to this many


class NpzSource(Source):
    """``.npz`` archives (np.savez and np.savez_compressed), members read through zipfile.

    Planning checks every member against the zip directory (no duplicate names, declared sizes no
    larger than the member, compression ratio at most ``max_compression_ratio``). Reading keeps one
    archive per worker thread open with its member decompressors (see :class:`_OpenArchive`); stored
    (uncompressed) members are read straight from the archive at their offset.
    """

    options_models = (
        "options_container.ContainerOptions",
        "options_numpy.NumpyOptions",
    )  # its flags: sources/options_*.py

    format_name = "npz"
    help_label = ".npz"
    suffixes = (".npz",)
    magic = (b"PK\x03\x04", b"PK\x05\x06")  # a zip archive: its first member, or the end record of an empty one
    content_label = "a zip archive (.npz)"
    modes = ("rows", "arrays")

    def __init__(self, options: SourceOptions):
        super().__init__(options)
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions

        self.numpy = options.of(NumpyOptions)  # --npz_mode, --exclude_datasets, --max_compression_ratio
        self.loose = self.numpy.npz_mode == "arrays"
        self.excluded = tuple(self.numpy.exclude_datasets) if self.numpy.exclude_datasets else None

    def _zip(self, path: str):
        refuse_special_file(path)
        stream = fileio.open_read(path)
        try:
            return zipfile.ZipFile(stream), stream
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            stream.close()
            raise SourceError(f"Not a valid .npz (zip) archive: {e}", file=path) from None

    def _members(self, zf, path) -> list[str]:
        """The ``.npy`` members to read (``--datasets``, ``--exclude_datasets``); SourceError for two members that
        are one name to ``np.load``: a repeated name, or ``x.npy`` beside ``x``."""
        everything = zf.namelist()
        names = [n for n in everything if n.endswith(".npy")]
        twins = sorted({n[:-4] for n in names} & set(everything))
        if twins:
            x = twins[0]
            raise SourceError(
                f"The archive holds members '{x}.npy' and '{x}', both '{x}' to np.load (which reads '{x}'): "
                f"converting '{x}.npy' would hide '{x}'",
                file=path,
                member=x,
                hint=f"rewrite the archive with distinct member names (np.savez writes '{x}.npy' for {x}=...)",
            )
        seen = set()
        for n in names:
            if n in seen:
                raise SourceError(
                    f"The archive holds two members named '{n}': one would hide the other",
                    file=path,
                    member=n[:-4],
                    hint="rewrite the archive with distinct member names",
                )
            seen.add(n)
        if not names:
            raise SchemaError("The archive holds no .npy member", file=path)
        return select_members(names, self.options.datasets, self.excluded, path)

    def _check_member(self, info: zipfile.ZipInfo, archive_bytes: int, path: str) -> None:
        """Compressed size within the archive; compression ratio within ``max_compression_ratio``."""
        member = info.filename[:-4]
        if info.compress_size > archive_bytes:
            raise SourceError(
                f"The zip directory declares {info.compress_size} compressed bytes, more than the "
                f"archive's {archive_bytes} bytes",
                file=path,
                member=member,
                hint="the archive is truncated or corrupt",
            )
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise SourceError(
                    f"Stored (uncompressed) member declares {info.file_size} bytes but "
                    f"{info.compress_size} stored bytes",
                    file=path,
                    member=member,
                    hint="the archive's zip directory is corrupt",
                )
            return
        if info.file_size <= RATIO_CHECK_MIN_BYTES:
            return
        ratio = info.file_size / max(1, info.compress_size)
        limit = self.numpy.max_compression_ratio
        if ratio > limit:
            raise SourceError(
                f"Member expands {ratio:.0f}x ({info.compress_size} compressed bytes to "
                f"{info.file_size}), more than --max_compression_ratio {limit:g} (a zip bomb?)",
                file=path,
                member=member,
                hint="if the data is genuine (e.g. mostly zeros), raise --max_compression_ratio",
            )

    def _check_total(self, zf, members, archive_bytes: int, path: str) -> None:
        """The members read, together, within ``max_compression_ratio`` (many members just under the 1 MiB
        floor of the per-member check would otherwise add up to any size)."""
        total = sum(zf.getinfo(m).file_size for m in members)
        limit = self.numpy.max_compression_ratio
        if total > RATIO_CHECK_MIN_BYTES and total > limit * max(1, archive_bytes):
            raise SourceError(
                f"The archive expands {total / max(1, archive_bytes):.0f}x in total ({archive_bytes} "
                f"bytes to {total}), more than --max_compression_ratio {limit:g} (a zip bomb?)",
                file=path,
                hint="if the data is genuine (e.g. mostly zeros), raise --max_compression_ratio",
            )

    def _header(self, zf, member: str, path: str) -> NpyHeader:
        where = f"{path}, member '{member[:-4]}'"
        try:
            with zf.open(member) as m:
                return read_npy_header(m, where)
        except SchemaError as e:  # an object member: the others may still be converted without it
            raise SchemaError(
                e.message,
                file=path,
                member=member[:-4],
                hint=f"{e.hint}, or leave the member out with --exclude_datasets {member[:-4]}",
            ) from None
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
            raise SourceError(f"Cannot read member: {e}", file=path, member=member[:-4]) from None
        except (NotImplementedError, RuntimeError) as e:  # unknown compression method, encrypted member
            raise SourceError(
                f"Cannot read member: {e}",
                file=path,
                member=member[:-4],
                hint="rewrite it with numpy.savez or numpy.savez_compressed",
            ) from None

    def index(self, path: str) -> FileIndex:
        """Learns rows and features; checks names, declared sizes and ratios (see the class).

        Raises:
          SourceError: not a zip, duplicate member names, a header declaring more bytes than the member
            holds, a member's ratio above ``max_compression_ratio``, too many rows of zero bytes.
          SchemaError: no .npy member, 0-d or differing members in rows mode, object arrays.
        """
        zf, stream = self._zip(path)
        with stream, zf:
            archive_bytes = stream.seek(0, 2)
            members = self._members(zf, path)
            for m in members:
                self._check_member(zf.getinfo(m), archive_bytes, path)
            self._check_total(zf, members, archive_bytes, path)
            headers = {}
            for m in members:
                headers[m] = self._header(zf, m, path)
                check_declared(headers[m], zf.getinfo(m).file_size, path, m[:-4])
        if self.loose:
            sizes = tuple(data_bytes(h) for h in headers.values())
            specs = (
                FeatureSpec(KEY, VLEN_BYTES, (), "list"),
                *merged_array_specs(list(headers.values()), path, [m[:-4] for m in headers]),
            )
            return FileIndex(path, len(members), specs, max(sizes), 1, tuple(members), sizes)
        specs, lengths = [], {}
        for m, h in headers.items():
            if not h.shape:
                raise SchemaError(
                    "Member is 0-d: rows mode needs a leading axis",
                    file=path,
                    member=m[:-4],
                    hint=f"use --npz_mode arrays (each member -> one Example), or leave it out "
                    f"with --exclude_datasets {m[:-4]}",
                )
            lengths[m[:-4]] = h.shape[0]
            specs += leaf_specs(m[:-4], h.dtype, h.shape[1:], f"{path}, member '{m[:-4]}'")
        check_names(specs, path)
        if len(set(lengths.values())) > 1:
            raise SchemaError(
                f"Members have different leading lengths ({lengths}): rows mode takes row i of every member",
                file=path,
                hint=f"use --npz_mode arrays (each member -> one Example), {ARRAYS_READERS}",
            )
        num_rows = next(iter(lengths.values()))
        check_empty_rows(
            num_rows, sum(data_bytes(h) // max(1, h.shape[0]) for h in headers.values()), self.options, path
        )
        compressed = any(zf.getinfo(m).compress_type != zipfile.ZIP_STORED for m in members)
        return FileIndex(path, num_rows, tuple(specs), row_bytes(specs), 1, tuple(members), sequential=compressed)

    # -- reading -----------------------------------------------------------------------------

    def _archive(self, path: str) -> _OpenArchive:
        """This thread's open archive for ``path`` (the previous one is closed: one open at a time)."""
        current = getattr(self._local, "archive", None)
        if current is not None and current.path == path:
            return current
        self.close()
        zf, stream = self._zip(path)
        self._local.archive = _OpenArchive(path, stream, zf)
        return self._local.archive

    def close(self) -> None:
        """Closes this thread's open archive, if any (reading again reopens it)."""
        current = getattr(self._local, "archive", None)
        self._local.archive = None
        if current is not None:
            current.close()

    def _member_header(self, arc: _OpenArchive, member: str):
        if member not in arc.headers:
            info = arc.zf.getinfo(member)
            h = self._header(arc.zf, member, arc.path)
            start = None
            if info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) and not info.flag_bits & 1:
                start = member_data_start(arc.stream, info, arc.path)
            arc.headers[member] = (h, info, start)
        return arc.headers[member]

    def _column_inflater(self, arc: _OpenArchive, member: str, c: int) -> Inflater:
        """Column ``c``'s stream of a deflated Fortran-order member, forked from column ``c - 1``'s."""
        key = (member, c)
        if key not in arc.members:
            _, info, data_start = arc.headers[member]
            prev = arc.members.get((member, c - 1))
            arc.members[key] = (
                prev.fork()
                if isinstance(prev, Inflater)
                else Inflater(arc.stream, data_start, info.compress_size, info.file_size, info.CRC)
            )
        return arc.members[key]

    def _member_stream(self, arc: _OpenArchive, member: str, slot: int = -1):
        key = (member, slot)
        if key not in arc.members:
            arc.members[key] = arc.zf.open(member)
        return arc.members[key]

    def _read_member(self, arc: _OpenArchive, member: str, start: int | None, stop: int | None) -> np.ndarray:
        """Rows ``[start, stop)`` of a member (the whole array when ``start`` is None)."""
        h, info, data_start = self._member_header(arc, member)
        where = f"{arc.path}, member '{member[:-4]}'"
        if start is None:
            h = dataclasses.replace(h, shape=h.shape or (1,))
            start, stop, whole = 0, h.shape[0], True
        else:
            whole = False
        ncols = math.prod(h.shape[1:])
        if info.compress_type == zipfile.ZIP_STORED and data_start is not None:  # random access into the archive
            raw = dataclasses.replace(h, data_offset=data_start + h.data_offset)
            data = read_rows(arc.stream, raw, start, stop, where)
        elif h.fortran and len(h.shape) > 1 and 1 < ncols <= MAX_COLUMN_STREAMS and not whole:
            if info.compress_type == zipfile.ZIP_DEFLATED and data_start is not None:
                column_stream = functools.partial(self._column_inflater, arc, member)
            else:  # bzip2/lzma: a fresh decompressor per column (each skips to its column once)
                column_stream = functools.partial(self._member_stream, arc, member)
            data = read_rows(column_stream(0), h, start, stop, where, column_stream)
        else:
            data = read_rows(self._member_stream(arc, member), h, start, stop, where)
        return data.reshape(arc.headers[member][0].shape) if whole else data

    def read(self, rr: RowRange) -> Columns:
        """The columns of ``rr``: ``{member: rows}`` (rows mode) or ``{key, array}`` (arrays mode).

        Raises:
          SourceError: the archive or a member cannot be read (naming file, member and rows).
        """
        arc = self._archive(rr.path)
        try:
            if self.loose:
                out = {KEY: []}
                for m in rr.items:
                    for name, leaf in flatten_fields(ARRAY, self._read_member(arc, m, None, None)):
                        out.setdefault(name, []).append(leaf)
                    out[KEY].append(m[:-4].encode())
                return out
            columns = {}
            for m in rr.items:
                columns.update(flatten_fields(m[:-4], self._read_member(arc, m, rr.start, rr.stop)))
            return columns
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError) as e:
            self.close()
            raise SourceError(f"Cannot read {rr.describe()}: {e}", file=rr.path) from None
        except BaseException:
            self.close()  # a failed stream is never reused
            raise
