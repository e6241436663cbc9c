"""Add fields to an existing TFRecord collection of ``tf.train.Example``, one input shard per work item.

The augment pipeline reads as::

    AugmentShards -> FinalizeAugment

* **Plan** (launcher, before any output exists): match the input shards (or read a convert output's
  ``metadata.json``), choose each shard's compression, infer the features of a collection without
  metadata from its first records, call ``--fn`` once on the first records to learn the new fields'
  dtypes and shapes, index the join source. Bad options fail here.
* **AugmentShards**: each worker streams one input shard a batch of records at a time, computes the new
  fields for the whole batch, encodes them in one call, and writes, per record, either the old record's
  bytes followed by the new Example's bytes (``rewrite``; a concatenation of serialized Examples is one
  Example, a protobuf merge) or only the new Example (``sidecar``) into a temporary file, renamed to
  the input shard's name when complete. A key join first extracts each record's key and joins it
  with the source rows (``CoGroupByKey``); a position join of a collection without record counts
  first counts every shard's records.
* **FinalizeAugment**: checks records in = records out, writes ``manifest.json`` (sidecar) and, last,
  ``metadata.json``, the commit point.

Old features are never decoded and re-encoded, except those named by ``--fn_inputs`` or the key
feature, which are decoded (and only read) to compute the new ones.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import itertools
import json
import logging
import os
import traceback
import uuid
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
import google_crc32c
import numpy as np
from apache_beam.metrics import Metrics

from transforms import beam_io, fileio, metadata, outdir, tfrecord
from transforms.codec import (MAX_FEATURES, VLEN_BYTES, FeatureSpec, batch_decodable, check_example_frame,
                              check_spec, decode_batch,
                              decode_example_lenient, drop_features, encode_columns, feature_key_pattern,
                              infer_feature_specs, normalize_dtype, split_features)
from transforms.errors import ConfigError, EtlError, RecordError, SchemaError, SourceError
from transforms.reader import MANIFEST_FILE, SIDECAR_FORMAT
from transforms.sources import FileIndex, RowRange, Source, SourceOptions

log = logging.getLogger(__name__)
NAMESPACE = beam_io.NAMESPACE
MODES = ("rewrite", "sidecar")
INFER_RECORDS = 1000  # records sampled to infer the features of a collection without metadata
PROBE_RECORDS = 8  # records --fn is called on in the launcher to learn its outputs' dtypes and shapes
BATCH_MB = 256  # new values of one batch are kept under this many MB: --batch_size shrinks for big new records
RESERVED_NAMES = (metadata.METADATA_FILE, metadata.SCHEMA_FILE, MANIFEST_FILE)
_SCALAR_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "float16", "float32", "float64", "bytes", "str")


def frame_error(e: RecordError, file: str, record: int) -> RecordError:
    """The RecordError of an input record that ``codec.check_example_frame`` refused, naming file and record."""
    limit = e.message.startswith("More than")  # the feature limit, not a malformed record
    return RecordError(e.message if limit else f"Input record is not a tf.train.Example: {e.message}", file=file,
                       record=record, payload_offset=e.context.get("offset"),
                       hint=e.hint or "augment reads tf.train.Example records only; remove or fix this record")


def _with(error: EtlError, hint: str | None = None, **context) -> EtlError:
    """``error`` with more context (its own keys win) and, when it has none, ``hint``."""
    return type(error)(error.message, hint=error.hint or hint, **{**context, **error.context})


# ----------------------------------------------------------------------------------------------
# The input collection
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class InputShard:
    """One input shard and where its output goes.

    Attributes:
      index: position in the collection's shard order (metadata order, else sorted paths).
      path: the input file. compression: ``none``, ``gzip`` or ``zlib``.
      output_file: the output shard's file name (the input's, compression suffix adjusted).
      records: record count from the input metadata, or None when unknown.
      offset: index of the shard's first record in the collection (position join), or None.
    """

    index: int
    path: str
    compression: str
    output_file: str
    records: int | None = None
    offset: int | None = None


@dataclasses.dataclass(frozen=True)
class InputCollection:
    """The input shards and their features (from ``metadata.json``, or inferred when ``inferred``)."""

    pattern: str
    shards: tuple[InputShard, ...]
    specs: tuple[FeatureSpec, ...]
    inferred: bool

    @property
    def num_records(self) -> int | None:
        counts = [s.records for s in self.shards]
        return None if None in counts else sum(counts)

    @property
    def compressions(self) -> set[str]:
        return {s.compression for s in self.shards}


def output_name(path: str, compression: str, output_compression: str) -> str:
    """The output shard name of input ``path``: the same name, the compression suffix swapped."""
    name = fileio.basename(path)
    for suffix in {"gzip": (".gz",), "zlib": (".zlib", ".zz")}.get(compression, ()):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
            break
    return name + tfrecord.SUFFIXES[output_compression]


def resolve_input(pattern: str, compression: str = "auto", sample_size: int | None = None,
                  max_record_bytes: int | None = None, max_features: int | None = None
                  ) -> tuple[InputCollection, list[bytes]]:
    """Finds the input shards, their compression and features; returns them and a sample of records.

    ``pattern`` is an output directory of tfrecord-etl (its ``metadata.json`` gives the shards, the
    compression, the features and the record counts) or a file pattern of TFRecord shards (when all
    matched files sit in such a directory and are listed in its metadata, the metadata is used too).
    ``compression`` ``auto``: from the metadata, else each file's suffix, else the first bytes of the
    first file without a suffix (applied to all files without one).

    Returns:
      ``(collection, sample)``: ``output_file`` is still the input name (see :func:`output_name`);
      ``sample`` holds up to ``sample_size`` (default :data:`INFER_RECORDS`) first records of the
      collection (features of a collection without metadata are inferred from it).

    Raises:
      ConfigError: a directory without metadata.json. SourceError: nothing matches, or a match is not a
        regular file (FIFO, device).
      SchemaError, RecordError: records that are not tf.train.Example, a record over ``max_record_bytes``
        (default ``tfrecord.record_limit()``), more than ``max_features`` features (default
        ``codec.MAX_FEATURES``) in a record or in the sample.
    """
    meta, counts = None, {}
    if fileio.is_dir(pattern):
        if not fileio.exists(fileio.join(pattern, metadata.METADATA_FILE)):
            raise ConfigError("--input is a directory without metadata.json (not a complete tfrecord-etl output)",
                              file=pattern, hint="pass a file pattern of its TFRecord shards, e.g. "
                                                 f"'{fileio.join(pattern, '*.tfrecord*')}'")
        meta = metadata.load(pattern)
        paths = metadata.shard_paths(pattern, meta)
    else:
        paths = [p for p, _ in fileio.match(pattern)]
        parents = {p[:len(p) - len(fileio.basename(p))] for p in paths}
        if len(parents) == 1:
            parent = parents.pop()
            if fileio.exists(fileio.join(parent, metadata.METADATA_FILE)):
                candidate = metadata.load(parent)
                if {fileio.basename(p) for p in paths} <= {s["file"] for s in candidate["shards"]}:
                    meta = candidate
    if meta is not None:
        counts = {s["file"]: s["records"] for s in meta["shards"]}
    for path in paths:
        tfrecord.check_regular(path)  # a FIFO or device among the shards is never opened
    comps = _compressions(paths, compression, meta)
    shards = tuple(InputShard(i, p, c, fileio.basename(p), counts.get(fileio.basename(p)))
                   for i, (p, c) in enumerate(zip(paths, comps)))
    sample = read_sample(shards, (sample_size or INFER_RECORDS) if meta is None else PROBE_RECORDS,
                         max_record_bytes)
    if meta is not None:
        return InputCollection(pattern, shards, tuple(meta["features"]), False), sample
    try:
        specs = infer_feature_specs(sample, max_features)
    except RecordError as e:
        raise _with(e, "the input must hold tf.train.Example records", file=shards[0].path) from None
    except SchemaError as e:
        raise e.with_context(file=pattern) from None
    return InputCollection(pattern, shards, specs, True), sample


def _compressions(paths: Sequence[str], compression: str, meta: dict | None) -> list[str]:
    if compression != "auto":
        return [compression] * len(paths)
    if meta is not None:
        return [meta["compression"]] * len(paths)
    comps = [tfrecord.compression_from_path(p) for p in paths]
    unsuffixed = [p for p, c in zip(paths, comps) if c == "none"]
    if unsuffixed:
        with fileio.open_read(unsuffixed[0]) as f:
            detected = tfrecord.detect_compression(f.read(12))
        comps = [detected if p in set(unsuffixed) else c for p, c in zip(paths, comps)]
    return comps


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


class _TallyReader:
    """A read-only stream that counts (and optionally checksums) the bytes read through it."""

    def __init__(self, raw, checksum=None):
        self._raw, self._checksum, self.bytes = raw, checksum, 0
        self.mode, self.name = "rb", getattr(raw, "name", "")

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self.bytes += len(data)
        if self._checksum is not None and data:
            self._checksum.update(data)
        return data

    def readable(self) -> bool:
        return True


def iter_shard(shard: InputShard, tally: dict | None = None, max_record_bytes: int | None = None
               ) -> Iterator[tuple[int, bytes]]:
    """``(record index, record bytes)`` of one input shard, streamed a record at a time, CRCs checked.

    With ``tally`` (a dict), sets ``tally["bytes"]`` and ``tally["crc32c"]`` (8 hex digits) of the
    stored (compressed) file bytes once the shard is read to its end.

    Raises:
      RecordError: a truncated or corrupt frame, the wrong compression, or a length header over
        ``max_record_bytes`` (default ``tfrecord.record_limit()``), checked before reading the record
        (file, record, offset).
    """
    checksum = google_crc32c.Checksum() if tally is not None else None
    tfrecord.check_regular(shard.path)
    with fileio.open_read(shard.path) as raw:
        stream = _TallyReader(raw, checksum)
        for index, _, record in tfrecord.iter_records(tfrecord.open_decompressed(stream, shard.compression),
                                                      shard.path, max_record_bytes=max_record_bytes):
            yield index, record
        while stream.read(1 << 22):  # bytes after the last frame (e.g. a gzip trailer) count too
            pass
    if tally is not None:
        tally["bytes"], tally["crc32c"] = stream.bytes, checksum.hexdigest().decode()


def batches(records: Iterable[tuple[int, bytes]], size: int) -> Iterator[tuple[int, list[bytes]]]:
    """``(index of the first record, records)`` batches of up to ``size`` records."""
    it = iter(records)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk[0][0], [r for _, r in chunk]


# ----------------------------------------------------------------------------------------------
# Values: constants, defaults, user functions
# ----------------------------------------------------------------------------------------------

def parse_scalar(text: str, dtype: str, where: str = "") -> np.ndarray | bytes:
    """``text`` as a value of ``dtype``: a 0-d array, or bytes for ``bytes``/``str`` (UTF-8).

    ``dtype`` is a NumPy dtype (``int8``, ``<f8``, ``|S6``, ...) or ``bytes``/``str``. Booleans read
    ``true/false/1/0/yes/no``; integers are range-checked.

    Raises:
      ConfigError: the text is not a value of that dtype, or the dtype is not supported.
    """
    at = f"{where}: " if where else ""
    if dtype in ("bytes", "str", VLEN_BYTES):
        return _utf8(text, at)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ConfigError(f"{at}unknown dtype {dtype!r}", hint=f"use one of {', '.join(_SCALAR_DTYPES)}") from None
    try:
        if dt.kind == "b":
            lower = text.strip().lower()
            if lower not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return np.array(lower in ("true", "1", "yes"), dt)
        if dt.kind in "iu":
            value, info = int(text), np.iinfo(dt)
            if not info.min <= value <= info.max:
                raise ValueError(f"{value} is out of range [{info.min}, {info.max}]")
            return np.array(value, dt)
        if dt.kind == "f":
            return np.array(float(text), dt)
        if dt.kind in "SU":
            return np.array(text, dt)
    except (ValueError, UnicodeEncodeError) as e:
        raise ConfigError(f"{at}cannot read {text!r} as {dt}: {e}") from None
    raise ConfigError(f"{at}values of dtype {dt} cannot be given on the command line",
                      hint=f"use one of {', '.join(_SCALAR_DTYPES)}")


def parse_constant(name: str, text: str) -> np.ndarray | bytes:
    """One ``--constants`` value ``VALUE[:DTYPE]``.

    Without ``DTYPE``: an integer is ``int64``, a decimal number ``float32``, anything else ``bytes``
    (UTF-8). ``DTYPE``: ``bool``, ``int8``..``int64``, ``uint8``..``uint64``, ``float16/32/64``,
    ``bytes``, ``str``. Raises ConfigError.
    """
    value, dtype = text, None
    if ":" in text and text.rsplit(":", 1)[1] in _SCALAR_DTYPES:
        value, dtype = text.rsplit(":", 1)
    where = f"--constants {name}"
    if dtype is not None:
        return parse_scalar(value, dtype, where)
    for kind in ("int64", "float32"):
        try:
            return parse_scalar(value, kind, where)
        except ConfigError:
            pass
    return _utf8(value, f"{where}: ")


def _utf8(text: str, at: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{at}{text!r} holds code point U+{ord(text[e.start]):04X} (a lone surrogate, e.g. from "
                          "bytes that are not UTF-8 on the command line), which has no UTF-8 form",
                          hint="give the value as valid UTF-8 text") from None


def load_function(spec: str) -> Callable:
    """The callable named by ``module:function`` (``function`` may be dotted: ``module:Class.method``).

    Raises:
      ConfigError: a malformed spec, a module that cannot be imported, or a missing or non-callable name.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--fn {spec!r} is not of the form module:function",
                          hint="e.g. --fn mypkg.features:add_label")
    hint = "make the module importable (PYTHONPATH, or install it on the workers, e.g. with Beam's --setup_file)"
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"Cannot import the module of --fn {spec}: {e}", hint=hint) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"--fn {spec}: '{module_name}' has no attribute '{attr}'", hint=hint)
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"--fn {spec} is not callable")
    return obj


