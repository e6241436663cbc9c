"""File signatures: which registered format a file's first bytes show, for ``format_of`` and for the messages of a
source that cannot read a file of another format (``other_format_hint``); and the formats tfrecord-etl recognises
but does not read (:data:`UNREAD`, the one list of them), each with the way out its error gives (``format_of``
raises :class:`UnreadFormatError` for them, so convert, verify and inspect say so).

Each source declares its own signature (``Source.magic``, ``magic_offsets``, ``content_label``, ``sniff``); the
registry (``sources/registry.py``) hands its classes, in its order, to :func:`register` once, at import; a lookup
before that (a format's module imported on its own) loads the registry first (:func:`signed`). The
sources that name another format in their errors (HDF5, NetCDF-3, MATLAB) import this module, which sits below
them and below the registry, so neither imports the other.
"""

from __future__ import annotations

import dataclasses
import importlib

from tfrecord_etl.transforms.errors import SourceError, UnreadFormatError
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
    head = read_head(path)
    found = content_format(head)
    if found is None:
        unread = unread_format(path, head, by_suffix=False)
        return f"it is {unread.label}, which tfrecord-etl does not read: {unread.way_out}" if unread else None
    if found == fmt:
        return None
    return f"it is {signed()[found].content_label}: use --format {found} (or leave --format out)"


@dataclasses.dataclass(frozen=True)
class Unread:
    """A format that tfrecord-etl recognises but does not read: ``label`` (what the file is), ``signatures`` (each a
    tuple of ``(offset, bytes)`` that must all stand in the file's first :data:`SNIFF_BYTES` bytes), ``suffixes``
    (lower-case, unambiguous ones only: told by the name when the content shows no signature) and ``way_out`` (how
    to turn such a file into arrays convert reads)."""

    label: str
    signatures: tuple[tuple[tuple[int, bytes], ...], ...]
    suffixes: tuple[str, ...]
    way_out: str

    def sniff(self, head: bytes) -> bool:
        """True when ``head`` shows one of this format's signatures."""
        return any(all(head[o : o + len(m)] == m for o, m in sig) for sig in self.signatures)


# The formats users meet that no source reads, in the order they are tried. References: EDF/EDF+ and BDF headers
# (the version field), the RIFF/WAVE and RF64 headers, IDL SAVE files (scipy.io.readsav: "SR" and the record format),
# Feather v1 (FEA1; Parquet and Feather v2 are read: sources/parquet.py).
UNREAD = (
    Unread(
        "a gzip-compressed FITS file",
        (),  # (told by its suffix: its first bytes are gzip's)
        (".fits.gz", ".fit.gz", ".fts.gz"),
        "gunzip it, then convert the .fits (read memory-mapped; tile-compressed .fits.fz files are read as they are)",
    ),
    Unread(
        "an EDF/BDF recording",
        (((0, b"0       "),), ((0, b"\xffBIOSEMI"),)),
        (".edf", ".bdf"),
        "with pyedflib: np.savez('x.npz', **{name: reader.readSignal(i) for i, name in "
        "enumerate(reader.getSignalLabels())}) (reader = pyedflib.EdfReader(FILE)), then convert the .npz "
        "(--npz_mode arrays when the channels' lengths differ)",
    ),
    Unread(
        "a WAV audio file",
        (((0, b"RIFF"), (8, b"WAVE")), ((0, b"RF64"), (8, b"WAVE"))),
        (".wav",),
        "with SciPy: rate, data = scipy.io.wavfile.read(FILE); np.save('x.npy', data), then convert the .npy "
        "(one Example per sample frame)",
    ),
    Unread(
        "an IDL SAVE file",
        (((0, b"SR\x00\x04"),), ((0, b"SR\x00\x06"),)),
        (),  # .sav is SPSS's suffix too: told by content only
        "with SciPy: np.savez('x.npz', **scipy.io.readsav(FILE)) (numeric variables), then convert the .npz",
    ),
    Unread(
        "a Feather v1 file",
        (((0, b"FEA1"),),),
        (),  # .feather is Feather v2 (Arrow IPC), which the parquet source reads: told by content only
        "with pyarrow: pyarrow.feather.write_feather(pyarrow.feather.read_table(FILE), 'x.feather') writes it as "
        "Feather v2, then convert the new file",
    ),
)


def unread_format(path: str, head: bytes, by_suffix: bool = True) -> Unread | None:
    """The :data:`UNREAD` format whose signature ``head`` (``path``'s first :data:`SNIFF_BYTES` bytes) shows, else
    (``by_suffix``) the one whose suffix ``path`` ends with, else None."""
    for unread in UNREAD:
        if unread.sniff(head):
            return unread
    lower = path.lower()
    if by_suffix:
        for unread in UNREAD:
            if lower.endswith(unread.suffixes):
                return unread
    return None


def unread_error(path: str, unread: Unread) -> UnreadFormatError:
    """The one-line error for a file of a format tfrecord-etl does not read, naming it and the way out."""
    return UnreadFormatError(
        f"The file is {unread.label}: a format recognised but not read by tfrecord-etl",
        file=path,
        hint=f"{unread.way_out} (convert's --format reads it as a format tfrecord-etl reads, if it is one)",
    )
