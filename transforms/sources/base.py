"""What every source shares: options, row ranges, file indexes, the Source base class (with the open files a
worker thread keeps between row ranges), row-range planning, feature specs of a row and the shared checks
(no FIFO or device is opened; rows of zero bytes are capped)."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import threading
from collections.abc import Sequence
from typing import ClassVar, TypeVar

import numpy as np

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec, normalize_dtype
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.storage import fileio

log = logging.getLogger("tfrecord_etl.transforms.sources")

T = TypeVar("T")
DEFAULT_RANGE_BYTES = 8 * 2**20  # see docs/performance.md: 64 MB ranges cost 1-1.5 s more kernel time per GB


# npz: uncompressed / compressed bytes of a member and of the whole archive. Deflate tops out near 1032
# (all zeros); real data measured with np.savez_compressed: float32 noise 1.1, int64 labels 11-27, 1% bool
# mask 49, 0.1% sparse uint8 image 264, a constant int64 array 684.
DEFAULT_MAX_COMPRESSION_RATIO = 500.0
DEFAULT_MAX_EMPTY_ROWS = 10**6  # rows mode: rows allowed when every row holds zero bytes
DEFAULT_MAX_VARIABLE_BYTES = 2 * 2**30  # matlab (v4-v7): one variable loaded whole (--max_mat_variable_mb 2048)
DEFAULT_MAX_MAT_NESTING = 64  # matlab (v5-v7): arrays inside cells/structs, levels (SciPy and NumPy crash near 5,000)
KEY, ARRAY = "key", "array"
DEFAULT_MAX_DATASETS = 100_000  # --max_datasets: planning keeps a name and a size per dataset
# row ranges of one file in a plan (each about 200 bytes of memory): 8 TiB at the default 8 MiB range, 64 PiB at
# --target_range_mb's largest; a declared shape beyond that is refused at planning instead of planned row by row
MAX_ROW_RANGES = 2**20


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """How to read the inputs. ``target_range_bytes``: the size of one row range, in bytes.

    A format's own options travel in ``formats`` (its ``FormatOptions`` model, read with :meth:`of`: raw, file
    collections, NumPy, MATLAB's limits, ENVI); the named fields below are the options every format or several formats share
    (containers' datasets, row group and mode; HDF5 and Zarr's storage flags)."""

    format: str | None = None  # None: from the file suffix
    datasets: tuple[str, ...] | None = None
    target_range_bytes: int = DEFAULT_RANGE_BYTES
    max_empty_rows: int = DEFAULT_MAX_EMPTY_ROWS  # rows mode, rows of zero bytes
    allow_external_storage: bool = False  # hdf5: read external raw files confined to the input's directory
    allow_fill_value: bool = False  # hdf5: read unallocated storage as the fill value
    # files: unlabelled files / orphan label rows are reported, not fatal (from --dead_letter_dir, not a format flag)
    files_dead_letters: bool = False
    container_mode: str = "auto"  # containers (hdf5, netcdf3, matlab, zarr): rows: row i of the chosen datasets
    # -> one Example; datasets: each dataset -> one; auto: rows, or datasets for a file holding no dataset with rows
    # (container.ContainerSource.switch_to_datasets)
    categoricals: str = "strings"  # hdf5, netcdf3: categorical columns as their names (strings) or codes
    row_group: int | None = None  # containers, rows mode without datasets: the row group (1 = largest, the default)
    max_datasets: int = DEFAULT_MAX_DATASETS  # hdf5: datasets walked in one file (and datasets-mode Examples)
    follow_symlinks: bool = False  # every source: follow symlinks that lead outside the pattern's base directory
    # the options models of the formats that read their own (FormatOptions.source_fields None): see of()
    formats: tuple = ()

    def of(self, model: type[T]) -> T:
        """The values of ``model`` (a format's ``FormatOptions`` subclass, ``sources/options.py``) these options
        carry, else its defaults: how a source reads the options it declares in ``options_models``."""
        for found in self.formats:
            if type(found) is model:
                return found
        return model()


@dataclasses.dataclass(frozen=True)
class RowRange:
    """Rows ``[start, stop)`` of ``path``; in ``arrays``/``files`` modes, rows are members or files.

    ``items`` names the datasets (hdf5), members (npz) or, in ``files`` mode (``item_files``), the
    files of the range.
    """

    path: str
    start: int
    stop: int
    items: tuple[str, ...] = ()
    item_files: bool = False

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def describe(self) -> str:
        return f"rows {self.start}-{self.stop - 1} of '{self.path}'"


@dataclasses.dataclass(frozen=True)
class FileIndex:
    """What planning learns of one file: rows, features (encoding not yet chosen), bytes per row."""

    path: str
    num_rows: int
    specs: tuple[FeatureSpec, ...]
    row_bytes: int
    chunk_rows: int = 1
    items: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()  # arrays/files modes: bytes of each row
    item_files: bool = False  # files mode: items are the files, one per row
    # rows are decompressed from the file's start (a deflated .npz member): a row range after the first reads
    # every compressed byte before it again unless the ranges are read in order by one worker (one stream)
    sequential: bool = False
    # what a convention says the converted datasets mean ({path: {attribute: JSON value}}, e.g. an NWB series'
    # unit and rate): recorded in metadata.json's ``sources`` entry, never per-row features
    attributes: dict | None = dataclasses.field(default=None, compare=False)


Columns = dict  # feature name -> np.ndarray (rows, *shape) or list of per-row values


def plan_row_ranges(index: FileIndex, target_bytes: int, start: int = 0, stop: int | None = None) -> list[RowRange]:
    """Splits a file into row ranges of about ``target_bytes`` each, aligned to HDF5 chunk rows.

    ``start``/``stop`` (rows) limit the split to part of a file whose rows are all ``row_bytes`` long
    (not to files of per-row ``sizes``); ranges then start at ``start`` and end at ``stop``.
    """
    if index.sizes:  # one row per member/file: group consecutive rows up to the target size
        ranges, start, acc = [], 0, 0
        for i, size in enumerate(index.sizes):
            if i > start and acc + size > target_bytes:
                ranges.append(RowRange(index.path, start, i, index.items[start:i], index.item_files))
                start, acc = i, 0
            acc += size
        if index.num_rows > start:
            ranges.append(RowRange(index.path, start, index.num_rows, index.items[start:], index.item_files))
        return ranges
    stop = index.num_rows if stop is None else stop
    rows = max(1, target_bytes // max(1, index.row_bytes))
    if index.chunk_rows > 1 and rows > index.chunk_rows:
        rows -= rows % index.chunk_rows
    count = -(-(stop - start) // rows)
    if count > MAX_ROW_RANGES:
        raise SourceError(
            f"The file declares {index.num_rows:,} rows of {index.row_bytes:,} bytes "
            f"({index.num_rows * index.row_bytes:,} bytes): {count:,} row ranges of "
            f"{rows * index.row_bytes:,} bytes, more than the {MAX_ROW_RANGES:,} one plan holds",
            file=index.path,
            hint="raise --target_range_mb (up to 64 GiB) for a file this large, or check its declared shape",
        )
    return [RowRange(index.path, s, min(s + rows, stop), index.items) for s in range(start, stop, rows)]


def merge_specs(indexes: Sequence[FileIndex], loose: bool) -> tuple[FeatureSpec, ...]:
    """The features shared by all files.

    With ``loose`` (arrays/files modes) dtypes and dimensions that differ become None; otherwise any
    difference is a SchemaError naming both files.
    """
    first = indexes[0]
    specs = {s.name: s for s in first.specs}
    for other in indexes[1:]:
        theirs = {s.name: s for s in other.specs}
        if set(theirs) != set(specs):
            raise SchemaError(
                f"Files have different features: {sorted(specs)} in '{first.path}' but "
                f"{sorted(theirs)} in '{other.path}'",
                hint="convert them in separate runs",
            )
        for name, spec in specs.items():
            o = theirs[name]
            if spec.categories != o.categories:
                raise SchemaError(
                    f"Categorical column '{name}' has other categories in '{other.path}' than in '{first.path}'",
                    hint="convert them in separate runs (metadata.json keeps one list of categories per feature)",
                )
            if spec.dtype == o.dtype and spec.shape == o.shape:
                continue
            if not loose:
                raise SchemaError(
                    f"Feature '{name}' is {spec.dtype} {spec.shape} in '{first.path}' but "
                    f"{o.dtype} {o.shape} in '{other.path}'",
                    hint="convert them in separate runs",
                )
            specs[name] = _loosen(spec, o)
    return tuple(specs.values())


def loosen_all(specs: Sequence[FeatureSpec]) -> FeatureSpec:
    """One spec covering all ``specs`` (of one feature): dtypes and dimensions that differ become None."""
    out = specs[0]
    for s in specs[1:]:
        out = _loosen(out, s)
    return out


def _loosen(a: FeatureSpec, b: FeatureSpec) -> FeatureSpec:
    dtype = a.dtype if a.dtype == b.dtype else None
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        shape = None
    else:
        shape = tuple(x if x == y else None for x, y in zip(a.shape, b.shape))
    return dataclasses.replace(a, dtype=dtype, shape=shape)


def row_spec(name: str, dtype: np.dtype, row_shape: tuple, where: str) -> FeatureSpec:
    return FeatureSpec(name, normalize_dtype(dtype, where), tuple(int(d) for d in row_shape))


def leaf_specs(name: str, dtype: np.dtype, row_shape: tuple, where: str, vlen_check=None) -> list[FeatureSpec]:
    """Feature specs of one array column: one per leaf field of a structured dtype."""
    if dtype.subdtype is not None:
        base, sub = dtype.subdtype
        return leaf_specs(name, base, tuple(row_shape) + tuple(sub), where, vlen_check)
    if dtype.fields is not None:
        out = []
        for field in dtype.names:
            out.extend(
                leaf_specs(
                    f"{name}/{field}", dtype.fields[field][0], row_shape, f"{where}, field '{field}'", vlen_check
                )
            )
        return out
    if dtype.kind == "O" and vlen_check is not None:
        vlen_check(dtype, where)
        return [FeatureSpec(name, VLEN_BYTES, tuple(int(d) for d in row_shape), "list")]
    return [row_spec(name, dtype, row_shape, where)]


def row_bytes(specs: Sequence[FeatureSpec]) -> int:
    total = 0
    for s in specs:
        itemsize = 64 if s.dtype in (None, VLEN_BYTES) else np.dtype(s.dtype).itemsize
        total += itemsize * (s.size or 1)
    return total


def refuse_special_file(path: str) -> None:
    """Refuses a local input that is not a regular file (FIFO, device, socket) before opening it: opening a
    FIFO blocks forever and a device has no end. Remote paths are objects, always regular.

    Raises:
      SourceError: naming the file and what it is.
    """
    if not fileio.is_local(path):
        return

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise SourceError(f"Cannot open file: {e.strerror}", file=path) from None
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a directory"
            if stat.S_ISDIR(mode)
            else "not a file"
        )
        raise SourceError(
            f"Not a regular file ({kind}): refused, never opened",
            file=path,
            hint="name regular .npy/.npz files as inputs",
        )


def check_empty_rows(num_rows: int, data_row_bytes: int, options: SourceOptions, path: str) -> None:
    """Rows of zero bytes (shape ``(N, 0)``) are not bounded by the file size: ``N`` is capped by
    ``options.max_empty_rows`` (``--max_empty_rows``).

    Raises:
      SourceError: more such rows than the limit (naming the file, the rows and the flag).
    """
    if data_row_bytes == 0 and num_rows > options.max_empty_rows:
        raise SourceError(
            f"Every row holds zero bytes and the header declares {num_rows} rows: more than "
            f"the limit of {options.max_empty_rows} empty rows",
            file=path,
            hint="raise --max_empty_rows if you really want that many empty Examples",
        )


class Source:
    """Base: ``index(path)`` learns a file's rows and features; ``read(row_range)`` returns columns."""

    format_name: str = ""  # the --format value; a registered source declares it
    suffixes: tuple[str, ...] = ()  # lower-case file suffixes that select it
    magic: tuple[bytes, ...] = ()  # how its files start: the file's content decides its source (format_of)
    magic_offsets: tuple[int, ...] = (0,)  # where a magic may stand (HDF5: after a user block, see Hdf5Source)
    content_label: str = ""  # what a file with this magic is, for messages about foreign files
    # what --help calls its inputs, in the list of formats of `tfrecord-etl --help` and `convert --help` (registry
    # order; flaghelp.input_formats); a registered source declares its own (the format's name otherwise)
    help_label: str = ""
    modes: tuple[str, ...] = ("rows",)  # its modes; the first is the default
    takes_datasets = True  # --datasets names its arrays (datasets, variables, members); False: refused for it
    loose = False  # arrays/files modes: dtype and shape may vary between rows
    # its options: FormatOptions subclasses (sources/options.py) as "MODULE.CLASS" under this package (imported
    # when used: they need pydantic, the light reader does not), the flags, config keys and --help groups they
    # declare; the registry builds the config, the command line and planning's SourceOptions from them
    options_models: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        """True when ``head`` (a file's first bytes, :data:`transforms.sources.SNIFF_BYTES` of them) shows one of
        this source's ``magic`` at one of its ``magic_offsets``."""
        return any(head[o : o + len(m)] == m for o in cls.magic_offsets if o < len(head) for m in cls.magic)

    def __init__(self, options: SourceOptions):
        self.options = options
        self._local = threading.local()  # what a worker thread keeps open between row ranges

    def __getstate__(self):  # open files stay with the worker that opened them
        state = dict(self.__dict__)
        state.pop("_local", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._local = threading.local()

    def index(self, path: str) -> FileIndex:
        raise NotImplementedError

    def read(self, rr: RowRange) -> Columns:
        raise NotImplementedError

    def pin_files(self, paths: Sequence[str]) -> None:
        """Records the size and modification time (``fileio.pin``) of every local file of ``paths`` at planning, for
        :meth:`read_pinned`; called before the files are indexed, so a change during planning is seen too. Remote
        inputs are pinned by their reads (ETag or generation, ``fileio``)."""
        self.pins = {p: fileio.pin(p) for p in paths if fileio.is_local(p)}

    def read_pinned(self, rr: RowRange) -> Columns:
        """:meth:`read`, with the range's local files (``rr.path``, or each file of a ``files`` range) checked
        against their pins (:meth:`pin_files`) before the read and after it, and after a read that failed (a file cut
        short while read fails as changed, not as corrupt): one ``os.stat`` per file each time.

        Raises:
          InputChangedError: a file's size or modification time is not the one planned (``... changed while it was
            read: run again``, naming the file). Anything :meth:`read` raises.
        """
        pins = getattr(self, "pins", None)
        paths = [p for p in (rr.items if rr.item_files else (rr.path,)) if p in pins] if pins else []
        for p in paths:
            fileio.check_pin(p, pins[p])
        try:
            columns = self.read(rr)
        finally:
            for p in paths:
                fileio.check_pin(p, pins[p])
        return columns

    def index_files(self, pattern: str, files: list[tuple[str, int]]) -> list[FileIndex] | None:
        """The indexes of all matched ``(path, size)`` at once, for a source that plans from the listing alone
        (``files``); None (the default) indexes each file with :meth:`index`."""
        return None

    def range_bytes(self, target_bytes: int) -> int:
        """The target bytes of one row range for this source (``--target_range_mb``, unless the source knows
        better: ``files`` plans one file per range)."""
        return target_bytes

    def describe(self) -> dict:
        """What ``metadata.json`` records of the inputs besides the files and rows (e.g. label names)."""
        return {}

    def tree(self, path: str) -> dict | None:
        """What ``tfrecord-etl inspect FILE`` lists of ``path``, in ``hdf5tree.render_tree``'s form (its HDUs,
        datasets, row groups and the default convert takes), or None (the default): inspect then prints what convert
        makes of the file (its rows and features, ``inspect.summarize_input``) or, for HDF5, NetCDF-3, MATLAB and
        Zarr, their own trees."""
        return None

    def is_sidecar(self, path: str) -> bool:
        """True for a matched file that describes data rather than holding it (never read as an input)."""
        return False

    def close(self) -> None:
        """Closes what this worker thread keeps open between row ranges (reading again reopens it)."""


def check_names(specs: Sequence[FeatureSpec], path: str) -> None:
    seen = set()
    for s in specs:
        if s.name in seen:
            raise SchemaError(f"Duplicate feature name '{s.name}'", file=path)
        seen.add(s.name)