def _bytes_objects(arr: np.ndarray, name: str, batch: bool = False) -> np.ndarray:
    """An object array of bytes (str as UTF-8) of a bytes/str array; ``batch``: ``arr`` is ``(rows, ...)``
    (errors then name the ``batch_row``). Raises RecordError for a str with no UTF-8 form."""
    out = np.empty(arr.shape, dtype=object)
    if arr.dtype.kind == "U":  # before NumPy makes str objects (it cannot for code points above U+10FFFF)
        from transforms.codec import check_unicode
        try:
            check_unicode(name, arr if batch and arr.ndim else arr.reshape(1, -1))
        except RecordError as e:
            if batch and arr.ndim:
                raise
            raise RecordError(e.message, hint=e.hint, feature=name) from None
    for idx, v in np.ndenumerate(arr):
        if isinstance(v, str):
            try:
                out[idx] = v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise RecordError(f"New feature '{name}' holds code point U+{ord(v[e.start]):04X} (a lone "
                                  "surrogate), which is not valid Unicode and has no UTF-8 form", feature=name,
                                  hint="return valid str values, or bytes") from None
        elif isinstance(v, (bytes, np.bytes_)):
            out[idx] = bytes(v)
        else:
            raise SchemaError(f"New feature '{name}' holds a {type(v).__name__} in an object array; only bytes "
                              "and str can be", feature=name, hint="return a numeric array, or bytes/str values")
    return out


