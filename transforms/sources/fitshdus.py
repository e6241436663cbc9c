"""The HDUs of a FITS file as the FITS source sees them: each data HDU's items (an image HDU is one array, a table
HDU one array per column), their names, dtypes and shapes; the size checks made before any data is touched; the
values as written (the unsigned-integer convention applied, other scaling not); and inspect's tree.

Values. A FITS image or column stores integers big-endian; ``BSCALE``/``BZERO`` (``TSCALn``/``TZEROn`` for a
column) turn them into physical values. The unsigned-integer convention (``BSCALE = 1`` and ``BZERO = 2**(n-1)``
on 16-, 32- and 64-bit integers, the FITS Standard 4.0, section 5.2.5; ``BZERO = -128`` on bytes for signed
bytes) is a type, not a scaling: it is applied, exactly (``uint16`` etc., a flip of the sign bit). Any other
scaling is not applied: the stored integers are written, exact, and the keywords are recorded in
``metadata.json`` (``FileIndex.attributes``), as NetCDF-3's ``scale_factor`` is. ``BLANK`` (``TNULLn``) stays a
stored value, recorded there too: the value that means undefined.
Logical (``L``) and bit (``X``) columns are booleans, character (``A``) columns fixed-width bytes without the
trailing blanks FITS pads them with; variable-length array columns (``P``/``Q``) are skipped (one warning).
Reference: FITS Standard 4.0 (IAU FITS Working Group, 2018); ``astropy.io.fits``.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math

import numpy as np

from tfrecord_etl.transforms.errors import SourceError

IMAGE, COLUMN = "image", "column"
RAW_DTYPES = {8: "u1", 16: ">i2", 32: ">i4", 64: ">i8", -32: ">f4", -64: ">f8"}  # BITPIX -> stored dtype
UNSIGNED_ZERO = {">i2": 2**15, ">i4": 2**31, ">i8": 2**63, "u1": -128}  # the unsigned (signed-byte) convention


@dataclasses.dataclass(frozen=True)
class Item:
    """One array of a FITS file: an image HDU (``column`` None) or a table column.

    ``name``: what ``--datasets`` names (the HDU's label, ``HDU/COLUMN`` for a column); ``feature``: the feature
    it becomes in rows mode (the HDU's label, or the column's name); ``hdu``: its index in the file (0: primary);
    ``label``: the HDU's label; ``dtype``/``shape``: what is written (``shape`` with the rows first); ``nbytes``:
    its bytes as written; ``tile_rows``: rows per compression tile (1 when not tile-compressed); ``scaling``: the
    keywords not applied (``{"BSCALE": 2.0, "BZERO": 10.0, "BLANK": -1}``; ``TSCAL``, ``TZERO``, ``TNULL`` for a
    column), empty when none."""

    name: str
    feature: str
    hdu: int
    label: str
    column: str | None
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    tile_rows: int = 1
    scaling: dict = dataclasses.field(default_factory=dict, compare=False)


def labels(hdus) -> list[str]:
    """Each HDU's label: its ``EXTNAME`` (``PRIMARY`` for the primary HDU) when no other HDU has it, else
    ``NAME_VER`` (``EXTVER``, as ``hdul['SCI', 2]`` addresses it) when that is unique, else ``HDUi``."""
    pairs = [(h.name or "", h.ver) for h in hdus]
    names, both = collections.Counter(n for n, _ in pairs), collections.Counter(pairs)
    out = []
    for i, (name, ver) in enumerate(pairs):
        if name and names[name] == 1:
            out.append(name)
        elif name and both[(name, ver)] == 1:
            out.append(f"{name}_{ver}")
        else:
            out.append(f"HDU{i}")
    return out


def declared_bytes(header) -> int:
    """The data bytes an HDU's header declares (FITS Standard 4.0, eq. 2): ``|BITPIX| / 8 * GCOUNT * (PCOUNT +
    NAXIS1 * ... * NAXISn)``, in Python integers (no overflow, however absurd the header)."""
    naxis = int(header.get("NAXIS", 0))
    if naxis == 0:
        return 0
    dims = [int(header.get(f"NAXIS{i}", 0)) for i in range(1, naxis + 1)]
    if header.get("GROUPS") is True and dims[0] == 0:
        dims = dims[1:]
    return (
        abs(int(header.get("BITPIX", 8)))
        // 8
        * int(header.get("GCOUNT", 1))
        * (int(header.get("PCOUNT", 0)) + math.prod(dims))
    )


def check_sizes(raw_hdus, file_size: int, path: str, max_ratio: float, max_hdus: int) -> None:
    """Every HDU's declared data within the file, and a tile-compressed image's declared pixels within
    ``max_ratio`` times its compressed bytes, before any data is read. ``raw_hdus``: the file opened lazily
    (``lazy_load_hdus``: each HDU is checked before astropy looks for the next one behind its data) with
    ``disable_image_compression=True`` (a compressed image is its binary table there).

    Raises:
      SourceError: naming the file, the HDU, the byte offset and the sizes (a truncated file, a header larger
        than the file, an absurd dimension, a compression bomb); more than ``max_hdus`` HDUs (``--max_datasets``).
    """
    for i in itertools.count():
        if i >= max_hdus:
            raise SourceError(
                f"The file holds more than {max_hdus:,} HDUs (--max_datasets)",
                file=path,
                hint="raise the limit with --max_datasets N if the file is what you meant",
            )
        try:
            hdu = raw_hdus[i]
        except IndexError:
            return
        label = hdu.name or f"HDU{i}"
        header, start = hdu.header, int(hdu.fileinfo()["datLoc"])
        need = declared_bytes(header)
        if start + need > file_size:
            raise SourceError(
                f"HDU '{label}' declares {need:,} data bytes from byte offset {start:,}, beyond the file's end "
                f"({file_size:,} bytes)",
                file=path,
                hint="the file is truncated or its header is wrong: fetch it again",
            )
        if header.get("ZIMAGE") is True:
            dims = [int(header.get(f"ZNAXIS{i}", 0)) for i in range(1, int(header.get("ZNAXIS", 0)) + 1)]
            pixels = abs(int(header.get("ZBITPIX", 8))) // 8 * math.prod(dims)
            if pixels > 2**20 and pixels > max_ratio * max(need, 1):
                raise SourceError(
                    f"HDU '{label}' is a compressed image of {pixels:,} bytes in {need:,} compressed bytes: more "
                    f"than {max_ratio:g} times (a compression bomb?)",
                    file=path,
                    hint="raise --max_compression_ratio if the file is what you meant",
                )


def image_dtype(bitpix: int, bscale, bzero, names: tuple[str, str] = ("BSCALE", "BZERO")) -> tuple[np.dtype, dict]:
    """``(dtype written, scaling not applied)`` of an image of ``BITPIX`` ``bitpix`` (or a column of that many
    bits, its keywords ``names``: ``TSCALn``, ``TZEROn``): the stored dtype, or the unsigned one under the
    unsigned-integer convention (signed bytes for ``BZERO = -128``)."""
    raw = RAW_DTYPES[int(bitpix)]
    bscale = 1 if bscale is None else bscale
    bzero = 0 if bzero is None else bzero
    if bscale == 1 and raw in UNSIGNED_ZERO and bzero == UNSIGNED_ZERO[raw]:
        return np.dtype(raw.replace("i", "u") if raw != "u1" else "i1"), {}
    scaling = {k: plain(v) for k, v, unit in zip(names, (bscale, bzero), (1, 0)) if v != unit}
    return np.dtype(raw), scaling


def plain(value):
    """A keyword's value as a JSON-ready Python number (astropy may hand NumPy scalars)."""
    return value.item() if isinstance(value, np.generic) else value


