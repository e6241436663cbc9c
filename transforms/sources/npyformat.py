"""The ``.npy`` format, shared by the .npy and .npz sources: header parsing, declared sizes checked against the
bytes present, and strided row reads (C and Fortran order, any byte order)."""

from __future__ import annotations

import dataclasses
import math
import zipfile
from typing import BinaryIO

import numpy as np

from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources.base import ARRAY, leaf_specs, loosen_all


@dataclasses.dataclass(frozen=True)
class NpyHeader:
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype
    data_offset: int


def read_npy_header(stream: BinaryIO, where: str) -> NpyHeader:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(stream)
        else:
            shape, fortran, dtype = fmt._read_array_header(stream, version)  # 3.0: utf-8 field names
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise SourceError(
            f"Not a readable .npy array: {e}", file=where, hint="the file is truncated or not written by numpy.save"
        ) from None
    if dtype.hasobject:
        raise SchemaError(
            "Array holds Python objects (a pickled object array); refused: input is never unpickled",
            file=where,
            hint="save the data with a numeric or string dtype",
        )
    return NpyHeader(tuple(shape), fortran, dtype, stream.tell())


def read_rows(stream: BinaryIO, h: NpyHeader, start: int, stop: int, where: str, column_stream=None) -> np.ndarray:
    """Rows ``[start, stop)`` of an array stored after ``h.data_offset``; reads only those bytes.

    C order: one seek and one read. Fortran order: a seek and a read per column of the rows (the
    first axis varies fastest there), reassembled in C order. ``column_stream(c)``, when given,
    returns the stream to read column ``c`` from (one forward-only decompressor per column of a
    compressed npz member, so reading ranges in order decompresses each byte once).

    Raises:
      SourceError: fewer bytes than the header declares (naming the byte offset and the rows).
    """
    k, rest = stop - start, h.shape[1:]
    item = h.dtype.itemsize
    ncols = math.prod(rest)

    def read(offset, nbytes, f=stream):
        f.seek(h.data_offset + offset)
        data = f.read(nbytes)
        if len(data) != nbytes:
            raise SourceError(
                f"Truncated array data: {len(data)} of {nbytes} bytes at byte {offset}",
                file=where,
                rows=f"{start}-{stop - 1}",
                hint="the file was cut short",
            )
        return data

    if not h.fortran or len(h.shape) <= 1:
        return np.frombuffer(read(start * ncols * item, k * ncols * item), dtype=h.dtype).reshape((k, *rest))
    cols = np.empty((ncols, k), dtype=h.dtype)
    for c in range(ncols):
        f = column_stream(c) if column_stream is not None else stream
        cols[c] = np.frombuffer(read((c * h.shape[0] + start) * item, k * item, f), dtype=h.dtype)
    return np.ascontiguousarray(cols.T.reshape((k, *rest), order="F"))


def data_bytes(h: NpyHeader) -> int:
    """Bytes of the array data the header declares (exact: Python ints, no overflow)."""
    return h.dtype.itemsize * math.prod(h.shape)


def check_declared(h: NpyHeader, present: int, path: str, member: str | None = None) -> None:
    """Refuses a header that declares more bytes (header + shape x itemsize) than are present.

    ``present``: the file size (.npy) or the member's uncompressed size in the zip directory (.npz).

    Raises:
      SourceError: naming the file (and member), the declared shape and dtype, declared and present bytes.
    """
    declared = h.data_offset + data_bytes(h)
    if declared > present:
        what = "member" if member is not None else "file"
        raise SourceError(
            f"Truncated array data: the .npy header declares shape {h.shape} of {h.dtype.str}, "
            f"{declared} bytes with the header, but the {what} holds {present} bytes",
            file=path,
            member=member,
            hint="the file is truncated or its header is corrupt; rewrite it with numpy.save",
        )


def read_whole(stream: BinaryIO, h: NpyHeader, where: str) -> np.ndarray:
    """The whole array (a 0-d array too), in C order."""
    flat = dataclasses.replace(h, shape=h.shape or (1,))
    return read_rows(stream, flat, 0, flat.shape[0], where).reshape(h.shape)


def merged_array_specs(headers, path, members=None) -> tuple[FeatureSpec, ...]:
    """The array features of arrays/files modes, loosened over ``headers`` (``members``: their npz member names,
    named in errors): ``array``, or ``array/FIELD`` per leaf field of a structured dtype (nested fields
    ``array/outer/inner``; a subarray field adds its dimensions after the array's, as ``flatten_fields`` reads it).

    Raises:
      SchemaError: an unsupported dtype, or members whose leaf fields differ (naming two of them).
    """
    wheres = [f"{path}, member '{m}'" for m in members] if members is not None else [path] * len(headers)
    by_name: dict[str, list[FeatureSpec]] = {}
    first = None
    for h, where, i in zip(headers, wheres, range(len(headers))):
        leaves = leaf_specs(ARRAY, h.dtype, h.shape, where)
        names = [s.name for s in leaves]
        if first is None:
            first = (names, i)
        elif names != first[0]:
            which = (
                (f"members '{members[first[1]]}' ({', '.join(first[0])}) and '{members[i]}' ({', '.join(names)})")
                if members is not None
                else "files"
            )
            raise SchemaError(
                f"Arrays of different fields cannot share one schema: {which}",
                file=path,
                hint="convert them in separate runs (--datasets / --exclude_datasets choose members)",
            )
        for s in leaves:
            by_name.setdefault(s.name, []).append(s)
    return tuple(loosen_all(specs) for specs in by_name.values())