def _column(name: str, arr: np.ndarray) -> np.ndarray:
    """A new feature's batch column: numeric arrays as they are; strings as object arrays of bytes."""
    return _bytes_objects(arr, name, batch=True) if arr.dtype.kind in "SUO" else arr


def spec_of(name: str, column: np.ndarray, encoding: str, allow_lossy: Iterable[str] = ()) -> FeatureSpec:
    """The FeatureSpec of a new feature from a batch column ``(rows, *shape)``.

    Numeric columns keep their dtype (little-endian string) and use ``encoding``; bytes/str become
    ``bytes`` features (``list`` encoding). Raises SchemaError (unsupported dtype, refused lossy cast).
    """
    if column.dtype == object:
        spec = FeatureSpec(name, VLEN_BYTES, tuple(column.shape[1:]), "list")
    else:
        spec = FeatureSpec(name, normalize_dtype(column.dtype, f"new feature '{name}'"), tuple(column.shape[1:]),
                           encoding)
    check_spec(spec, allow_lossy)
    return spec


def _call(fn: Callable, fn_name: str, inputs: dict, file: str, record) -> Mapping:
    try:
        out = fn(inputs)
    except Exception as e:  # the user's code: name the record and the line
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise RecordError(f"--fn {fn_name} raised {type(e).__name__}: {e} (at {frame.filename}:{frame.lineno})",
                          file=file, record=record, hint="fix the function; it gets {name: np.ndarray} of the "
                          "--fn_inputs and returns {new name: array}") from e
    if not isinstance(out, Mapping):
        raise SchemaError(f"--fn {fn_name} returned a {type(out).__name__}, expected a dict of arrays",
                          file=file, record=record)
    bad = [k for k in out if not isinstance(k, str)]
    if bad:
        key = bad[0]
        twin = [k for k in out if k is not key and str(k) == str(key)]
        what = f"keys {key!r} and {twin[0]!r}, which name the same feature" if twin else \
            f"key {key!r} ({type(key).__name__})"
        raise SchemaError(f"--fn {fn_name} returned {what}; feature names must be str", file=file, record=record,
                          feature=str(key), hint="return {str name: array} with distinct names")
    return out


def value_bytes(value) -> int:
    """Bytes a new value holds: ``nbytes`` of a numeric array, the total length of bytes/str values."""
    if isinstance(value, (bytes, str)):
        return len(value)
    arr = np.asarray(value)
    if arr.dtype == object:
        return sum(len(v) if isinstance(v, (bytes, str)) else 8 for v in arr.reshape(-1).tolist())
    return int(arr.nbytes)


def check_new_size(size: int, limit: int | None, fn_name: str, file: str, record) -> None:
    """Raises RecordError when the new values of one record (``size`` bytes) are over ``limit``."""
    if limit is not None and size > limit:
        raise RecordError(f"--fn {fn_name} returned {size} bytes ({size / 2**20:.1f} MB) for one record, over the "
                          f"record size limit of {limit} bytes (--max_record_mb {limit / 2**20:g})", file=file,
                          record=record, size=size, hint="return smaller values, or raise --max_record_mb")


def decode_record(specs: Sequence[FeatureSpec], record: bytes, file: str, index: int) -> dict[str, np.ndarray]:
    """The features in ``specs`` of one record (``codec.decode_example_lenient``); errors name the record."""
    try:
        return decode_example_lenient(record, specs)
    except RecordError as e:
        raise _with(e, "the --fn_inputs features must decode with the input's feature specs", file=file,
                    record=index) from None


def decode_inputs(specs: Sequence[FeatureSpec], records: Sequence[bytes], file: str, first: int):
    """``{name: (rows, *shape)}`` of a batch decoded in one C++ call (``codec.decode_batch``), or None when
    a spec cannot be decoded that way (varying shapes). A bad record is located by decoding record by
    record, so the error names it."""
    if not specs or not all(batch_decodable(s) for s in specs):
        return None if specs else {}
    try:
        return decode_batch(records, specs)
    except RecordError as batch_error:
        for i, record in enumerate(records):
            decode_record(specs, record, file, first + i)
        raise batch_error.with_context(file=file, record=f"{first}-{first + len(records) - 1}") from None


def fn_columns(fn: Callable, fn_name: str, specs: Sequence[FeatureSpec], records: Sequence[bytes], batched: bool,
               file: str, first: int, max_record_bytes: int | None = None) -> dict[str, np.ndarray]:
    """The new columns ``{name: (rows, *shape)}`` that ``fn`` computes for a batch of records.

    Only the features in ``specs`` are decoded (``codec.decode_example_lenient``). Per example
    (``batched`` False), ``fn({name: array of the feature's shape})`` returns ``{new name: value}``;
    values are stacked. With ``batched``, ``fn`` is called once with arrays stacked along a new leading
    axis of ``len(records)`` and returns arrays with that leading length.

    Raises:
      RecordError: a record cannot be decoded, ``fn`` raised, or its values for one record are over
        ``max_record_bytes`` (checked as each record's values come back; naming the file and record index).
      SchemaError: outputs of different keys, shapes or dtypes between examples; a wrong batch length;
        a key that is not a str (``1`` and ``"1"`` would name one feature).
    """
    n = len(records)
    stacked = decode_inputs(specs, records, file, first)
    if stacked is None:
        inputs = [decode_record(specs, r, file, first + i) for i, r in enumerate(records)]
    else:
        inputs = [{name: arr[i] for name, arr in stacked.items()} for i in range(n)] if not batched else []
    if batched:
        if stacked is None:
            stacked = {}
            for spec in specs:
                try:
                    stacked[spec.name] = np.stack([x[spec.name] for x in inputs])
                except ValueError:
                    raise SchemaError(f"--fn_batch: feature '{spec.name}' varies in length between records, so "
                                      "it cannot be stacked", file=file, record=f"{first}-{first + n - 1}",
                                      hint="use a per-example --fn (without --fn_batch)") from None
        out = _call(fn, fn_name, stacked, file, f"{first}-{first + n - 1}")
        check_new_size(sum(value_bytes(v) for v in out.values()) // max(n, 1), max_record_bytes, fn_name, file,
                       f"{first}-{first + n - 1}")
        columns = {}
        for name, value in out.items():
            arr = np.asarray(value)
            if arr.ndim == 0 or arr.shape[0] != n:
                raise SchemaError(f"--fn_batch {fn_name}: '{name}' has shape {arr.shape}, expected a leading "
                                  f"axis of {n} (one value per record)", file=file, record=f"{first}-{first + n - 1}")
            try:
                columns[str(name)] = _column(name, arr)
            except EtlError as e:
                raise e.with_context(file=file, record=f"{first}-{first + n - 1}") from None
        return columns
    outs = []
    for i, x in enumerate(inputs):
        outs.append(_call(fn, fn_name, x, file, first + i))
        check_new_size(sum(value_bytes(v) for v in outs[-1].values()), max_record_bytes, fn_name, file, first + i)
    names = list(outs[0])
    columns = {}
    for name in names:
        values = []
        for i, out in enumerate(outs):
            if name not in out or len(out) != len(names):
                raise SchemaError(f"--fn {fn_name} returned keys {sorted(out)} but {sorted(names)} for the first "
                                  "record of the batch", file=file, record=first + i,
                                  hint="return the same keys for every record")
            values.append(np.asarray(out[name]))
        kinds = {v.dtype.kind in "SUO" for v in values}
        if len(kinds) == 1 and kinds.pop():
            converted = []
            for i, v in enumerate(values):
                try:
                    converted.append(_bytes_objects(v, name))
                except EtlError as e:
                    raise e.with_context(file=file, record=first + i) from None
            values = converted
        shapes, dtypes = {v.shape for v in values}, {v.dtype for v in values}
        if len(shapes) > 1 or len(dtypes) > 1:
            what = f"shapes {sorted(map(str, shapes))}" if len(shapes) > 1 else f"dtypes {sorted(map(str, dtypes))}"
            raise SchemaError(f"--fn {fn_name}: '{name}' has {what} in one batch; a new feature has one dtype "
                              "and shape", file=file, record=f"{first}-{first + n - 1}", feature=name)
        columns[str(name)] = np.stack(values)
    return columns