def as_written(stored: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``stored`` (a stored image or column) as ``dtype`` (:func:`image_dtype`): the same array, or under the
    unsigned convention its bits with the sign bit flipped (exact: ``stored + 2**(n-1)``, ``stored - 128``)."""
    if stored.dtype.kind == dtype.kind or {stored.dtype.kind, dtype.kind} - {"i", "u"}:
        return stored
    unsigned = stored.view(stored.dtype.str.replace("i", "u"))
    flipped = unsigned ^ unsigned.dtype.type(1 << (8 * stored.dtype.itemsize - 1))  # (in native byte order)
    return flipped.view(dtype.newbyteorder(flipped.dtype.byteorder))


def image_item(hdu, index: int, label: str) -> Item | None:
    """The :class:`Item` of an image HDU (plain or tile-compressed), None when it holds no data."""
    shape = tuple(int(d) for d in hdu.shape)
    if not shape or 0 in shape:
        return None
    header = hdu.header
    dtype, scaling = image_dtype(header["BITPIX"], header.get("BSCALE"), header.get("BZERO"))
    if header.get("BLANK") is not None and dtype.kind in "iu":
        scaling["BLANK"] = plain(header["BLANK"])
    tile = getattr(hdu, "tile_shape", None)
    tile_rows = int(tile[0]) if tile is not None and len(tile) else 1
    return Item(label, label, index, label, None, dtype, shape, math.prod(shape) * dtype.itemsize, tile_rows, scaling)


def is_vla(column) -> bool:
    """True for a variable-length array column (``P``/``Q`` format): skipped."""
    return str(column.format).lstrip("0123456789")[:1] in ("P", "Q")


def column_items(hdu, index: int, label: str) -> tuple[list[Item], list[str]]:
    """The :class:`Item` of each column of a table HDU (binary or ASCII), and the variable-length array columns'
    names (skipped). Dtypes and row shapes come from a read of the first row (none read for an empty table)."""
    items, skipped = [], []
    rows = int(hdu.header.get("NAXIS2", 0))
    for column in hdu.columns:
        if is_vla(column):
            skipped.append(f"{label}/{column.name}")
            continue
        values, scaling = column_rows(hdu, column, 0, min(rows, 1))
        shape = (rows, *values.shape[1:])
        items.append(
            Item(
                f"{label}/{column.name}",
                column.name,
                index,
                label,
                column.name,
                values.dtype,
                shape,
                math.prod(shape) * values.dtype.itemsize,
                1,
                scaling,
            )
        )
    return items, skipped


def column_rows(hdu, column, start: int, stop: int) -> tuple[np.ndarray, dict]:
    """Rows ``start:stop`` of ``column`` as written (see the module), and the scaling not applied."""
    from astropy.io import fits  # deferred: astropy, the FITS source's own dependency

    rec = hdu.data[start:stop]
    code = str(column.format).lstrip("0123456789")[:1]
    if isinstance(hdu, fits.TableHDU):  # ASCII table: the numbers are text, parsed by astropy
        values = np.asarray(rec.field(column.name))
        return (np.char.encode(values, "ascii") if values.dtype.kind == "U" else values), {}
    if code in ("L", "X"):
        return np.asarray(rec.field(column.name), dtype=bool), {}
    stored = np.array(rec.view(np.ndarray)[column.name])
    if code == "A":
        return np.char.rstrip(stored, b" ").astype(stored.dtype), {}
    raw = stored.dtype.newbyteorder(">").str if stored.dtype.itemsize > 1 else stored.dtype.str.lstrip("|")
    if raw in UNSIGNED_ZERO:
        bits = {"u1": 8, ">i2": 16, ">i4": 32, ">i8": 64}[raw]
        dtype, scaling = image_dtype(bits, column.bscale, column.bzero, ("TSCAL", "TZERO"))
        if column.null is not None:
            scaling["TNULL"] = plain(column.null)
        return as_written(stored, dtype), scaling
    scaling = {
        k: plain(v) for k, v, unit in (("TSCAL", column.bscale, 1), ("TZERO", column.bzero, 0)) if v not in (None, unit)
    }
    return stored, scaling
