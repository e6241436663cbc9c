"""Hostile MATLAB v5/v7 .mat files (hostile groups 13 and 18): arrays nested deeper than SciPy's reader (recursive C)
and NumPy's free survive, and cells declared but not stored. The files are written byte by byte here (MAT-File
Format, Level 5), small: nesting costs 48 bytes a level.
"""

from __future__ import annotations

import glob
import os
import struct
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
import scipy
import scipy.io

from tests.conftest import ROOT, convert
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources import MatlabSource, SourceOptions

CELL, STRUCT, DOUBLE = 1, 2, 6


def tag(kind: int, nbytes: int) -> bytes:
    return struct.pack("<II", kind, nbytes)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def matrix_head(mclass: int, dims, name: bytes, body_bytes: int, extra: bytes = b"") -> bytes:
    """The miMATRIX tag and subelements (flags, dimensions, name, ``extra``) of an array whose remaining body (its
    nested arrays or data) is ``body_bytes`` long."""
    head = (
        tag(6, 8)
        + struct.pack("<II", mclass, 0)
        + tag(5, 4 * len(dims))
        + padded(b"".join(struct.pack("<i", d) for d in dims))
        + tag(1, len(name))
        + padded(name)
        + extra
    )
    return tag(14, len(head) + body_bytes) + head


def double(value: float) -> bytes:
    data = tag(9, 8) + struct.pack("<d", value)
    return matrix_head(DOUBLE, (1, 1), b"", len(data)) + data


def nested(levels: int, kind: int = CELL, name: bytes = b"c", leaf: float = 1.0) -> bytes:
    """A variable ``name`` of ``levels`` cells (or 1x1 structs with one field ``s``, the innermost field ``x``) nested
    inside each other around one double: written from the inside out, in linear time."""
    inner = double(leaf)
    heads, size = [], len(inner)
    for level in range(levels):
        field = b"x" if level == 0 else b"s"
        extra = tag(5, 4) + padded(struct.pack("<i", 8)) + tag(1, 8) + field.ljust(8, b"\0") if kind == STRUCT else b""
        head = matrix_head(kind, (1, 1), name if level == levels - 1 else b"", size, extra)
        heads.append(head)
        size += len(head)
    return b"".join(reversed(heads)) + inner


def mat_file(path, *elements: bytes, compressed: bool = False) -> None:
    header = (
        b"MATLAB 5.0 MAT-file, written by tests/test_hostile_matlab.py".ljust(116, b" ")
        + b"\0" * 8
        + struct.pack("<H", 0x0100)
        + b"IM"
    )
    body = b"".join(tag(15, len(z)) + z for z in map(zlib.compress, elements)) if compressed else b"".join(elements)
    path.write_bytes(header + body)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compressed", [False, True], ids=["v6", "v7-compressed"])
def test_cells_nested_10000_deep_are_one_line_not_a_crash(tmp_path, compressed):
    """Hostile group 26: a file of cells nested 10,000 deep (480 KB; 20 KB compressed) printed one error line and
    then died of SIGSEGV (exit 139): SciPy loaded it by recursion in C and NumPy's free of the nested object arrays
    overflowed the stack. Now the nesting is walked without recursion before SciPy sees the file: exit 2, one line
    naming the file, the variable, the limit and its flag."""
    path = tmp_path / "deep.mat"
    mat_file(path, nested(10_000), compressed=compressed)
    assert os.path.getsize(path) < (30_000 if compressed else 500_000)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.convert",
            "--input",
            str(path),
            "--output_dir",
            str(tmp_path / "out"),
            "--container_mode",
            "datasets",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3"),
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: SourceError: The variable's arrays nest more than 64 deep")
    assert "--max_mat_nesting" in lines[0] and f"file='{path}'" in lines[0] and "dataset='/c'" in lines[0]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.tfrecord*"))