# ----------------------------------------------------------------------------------------------
# Joins with an array source (HDF5 / .npz / .npy, read with the convert pipeline's sources)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JoinPlan:
    """An array source joined to the records, by position (row n -> record n) or by key.

    Attributes:
      fields: ``(source feature, new feature name)`` pairs. specs: the new features' specs.
      key_spec: the collection's key feature (key join). join_key: the source's key feature.
      defaults: new name -> value for a record whose key has no source row; None: that is an error.
    """

    pattern: str
    by: str
    source: Source
    indexes: tuple[FileIndex, ...]
    ranges: tuple[RowRange, ...]
    fields: tuple[tuple[str, str], ...]
    specs: tuple[FeatureSpec, ...]
    key_spec: FeatureSpec | None = None
    join_key: str | None = None
    defaults: dict | None = None

    @property
    def num_rows(self) -> int:
        return sum(i.num_rows for i in self.indexes)


def _key_kind(spec: FeatureSpec) -> str | None:
    if spec.dtype == VLEN_BYTES:
        return "bytes"
    if spec.dtype is None:
        return None
    kind = np.dtype(spec.dtype).kind
    return "int" if kind in "iu" else ("bytes" if kind in "SU" else None)


def key_of(value, where: dict) -> int | bytes:
    """A join key from a decoded value holding one element: a Python int, or bytes (str as UTF-8).

    Raises:
      RecordError: not exactly one element, or not an integer or string.
    """
    arr = np.asarray(value)
    if arr.size != 1:
        raise RecordError(f"The key holds {arr.size} values, expected 1", **where)
    v = arr.reshape(-1)[0]
    if isinstance(v, (bytes, np.bytes_)):
        return bytes(v)
    if isinstance(v, (str, np.str_)):
        return str(v).encode("utf-8")
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    raise RecordError(f"The key {v!r} is a {type(v).__name__}, expected an integer or a string", **where)


def default_value(spec: FeatureSpec, text: str):
    """A ``--defaults`` value for ``spec``: an array of its shape and dtype, or bytes. Raises ConfigError."""
    value = parse_scalar(text, spec.dtype, f"--defaults {spec.name}")
    if spec.dtype == VLEN_BYTES:
        if spec.shape == ():
            return value
        out = np.empty(spec.shape, object)
        out.fill(value)
        return out
    return np.full(spec.shape, value, dtype=spec.dtype)


def plan_join(pattern: str, by: str, old_specs: Sequence[FeatureSpec], *, key_feature=None, join_key=None,
              fields: Mapping[str, str] | None = None, datasets=None, missing="error", defaults=None,
              encoding="tensor", allow_lossy=()) -> JoinPlan:
    """Indexes the join source (``beam_io.plan_inputs``) and checks the join options.

    Args:
      pattern: file pattern of HDF5 / .npz / .npy files (rows mode). by: ``position`` or ``key``.
      old_specs: the collection's features (the key feature is looked up there).
      fields: source feature -> new name (default: every source feature but the key, same name).
      datasets: HDF5 dataset paths to read (default all). missing/defaults: see :class:`JoinPlan`.

    Raises:
      ConfigError: unknown features or defaults. SchemaError: key kinds that cannot match.
      SourceError: unreadable source files.
    """
    plan = beam_io.plan_inputs(pattern, SourceOptions(datasets=tuple(datasets) if datasets else None))
    src_specs = beam_io.choose_encodings(plan.specs, encoding, {}, allow_lossy)
    by_name = {s.name: s for s in src_specs}
    key_spec = None
    if by == "key":
        old = {s.name: s for s in old_specs}
        if key_feature not in old:
            raise ConfigError(f"--key_feature '{key_feature}' is not a feature of the input",
                              hint=f"features are {sorted(old)}")
        if join_key not in by_name:
            raise ConfigError(f"--join_key '{join_key}' is not a feature of the join source", file=pattern,
                              hint=f"source features are {sorted(by_name)}")
        key_spec, src_key = old[key_feature], by_name[join_key]
        kinds = (_key_kind(key_spec), _key_kind(src_key))
        if None in kinds or kinds[0] != kinds[1]:
            raise SchemaError(f"Cannot join key feature '{key_feature}' ({key_spec.dtype}) with source key "
                              f"'{join_key}' ({src_key.dtype})", file=pattern,
                              hint="both keys must be integers, or both strings")
        if src_key.size != 1:
            raise SchemaError(f"Source key '{join_key}' has shape {src_key.shape}; a key is one value per row",
                              file=pattern)
    fields = dict(fields) if fields else {n: n for n in by_name if n != join_key}
    unknown = sorted(set(fields) - set(by_name))
    if unknown:
        raise ConfigError(f"--join_fields names {unknown}, which the join source does not have", file=pattern,
                          hint=f"source features are {sorted(by_name)}")
    specs = tuple(dataclasses.replace(by_name[src], name=new) for src, new in fields.items())
    parsed_defaults = None
    if missing == "default":
        defaults = dict(defaults or {})
        names = [s.name for s in specs]
        lacking, extra = [n for n in names if n not in defaults], sorted(set(defaults) - set(names))
        if lacking or extra:
            raise ConfigError(f"--missing default needs one --defaults value per joined feature: "
                              f"{'missing ' + str(lacking) if lacking else 'unknown ' + str(extra)}",
                              hint=f"joined features are {names}")
        parsed_defaults = {s.name: default_value(s, defaults[s.name]) for s in specs}
    return JoinPlan(pattern, by, plan.source, plan.indexes, plan.ranges, tuple(fields.items()), specs, key_spec,
                    join_key, parsed_defaults)


def _concat(parts: list):
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
    return [v for p in parts for v in p]


