"""ENVI raster files (``--format envi``): a raw binary image cube described by an ENVI header, the text sidecar
``<file>.hdr`` (or ``<file stem>.hdr``) that ENVI, GDAL, SPy and most remote-sensing and hyperspectral software
write next to the data. The header gives what ``--format raw`` needs from flags: the data type, the three
dimensions (``samples`` across a line, ``lines``, ``bands``), the byte order, the header offset and the
interleave (``bsq``: band after band; ``bil``: line after line, its bands one after the other; ``bip``: pixel after
pixel, its bands together). The bytes are read as raw files are (``RawSource``: memory-mapped when local, one
ranged read per row range when remote).

What a row is (``--envi_rows``): ``storage`` (default): the file's outermost axis, one Example per band of a
``bsq`` file (an image of lines x samples) or per line of a ``bil`` / ``bip`` file (bands x samples, samples x
bands); ``pixels``: one Example per pixel, its spectrum (one value per band), for ``bip`` and ``bsq`` files.

The format is described by NV5 (formerly Harris / L3Harris), "ENVI Header Files" in the ENVI documentation; the
data type codes are IDL's. Only the keys that locate the data are read; the others (wavelength, map info, ...)
are left to the user.
"""

from __future__ import annotations

import math
import re

import numpy as np

from tfrecord_etl.transforms.errors import ConfigError, SourceError
from tfrecord_etl.transforms.sources.raw import RawLayout, RawSource
from tfrecord_etl.transforms.storage import fileio

# .hdr/.img pairs of another kind (a binary header of 348 bytes and more): not ENVI, said so in the error
NOT_ENVI_HINT = (
    "an Analyze 7.5 or NIfTI-1 pair (.hdr/.img) has a binary header: convert a NIfTI pair's .hdr (--format nifti), "
    "an Analyze pair's data with --format raw (--dtype, --shape, --offset)"
)
MAX_HEADER_BYTES = 64 * 1024  # a header names a few dozen keys; wavelength lists of a few hundred bands fit
# IDL's type codes, as ENVI headers give them ("data type = 4"): the NumPy dtype without its byte order
DATA_TYPES = {1: "u1", 2: "i2", 3: "i4", 4: "f4", 5: "f8", 6: "c8", 9: "c16", 12: "u2", 13: "u4", 14: "i8", 15: "u8"}
INTERLEAVES = ("bsq", "bil", "bip")
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 _./()-]*?)\s*=\s*(.*)$")


