"""New values: defaults and user functions (--fn), checked and encoded (``--constants`` parsed: :mod:`constants`)."""

from __future__ import annotations

import dataclasses
import importlib
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from tfrecord_etl.transforms.augment.common import amend_error
from tfrecord_etl.transforms.codec import (
    VLEN_BYTES,
    FeatureSpec,
    batch_decodable,
    check_spec,
    check_unicode,
    decode_batch,
    decode_example_lenient,
    normalize_dtype,
)
from tfrecord_etl.transforms.codec.encodings import resolve_encoding
from tfrecord_etl.transforms.errors import ConfigError, EtlError, RecordError, SchemaError

# a module --fn imports when called that this process lacks: on a runner's worker, where the launcher had it
FN_IMPORT_HINT = (
    "install the module where --fn runs: on a runner, in the workers' Python environment (the SDK harness image, "
    "the worker pool's environment, or Beam's --requirements_file / --setup_file), not only the launcher's"
)


def load_function(spec: str) -> Callable:
    """The callable named by ``module:function`` (``function`` may be dotted: ``module:Class.method``).

    Raises:
      ConfigError: a malformed spec, a module that cannot be imported, or a missing or non-callable name.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"--fn {spec!r} is not of the form module:function", hint="e.g. --fn mypkg.features:add_label"
        )
    hint = "make the module importable (PYTHONPATH, or install it on the workers, e.g. with Beam's --setup_file)"
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"Cannot import the module of --fn {spec}: {e}", hint=hint) from None
    except Exception as e:  # the module's own code failed while it was imported (a syntax error, a check of its own)
        raise ConfigError(
            f"Importing the module of --fn {spec} raised {type(e).__name__}: {e}",
            hint="fix the module; it must import in the launcher and on every worker",
        ) from None
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
                raise RecordError(
                    f"New feature '{name}' holds code point U+{ord(v[e.start]):04X} (a lone "
                    "surrogate), which is not valid Unicode and has no UTF-8 form",
                    feature=name,
                    hint="return valid str values, or bytes",
                ) from None
        elif isinstance(v, (bytes, np.bytes_)):
            out[idx] = bytes(v)
        else:
            raise SchemaError(
                f"New feature '{name}' holds a {type(v).__name__} in an object array; only bytes and str can be",
                feature=name,
                hint="return a numeric array, or bytes/str values",
            )
    return out


def _column(name: str, arr: np.ndarray) -> np.ndarray:
    """A new feature's batch column: numeric arrays as they are; strings as object arrays of bytes."""
    return _bytes_objects(arr, name, batch=True) if arr.dtype.kind in "SUO" else arr


def spec_of(name: str, column: np.ndarray, encoding: str, allow_lossy: Iterable[str] = ()) -> FeatureSpec:
    """The FeatureSpec of a new feature from a batch column ``(rows, *shape)``.

    Numeric columns keep their dtype (little-endian string) and use ``encoding`` (``auto``: the rule of
    ``codec.encodings.auto_encoding``); bytes/str become
    ``bytes`` features (``list`` encoding). Raises SchemaError (unsupported dtype, refused lossy cast).
    """
    if column.dtype == object:
        spec = FeatureSpec(name, VLEN_BYTES, tuple(column.shape[1:]), "list")
    else:
        spec = FeatureSpec(
            name, normalize_dtype(column.dtype, f"new feature '{name}'"), tuple(column.shape[1:]), encoding
        )
        spec = dataclasses.replace(spec, encoding=resolve_encoding(encoding, spec))
    check_spec(spec, allow_lossy)
    return spec


def _call(fn: Callable, fn_name: str, inputs: dict, file: str, record) -> Mapping:
    try:
        out = fn(inputs)
    except Exception as e:  # the user's code: name the record and the line
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise RecordError(
            f"--fn {fn_name} raised {type(e).__name__}: {e} (at {frame.filename}:{frame.lineno})",
            file=file,
            record=record,
            hint=FN_IMPORT_HINT
            if isinstance(e, ImportError)
            else "fix the function; it gets {name: np.ndarray} of the --fn_inputs and returns {new name: array}",
        ) from e
    if not isinstance(out, Mapping):
        raise SchemaError(
            f"--fn {fn_name} returned a {type(out).__name__}, expected a dict of arrays", file=file, record=record
        )
    bad = [k for k in out if not isinstance(k, str)]
    if bad:
        key = bad[0]
        twin = [k for k in out if k is not key and str(k) == str(key)]
        what = (
            f"keys {key!r} and {twin[0]!r}, which name the same feature"
            if twin
            else f"key {key!r} ({type(key).__name__})"
        )
        raise SchemaError(
            f"--fn {fn_name} returned {what}; feature names must be str",
            file=file,
            record=record,
            feature=str(key),
            hint="return {str name: array} with distinct names",
        )
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
        raise RecordError(
            f"--fn {fn_name} returned {size} bytes ({size / 2**20:.1f} MB) for one record, over the "
            f"record size limit of {limit} bytes (--max_record_mb {limit / 2**20:g})",
            file=file,
            record=record,
            size=size,
            hint="return smaller values, or raise --max_record_mb",
        )