def read_source_rows(join: JoinPlan, start: int, stop: int) -> dict:
    """The join fields of source rows ``[start, stop)`` (rows numbered across the source files in order).

    Returns ``{new name: column}`` (arrays ``(rows, *shape)``, or lists for variable-length strings).

    Raises:
      SourceError: the source has fewer rows than asked (a position join on a collection with more
        records than source rows).
    """
    parts, base = [], 0
    for index in join.indexes:
        lo, hi = max(start, base), min(stop, base + index.num_rows)
        if lo < hi:
            parts.append(join.source.read(RowRange(index.path, lo - base, hi - base, index.items)))
        base += index.num_rows
    if stop > base:
        raise SourceError(f"The join source has {base} rows, but record {stop - 1} needs row {stop - 1}",
                          file=join.pattern, hint="--join_by position needs one source row per record")
    return {new: _concat([p[src] for p in parts]) for src, new in join.fields}


def _stack_joined(spec: FeatureSpec, values: list):
    if spec.dtype == VLEN_BYTES or not spec.is_fixed:
        return list(values)
    return np.stack([np.asarray(v) for v in values]).astype(np.dtype(spec.dtype), copy=False)


# ----------------------------------------------------------------------------------------------
# The plan and the batch step (pure: no Beam)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AugmentPlan:
    """Everything the workers need, decided in the launcher.

    Attributes:
      collection: the input shards (``output_file`` set) and old features.
      mode: ``rewrite`` (old record bytes + new Example) or ``sidecar`` (new Example only).
      fn, fn_specs, fn_batch: the user function (``module:function``), the old features it gets, batch calls.
      constants: ``(name, value)``; value is a 0-d array or bytes.
      new_specs: the new features, in order: fn outputs, join fields, constants.
      replace: new feature names allowed to replace existing ones; drop_keys: Example keys removed
        from old records first (the replaced features and their ``/shape``, ``/dtype`` companions).
      batch_size: records per batch (one encode call per batch).
      options: the validated config, recorded in the metadata.
    """

    collection: InputCollection
    output_dir: str
    mode: str
    output_compression: str
    new_specs: tuple[FeatureSpec, ...]
    fn: str | None = None
    fn_specs: tuple[FeatureSpec, ...] = ()
    fn_batch: bool = False
    constants: tuple[tuple[str, object], ...] = ()
    join: JoinPlan | None = None
    replace: tuple[str, ...] = ()
    drop_keys: tuple[str, ...] = ()
    allow_lossy: tuple[str, ...] = ()
    batch_size: int = 4096
    options: dict = dataclasses.field(default_factory=dict)
    max_record_bytes: int = dataclasses.field(default_factory=tfrecord.record_limit)
    max_features: int = MAX_FEATURES

    @property
    def output_specs(self) -> tuple[FeatureSpec, ...]:
        """The features of the output shards: old (minus replaced) + new, or only the new ones (sidecar)."""
        if self.mode == "sidecar":
            return self.new_specs
        return tuple(s for s in self.collection.specs if s.name not in self.replace) + self.new_specs


class BatchAugmenter:
    """Turns one batch of input records into output records; the pure core of AugmentShardFn.

    Per record: refuses a new feature name that the record already holds (SchemaError naming the
    feature, file and record index) unless it is in ``plan.replace``, then removes the replaced
    entries byte for byte (``codec.drop_features``). Per batch: computes the new columns (fn, join,
    constants) and encodes them in one ``codec.encode_columns`` call.
    """

    def __init__(self, plan: AugmentPlan):
        self.plan = plan
        self._fn = None
        self._new_keys = {k for s in plan.new_specs for k, _, _ in metadata.example_features(s)}
        self._allowed = set(plan.drop_keys) | {k for s in plan.new_specs if s.name in plan.replace
                                               for k, _, _ in metadata.example_features(s)}
        self._drop = frozenset(plan.drop_keys)
        self._patterns = tuple(feature_key_pattern(k) for k in sorted(self._new_keys | self._drop))

    def prepare(self, record: bytes, file: str, index: int) -> bytes:
        """The old record, checked to be framed as a tf.train.Example (every record, not only the sampled
        ones: ``codec.check_example_frame``, values not decoded) and for name clashes, with the replaced
        features removed.

        Raises:
          RecordError: not a tf.train.Example, or more than ``plan.max_features`` features (file, record).
          SchemaError: a new feature's name is already in the record.
        """
        try:
            check_example_frame(record, self.plan.max_features)
        except RecordError as e:
            raise frame_error(e, file, index) from None
        if not any(p in record for p in self._patterns):  # fast path: no parse
            return record
        try:
            present = set(split_features(record))
        except RecordError as e:
            raise e.with_context(file=file, record=index) from None
        clash = sorted((present & self._new_keys) - self._allowed)
        if clash:
            raise SchemaError(f"New feature '{clash[0]}' already exists in the record", file=file, record=index,
                              feature=clash[0], hint=f"pass --replace_fields {clash[0]} to replace it (rewrite "
                              "mode), or choose another name")
        return drop_features(record, self._drop) if present & self._drop else record

    def new_columns(self, records: Sequence[bytes], file: str, first: int, join_columns: dict | None = None) -> dict:
        """``{new name: column}`` for a batch: fn outputs, join columns (given), constants."""
        n, plan = len(records), self.plan
        columns = {}
        if plan.fn:
            if self._fn is None:
                self._fn = load_function(plan.fn)
            columns.update(fn_columns(self._fn, plan.fn, plan.fn_specs, records, plan.fn_batch, file, first,
                                      plan.max_record_bytes))
        columns.update(join_columns or {})
        for name, value in plan.constants:
            if isinstance(value, bytes):
                col = np.empty(n, dtype=object)
                col.fill(value)
            else:
                col = np.full(n, value, dtype=value.dtype)
            columns[name] = col
        return columns

    def augment(self, records: Sequence[bytes], file: str, first: int, join_columns: dict | None = None):
        """Output records of one batch: a list of bytes (rewrite) or a ``codec.EncodedBatch`` (sidecar).

        Raises:
          SchemaError: a name clash, or new values whose dtype/shape differ from ``plan.new_specs``.
          RecordError: a malformed record, or ``--fn`` raised.
        """
        n, plan = len(records), self.plan
        prepared = [self.prepare(r, file, first + i) for i, r in enumerate(records)]
        columns = self.new_columns(records, file, first, join_columns)
        names = [s.name for s in plan.new_specs]
        if sorted(columns) != sorted(names):
            raise SchemaError(f"The new features of this batch are {sorted(columns)}, but the first records gave "
                              f"{sorted(names)}", file=file, record=f"{first}-{first + n - 1}",
                              hint="--fn must return the same keys for every record")
        for spec in plan.new_specs:
            col = columns[spec.name]
            if isinstance(col, np.ndarray) and spec.is_fixed and col.shape[1:] != spec.shape:
                raise SchemaError(f"New feature '{spec.name}' has shape {col.shape[1:]} here but {spec.shape} in "
                                  "the first records", file=file, record=f"{first}-{first + n - 1}", feature=spec.name)
        try:
            encoded = encode_columns(columns, plan.new_specs, n, plan.allow_lossy)
        except EtlError as e:
            raise _with(e, "a new feature keeps the dtype and shape of the first records (see the metadata)",
                        file=file, record=f"{first}-{first + n - 1}") from None
        self._check_sizes(encoded, prepared, file, first)
        if plan.mode == "sidecar":
            return encoded
        return [old + new for old, new in zip(prepared, encoded.records())]

    def _check_sizes(self, encoded, prepared: Sequence[bytes], file: str, first: int) -> None:
        """Raises RecordError naming the record when an output record is over ``plan.max_record_bytes``."""
        limit, width = self.plan.max_record_bytes, encoded.width
        tails = encoded.tails or [b""] * encoded.num_rows
        old = prepared if self.plan.mode == "rewrite" else [b""] * encoded.num_rows
        for i, (tail, rec) in enumerate(zip(tails, old)):
            size = width + len(tail) + len(rec)
            if size > limit:
                raise RecordError(f"Output record of {size} bytes ({size / 2**20:.1f} MB) is over the record size "
                                  f"limit of {limit} bytes (--max_record_mb {limit / 2**20:g})", file=file,
                                  record=first + i, size=size, hint="raise --max_record_mb, or add smaller values")


