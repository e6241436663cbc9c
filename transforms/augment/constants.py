"""``--constants`` and join-key values given on the command line: ``VALUE[:DTYPE]`` parsed into a NumPy scalar of
that dtype, or UTF-8 bytes."""

from __future__ import annotations

import numpy as np

from tfrecord_etl.transforms.augment.common import SCALAR_DTYPES
from tfrecord_etl.transforms.codec import VLEN_BYTES
from tfrecord_etl.transforms.errors import ConfigError


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
        raise ConfigError(f"{at}unknown dtype {dtype!r}", hint=f"use one of {', '.join(SCALAR_DTYPES)}") from None
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
    raise ConfigError(
        f"{at}values of dtype {dt} cannot be given on the command line", hint=f"use one of {', '.join(SCALAR_DTYPES)}"
    )


def parse_constant(name: str, text: str) -> np.ndarray | bytes:
    """One ``--constants`` value ``VALUE[:DTYPE]``.

    Without ``DTYPE``: an integer is ``int64``, a decimal number ``float32``, anything else ``bytes``
    (UTF-8). ``DTYPE``: ``bool``, ``int8``..``int64``, ``uint8``..``uint64``, ``float16/32/64``,
    ``bytes``, ``str``. Raises ConfigError.
    """
    value, dtype = text, None
    if ":" in text and text.rsplit(":", 1)[1] in SCALAR_DTYPES:
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
        raise ConfigError(
            f"{at}{text!r} holds code point U+{ord(text[e.start]):04X} (a lone surrogate, e.g. from "
            "bytes that are not UTF-8 on the command line), which has no UTF-8 form",
            hint="give the value as valid UTF-8 text",
        ) from None
