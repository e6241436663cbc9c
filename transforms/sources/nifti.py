"""NIfTI-1 and NIfTI-2 images (``--format nifti``): ``.nii``, ``.nii.gz`` and ``.hdr``/``.img`` pairs, read with
nibabel, the field's library (its header classes and its ``ArrayProxy``, what ``nibabel.load(FILE).dataobj`` is).

What a row is: a volume. A 4-D image (i, j, k, time) gives one Example per volume, the last axis; an image of 5 to 7
axes one Example per time point (axis 4 of NIfTI's ``dim``: its later axes, e.g. a vector's components, stay in the
Example); an image of 1 to 3 axes one Example. Each Example holds:

* ``data``: the voxels of the volume in the image's own axis order (``(i, j, k, ...)``, as nibabel returns them),
  the stored values exactly (``--nifti_scaling raw``, the default: ``img.dataobj.get_unscaled()``, the stored dtype)
  or nibabel's scaled ones (``--nifti_scaling apply``: ``np.asanyarray(img.dataobj)``); an RGB image's channels
  as ``data/R``, ``data/G`` (, ``data/B``, ``data/A``);
* the image's context, the same in every Example of a file: ``affine`` float64 (4, 4) (nibabel's ``img.affine``:
  the sform, else the qform, else the voxel sizes), ``zooms`` float64 (ndim,) (``header.get_zooms()``: voxel sizes
  and the time step), ``xyz_unit`` and ``t_unit`` (bytes: ``mm``, ``sec``, ... ``header.get_xyzt_units()``) and,
  in raw mode, ``scl_slope`` and ``scl_inter`` float64 () (``header.get_slope_inter()``, 1 and 0 when unset:
  ``data * scl_slope + scl_inter`` is the scaled value).

Row ranges read only their volumes (``dataobj`` slicing: one seek and one read per range for a 4-D image). A
``.nii.gz`` is one gzip stream: each worker thread keeps it open between row ranges, so a planned shard's ranges,
read in order, decompress each byte once (``FileIndex.sequential``), as deflated ``.npz`` members are.
The header's sizes are checked before anything is read (``niftiheader.check_sizes``).
"""

from __future__ import annotations

import io

import numpy as np

from tfrecord_etl.transforms.codec import flatten_fields, to_little_endian
from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.base import (
    Columns,
    FileIndex,
    RowRange,
    Source,
    check_names,
    leaf_specs,
    row_bytes,
    row_spec,
)
from tfrecord_etl.transforms.sources.niftiheader import HINT, SIGNATURES, NiftiLayout, read_layout, signature
from tfrecord_etl.transforms.storage import fileio

UNIT_DTYPE = np.dtype("S7")  # nibabel's unit names: unknown, meter, mm, micron, sec, msec, usec, hz, ppm, rads
TIME_AXIS = 3  # dim[4] of the header, axis 3 of nibabel's shape: a volume per index


class _OpenImage:
    """One worker thread's open image: the stream of its voxels (decompressed for a ``.nii.gz``) and nibabel's
    ``ArrayProxy`` over it. Ranges read in order move the stream forward only."""

    def __init__(self, path: str, layout: NiftiLayout, scaled: bool):
        # deferred: nibabel, the field's reader (optional: the nifti extra)
        from nibabel.arrayproxy import ArrayProxy

        self.path, self.layout = path, layout
        self.raw = fileio.open_read(layout.data_path)
        self.stream = self.raw
        if layout.gz:
            # deferred: the compression backend's modules (isal, zlib-ng) load on first use
            from tfrecord_etl.transforms import compression

            self.stream = compression.get().open_gzip(self.raw)
        spec = layout.header if scaled else (layout.shape, layout.dtype, layout.offset)
        self.proxy = ArrayProxy(self.stream, spec, mmap=False)

    def check_stream_end(self) -> None:
        """Reads a ``.nii.gz`` stream to its end after its last volume, so that gzip checks its CRC32 and length
        (RFC 1952) over every byte decompressed: a corrupt stream fails here rather than giving wrong voxels.

        Raises:
          OSError (gzip's BadGzipFile): a CRC or length mismatch. SourceError: more than 1 MiB after the voxels.
        """
        extra = 0
        while chunk := self.stream.read(1 << 16):
            extra += len(chunk)
            if extra > 2**20:
                raise SourceError(
                    "The gzip stream holds more than 1 MiB after the voxels its NIfTI header declares",
                    file=self.path,
                    hint=HINT,
                )

    def close(self) -> None:
        if self.stream is not self.raw:
            self.stream.close()
        self.raw.close()


