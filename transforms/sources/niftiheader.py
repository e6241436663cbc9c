"""A NIfTI file's header, read with nibabel and checked before any voxel is read: the signatures (NIfTI-1 ``n+1`` /
``ni1`` at byte 344, NIfTI-2 ``n+2`` / ``ni2`` at byte 4, also inside a gzip stream), the header of a ``.nii``,
``.nii.gz`` or ``.hdr`` (whose voxels are in the ``.img`` beside it), and the sizes it declares against the file's
(a truncated file, an offset past the end, a gzip stream declaring far more voxels than it can hold, absurd
dimensions): every one refused in one line before anything is allocated.

References: the NIfTI-1 header (``nifti1.h``, NIfTI DFWG 2004) and NIfTI-2 header (``nifti2.h``, 2011); nibabel's
``Nifti1Header`` / ``Nifti2Header`` (and their ``Pair`` forms) parse them, as nibabel's ``load`` does.
"""

from __future__ import annotations

import dataclasses
import io
import math
import zlib

import numpy as np

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.base import refuse_special_file
from tfrecord_etl.transforms.storage import fileio

# (offset, magic, nibabel header class, single file): the four NIfTI signatures
SIGNATURES = (
    (344, b"n+1\x00", "Nifti1Header", True),
    (344, b"ni1\x00", "Nifti1PairHeader", False),
    (4, b"n+2\x00\r\n\x1a\n", "Nifti2Header", True),
    (4, b"ni2\x00\r\n\x1a\n", "Nifti2PairHeader", False),
)
GZIP_MAGIC = b"\x1f\x8b"
HEADER_BYTES = 540  # NIfTI-2's sizeof_hdr (NIfTI-1's is 348): what is read of a header, at most
HINT = "check that it is a whole NIfTI file (nibabel.load(FILE) reads it?)"


def inflate_head(head: bytes, n: int = HEADER_BYTES) -> bytes:
    """The first ``n`` (at most) decompressed bytes of the gzip stream starting ``head`` (b"" when it is not one):
    decompression stops after ``n`` bytes, so a gzip bomb costs nothing here."""
    try:
        return zlib.decompressobj(31).decompress(head, n)
    except zlib.error:
        return b""


def signature(head: bytes) -> tuple[int, bytes, str, bool] | None:
    """The NIfTI signature (:data:`SIGNATURES` entry) that ``head`` (a file's first bytes, a gzip stream's looked
    into) shows, else None."""
    if head[:2] == GZIP_MAGIC:
        head = inflate_head(head)
    for sig in SIGNATURES:
        offset, magic = sig[0], sig[1]
        if head[offset : offset + len(magic)] == magic:
            return sig
    return None


@dataclasses.dataclass(frozen=True)
class NiftiLayout:
    """Where one image's voxels are and what they are: ``header`` (nibabel's, the file's own), ``data_path`` (the
    ``.nii`` / ``.nii.gz`` itself, or a pair's ``.img``), ``gz`` (a gzip stream), ``shape`` (the image's axes, in
    its own order: i, j, k, then time and the rest), ``dtype`` (the stored one, with its byte order), ``offset``
    (bytes before the voxels, decompressed), ``nbytes`` (the voxels' bytes)."""

    header: object
    data_path: str
    gz: bool
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    nbytes: int

    @property
    def version(self) -> int:
        """1 for NIfTI-1, 2 for NIfTI-2."""
        return 2 if type(self.header).__name__.startswith("Nifti2") else 1


def pair_data_path(path: str) -> str:
    """The ``.img`` file of a ``.hdr`` (same stem, the suffix's case kept: ``X.HDR`` -> ``X.IMG``)."""
    stem, suffix = path[:-4], path[-4:]
    return stem + (".IMG" if suffix.isupper() else ".img")


def _read_header_bytes(path: str) -> tuple[bytes, bool]:
    """The first :data:`HEADER_BYTES` bytes of ``path``'s header (decompressed for a gzip stream) and whether it
    is one."""
    refuse_special_file(path)
    with fileio.open_read(path) as f:
        head = f.read(2)
        f.seek(0)
        if head == GZIP_MAGIC:
            # deferred: the compression backend's modules (isal, zlib-ng) load on first use
            from tfrecord_etl.transforms import compression

            backend = compression.get()
            try:
                with backend.open_gzip(f) as g:
                    return g.read(HEADER_BYTES), True
            except (OSError, EOFError, *backend.errors()) as e:
                raise SourceError(f"Cannot decompress the gzip stream's first bytes: {e}", file=path) from None
        return f.read(HEADER_BYTES), False