def _check_options(cfg) -> None:
    problems = []
    if cfg.mode not in MODES:
        problems.append(f"--mode must be one of {MODES}")
    if not (cfg.fn or cfg.join_input or cfg.constants):
        problems.append("nothing to add: give --fn, --join_input or --constants")
    if (cfg.fn_inputs or cfg.fn_batch) and not cfg.fn:
        problems.append("--fn_inputs and --fn_batch need --fn")
    if cfg.join_input and cfg.join_by == "key" and not (cfg.key_feature and cfg.join_key):
        problems.append("--join_by key needs --key_feature (the input's key) and --join_key (the source's)")
    if (cfg.key_feature or cfg.join_key) and not (cfg.join_input and cfg.join_by == "key"):
        problems.append("--key_feature and --join_key need --join_input and --join_by key")
    if (cfg.join_fields or cfg.join_datasets) and not cfg.join_input:
        problems.append("--join_fields and --join_datasets need --join_input")
    if cfg.missing == "default" and not (cfg.join_input and cfg.join_by == "key"):
        problems.append("--missing default needs --join_by key")
    if cfg.defaults and cfg.missing != "default":
        problems.append("--defaults needs --missing default")
    if cfg.replace_fields and cfg.mode == "sidecar":
        problems.append("--replace_fields needs --mode rewrite: a sidecar cannot remove a value from the "
                        "original records")
    if problems:
        raise ConfigError("; ".join(problems), hint="see python -m pipelines.augment --help")