class NiftiSource(Source):
    """NIfTI-1 / NIfTI-2 images: one Example per volume, the voxels and the image's context (module docstring)."""

    format_name = "nifti"
    help_label = "NIfTI-1/-2 images (.nii, .nii.gz, .hdr/.img)"
    suffixes = (".nii", ".nii.gz")
    magic = tuple(sorted({m for _, m, _, _ in SIGNATURES}))
    magic_offsets = (4, 344)
    content_label = "a NIfTI image"
    takes_datasets = False
    options_models = ("nifti_options.NiftiOptions",)  # --nifti_scaling

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        """True when ``head`` shows a NIfTI signature at its own offset, looking inside a gzip stream."""
        return signature(head) is not None

    def is_sidecar(self, path: str) -> bool:
        """True for a pair's ``.img`` whose ``.hdr`` is beside it: the ``.hdr`` is the input, read with it."""
        return path.lower().endswith(".img") and fileio.exists(path[:-4] + (".HDR" if path[-4:].isupper() else ".hdr"))

    @property
    def scaled(self) -> bool:
        """True with ``--nifti_scaling apply``."""
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.nifti_options import NiftiOptions

        return self.options.of(NiftiOptions).nifti_scaling == "apply"

    def layout(self, path: str) -> NiftiLayout:
        """The checked header of ``path`` (``niftiheader.read_layout``, within ``--max_compression_ratio``)."""
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions

        return read_layout(path, self.options.of(NumpyOptions).max_compression_ratio)

    def index(self, path: str) -> FileIndex:
        """Volumes and features of ``path`` from its header alone (nothing of the voxels is read).

        Raises:
          SourceError: what ``niftiheader.read_layout`` raises. SchemaError: a stored type no Example holds
            (float128, complex256).
        """
        layout = self.layout(path)
        shape, header = layout.shape, layout.header
        rows = shape[TIME_AXIS] if len(shape) > TIME_AXIS else 1
        volume = shape[:TIME_AXIS] + shape[TIME_AXIS + 1 :]
        where = f"the voxels of '{path}'"
        dtype = self._scaled_dtype(layout) if self.scaled else layout.dtype
        specs = leaf_specs("data", dtype, volume, where)
        specs += [
            row_spec("affine", np.dtype("f8"), (4, 4), where),
            row_spec("zooms", np.dtype("f8"), (len(shape),), where),
            row_spec("xyz_unit", UNIT_DTYPE, (), where),
            row_spec("t_unit", UNIT_DTYPE, (), where),
        ]
        if not self.scaled:
            specs += [
                row_spec("scl_slope", np.dtype("f8"), (), where),
                row_spec("scl_inter", np.dtype("f8"), (), where),
            ]
        check_names(specs, path)
        attributes = {
            "nifti": {
                "version": layout.version,
                "data_file": layout.data_path,
                "shape": list(shape),
                "stored_dtype": layout.dtype.str,
                "descrip": _text(header["descrip"]),
                "intent": [str(v) for v in header.get_intent()[::2]],
                "qform_code": int(header["qform_code"]),
                "sform_code": int(header["sform_code"]),
                "toffset": float(header["toffset"]),
            }
        }
        return FileIndex(path, rows, tuple(specs), row_bytes(specs), 1, sequential=layout.gz, attributes=attributes)

    @staticmethod
    def _scaled_dtype(layout: NiftiLayout) -> np.dtype:
        """The dtype of nibabel's scaled values (``np.asanyarray(img.dataobj)``): its own scaling, applied to one
        stored zero."""
        # deferred: nibabel, the field's reader (optional: the nifti extra)
        from nibabel.arrayproxy import ArrayProxy

        one = layout.header.copy()
        one.set_data_shape((1,))
        one.set_data_offset(0)
        return np.asarray(ArrayProxy(io.BytesIO(bytes(layout.dtype.itemsize)), one, mmap=False)[:]).dtype

    def _open(self, path: str) -> _OpenImage:
        current = getattr(self._local, "image", None)
        if current is not None and current.path == path:
            return current
        self.close()
        self._local.image = _OpenImage(path, self.layout(path), self.scaled)
        return self._local.image

    def read(self, rr: RowRange) -> Columns:
        """The volumes ``rr.start``-``rr.stop - 1`` of ``rr.path``: ``data`` of shape ``(rows, *volume)`` and the
        context features, each of shape ``(rows, *its shape)``.

        Raises:
          SourceError: the voxels cannot be read (a stream cut short or corrupt), naming the rows and the file.
        """
        image = self._open(rr.path)
        layout, n = image.layout, rr.num_rows
        try:
            if len(layout.shape) > TIME_AXIS:
                slicer = (slice(None),) * TIME_AXIS + (slice(rr.start, rr.stop),)
                data = np.moveaxis(np.asarray(image.proxy[slicer]), TIME_AXIS, 0)
            else:
                data = np.asarray(image.proxy[(slice(None),) * len(layout.shape)])[np.newaxis]
            if layout.gz and rr.stop == (layout.shape[TIME_AXIS] if len(layout.shape) > TIME_AXIS else 1):
                image.check_stream_end()
        except Exception as e:  # noqa: BLE001 - nibabel/NumPy on a short read, gzip and zlib errors on corrupt streams
            self.close()
            raise SourceError(f"Cannot read the voxels of {rr.describe()}: {e}", file=rr.path, hint=HINT) from None
        columns: Columns = {name: to_little_endian(a) for name, a in flatten_fields("data", data)}
        header = layout.header
        xyz, t = header.get_xyzt_units()
        context = {
            "affine": np.asarray(header.get_best_affine(), dtype="f8"),
            "zooms": np.asarray(header.get_zooms(), dtype="f8"),
            "xyz_unit": np.array(xyz, dtype=UNIT_DTYPE),
            "t_unit": np.array(t, dtype=UNIT_DTYPE),
        }
        if not self.scaled:
            slope, inter = header.get_slope_inter()
            context["scl_slope"] = np.array(1.0 if slope is None else slope, dtype="f8")
            context["scl_inter"] = np.array(0.0 if inter is None else inter, dtype="f8")
        for name, value in context.items():
            columns[name] = np.repeat(value[np.newaxis], n, axis=0)
        return columns

    def close(self) -> None:
        """Closes the image this worker thread keeps open."""
        current = getattr(self._local, "image", None)
        self._local.image = None
        if current is not None:
            current.close()


def _text(value) -> str:
    """A header's fixed-size text field (``descrip``) as text, up to its first NUL."""
    return bytes(np.asarray(value).item()).split(b"\x00", 1)[0].decode("latin-1")
