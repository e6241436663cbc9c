"""Raw binary arrays (``--format raw``): a file of fixed-size rows as ``np.memmap`` opens it, with the dtype, the
shape, the byte offset of the data, the order (C or Fortran) and optionally the row count given by flags or by a
sidecar file; without a count the rows come from the file size. Local files are memory-mapped; remote ones are
read with one ranged read per row range (C order) or per column (Fortran order), as ``.npy`` files are."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from tfrecord_etl.transforms.codec import flatten_fields
from tfrecord_etl.transforms.errors import ConfigError, SchemaError, SourceError
from tfrecord_etl.transforms.sources.base import (
    ARRAY,
    Columns,
    FileIndex,
    RowRange,
    Source,
    check_empty_rows,
    leaf_specs,
    refuse_special_file,
    row_bytes,
)
from tfrecord_etl.transforms.sources.npyformat import NpyHeader, read_rows
from tfrecord_etl.transforms.storage import fileio

SIDECAR_SUFFIXES = (".json", ".yaml", ".yml")
DIRECTORY_SIDECARS = tuple(f"raw{s}" for s in SIDECAR_SUFFIXES)  # one layout for every file of a directory
MAX_SIDECAR_BYTES = 64 * 1024
LAYOUT_KEYS = ("dtype", "shape", "offset", "order", "count")


@dataclasses.dataclass(frozen=True)
class RawLayout:
    """How a raw file holds its array: ``dtype`` (a NumPy dtype string, any byte order), ``shape`` (the array's
    shape; the first dimension may be -1: as many rows as the file holds), ``offset`` (bytes before the data),
    ``order`` (``C``, or ``F`` for Fortran order: the first axis varies fastest) and ``count`` (rows after the
    offset; the bytes after them are left unread, e.g. a second array; None: up to the end of the file)."""

    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    offset: int = 0
    order: str = "C"
    count: int | None = None

    def merged(self, other: RawLayout, where: str) -> RawLayout:
        """This layout (from flags) completed by ``other`` (from a sidecar); a key set in both must agree.

        Raises:
          ConfigError: a key given differently by the flags and the sidecar ``where``.
        """
        out = {}
        for key in LAYOUT_KEYS:
            mine, theirs = getattr(self, key), getattr(other, key)
            default = getattr(RawLayout, key)
            if mine != default and theirs != default and mine != theirs:
                raise ConfigError(
                    f"--{key} {mine!r} disagrees with {key}: {theirs!r} in the sidecar {where}",
                    hint="drop the flag or fix the sidecar",
                )
            out[key] = mine if mine != default else theirs
        return RawLayout(**out)


def parse_layout(obj, where: str) -> RawLayout:
    """A :class:`RawLayout` from a sidecar mapping (``{"dtype": ">f4", "shape": [-1, 28, 28], "offset": 0,
    "order": "C", "count": 100}``; all but dtype and shape optional). Raises ConfigError naming ``where`` for
    unknown keys or bad values."""
    if not isinstance(obj, dict):
        raise ConfigError(
            f"The raw sidecar {where} holds a {type(obj).__name__}, expected a mapping of {', '.join(LAYOUT_KEYS)}"
        )
    unknown = sorted(set(obj) - set(LAYOUT_KEYS))
    if unknown:
        raise ConfigError(f"The raw sidecar {where} has unknown keys {unknown}", hint=f"keys are {list(LAYOUT_KEYS)}")
    try:
        shape = obj.get("shape")
        if isinstance(shape, str):
            shape = [int(d) for d in shape.split(",")]
        layout = RawLayout(
            None if obj.get("dtype") is None else str(obj["dtype"]),
            None if shape is None else tuple(int(d) for d in shape),
            int(obj.get("offset", 0)),
            str(obj.get("order", "C")).upper(),
            None if obj.get("count") is None else int(obj["count"]),
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"The raw sidecar {where} has a bad value: {e}") from None
    return layout


def check_layout(layout: RawLayout, path: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of a complete layout, checked: a supported dtype without Python objects, dimensions
    >= 0 (only the first may be -1), offset >= 0, order C or F, a count >= 0 that agrees with a fixed first
    dimension. With a count, the shape's first dimension is the count.

    Raises:
      ConfigError: a missing or bad dtype/shape/offset/order/count (naming the file).
    """
    if layout.dtype is None or layout.shape is None:
        raise ConfigError(
            "--format raw needs the array's dtype and shape",
            file=path,
            hint="pass --dtype (e.g. '>f4') and --shape (e.g. -1,28,28), or put them in a sidecar "
            f"{fileio.basename(path)}.json / raw.json next to the file",
        )
    try:
        dtype = np.dtype(layout.dtype)
    except TypeError as e:
        raise ConfigError(f"--dtype {layout.dtype!r} is not a NumPy dtype: {e}", file=path) from None
    if dtype.hasobject:
        raise SchemaError(f"--dtype {layout.dtype!r} holds Python objects, which raw bytes cannot", file=path)
    if not layout.shape or any(d < 0 for d in layout.shape[1:]) or layout.shape[0] < -1:
        raise ConfigError(
            f"--shape {list(layout.shape or ())} must list the dimensions, each >= 0; only the first "
            "may be -1 (as many rows as the file holds)",
            file=path,
        )
    if layout.offset < 0 or layout.order not in ("C", "F"):
        raise ConfigError(f"--offset {layout.offset} must be >= 0 and --order C or F (got {layout.order!r})", file=path)
    if layout.count is None:
        return dtype, tuple(layout.shape)
    if layout.count < 0:
        raise ConfigError(f"--count {layout.count} must be >= 0 (rows after --offset)", file=path)
    if layout.shape[0] not in (-1, layout.count):
        raise ConfigError(
            f"--count {layout.count} disagrees with --shape {list(layout.shape)}",
            file=path,
            hint="give the row count once: --shape -1,... with --count, or --shape alone",
        )
    return dtype, (layout.count, *layout.shape[1:])


