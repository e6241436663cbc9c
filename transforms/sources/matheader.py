"""The variable headers of a MATLAB v4-v7 ``.mat`` file, read without loading a variable: ``scipy.io.whosmat``'s scan
(name, dimensions, class) and what SciPy's header object keeps to itself (a v5 variable's compressed and complex
flags, the bytes a compressed variable inflates to).

Reference: MathWorks, "MAT-File Format" (Level 4 and Level 5 MAT-files: the header, data element tags, the Array
Flags subelement); ``scipy.io.whosmat``.
"""

from __future__ import annotations

import zlib

from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources.mattext import matlab_shape
from tfrecord_etl.transforms.sources.matvalues import FUNCTION_WORKSPACE, MatVariable
from tfrecord_etl.transforms.sources.signatures import other_format_hint

MI_COMPRESSED, COMPLEX_FLAG = 15, 0x0800
V5_VERSIONS = (b"\x00\x01IM", b"\x01\x00MI")  # the v5 header's version 0x0100 and endian indicator, at byte 124


def is_v5(f) -> bool:
    """True when the open file ``f`` is a Level 5 MAT-file (v6, v7), by its header's version and endian indicator."""
    f.seek(124)
    return f.read(4) in V5_VERSIONS


def variables(f, path: str, fmt: str = "matlab") -> list[MatVariable]:
    """The variable headers of the open file ``f``, in file order (``scipy.io.whosmat``'s scan, which also reads
    each header's complex flag; nothing is loaded).

    Raises:
      SourceError: not a MATLAB v4-v7 file, or a damaged header (naming the file; the format its first bytes show,
        when it is another registered one than ``fmt``).
    """
    from scipy.io.matlab import _mio, _mio4, _mio5, _mio5_params

    try:
        f.seek(0)
        reader, _ = _mio.mat_reader_factory(f, chars_as_strings=False, mat_dtype=True)
        v5 = isinstance(reader, _mio5.MatFile5Reader)
        classes, sparse = (
            (_mio5_params.mclass_info, _mio5_params.mxSPARSE_CLASS) if v5 else (_mio4.mclass_info, _mio4.mxSPARSE_CLASS)
        )
        f.seek(0)
        reader.initialize_read()
        if v5:
            reader.read_file_header()
        out = []
        while not reader.end_of_stream():
            start = f.tell()
            hdr, stop = reader.read_var_header()
            name = hdr.name.decode("latin1") if hdr.name is not None else "None"
            mclass = (
                "sparse"
                if hdr.mclass == sparse
                else ("logical" if hdr.is_logical else classes.get(hdr.mclass, "unknown"))
            )
            shape = matlab_shape(reader._matrix_reader.shape_from_header(hdr))
            if v5:
                compressed, is_complex = array_flags(f, start, reader.byte_order)
            else:  # a v4 sparse matrix is rows of (i, j, real[, imag]): four columns when complex
                compressed, is_complex = False, bool(hdr.is_complex) or (mclass == "sparse" and hdr.dims[1] == 4)
            out.append(
                MatVariable(
                    name or FUNCTION_WORKSPACE,
                    shape,
                    mclass,
                    is_complex,
                    start,
                    int(stop),
                    compressed,
                    reader.byte_order if v5 else "<",
                    logical=bool(getattr(hdr, "is_logical", False)),
                )
            )
            f.seek(stop)
        return out
    except SourceError:
        raise
    except Exception as e:  # noqa: BLE001 - SciPy raises ValueError/TypeError/MatReadError on damaged headers
        raise SourceError(
            f"Not a readable MATLAB v4-v7 .mat file: {e}",
            file=path,
            hint=other_format_hint(path, fmt) or "check that the file is complete",
        ) from None


def array_flags(f, start: int, byte_order: str) -> tuple[bool, bool]:
    """``(compressed, complex)`` of the v5 variable at byte ``start``: its tag's data type (miCOMPRESSED: 15), then
    the complex bit of its Array Flags subelement (MAT-File Format, Level 5: the tag, 8 bytes, then the flags'
    tag, 8 bytes, then the flags word; inflated from the first compressed bytes for a compressed variable).
    SciPy's header object keeps that bit to itself."""
    f.seek(start)
    tag = f.read(8)
    order = "little" if byte_order == "<" else "big"
    compressed = int.from_bytes(tag[:4], order) == MI_COMPRESSED
    if compressed:
        body = zlib.decompressobj().decompress(f.read(min(int.from_bytes(tag[4:8], order), 4096)), 24)
    else:
        body = tag + f.read(16)
    return compressed, bool(int.from_bytes(body[16:20], order) & COMPLEX_FLAG)


def inflated_bytes(f, var: MatVariable, limit: int) -> int:
    """The bytes a compressed (miCOMPRESSED) variable inflates to, counted in 1 MiB steps without keeping them,
    stopping once over ``limit``."""
    f.seek(var.start + 8)
    inflater, remaining, total = zlib.decompressobj(), var.stop - var.start - 8, 0
    while remaining > 0 and total <= limit:
        chunk = f.read(min(2**20, remaining))
        if not chunk:
            break
        remaining -= len(chunk)
        while chunk and total <= limit:
            total += len(inflater.decompress(chunk, 2**20))
            chunk = inflater.unconsumed_tail
    return total
