"""pandas ``HDFStore`` tables (``df.to_hdf(path, key="df", format="table")``, written by PyTables): which of a
table's fields are categorical columns and where their category names are, read with h5py; input is never
unpickled.

What pandas writes (``pandas/io/pytables.py``): the frame's rows are one compound dataset ``/df/table``
(``CLASS`` ``TABLE``, its group's ``pandas_type`` ``frame_table`` or ``series_table``) with the field ``index``,
one field ``values_block_N`` per block of columns of one dtype (a subarray of the block's width; a categorical
column is a block of its own, width 1) and one field per ``data_columns`` column (named after it). Per field
``F`` the table's attributes say ``F_meta`` = ``category`` for a categorical (``DataCol.set_attr``) and ``F_kind``
the columns it holds, a list of names pickled by PyTables. The categories are a small pandas table of their own
(``Table.write_metadata``, ``_get_metadata_path``): ``/df/meta/F/meta/table``, fields ``index`` and ``values``
(the names as UTF-8 bytes, or numbers), the codes an index into them, -1 a missing value. pandas writes no
such table when a column has no categories (all values missing): it reads zero categories then, as done here.

The column's name is read from ``F_kind`` by :func:`pickled_names`, which walks the pickle's opcodes
(``pickletools.genops``: no code runs) and accepts only a list or tuple of strings; otherwise the field's name
is kept. Categories of dates, times or periods (stored as integers pandas converts back) are not mapped: the codes
are written (logged). pandas' ``ordered`` flag is in the group's pickled ``info`` dictionary, which is not read: ``ordered``
is false here.
"""

from __future__ import annotations

import pickletools
import re

import numpy as np

from tfrecord_etl.transforms.codec import Categories
from tfrecord_etl.transforms.sources.base import log

PICKLE_LIMIT = 65_536  # bytes of a pickled attribute parsed (a list of column names; a block of many is longer)
_STRINGS = {
    "STRING",
    "BINSTRING",
    "SHORT_BINSTRING",
    "UNICODE",
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "BINUNICODE8",
}
# the ``values_dtype`` of a category table whose stored values are the names (text, numbers): dates, times and
# periods are stored as integers pandas converts back (microseconds, ordinals), which are no names
_NAMED_DTYPES = re.compile(r"(bytes|str|u?int|float|bool)\d*")
_MEMO = {"PROTO", "FRAME", "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"}  # bookkeeping: no value of its own


def _text(value) -> str | None:
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def pickled_names(raw) -> tuple[str, ...] | None:
    """The strings of a pickled list or tuple of strings (PyTables' ``F_kind``: ``(lp0\\nVlabel\\np1\\na.``), or
    None for anything else (no pickle, another type, nested lists, more than :data:`PICKLE_LIMIT` bytes). The
    pickle's opcodes are read one by one with ``pickletools.genops``: nothing is unpickled, no code runs."""
    if isinstance(raw, np.ndarray) and raw.size == 1:
        raw = raw.ravel()[0]
    if not isinstance(raw, bytes | np.bytes_) or len(raw) > PICKLE_LIMIT:
        return None
    stack: list = []
    marks: list[int] = []
    try:
        for op, arg, _ in pickletools.genops(bytes(raw)):
            name = op.name
            if name in _MEMO:
                continue
            if name == "STOP":
                break
            if name in _STRINGS:
                if isinstance(arg, bytes):
                    arg = arg.decode("utf-8")
                if not isinstance(arg, str):
                    return None
                stack.append(arg)
            elif name == "MARK":
                marks.append(len(stack))
            elif name in ("EMPTY_LIST", "EMPTY_TUPLE"):
                stack.append([])
            elif name in ("LIST", "TUPLE", "APPENDS"):
                start = marks.pop()
                items = stack[start:]
                del stack[start:]
                if name == "APPENDS":
                    if not stack or not isinstance(stack[-1], list):
                        return None
                    stack[-1].extend(items)
                else:
                    stack.append(items)
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    return None
                items = stack[-n:]
                del stack[-n:]
                stack.append(items)
            elif name == "APPEND":
                if len(stack) < 2 or not isinstance(stack[-2], list):
                    return None
                stack[-2].append(stack.pop())
            else:  # any other opcode (numbers, dicts, globals, calls...): not a list of names
                return None
    except (ValueError, IndexError, UnicodeDecodeError):  # a truncated or malformed pickle
        return None
    if len(stack) != 1 or not isinstance(stack[0], list) or not all(isinstance(v, str) for v in stack[0]):
        return None
    return tuple(stack[0])


def is_table(dset) -> bool:
    """True for a pandas ``HDFStore`` table: a compound dataset named ``table`` with ``CLASS`` ``TABLE`` in a
    group whose ``pandas_type`` ends in ``_table`` (``frame_table``, ``series_table``)."""
    if dset.dtype.fields is None or dset.name.rsplit("/", 1)[-1] != "table":
        return False
    if _text(dset.attrs.get("CLASS")) != "TABLE":
        return False
    kind = _text(dset.parent.attrs.get("pandas_type"))
    return kind is not None and kind.endswith("_table")


def table_columns(f, dset, base: str, names_of) -> list[tuple[str, str, Categories, bool]]:
    """``(column, feature, categories, squeeze)`` of each categorical field of the pandas table ``dset`` (open in
    ``f``, read under the name ``base``): ``column`` the field's name as read (``df/table/values_block_0``),
    ``feature`` ``df/table/<the column's name>`` (the field's name when ``F_kind`` names no single column),
    ``squeeze`` true for a block field (shape ``[1]``: one name per row is written). ``names_of(dataset,
    column)`` reads the names of the ``values`` field of a metadata table, or None (logged: codes kept)."""
    attrs = dset.attrs
    group = dset.parent.name.rstrip("/")
    out = []
    for field in dset.dtype.names:
        if _text(attrs.get(f"{field}_meta")) != "category":
            continue
        ftype = dset.dtype.fields[field][0]
        sub = ftype.subdtype
        base_type, width = (sub[0], sub[1]) if sub is not None else (ftype, ())
        if base_type.fields is not None or base_type.kind not in "iu" or width not in ((), (1,)):
            continue
        column = f"{base}/{field}"
        names = pickled_names(attrs.get(f"{field}_kind"))
        feature = f"{base}/{names[0]}" if names is not None and len(names) == 1 and names[0] else column
        where = f"{group}/meta/{field}/meta/table"
        if f"{group}/meta/{field}" not in f:  # pandas wrote no categories: every value is missing
            values, origin = (), f"{where} (absent: no categories)"
        else:  # (names_of logs why a table holds no names)
            table = f.get(where)
            stored = _text(getattr(table, "attrs", {}).get("values_dtype")) or ""
            if stored and not _NAMED_DTYPES.fullmatch(stored):
                log.warning(
                    "The categories of the categorical column '%s' are %s values (%s): its codes are written",
                    column,
                    stored,
                    where,
                )
                continue
            values, origin = names_of(table, column), where
        if values is not None:
            out.append((column, feature, Categories(tuple(values), origin=origin), width == (1,)))
    return out