class RawSource(Source):
    """Raw binary files of fixed-size rows (``np.memmap``'s view of a file), rows mode."""

    options_models = ("options_raw.RawOptions",)  # its flags: sources/options_*.py

    format_name = "raw"
    help_label = "raw binary files"
    suffixes = (".raw", ".bin", ".dat")
    takes_datasets = False  # one array per file
    modes = ("rows",)

    def is_sidecar(self, path: str) -> bool:
        """True for a layout sidecar (``<file>.json|yaml|yml`` or ``raw.json|yaml|yml``): never read as data."""
        name = fileio.basename(path).lower()
        return name in DIRECTORY_SIDECARS or name.endswith(
            tuple(s + t for s in self.suffixes for t in SIDECAR_SUFFIXES)
        )

    def _sidecar(self, path: str) -> RawLayout:
        """The layout of ``path``'s sidecar (``<path>.json|yaml|yml``, else ``raw.json|yaml|yml`` in its
        directory), or an empty layout. Sidecars are small (at most 64 KiB) YAML or JSON mappings."""
        import yaml

        directory = fileio.dirname(path)
        candidates = [path + s for s in SIDECAR_SUFFIXES] + [fileio.join(directory, n) for n in DIRECTORY_SIDECARS]
        for candidate in candidates:
            if not fileio.exists(candidate):
                continue
            refuse_special_file(candidate)
            with fileio.open_read(candidate) as f:
                text = f.read(MAX_SIDECAR_BYTES + 1)
            if len(text) > MAX_SIDECAR_BYTES:
                raise ConfigError(f"The raw sidecar is over {MAX_SIDECAR_BYTES} bytes", file=candidate)
            try:
                obj = json.loads(text) if candidate.endswith(".json") else yaml.safe_load(text)
            except (ValueError, yaml.YAMLError) as e:
                raise ConfigError(
                    f"The raw sidecar is not valid {'JSON' if candidate.endswith('.json') else 'YAML'}: {e}",
                    file=candidate,
                ) from None
            return parse_layout(obj, candidate)
        return RawLayout()

    def layout(self, path: str) -> RawLayout:
        """The flags' layout completed by the file's sidecar, if any."""
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.options_raw import RawOptions

        o = self.options.of(RawOptions)
        flags = RawLayout(o.dtype, tuple(o.shape) if o.shape else None, o.offset, o.order, o.count)
        sidecar = self._sidecar(path)
        return flags.merged(sidecar, path + " (sidecar)") if sidecar != RawLayout() else flags

    def header(self, path: str, size: int) -> NpyHeader:
        """The file's array as a .npy header would declare it, its rows from ``size`` (the file's bytes).

        Raises:
          ConfigError: no or a bad layout. SourceError: the data is not a whole number of rows (naming the
            remainder); a fixed shape whose bytes differ from the data's; a count of rows past the end of the file.
        """
        layout = self.layout(path)
        dtype, shape = check_layout(layout, path)
        row_bytes = dtype.itemsize * math.prod(shape[1:])
        data = size - layout.offset
        if data < 0:
            raise SourceError(f"The file holds {size} bytes, less than --offset {layout.offset}", file=path)
        if shape[0] == -1:
            if row_bytes == 0:
                raise SourceError(
                    "--shape -1,... with rows of 0 bytes: the row count cannot come from the size",
                    file=path,
                    hint="give the row count as the first dimension",
                )
            rows, rest = divmod(data, row_bytes)
            if rest:
                raise SourceError(
                    f"The data ({data} bytes after offset {layout.offset}) is not a whole number of "
                    f"rows of {row_bytes} bytes ({dtype.str} {list(shape[1:])}): {rest} bytes remain",
                    file=path,
                    hint="check --dtype, --shape and --offset; --count N reads N rows "
                    "after --offset and leaves the bytes after them",
                )
            shape = (rows, *shape[1:])
        elif layout.count is not None:
            if row_bytes * shape[0] > data:
                raise SourceError(
                    f"--count {shape[0]} rows of {row_bytes} bytes ({dtype.str} {list(shape[1:])}) are "
                    f"{row_bytes * shape[0]} bytes, but the file holds {data} bytes after offset "
                    f"{layout.offset}",
                    file=path,
                    hint="check --count, --dtype, --shape and --offset",
                )
        elif row_bytes * shape[0] != data:
            extra = data - row_bytes * shape[0]
            raise SourceError(
                f"--shape {list(shape)} of {dtype.str} is {row_bytes * shape[0]} bytes, but the file "
                f"holds {data} bytes after offset {layout.offset}",
                file=path,
                hint=(
                    f"add --count {shape[0]} to read those rows and leave the {extra} bytes after "
                    "them (e.g. a second array), or use -1 as the first dimension to take the row "
                    "count from the file size"
                )
                if extra > 0
                else "check --dtype, --shape and --offset, or use -1 as the first dimension to take the "
                "row count from the file size",
            )
        return NpyHeader(shape, layout.order == "F", dtype, layout.offset)

    def index(self, path: str) -> FileIndex:
        """Rows and features of one raw file from its size and layout; nothing is read but the sidecar.

        Raises:
          ConfigError, SourceError, SchemaError: see :meth:`header`; more rows of 0 bytes than --max_empty_rows.
        """
        refuse_special_file(path)
        h = self.header(path, fileio.size(path))
        check_empty_rows(h.shape[0], h.dtype.itemsize * math.prod(h.shape[1:]), self.options, path)
        specs = tuple(leaf_specs(ARRAY, h.dtype, h.shape[1:], path))
        return FileIndex(path, h.shape[0], specs, row_bytes(specs), 1, ())

    def read(self, rr: RowRange) -> Columns:
        refuse_special_file(rr.path)
        h = self.header(rr.path, fileio.size(rr.path))
        if fileio.is_local(rr.path) and h.shape[0]:
            mm = np.memmap(
                rr.path, dtype=h.dtype, mode="r", offset=h.data_offset, shape=h.shape, order="F" if h.fortran else "C"
            )
            data = np.array(mm[rr.start : rr.stop], order="C")
            del mm
        else:
            with fileio.open_read(rr.path) as f:
                data = read_rows(f, h, rr.start, rr.stop, rr.path)
        return dict(flatten_fields(ARRAY, data))