@pytest.mark.parametrize("compressed", [False, True], ids=["v6", "v7-compressed"])
def test_struct_nesting_over_the_limit_is_refused_and_the_flag_raises_it(tmp_path, capsys, compressed):
    """Hostile group 26: a struct nested 70 deep is refused at the default --max_mat_nesting 64 (naming the variable
    and the flag); with --max_mat_nesting 80 its innermost field converts exactly, as SciPy reads it."""
    path = tmp_path / "s.mat"
    mat_file(path, nested(70, STRUCT, b"s", leaf=2.5), compressed=compressed)
    code, _, err = convert(path, tmp_path / "out", capsys=capsys)
    assert code == 2 and "nest more than 64 deep" in err and "dataset='/s'" in err and "--max_mat_nesting" in err
    code, _, err = convert(path, tmp_path / "out", "--max_mat_nesting", "80", capsys=capsys)
    assert code == 0, err
    (record,) = list(reader.iter_numpy(str(tmp_path / "out")))
    (name,) = record
    assert name == "s/" + "s/" * 69 + "x" and record[name].tolist() == [2.5]


def test_cells_declared_but_not_stored_are_refused_before_scipy_allocates_them(tmp_path, capsys):
    """Hostile group 13: a cell array declaring 100,000 x 100,000 cells and holding one (SciPy allocates an object
    array of 10**10 entries, 80 GB, before reading the first) is refused at planning, naming the variable."""
    path = tmp_path / "bomb.mat"
    inner = double(1.0)
    mat_file(path, matrix_head(CELL, (100_000, 100_000), b"c", len(inner)) + inner)
    with pytest.raises(
        SourceError,
        match=r"Cannot read the variable's arrays: the variable's elements run past its "
        r"end .* dataset='/c'",
    ):
        MatlabSource(SourceOptions("matlab", container_mode="datasets")).index(str(path))


def reference_depth(value) -> int:
    """How deep SciPy's reader recursed for a loaded value: one level per array, its cells and struct fields one
    deeper (a function handle or object wraps its struct: one level more)."""
    best, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        best = max(best, depth)
        if isinstance(v, np.ndarray) and type(v) is not np.ndarray:  # MatlabFunction, MatlabObject, MatlabOpaque
            inner = v.view(np.ndarray)
            stack.append((inner, depth + 1 if type(v).__name__ == "MatlabFunction" else depth))
        elif isinstance(v, np.ndarray) and v.dtype.names and v.dtype != object:
            stack += [(e[n], depth + 1) for e in v.ravel() for n in v.dtype.names]
        elif isinstance(v, np.ndarray) and v.dtype == object:
            stack += [(e, depth + 1) for e in v.ravel() if e is not None]  # (a struct without fields: Nones)
    return best


def test_the_walk_reads_every_scipy_test_file_as_scipy_does():
    """The nesting walk parses SciPy's own MATLAB test files (v5-v7, both byte orders, cells, structs, objects,
    function handles, sparse, char, empty) without a refusal, and finds SciPy's depth for every variable."""
    from tfrecord_etl.transforms.sources import matnesting

    folder = os.path.join(os.path.dirname(scipy.__file__), "io", "matlab", "tests", "data")
    checked = 0
    for path in sorted(glob.glob(os.path.join(folder, "*.mat"))):
        source = MatlabSource(SourceOptions("matlab"))
        with open(path, "rb") as f:
            f.seek(124)
            if f.read(4) not in (b"\x00\x01IM", b"\x01\x00MI"):
                continue  # v4
            try:
                table = source.variables(f, path)
            except SourceError:
                continue  # deliberately broken files of SciPy's tests
            for var in table:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        value = scipy.io.loadmat(path, variable_names=[var.name])[var.name]
                except Exception:  # noqa: BLE001 - broken on purpose
                    continue
                depth = matnesting.nesting_depth(f, var.start, var.stop, var.compressed, var.byte_order, 10**6)
                assert depth == reference_depth(value), (path, var.name)
                checked += 1
    assert checked > 100
