"""File signatures: which registered format a file's first bytes show, for ``format_of`` and for the messages of a
source that cannot read a file of another format (``other_format_hint``).

Each source declares its own signature (``Source.magic``, ``magic_offsets``, ``content_label``, ``sniff``); the
registry (``sources/registry.py``) hands its classes, in its order, to :func:`register` once, at import; a lookup
before that (a format's module imported on its own) loads the registry first (:func:`signed`). The
sources that name another format in their errors (HDF5, NetCDF-3, MATLAB) import this module, which sits below
them and below the registry, so neither imports the other.
"""

from __future__ import annotations

import importlib

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.base import Source, refuse_special_file
from tfrecord_etl.transforms.storage import fileio

SNIFF_BYTES = 2056  # the first bytes read to tell a file's format: up to an HDF5 signature after 2048 bytes

# The registered sources by format name, in the registry's order (first match wins): filled by register()
SIGNED: dict[str, type[Source]] = {}


def signed() -> dict[str, type[Source]]:
    """:data:`SIGNED`, after loading the registry (``sources/registry.py``, which calls :func:`register` at its
    import) when nothing has loaded it yet: the registry imports the format modules, which import this module, so
    it is imported by name here rather than at the top."""
    if not SIGNED:
        importlib.import_module("tfrecord_etl.transforms.sources.registry")
    return SIGNED


def register(classes: dict[str, type[Source]]) -> None:
    """Makes the registry's source classes (format name -> class, in its order) the formats told by content."""
    SIGNED.clear()
    SIGNED.update(classes)


def content_format(head: bytes) -> str | None:
    """The registered format whose ``magic`` ``head`` (a file's first :data:`SNIFF_BYTES` bytes) shows, or None."""
    for name, cls in signed().items():
        if cls.sniff(head):
            return name
    return None


def read_head(path: str, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes of ``path`` (b"" when it cannot be read: the source's own open reports why)."""
    try:
        refuse_special_file(path)
        with fileio.open_read(path) as f:
            return f.read(n)
    except (OSError, SourceError):
        return b""


def deep_signature(path: str) -> str | None:
    """The format whose magic stands at one of its ``magic_offsets`` past the first :data:`SNIFF_BYTES` bytes
    (an HDF5 file behind a user block of 4096 bytes or more): one small read per offset before the file's end."""
    try:
        refuse_special_file(path)  # (a FIFO is never opened)
        with fileio.open_read(path) as f:
            for name, cls in signed().items():
                for offset in (o for o in cls.magic_offsets if o >= SNIFF_BYTES):
                    f.seek(offset)
                    got = f.read(max(map(len, cls.magic)))
                    if not got:
                        break
                    if got.startswith(cls.magic):
                        return name
    except (OSError, ValueError, SourceError):
        return None
    return None


def other_format_hint(path: str, fmt: str) -> str | None:
    """A hint for a file that ``fmt``'s reader cannot read but whose first bytes show another registered format
    (``"it is a NetCDF-3 file: use --format netcdf3"``), else None."""
    found = content_format(read_head(path))
    if found is None or found == fmt:
        return None
    return f"it is {signed()[found].content_label}: use --format {found} (or leave --format out)"