def decode_record(specs: Sequence[FeatureSpec], record: bytes, file: str, index: int) -> dict[str, np.ndarray]:
    """The features in ``specs`` of one record (``codec.decode_example_lenient``); errors name the record."""
    try:
        return decode_example_lenient(record, specs)
    except RecordError as e:
        raise amend_error(
            e, "the --fn_inputs features must decode with the input's feature specs", file=file, record=index
        ) from None


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


def fn_columns(
    fn: Callable,
    fn_name: str,
    specs: Sequence[FeatureSpec],
    records: Sequence[bytes],
    batched: bool,
    file: str,
    first: int,
    max_record_bytes: int | None = None,
) -> dict[str, np.ndarray]:
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
            stacked = _stacked(specs, inputs, file, first)
        return _batch_columns(fn, fn_name, stacked, n, file, first, max_record_bytes)
    outs = []
    for i, x in enumerate(inputs):
        outs.append(_call(fn, fn_name, x, file, first + i))
        check_new_size(sum(value_bytes(v) for v in outs[-1].values()), max_record_bytes, fn_name, file, first + i)
    names = list(outs[0])
    return {str(name): _stacked_outputs(fn_name, name, names, outs, file, first) for name in names}


def _stacked(specs: Sequence[FeatureSpec], inputs: list[dict], file: str, first: int) -> dict[str, np.ndarray]:
    """``--fn_batch``: each input feature of the records stacked along a new leading axis.

    Raises:
      SchemaError: a feature whose length varies between records (it cannot be stacked).
    """
    n, stacked = len(inputs), {}
    for spec in specs:
        try:
            stacked[spec.name] = np.stack([x[spec.name] for x in inputs])
        except ValueError:
            raise SchemaError(
                f"--fn_batch: feature '{spec.name}' varies in length between records, so it cannot be stacked",
                file=file,
                record=f"{first}-{first + n - 1}",
                hint="use a per-example --fn (without --fn_batch)",
            ) from None
    return stacked


def _batch_columns(
    fn: Callable, fn_name: str, stacked: dict, n: int, file: str, first: int, max_record_bytes: int | None
) -> dict[str, np.ndarray]:
    """``--fn_batch``: ``fn`` called once on the stacked inputs; each output checked to hold one value per record.

    Raises:
      RecordError: ``fn`` raised, or its values are over ``max_record_bytes`` per record. SchemaError: an output
        without a leading axis of ``n``, or a key that is not a str.
    """
    out = _call(fn, fn_name, stacked, file, f"{first}-{first + n - 1}")
    check_new_size(
        sum(value_bytes(v) for v in out.values()) // max(n, 1),
        max_record_bytes,
        fn_name,
        file,
        f"{first}-{first + n - 1}",
    )
    columns = {}
    for name, value in out.items():
        arr = np.asarray(value)
        if arr.ndim == 0 or arr.shape[0] != n:
            raise SchemaError(
                f"--fn_batch {fn_name}: '{name}' has shape {arr.shape}, expected a leading "
                f"axis of {n} (one value per record)",
                file=file,
                record=f"{first}-{first + n - 1}",
            )
        try:
            columns[str(name)] = _column(name, arr)
        except EtlError as e:
            raise e.with_context(file=file, record=f"{first}-{first + n - 1}") from None
    return columns


def _stacked_outputs(fn_name: str, name, names: list, outs: Sequence[Mapping], file: str, first: int) -> np.ndarray:
    """Per-example ``--fn``: the values of output ``name`` of every record, stacked (strings as bytes objects).

    Raises:
      SchemaError: a record whose outputs have other keys than the first's, or values of another shape or dtype.
    """
    n, values = len(outs), []
    for i, out in enumerate(outs):
        if name not in out or len(out) != len(names):
            raise SchemaError(
                f"--fn {fn_name} returned keys {sorted(out)} but {sorted(names)} for the first record of the batch",
                file=file,
                record=first + i,
                hint="return the same keys for every record",
            )
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
        raise SchemaError(
            f"--fn {fn_name}: '{name}' has {what} in one batch; a new feature has one dtype and shape",
            file=file,
            record=f"{first}-{first + n - 1}",
            feature=name,
        )
    return np.stack(values)
