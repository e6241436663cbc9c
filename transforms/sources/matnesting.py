"""How deep the arrays of one MATLAB v5/v7 variable nest, found before SciPy loads it.

``scipy.io.loadmat`` reads a cell, struct, object, function handle or opaque value by calling its C (Cython) reader
again for each element, and NumPy frees the loaded object arrays the same way: a cell nested 5,000 deep or more ends
the process with SIGSEGV (a C stack overflow: on Linux's 8 MiB stack the free crashed at 6,000 levels, the load
itself deeper), which no ``except`` can catch. :func:`nesting_depth` walks the same elements without recursion (an
explicit stack, as SciPy's ``VarReader5.read_mi_matrix`` / ``array_from_header`` read them: element by element, the
number of nested matrices taken from the dimensions and field names, never from the byte counts that SciPy ignores
too) and stops as soon as the depth passes the limit, so the caller refuses the variable before SciPy sees it.
Bytes are skipped, never kept: an uncompressed variable is walked by seeking, a compressed one (miCOMPRESSED) is
inflated in pieces of at most 1 MiB.

Reference: MathWorks, "MAT-File Format" (Level 5 MAT-files: data element tags, the small data element format, the
miMATRIX subelements of each array class).
"""

from __future__ import annotations

import zlib

MI_MATRIX, MI_COMPRESSED = 14, 15
CELL, STRUCT, OBJECT, SPARSE, CHAR, FUNCTION, OPAQUE = 1, 2, 3, 5, 4, 16, 17
NUMERIC = frozenset(range(6, 16))  # mxDOUBLE_CLASS .. mxUINT64_CLASS
CONTAINERS = frozenset((CELL, STRUCT, OBJECT, FUNCTION, OPAQUE))
STEP = 2**20


class Damaged(ValueError):
    """The variable's elements end early or are not what SciPy's reader expects there (SciPy would fail too)."""


class _Plain:
    """The bytes ``[start, stop)`` of an uncompressed variable of the open file ``f``."""

    def __init__(self, f, start: int, stop: int):
        self.f, self.pos, self.stop = f, start, stop

    def read(self, n: int) -> bytes:
        if self.pos + n > self.stop:
            raise Damaged(f"the variable's elements run past its end ({self.stop - self.pos} bytes left, {n} needed)")
        self.f.seek(self.pos)
        data = self.f.read(n)
        if len(data) < n:
            raise Damaged("the file ends inside the variable")
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if self.pos + n > self.stop:
            raise Damaged(f"the variable's elements run past its end ({self.stop - self.pos} bytes left, {n} needed)")
        self.pos += n


class _Inflated:
    """The inflated bytes of a compressed variable (the zlib stream at ``[start, stop)`` of ``f``), read forwards
    in pieces: memory stays at about :data:`STEP` whatever the variable's size."""

    def __init__(self, f, start: int, stop: int):
        self.f, self.pos, self.stop = f, start, stop
        self.inflater, self.buffer, self.at, self.tail = zlib.decompressobj(), b"", 0, b""

    def _more(self, want: int) -> None:
        while len(self.buffer) - self.at < want:
            if not self.tail:
                if self.pos >= self.stop or self.inflater.eof:
                    raise Damaged("the compressed variable ends inside an element")
                self.f.seek(self.pos)
                self.tail = self.f.read(min(STEP, self.stop - self.pos))
                if not self.tail:
                    raise Damaged("the file ends inside the variable")
                self.pos += len(self.tail)
            try:
                out = self.inflater.decompress(self.tail, STEP)
            except zlib.error as e:
                raise Damaged(f"the compressed variable is damaged ({e})") from None
            self.tail = self.inflater.unconsumed_tail
            self.buffer, self.at = self.buffer[self.at :] + out, 0

    def read(self, n: int) -> bytes:
        self._more(n)
        self.at += n
        return self.buffer[self.at - n : self.at]

    def skip(self, n: int) -> None:
        while n > 0:
            step = min(n, STEP)
            self._more(step)
            self.at += step
            n -= step