def parse_header(text: str, where: str) -> dict[str, str]:
    """The ``key = value`` pairs of an ENVI header (keys lower-case, ``{...}`` values may span lines; the first
    line must be ``ENVI``).

    Raises:
      SourceError: not an ENVI header, a line that is not ``key = value``, an unclosed ``{``, a key given twice
        (naming the header and the line).
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != "ENVI":
        raise SourceError("Not an ENVI header: its first line is not 'ENVI'", file=where, hint=NOT_ENVI_HINT)
    out: dict[str, str] = {}
    i = 1
    while i < len(lines):
        number, line = i + 1, lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith(";"):
            continue
        m = _KEY.match(line)
        if m is None:
            raise SourceError(
                f"Line {number} of the ENVI header is not 'key = value': {line.strip()[:80]!r}", file=where
            )
        key, value = " ".join(m.group(1).lower().split()), m.group(2).strip()
        while value.startswith("{") and "}" not in value:
            if i >= len(lines):
                raise SourceError(f"The value of {key!r} (line {number}) opens '{{' and never closes it", file=where)
            value += " " + lines[i].strip()
            i += 1
        if key in out:
            raise SourceError(f"The ENVI header gives {key!r} twice (again on line {number})", file=where)
        out[key] = value
    return out


def _int(header: dict[str, str], key: str, where: str, default: int | None = None, low: int = 0) -> int:
    """``header[key]`` as an integer >= ``low`` (``default`` when absent).

    Raises:
      SourceError: a required key missing, or a value that is not such an integer.
    """
    if key not in header:
        if default is None:
            raise SourceError(f"The ENVI header has no {key!r}", file=where, hint="every ENVI header gives it")
        return default
    try:
        value = int(header[key])
    except ValueError:
        raise SourceError(f"The ENVI header's {key!r} is {header[key]!r}, not an integer", file=where) from None
    if value < low:
        raise SourceError(f"The ENVI header's {key!r} is {value}, less than {low}", file=where)
    return value


def header_layout(header: dict[str, str], where: str, rows: str = "storage") -> RawLayout:
    """The raw layout of the cube an ENVI header describes, its rows as ``rows`` (``storage`` or ``pixels``)
    says: shape ``(bands, lines, samples)`` (bsq), ``(lines, bands, samples)`` (bil), ``(lines, samples, bands)``
    (bip); pixels: ``(lines * samples, bands)``, in Fortran order for bsq.

    Raises:
      SourceError: a missing or bad key, an unknown data type, byte order or interleave (naming the header).
      ConfigError: ``pixels`` for a bil file, whose spectra are not evenly spaced.
    """
    samples, lines = _int(header, "samples", where, low=1), _int(header, "lines", where, low=1)
    bands, offset = _int(header, "bands", where, low=1), _int(header, "header offset", where, 0)
    code, order = _int(header, "data type", where), _int(header, "byte order", where, 0)
    if code not in DATA_TYPES:
        raise SourceError(
            f"The ENVI header's data type {code} is not one this reader knows",
            file=where,
            hint=f"known: {', '.join(f'{k} ({v})' for k, v in DATA_TYPES.items())}",
        )
    if order not in (0, 1):
        raise SourceError(f"The ENVI header's byte order is {order}: 0 (little-endian) or 1 (big-endian)", file=where)
    interleave = header.get("interleave", "bsq").strip().lower()
    if interleave not in INTERLEAVES:
        raise SourceError(
            f"The ENVI header's interleave is {interleave!r}: one of {', '.join(INTERLEAVES)}", file=where
        )
    dtype = np.dtype(DATA_TYPES[code]).newbyteorder("<" if order == 0 else ">").str
    if rows == "pixels":
        if interleave == "bil":
            raise ConfigError(
                "--envi_rows pixels: a bil file stores each pixel's bands a line apart, not as one array",
                file=where,
                hint="convert it with --envi_rows storage (one Example per line: bands x samples)",
            )
        return RawLayout(dtype, (lines * samples, bands), offset, "F" if interleave == "bsq" else "C")
    shape = {"bsq": (bands, lines, samples), "bil": (lines, bands, samples), "bip": (lines, samples, bands)}
    return RawLayout(dtype, shape[interleave], offset, "C")


class EnviSource(RawSource):
    """ENVI raster files: the raw bytes its header (``<file>.hdr`` or ``<stem>.hdr``) describes, rows mode."""

    format_name = "envi"
    help_label = "ENVI image cubes"
    suffixes = (".img", ".bsq", ".bil", ".bip")
    options_models = ("envi_options.EnviOptions",)  # --envi_rows

    def is_sidecar(self, path: str) -> bool:
        """True for an ENVI header (``.hdr``): never read as data."""
        return path.lower().endswith(".hdr")

    def header_path(self, path: str) -> str:
        """The header of ``path``: ``<path>.hdr`` if it exists, else ``<path without its suffix>.hdr``.

        Raises:
          SourceError: neither exists (naming both).
        """
        base = fileio.basename(path)
        candidates = [path + ".hdr"]
        if "." in base:
            candidates.append(path[: len(path) - len(base)] + base.rsplit(".", 1)[0] + ".hdr")
        for candidate in candidates:
            if fileio.exists(candidate):
                return candidate
        raise SourceError(
            f"No ENVI header next to the file: looked for {' and '.join(candidates)}",
            file=path,
            hint="an ENVI file's layout is in its .hdr file: copy it next to the data, or use --format raw "
            "with --dtype and --shape",
        )

    def layout(self, path: str) -> RawLayout:
        """The layout of ``path``'s cube from its ENVI header (at most 64 KiB of text).

        Raises:
          SourceError: no header, a header too large, not text, or not a valid ENVI header.
        """
        where = self.header_path(path)
        with fileio.open_read(where) as f:
            raw = f.read(MAX_HEADER_BYTES + 1)
        if len(raw) > MAX_HEADER_BYTES:
            raise SourceError(f"The ENVI header is over {MAX_HEADER_BYTES} bytes", file=where)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SourceError(
                f"The ENVI header is not text (byte offset {e.start})", file=where, hint=NOT_ENVI_HINT
            ) from None
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.envi_options import EnviOptions

        rows = self.options.of(EnviOptions).envi_rows
        return header_layout(parse_header(text, where), where, rows)

    def header(self, path: str, size: int):
        """The file's array as a .npy header would declare it, after checking that the file holds exactly the
        bytes its ENVI header declares (checked from the file size before anything is read).

        Raises:
          SourceError: the file's size differs from the header's offset plus the cube's bytes (giving both).
        """
        layout = self.layout(path)
        expected = layout.offset + np.dtype(layout.dtype).itemsize * math.prod(layout.shape)
        if size != expected:
            raise SourceError(
                f"The file holds {size} bytes, but its ENVI header declares {expected} ({layout.offset} bytes of "
                f"header offset, then {list(layout.shape)} of {layout.dtype})",
                file=path,
                hint="check that the .hdr file belongs to this data file",
            )
        return super().header(path, size)