def read_layout(path: str, max_ratio: float) -> NiftiLayout:
    """The header of the NIfTI file ``path`` (a ``.nii``, ``.nii.gz`` or a pair's ``.hdr``; a pair's ``.img``
    names its ``.hdr``), parsed by nibabel, with its declared sizes checked against the file's (see
    :func:`check_sizes`).

    Raises:
      SourceError: no NIfTI signature, a header cut short, one nibabel refuses (naming the field), no ``.img``
        beside a ``.hdr``, sizes the file cannot hold (naming the file, the byte offset and the sizes).
    """
    # deferred: nibabel, the field's reader (optional: the nifti extra)
    from nibabel import nifti1, nifti2

    if path.lower().endswith(".img"):
        path = path[:-4] + (".HDR" if path[-4:].isupper() else ".hdr")
    raw, gz = _read_header_bytes(path)
    sig = signature(raw)
    if sig is None:
        raise SourceError(
            "Not a NIfTI file: no 'n+1'/'ni1' at byte 344 nor 'n+2'/'ni2' at byte 4",
            file=path,
            hint="an Analyze 7.5 .hdr has no NIfTI signature: read it with nibabel and convert a .npy",
        )
    cls = getattr(nifti2 if sig[2].startswith("Nifti2") else nifti1, sig[2])
    need = 540 if sig[2].startswith("Nifti2") else 348
    if len(raw) < need:
        raise SourceError(f"The NIfTI header is cut short: {len(raw)} of its {need} bytes", file=path, hint=HINT)
    try:
        declared = cls.from_fileobj(io.BytesIO(raw[:need]), check=False)["vox_offset"]  # before nibabel fixes it
        minimum = need + 4 if sig[3] else 0  # a single file's voxels follow its header and extension flags
        if declared < minimum:
            raise SourceError(
                f"The NIfTI header puts the voxels at byte offset {int(declared)}, inside the header ({minimum} bytes)",
                file=path,
                hint=HINT,
            )
        header = cls.from_fileobj(io.BytesIO(raw[:need]), check=True)
        shape = tuple(int(d) for d in header.get_data_shape())
        dtype = np.dtype(header.get_data_dtype())
        offset = int(header.get_data_offset())
    except SourceError:
        raise
    except Exception as e:  # noqa: BLE001 - nibabel's HeaderDataError, ValueError, KeyError (unknown datatype)
        raise SourceError(f"nibabel refuses the NIfTI header: {e}", file=path, hint=HINT) from None
    data_path = path if sig[3] else pair_data_path(path)
    if not sig[3] and not fileio.exists(data_path):
        raise SourceError(
            f"No data file beside the NIfTI pair's header: {data_path} does not exist",
            file=path,
            hint="a .hdr/.img pair's voxels are in the .img: copy it next to the .hdr",
        )
    nbytes = math.prod(shape) * dtype.itemsize
    layout = NiftiLayout(header, data_path, gz and sig[3], shape, dtype, offset, nbytes)
    check_sizes(layout, max_ratio)
    return layout


def check_sizes(layout: NiftiLayout, max_ratio: float) -> None:
    """The sizes the header declares, against the file's: a dimension of 0, voxels past the end of a ``.nii`` / ``.img`` (a truncated file or absurd dimensions), a ``.nii.gz`` whose
    declared bytes exceed ``max_ratio`` times its compressed size (a gzip bomb) or its gzip trailer's size.

    Raises:
      SourceError: naming the file, the byte offset and both sizes.
    """
    path, shape = layout.data_path, layout.shape
    if not shape or 0 in shape:
        raise SourceError(f"The NIfTI header declares an image of shape {list(shape)}: no voxels", file=path)
    size, need = fileio.size(path), layout.offset + layout.nbytes
    declared = f"{list(shape)} of {layout.dtype} ({layout.nbytes:,} bytes) at byte offset {layout.offset}"
    if not layout.gz:
        if size < need:
            raise SourceError(
                f"The file holds {size:,} bytes, but its NIfTI header declares {declared}: truncated, or absurd "
                f"dimensions",
                file=path,
                hint=HINT,
            )
        return
    if need > max_ratio * size:
        raise SourceError(
            f"The NIfTI header declares {declared}, {need / max(1, size):,.0f} times the gzip stream's {size:,} "
            f"bytes: more than --max_compression_ratio {max_ratio:g} (a gzip bomb, or absurd dimensions)",
            file=path,
            hint="if the image is genuine (e.g. mostly zeros), raise --max_compression_ratio",
        )
    if need < 2**32:  # the gzip trailer's ISIZE: the decompressed size modulo 2**32 (RFC 1952)
        with fileio.open_read(path) as f:
            f.seek(size - 4)
            isize = int.from_bytes(f.read(4), "little")
        if isize < need:
            raise SourceError(
                f"The gzip stream decompresses to {isize:,} bytes (its trailer), but its NIfTI header declares "
                f"{declared}: truncated, or absurd dimensions",
                file=path,
                hint=HINT,
            )