def nesting_depth(f, start: int, stop: int, compressed: bool, byte_order: str, limit: int) -> int:
    """The deepest nesting of arrays in the v5 variable stored at bytes ``[start, stop)`` of the open file ``f`` (1:
    an array holding no other array; a cell of numbers: 2), or ``limit + 1`` as soon as the walk passes ``limit``.

    Raises:
      Damaged: the elements do not parse as SciPy's reader would read them (then loading would fail too).
    """
    order = "little" if byte_order == "<" else "big"
    stream = _Inflated(f, start + 8, stop) if compressed else _Plain(f, start, stop)
    pending = [1]  # per open level: the matrices still to read there
    deepest = 0
    while pending:
        if pending[-1] == 0:
            pending.pop()
            continue
        pending[-1] -= 1
        depth = len(pending)
        deepest = max(deepest, depth)
        if deepest > limit:
            return limit + 1
        children = _matrix(stream, order)
        if children:
            pending.append(children)
    return deepest


def _u32(data: bytes, at: int, order: str) -> int:
    return int.from_bytes(data[at : at + 4], order)


def _element(stream, order: str) -> tuple[int, bytes]:
    """One data element: ``(its byte count, its bytes when at most 4 KiB, else b"")`` (its tag read, its padding
    skipped; the small data element format included)."""
    tag = stream.read(8)
    first = _u32(tag, 0, order)
    if first >> 16:  # small data element: type and byte count in 4 bytes, the data in the other 4
        count = first >> 16
        if count > 4:
            raise Damaged("a small data element declares more than 4 bytes")
        return count, tag[4 : 4 + count]
    count = _u32(tag, 4, order)
    data = stream.read(count) if count <= 4096 else (stream.skip(count) or b"")
    if count % 8:
        stream.skip(8 - count % 8)
    return count, data


def _skip_elements(stream, order: str, n: int) -> None:
    for _ in range(n):
        tag = stream.read(8)
        first = _u32(tag, 0, order)
        if first >> 16:
            continue
        count = _u32(tag, 4, order)
        stream.skip(count + (-count % 8))


def _matrix(stream, order: str) -> int:
    """Reads one miMATRIX element's own subelements (not its nested matrices) and returns how many nested matrices
    follow it in the stream (SciPy reads them next, one level deeper)."""
    tag = stream.read(8)
    if _u32(tag, 0, order) != MI_MATRIX:
        raise Damaged("an element that should be an array (miMATRIX) is not")
    if _u32(tag, 4, order) == 0:
        return 0  # an empty matrix
    flags = stream.read(16)  # the array flags' tag and the flags themselves (as SciPy's read_header reads them)
    mclass = _u32(flags, 8, order) & 0xFF
    complex_ = bool(_u32(flags, 8, order) >> 11 & 1)
    if mclass == OPAQUE:  # a name (newer SciPy) or nothing, then strings: 3 elements in all, then one matrix
        _skip_elements(stream, order, 3)
        return 1
    _, dims_data = _element(stream, order)
    dims = [int.from_bytes(dims_data[i : i + 4], order, signed=True) for i in range(0, len(dims_data) - 3, 4)]
    _skip_elements(stream, order, 1)  # the name
    count = 1
    for d in dims:
        count *= max(d, 0)
    if mclass in NUMERIC:
        _skip_elements(stream, order, 2 if complex_ else 1)
        return 0
    if mclass == SPARSE:
        _skip_elements(stream, order, 4 if complex_ else 3)
        return 0
    if mclass == CHAR:
        _skip_elements(stream, order, 1)
        return 0
    if mclass == CELL:
        return count
    if mclass == FUNCTION:
        return 1
    if mclass == OBJECT:
        _skip_elements(stream, order, 1)  # the class name
    if mclass in (STRUCT, OBJECT):
        _, length = _element(stream, order)
        namelength = int.from_bytes(length[:4], order, signed=True) if len(length) >= 4 else 0
        names, _ = _element(stream, order)
        fields = names // namelength if namelength > 0 else 0
        return count * fields
    raise Damaged(f"an array of unknown class {mclass}")