def plan_augment(cfg) -> AugmentPlan:
    """Plans a run from a validated config (``pipelines.augment.AugmentConfig`` or any object with its fields).

    Every user error surfaces here, before any output exists: options, inputs, the join source, the
    new fields' dtypes and shapes (``--fn`` is called once on the first records), name clashes with
    the known features, and a position join's row count when the record counts are known.

    Raises:
      ConfigError, SourceError, SchemaError, RecordError.
    """
    _check_options(cfg)
    max_record_bytes = tfrecord.record_limit(getattr(cfg, "max_record_mb", None))
    max_features = getattr(cfg, "max_features", None) or MAX_FEATURES
    collection, sample = resolve_input(cfg.input, cfg.compression, None, max_record_bytes, max_features)
    comps = collection.compressions
    if cfg.output_compression is None and len(comps) > 1:
        raise ConfigError(f"The input shards use several compressions {sorted(comps)}",
                          hint="choose the output's with --output_compression")
    out_comp = cfg.output_compression or comps.pop()
    shards = tuple(dataclasses.replace(s, output_file=output_name(s.path, s.compression, out_comp))
                   for s in collection.shards)
    names = [s.output_file for s in shards]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"Two input shards would write the same output file '{dupes[0]}'", file=cfg.input,
                          hint="input shards need distinct file names (augment one directory at a time)")
    bad = [n for n in names if n in RESERVED_NAMES or n.startswith(beam_io.TEMP_PREFIX)]
    if bad:
        raise ConfigError(f"Input file '{bad[0]}' is not a shard name this pipeline can write", file=cfg.input,
                          hint="narrow the --input pattern to the TFRecord shards")
    outdir.check_inputs_outside(cfg.output_dir, [s.path for s in shards] +
                                ([p for p, _ in fileio.match(cfg.join_input)] if cfg.join_input else []))
    old = {s.name: s for s in collection.specs}
    where = " (inferred from the first records)" if collection.inferred else ""
    missing = [n for n in cfg.fn_inputs if n not in old]
    if missing:
        raise ConfigError(f"--fn_inputs names {missing}, which the input does not have{where}", file=cfg.input,
                          hint=f"features are {sorted(old)}")
    fn_specs = tuple(old[n] for n in cfg.fn_inputs)
    new_specs: list[FeatureSpec] = []
    if cfg.fn:
        if not sample:
            raise ConfigError("The input holds no record, so --fn cannot be probed for its outputs", file=cfg.input)
        probe = sample[:PROBE_RECORDS]
        for i, record in enumerate(probe):
            try:
                check_example_frame(record, max_features)
            except RecordError as e:
                raise frame_error(e, shards[0].path, i) from None
        columns = fn_columns(load_function(cfg.fn), cfg.fn, fn_specs, probe, cfg.fn_batch, shards[0].path, 0,
                             max_record_bytes)
        if not columns:
            raise SchemaError(f"--fn {cfg.fn} returned no feature", hint="return {new name: array}")
        new_specs += [spec_of(n, c, cfg.encoding, cfg.allow_lossy) for n, c in columns.items()]
    join = None
    if cfg.join_input:
        join = plan_join(cfg.join_input, cfg.join_by, collection.specs, key_feature=cfg.key_feature,
                         join_key=cfg.join_key, fields=cfg.join_fields, datasets=cfg.join_datasets,
                         missing=cfg.missing, defaults=cfg.defaults, encoding=cfg.encoding,
                         allow_lossy=cfg.allow_lossy)
        new_specs += join.specs
    constants = tuple((name, parse_constant(name, text)) for name, text in cfg.constants.items())
    for name, value in constants:
        col = np.empty(1, object) if isinstance(value, bytes) else np.full(1, value, dtype=value.dtype)
        if isinstance(value, bytes):
            col[0] = value
        new_specs.append(spec_of(name, col, cfg.encoding, cfg.allow_lossy))
    seen: dict[str, int] = {}
    for s in new_specs:
        seen[s.name] = seen.get(s.name, 0) + 1
    twice = sorted(n for n, c in seen.items() if c > 1)
    if twice:
        raise ConfigError(f"New feature '{twice[0]}' comes from two places (--fn, --join_fields, --constants)",
                          hint="rename one of them")
    not_new = sorted(set(cfg.replace_fields) - set(seen))
    if not_new:
        raise ConfigError(f"--replace_fields names {not_new}, which are not new features", hint=f"new features are "
                          f"{sorted(seen)}; --replace_fields lets a new feature replace an existing one")
    clash = sorted(n for n in seen if n in old and n not in cfg.replace_fields)
    if clash:
        raise SchemaError(f"New feature '{clash[0]}' already exists in the input{where}", file=cfg.input,
                          feature=clash[0], hint=f"pass --replace_fields {clash[0]} to replace it (rewrite mode), "
                          "or choose another name")
    drop_keys = sorted({k for n in cfg.replace_fields
                        for k in ([e[0] for e in metadata.example_features(old[n])] if n in old else [n])})
    if join is not None and join.by == "position" and collection.num_records is not None:
        if join.num_rows != collection.num_records:
            raise SourceError(f"The join source has {join.num_rows} rows but the input has {collection.num_records} "
                              "records", file=cfg.join_input, hint="--join_by position needs one source row per "
                              "record, in shard order")
        offsets = np.concatenate([[0], np.cumsum([s.records for s in shards])])
        shards = tuple(dataclasses.replace(s, offset=int(o)) for s, o in zip(shards, offsets))
    batch_size = cfg.batch_size
    if cfg.fn and columns:  # big new values: fewer records per batch, so a batch's values stay under BATCH_MB
        per_record = max(1, sum(value_bytes(c) for c in columns.values()) // max(1, len(probe)))
        batch_size = max(1, min(batch_size, (BATCH_MB << 20) // per_record))
        if batch_size < cfg.batch_size:
            log.info("--fn returns about %d bytes per record: batches of %d records", per_record, batch_size)
    plan = AugmentPlan(dataclasses.replace(collection, shards=shards), cfg.output_dir, cfg.mode, out_comp,
                       tuple(new_specs), cfg.fn, fn_specs, cfg.fn_batch, constants, join, tuple(cfg.replace_fields),
                       tuple(drop_keys), tuple(cfg.allow_lossy), batch_size, cfg.model_dump(), max_record_bytes,
                       max_features)
    metadata.check_unique(plan.output_specs)
    return plan


# ----------------------------------------------------------------------------------------------
# Beam: DoFns and PTransforms
# ----------------------------------------------------------------------------------------------

def count_records(shard: InputShard, max_record_bytes: int | None = None) -> tuple[int, int]:
    """``(shard index, record count)``, by walking the shard's frames (CRCs and record sizes checked)."""
    return shard.index, sum(1 for _ in iter_shard(shard, max_record_bytes=max_record_bytes))


def plan_offsets(counts: Sequence[tuple[int, int]], num_rows: int, pattern: str, join_pattern: str) -> dict:
    """Shard index -> index of its first record in the collection; checks records = source rows.

    Raises:
      SourceError: the join source's row count differs from the collection's record count.
    """
    counts = sorted(counts)
    total = sum(n for _, n in counts)
    if total != num_rows:
        raise SourceError(f"The join source has {num_rows} rows but the input has {total} records",
                          file=join_pattern, input=pattern,
                          hint="--join_by position needs one source row per record, in shard order")
    offsets = np.concatenate([[0], np.cumsum([n for _, n in counts])])
    return {index: int(o) for (index, _), o in zip(counts, offsets)}


class ExtractKeysFn(beam.DoFn):
    """Streams one input shard: ``(key, (shard index, record index))`` per record (key join)."""

    def __init__(self, key_spec: FeatureSpec, batch_size: int = 4096, max_record_bytes: int | None = None,
                 max_features: int | None = None):
        self._spec, self._batch_size, self._max = key_spec, batch_size, max_record_bytes
        self._max_features = max_features

    def process(self, shard: InputShard):
        specs, name = [self._spec], self._spec.name
        for first, records in batches(iter_shard(shard, max_record_bytes=self._max), self._batch_size):
            for i, record in enumerate(records):  # framing and feature count, before the C++ decoder sees it
                try:
                    check_example_frame(record, self._max_features)
                except RecordError as e:
                    raise frame_error(e, shard.path, first + i) from None
            decoded = decode_inputs(specs, records, shard.path, first)
            values = decoded[name] if decoded is not None else \
                [decode_record(specs, r, shard.path, first + i)[name] for i, r in enumerate(records)]
            for i, value in enumerate(values):
                where = {"file": shard.path, "record": first + i, "feature": name}
                yield key_of(value, where), (shard.index, first + i)


class ReadJoinRowsFn(beam.DoFn):
    """Reads one row range of the join source: ``(key, {new name: row value})`` per row (key join)."""

    def __init__(self, join: JoinPlan):
        self._join = join

    def process(self, rr: RowRange):
        join = self._join
        columns = join.source.read(rr)
        keys = columns[join.join_key]
        for i in range(rr.num_rows):
            where = {"file": rr.path, "row": rr.start + i, "feature": join.join_key}
            values = {}
            for src, new in join.fields:
                v = columns[src][i]
                values[new] = v.copy() if isinstance(v, np.ndarray) else v
            yield key_of(keys[i], where), values

    def finish_bundle(self):
        self._join.source.close()


def match_keys(element, join: JoinPlan, shard_paths: Mapping[int, str]):
    """One ``CoGroupByKey`` group -> ``(shard index, (record index, values))`` per record with that key.

    Raises:
      SourceError: a key appears in several source rows; a record's key has no source row and no
        default is configured (naming the shard and record).
    """
    key, grouped = element
    refs, rows = list(grouped["records"]), list(grouped["rows"])
    if not refs:
        return
    if len(rows) > 1:
        raise SourceError(f"Key {key!r} appears in {len(rows)} rows of the join source", file=join.pattern,
                          hint="keys must be unique in the join source")
    if rows:
        values = rows[0]
    elif join.defaults is not None:
        values = join.defaults
    else:
        shard, record = min(refs)
        raise SourceError(f"No row of the join source has key {key!r} (held by {len(refs)} record(s))",
                          file=join.pattern, shard=shard_paths[shard], record=record, feature=join.key_spec.name,
                          hint="add the key to the join source, or pass --missing default --defaults NAME=VALUE,...")
    for shard, record in refs:
        yield shard, (record, values)


class AugmentShardFn(beam.DoFn):
    """Augments one input shard into one output shard, streamed a batch of records at a time.

    Elements: an :class:`InputShard`, or ``(shard index, {"shard": [InputShard], "values": [(record
    index, {name: value}), ...]})`` after a key join. Side input ``offsets`` (position join without
    known counts): shard index -> first record index in the collection.

    The output is written to ``.tmp-<name>-<uuid4>`` in the output directory and renamed to ``<name>``
    when complete (a retried attempt writes its own temporary file; the last rename wins, so exactly one
    final file exists); on failure the temporary file is deleted. Yields ``{"index", "input", "file",
    "records_in", "records", "bytes", "input_bytes", "crc32c", "compression"}``.

    Raises:
      RecordError: records in != records out, or != the count in the input metadata.
    """

    def __init__(self, plan: AugmentPlan):
        self._plan = plan
        self._augmenter = None
        self._read = Metrics.counter(NAMESPACE, "records_read")
        self._written = Metrics.counter(NAMESPACE, "records_written")
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._clock = beam_io.ShardClock()

    def setup(self):
        self._augmenter = BatchAugmenter(self._plan)

    def process(self, element, offsets=None):
        plan = self._plan
        self._clock.start()
        if isinstance(element, InputShard):
            shard, joined = element, None
        else:
            _, grouped = element
            shard, joined = list(grouped["shard"])[0], dict(grouped["values"])
        offset = shard.offset if shard.offset is not None else (offsets or {}).get(shard.index)
        final = fileio.join(plan.output_dir, shard.output_file)
        temp = fileio.join(plan.output_dir, f"{beam_io.TEMP_PREFIX}{shard.output_file}-{uuid.uuid4().hex}")
        tally: dict = {}
        count = 0
        try:
            with fileio.open_write(temp) as raw:
                writer = tfrecord.ShardWriter(raw, plan.output_compression)
                for first, records in batches(iter_shard(shard, tally, plan.max_record_bytes), plan.batch_size):
                    join_columns = self._join_columns(shard, first, len(records), offset, joined)
                    out = self._augmenter.augment(records, shard.path, first, join_columns)
                    if isinstance(out, list):
                        writer.write_batch(out)
                    else:
                        writer.write_encoded(out)
                    count += len(records)
                writer.close()
            expected = [("records written", writer.records), ("metadata", shard.records),
                        ("joined records", None if joined is None else len(joined))]
            for what, n in expected:
                if n is not None and n != count:
                    raise RecordError(f"The shard holds {count} records but {what}: {n}", file=shard.path,
                                      hint="the input changed during the run, or its metadata is wrong")
            fileio.rename(temp, final)
        except BaseException:
            try:
                fileio.delete([temp])
            except Exception:  # keep the original error
                log.warning("Cannot delete temporary file %s", temp)
            raise
        finally:
            if plan.join is not None:
                plan.join.source.close()  # the join source's files stay open for one shard
        size = fileio.size(final)
        self._read.inc(count)
        self._written.inc(writer.records)
        self._shards.inc()
        self._clock.end()
        yield {"index": shard.index, "input": shard.path, "file": shard.output_file, "records_in": count,
               "records": writer.records, "bytes": size, "input_bytes": tally["bytes"], "crc32c": tally["crc32c"],
               "compression": shard.compression}

    def _join_columns(self, shard: InputShard, first: int, n: int, offset, joined):
        join = self._plan.join
        if join is None:
            return None
        if join.by == "position":
            return read_source_rows(join, offset + first, offset + first + n)
        columns = {}
        for spec in join.specs:
            try:
                values = [joined[i][spec.name] for i in range(first, first + n)]
            except KeyError as e:
                raise RecordError(f"Record {e.args[0]} has no joined values", file=shard.path,
                                  hint="the input changed during the run") from None
            columns[spec.name] = _stack_joined(spec, values)
        return columns


def _keyed_by_index(shard: InputShard):
    return shard.index, shard


class AugmentShards(beam.PTransform):
    """Input shards -> augmented output shards (one work item per shard); yields per-shard results.

    Without a join: ``Create(shards) | Reshuffle | ParDo(AugmentShardFn)``. Position join without
    record counts: a first pass counts each shard's records (side input of first-record offsets). Key
    join: ``ExtractKeys`` (records) and ``ReadJoinRows`` (source) are joined with ``CoGroupByKey``,
    grouped by shard with the shard itself, then each group is augmented.
    """

    def __init__(self, plan: AugmentPlan):
        super().__init__()
        self._plan = plan

    def expand(self, pbegin):
        plan, join = self._plan, self._plan.join
        shards = pbegin | "CreateShards" >> beam.Create(list(plan.collection.shards))
        augment = AugmentShardFn(plan)
        if join is not None and join.by == "key":
            paths = {s.index: s.path for s in plan.collection.shards}
            keys = (shards
                    | "SpreadShards" >> beam.Reshuffle()
                    | "ExtractKeys" >> beam.ParDo(ExtractKeysFn(join.key_spec, plan.batch_size, plan.max_record_bytes,
                                                              plan.max_features)))
            rows = (pbegin
                    | "CreateJoinRanges" >> beam.Create(list(join.ranges))
                    | "SpreadJoinRanges" >> beam.Reshuffle()
                    | "ReadJoinRows" >> beam.ParDo(ReadJoinRowsFn(join)))
            matched = ({"records": keys, "rows": rows}
                       | "JoinByKey" >> beam.CoGroupByKey()
                       | "MatchKeys" >> beam.FlatMap(match_keys, join, paths))
            return ({"shard": shards | "KeyShards" >> beam.Map(_keyed_by_index), "values": matched}
                    | "GroupByShard" >> beam.CoGroupByKey()
                    | "AugmentShard" >> beam.ParDo(augment))
        spread = shards | "SpreadShards" >> beam.Reshuffle()
        if join is None or all(s.offset is not None for s in plan.collection.shards):
            return spread | "AugmentShard" >> beam.ParDo(augment)
        offsets = (spread
                   | "CountRecords" >> beam.Map(count_records, plan.max_record_bytes)
                   | "CollectCounts" >> beam.combiners.ToList()
                   | "PlanOffsets" >> beam.Map(plan_offsets, join.num_rows, plan.collection.pattern, join.pattern))
        return spread | "AugmentShard" >> beam.ParDo(augment, offsets=beam.pvalue.AsSingleton(offsets))


def manifest(plan: AugmentPlan, results: Sequence[dict]) -> dict:
    """The ``manifest.json`` of a sidecar collection: each input shard's path, compression, record
    count, size in bytes and CRC32C (of the stored bytes), with its sidecar shard, and the original
    features (``inferred`` when they were inferred from a collection without metadata)."""
    return {
        "format": SIDECAR_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "input": plan.collection.pattern,
        "inferred": plan.collection.inferred,
        "features": [s.to_json() for s in plan.collection.specs],
        "shards": [{"input": _absolute(r["input"]), "compression": r["compression"], "records": r["records_in"],
                    "bytes": r["input_bytes"], "crc32c": r["crc32c"], "sidecar": r["file"]} for r in results],
        "num_records": sum(r["records_in"] for r in results),
    }


def _absolute(path: str) -> str:
    return os.path.abspath(path) if fileio.is_local(path) else path


class FinalizeAugmentFn(beam.DoFn):
    """Checks records in = records out (per shard and in total), writes ``manifest.json`` (sidecar) and,
    last, ``schema.pbtxt`` + ``metadata.json``; removes temporaries of killed attempts.

    Raises:
      RecordError: a shard missing or duplicated, or records lost.
    """

    def __init__(self, plan: AugmentPlan):
        self._plan = plan

    def process(self, results):
        plan = self._plan
        results = sorted(results, key=lambda r: r["index"])
        if [r["index"] for r in results] != list(range(len(plan.collection.shards))):
            raise RecordError(f"{len(results)} shard results for {len(plan.collection.shards)} input shards",
                              file=plan.output_dir, hint="re-run; report it if it happens again")
        total_in, total_out = sum(r["records_in"] for r in results), sum(r["records"] for r in results)
        bad = [r["input"] for r in results if r["records_in"] != r["records"]]
        expected = plan.collection.num_records
        if bad or total_in != total_out or (expected is not None and expected != total_in):
            raise RecordError(f"Records in ({total_in}) != records out ({total_out}) (metadata: {expected})",
                              file=bad[0] if bad else plan.output_dir, hint="re-run; report it if it happens again")
        outdir.remove_temporaries(plan.output_dir, [r["file"] for r in results])
        if plan.mode == "sidecar":
            tmp = fileio.join(plan.output_dir, f".{MANIFEST_FILE}.tmp")
            fileio.write_bytes(tmp, json.dumps(manifest(plan, results), indent=1).encode())
            fileio.rename(tmp, fileio.join(plan.output_dir, MANIFEST_FILE))
        specs = plan.output_specs
        shards = [{"file": r["file"], "records": r["records"], "bytes": r["bytes"]} for r in results]
        sources = [{"path": r["input"], "records": r["records_in"]} for r in results]
        meta = metadata.build(specs, shards, plan.output_compression, sources, "augment", plan.options)
        meta["augment"] = {
            "mode": plan.mode, "input": plan.collection.pattern, "input_features_inferred": plan.collection.inferred,
            "records_in": total_in, "new_features": [s.name for s in plan.new_specs], "replaced": list(plan.replace),
            "join": None if plan.join is None else {"input": plan.join.pattern, "by": plan.join.by,
                                                    "files": [i.path for i in plan.join.indexes]},
        }
        metadata.write(plan.output_dir, meta, specs)
        yield plan.output_dir


class FinalizeAugment(beam.PTransform):
    """Per-shard results -> ``manifest.json`` (sidecar) and ``metadata.json``, after every shard is final."""

    def __init__(self, plan: AugmentPlan):
        super().__init__()
        self._plan = plan

    def expand(self, results):
        return (results
                | "CollectShards" >> beam.combiners.ToList()
                | "WriteMetadata" >> beam.ParDo(FinalizeAugmentFn(self._plan)))
