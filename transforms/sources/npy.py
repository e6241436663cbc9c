"""``.npy`` source: rows of one array (memory-mapped when local), or one Example per file."""

from __future__ import annotations

import math

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
    leaf_specs,
    refuse_special_file,
    row_bytes,
)
from tfrecord_etl.transforms.sources.npyformat import (
    NpyHeader,
    check_declared,
    data_bytes,
    merged_array_specs,
    read_npy_header,
    read_rows,
    read_whole,
)
from tfrecord_etl.transforms.storage import fileio


class NpySource(Source):
    """``.npy`` files: rows of one array (memory-mapped when local), or one Example per file."""

    options_models = ("options_numpy.NumpyOptions",)  # its flags: sources/options_*.py

    format_name = "npy"
    help_label = ".npy"
    suffixes = (".npy",)
    magic = (b"\x93NUMPY",)  # NumPy's .npy format ("format.py": the magic string, then the version)
    content_label = "a .npy array"
    takes_datasets = False  # one array per file
    modes = ("rows", "files")

    def __init__(self, options: SourceOptions):
        super().__init__(options)
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions

        self.loose = options.of(NumpyOptions).npy_mode == "files"

    def _header(self, path: str) -> NpyHeader:
        refuse_special_file(path)
        with fileio.open_read(path) as f:
            return read_npy_header(f, path)

    def index(self, path: str) -> FileIndex:
        """Learns rows and features from the header, checked against the file size.

        Raises:
          SourceError: unreadable header, a header declaring more bytes than the file holds, more rows
            of zero bytes than ``max_empty_rows``.
          SchemaError: object arrays, 0-d arrays in rows mode.
        """
        refuse_special_file(path)
        with fileio.open_read(path) as f:
            h = read_npy_header(f, path)
            check_declared(h, f.seek(0, 2), path)
        if self.loose:
            size = data_bytes(h)
            specs = (FeatureSpec(KEY, VLEN_BYTES, (), "list"), *merged_array_specs([h], path))
            return FileIndex(path, 1, specs, size, 1, (path,), (size,))
        if not h.shape:
            raise SchemaError(
                "Array is 0-d: rows mode needs a leading axis",
                file=path,
                hint="use --npy_mode files (each file -> one Example)",
            )
        check_empty_rows(h.shape[0], h.dtype.itemsize * math.prod(h.shape[1:]), self.options, path)
        name = ARRAY
        specs = tuple(leaf_specs(name, h.dtype, h.shape[1:], path))
        return FileIndex(path, h.shape[0], specs, row_bytes(specs), 1, ())

    def read(self, rr: RowRange) -> Columns:
        if self.loose:
            out = {KEY: [fileio.basename(p)[:-4].encode() for p in rr.items]}
            for p in rr.items:
                h = self._header(p)
                with fileio.open_read(p) as f:
                    for name, leaf in flatten_fields(ARRAY, read_whole(f, h, p)):
                        out.setdefault(name, []).append(leaf)
            return out
        if fileio.is_local(rr.path):
            refuse_special_file(rr.path)
            try:
                mm = np.load(rr.path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as e:
                raise SourceError(
                    f"Cannot memory-map the array: {e}",
                    file=rr.path,
                    rows=f"{rr.start}-{rr.stop - 1}",
                    hint="the file may be truncated",
                ) from None
            data = np.array(mm[rr.start : rr.stop], order="C")
            del mm
        else:
            h = self._header(rr.path)
            with fileio.open_read(rr.path) as f:
                data = read_rows(f, h, rr.start, rr.stop, rr.path)
        return dict(flatten_fields(ARRAY, data))
