"""The compression backend: the one library that compresses and decompresses every gzip and zlib stream of a run.

gzip shards (``.gz``), zlib shards (``.deflate``) and the per-tensor ``zlib`` encoding are all DEFLATE streams
(RFC 1951) in a gzip (RFC 1952) or zlib (RFC 1950) wrapper; any conforming library reads what any other writes.
Three libraries are used, the first one installed winning:

* ``isal``: Intel's ISA-L (``python-isal``, the ``isal`` package; Linux, macOS and Windows wheels), levels 0-3;
  several times faster than zlib both ways (``isal.isal_zlib``, ``isal.igzip``).
* ``zlib-ng``: zlib-ng in its native API (``zlib_ng.zlib_ng``, ``zlib_ng.gzip_ng``), levels 0-9.
* ``zlib``: CPython's ``zlib`` and ``gzip`` modules, levels 0-9 (TensorFlow's and Beam's own compressor).

The environment variable ``TFRECORD_ETL_COMPRESSION_BACKEND`` (``isal``, ``zlib-ng`` or ``zlib``) forces one.
The backend of a conversion is chosen once, on the launcher, recorded in ``metadata.json`` with its version and
level, and passed by name to the workers that write the shards. Output is byte-identical for the same records,
level and backend (the gzip header is written here, the same for every backend: no file name, mtime 0, XFL 0,
OS 255), not across backends: each library makes its own (valid) DEFLATE stream.

Default levels (:data:`DEFAULT_LEVELS`) are the fastest level of each backend whose output on the benchmark's
LinkeTurbidity rows (pvlib's uint8 climatology, as converted) is within 15% of zlib level 6 (TensorFlow's GZIP
default); measured in this repository's docs (performance page). The ideas: python-isal's ``igzip`` and
zlib-ng's ``gzip_ng`` modules (drop-in replacements of ``gzip``), and ``xopen``'s backend fallback order.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import struct
import zlib
from importlib.metadata import version as dist_version
from typing import Any, BinaryIO

ENV = "TFRECORD_ETL_COMPRESSION_BACKEND"
ORDER = ("isal", "zlib-ng", "zlib")  # preference when the backend is not forced
LEVELS = {"isal": (0, 3), "zlib-ng": (0, 9), "zlib": (0, 9)}  # inclusive range of each backend's levels
DEFAULT_LEVELS = {"isal": 3, "zlib-ng": 3, "zlib": 6}  # fastest within 15% of zlib 6's size (see module doc)
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, mtime 0, XFL 0, OS 255 (unknown)
_TRAILER = struct.Struct("<II")
_MODULES = {
    "isal": ("isal.isal_zlib", "isal.igzip", "isal"),
    "zlib-ng": ("zlib_ng.zlib_ng", "zlib_ng.gzip_ng", "zlib_ng"),
    "zlib": ("zlib", "gzip", None),
}


class BackendUnavailable(ImportError):
    """The backend asked for (by name, ``TFRECORD_ETL_COMPRESSION_BACKEND`` or a run's metadata) is not installed
    here, or the name is not a backend."""


@dataclasses.dataclass(frozen=True)
class Backend:
    """One compression library: ``zlib`` is its zlib-compatible module (``compressobj``, ``decompressobj``,
    ``crc32``, ``error``), ``gzip`` its ``GzipFile`` module; ``version`` the library's version."""

    name: str
    version: str
    zlib: Any  # a module
    gzip: Any

    @property
    def default_level(self) -> int:
        return DEFAULT_LEVELS[self.name]

    def level(self, level: int | None) -> int:
        """``level`` checked against this backend's range (None: its default). Raises ValueError out of range."""
        if level is None:
            return self.default_level
        low, high = LEVELS[self.name]
        if not low <= level <= high:
            raise ValueError(
                f"--compression_level {level} is out of range for the {self.name} backend "
                f"({low}-{high}; default {self.default_level})"
            )
        return level

    def describe(self, level: int | None = None) -> dict:
        """``{"name", "version", "level"}``: what ``metadata.json`` records under ``compression_backend``."""
        return {"name": self.name, "version": self.version, "level": self.level(level)}

    def compress(self, data, level: int | None = None) -> bytes:
        """``data`` as one zlib stream (RFC 1950), at ``level`` (None: the backend's default)."""
        return self.zlib.compress(data, self.level(level))

    def errors(self) -> tuple[type[BaseException], ...]:
        """The exception types this backend's decompressors raise on a corrupt stream."""
        return (self.zlib.error,)

    def open_gzip(self, raw: BinaryIO) -> BinaryIO:
        """A read-only stream of the decompressed bytes of the gzip stream (members concatenated) in ``raw``."""
        return self.gzip.GzipFile(fileobj=raw, mode="rb")

    def open_zlib(self, raw: BinaryIO) -> BinaryIO:
        """A read-only stream of the decompressed bytes of the zlib stream in ``raw`` (what TensorFlow's ZLIB
        option writes)."""
        return io.BufferedReader(_ZlibReader(raw, self.zlib.decompressobj()), 1 << 20)


def _load(name: str) -> Backend:
    if name not in _MODULES:
        raise BackendUnavailable(f"Unknown compression backend {name!r}: use one of {', '.join(ORDER)}")
    zmod, gmod, dist = _MODULES[name]
    try:
        z, g = importlib.import_module(zmod), importlib.import_module(gmod)
    except ImportError as e:
        raise BackendUnavailable(
            f"The {name} compression backend is not installed ({e}): pip install "
            f"{'zlib-ng' if name == 'zlib-ng' else name}"
        ) from None
    version = zlib.ZLIB_RUNTIME_VERSION if dist is None else dist_version("isal" if name == "isal" else "zlib-ng")
    return Backend(name, version, z, g)


_CACHE: dict[str, Backend] = {}


def get(name: str | None = None) -> Backend:
    """The backend named ``name``; None: the one ``TFRECORD_ETL_COMPRESSION_BACKEND`` names, else the first of
    :data:`ORDER` installed. Raises BackendUnavailable for a name not installed (never a silent fallback: a run's
    workers use the launcher's backend or fail)."""
    if name is None:
        name = os.environ.get(ENV, "").strip() or None
        if name is None:
            for candidate in ORDER:
                try:
                    return get(candidate)
                except BackendUnavailable:
                    continue
    if name not in _CACHE:
        _CACHE[name] = _load(name)
    return _CACHE[name]


def available() -> list[str]:
    """The backends installed here, in :data:`ORDER`."""
    out = []
    for name in ORDER:
        try:
            get(name)
            out.append(name)
        except BackendUnavailable:
            pass
    return out


def all_errors() -> tuple[type, ...]:
    """The corrupt-stream exceptions of every installed backend (``zlib.error`` always among them)."""
    errors = [zlib.error]
    for name in available():
        errors += [e for e in get(name).errors() if e not in errors]
    return tuple(errors)


class _ZlibReader(io.RawIOBase):
    """A read-only stream over a ZLIB-compressed stream, through a backend's ``decompressobj``."""

    def __init__(self, raw: BinaryIO, decompressor):
        self._raw, self._z, self._buf = raw, decompressor, b""

    def readable(self):
        return True

    def readinto(self, b):
        while not self._buf and not self._z.eof:
            chunk = self._raw.read(1 << 20)
            if not chunk:
                if not self._z.eof:
                    raise EOFError("ZLIB stream ended before its end marker")
                break
            self._buf = self._z.decompress(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class StreamCompressor:
    """Compresses the bytes written to it into ``out`` (anything with ``write``) as one gzip or zlib stream:
    ``write(data)`` compresses, ``finish()`` writes the end (and the gzip trailer) and must be called once.

    gzip: :data:`GZIP_HEADER`, the backend's raw DEFLATE stream, then CRC-32 and length mod 2**32 (RFC 1952),
    so the header bytes do not depend on the library or the platform. zlib: the backend's zlib stream.
    """

    def __init__(self, out, kind: str, backend: Backend, level: int | None = None):
        if kind not in ("gzip", "zlib"):
            raise ValueError(f"kind must be gzip or zlib, not {kind!r}")
        self._out, self._gzip = out, kind == "gzip"
        z = backend.zlib
        self._z = z.compressobj(backend.level(level), z.DEFLATED, -15 if self._gzip else 15)
        self._crc32, self._crc, self._size = z.crc32, 0, 0
        if self._gzip:
            out.write(GZIP_HEADER)

    def write(self, data) -> None:
        if self._gzip:
            self._crc = self._crc32(data, self._crc)
            self._size += len(memoryview(data).cast("B")) if not isinstance(data, bytes) else len(data)
        chunk = self._z.compress(data)
        if chunk:
            self._out.write(chunk)

    def finish(self) -> None:
        self._out.write(self._z.flush())
        if self._gzip:
            self._out.write(_TRAILER.pack(self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF))


BEAM_WRITER = {
    "name": "zlib",
    "version": zlib.ZLIB_RUNTIME_VERSION,
    "level": 6,
    "by": "Beam WriteToTFRecord",
}  # --writer beam: Beam's own compressor, zlib at Z_DEFAULT_COMPRESSION


def settings(kind: str, level: int | None = None, backend: str | None = None) -> dict | None:
    """What a run that writes ``kind`` (``none``, ``gzip`` or ``zlib``) shards compresses with:
    ``{"name", "version", "level"}`` of the backend (``get(backend)``) at ``level`` (None: its default), or None
    for ``none``. Called once, on the launcher; the writers get the name and level, ``metadata.json`` the whole.

    Raises:
      ValueError: ``level`` out of the backend's range (the message names the range and the default).
      BackendUnavailable: ``backend`` (or ``TFRECORD_ETL_COMPRESSION_BACKEND``) is not installed.
    """
    if kind == "none":
        return None
    return get(backend).describe(level)


def label(chosen: dict | None) -> str:
    """A run summary's words for :func:`settings`' result: ``"isal 1.9.1, level 3"`` (``""`` for None)."""
    if not chosen:
        return ""
    return f"{chosen['name']} {chosen['version']}, level {chosen['level']}" + (
        f", by {chosen['by']}" if chosen.get("by") else ""
    )
