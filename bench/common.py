"""What the benchmark's contenders share: row layouts, chunked HDF5 reads, the per-row Example, record counts.

Kept free of TensorFlow and Beam imports at module level, so the driver and the raw copy stay light.
"""

from __future__ import annotations

import glob
import os
import struct
from collections.abc import Iterator

import numpy as np

# Row layouts of the generated inputs: dataset path -> (dtype, per-row shape).
SMALL = {"/x": ("<f4", (16,)), "/id": ("<i8", ())}
LARGE = {"/image": ("|u1", (64, 64, 3)), "/emb": ("<f4", (128,)), "/id": ("<i8", ())}
LAYOUTS = {"small": SMALL, "large": LARGE}

# Size of one chunk read by the single-process contenders (seed loop, raw copy), in bytes.
CHUNK_BYTES = 16 * 2**20

# The int64 field the augmentation contenders add to every record: NAME=VALUE:DTYPE.
AUGMENT_NAME, AUGMENT_VALUE = "label", 7
AUGMENT_CONSTANT = f"{AUGMENT_NAME}={AUGMENT_VALUE}:int64"


def row_bytes(layout: dict) -> int:
    """Raw array bytes of one row of ``layout``."""
    return sum(np.dtype(dt).itemsize * int(np.prod(shape, dtype=np.int64)) for dt, shape in layout.values())


def seed_form(dtype) -> str:
    """The Example form the hand-written seed loop gives a dataset (seed 000): ``uint8`` arrays as one
    ``bytes`` value (``array.tobytes()``), floats as a ``float_list``, integers as an ``int64_list``.

    The convert contenders are asked for the same forms (``--encoding list --feature_encodings
    image=tensor``), so every contender writes Examples of the same features and kinds.
    """
    kind = np.dtype(dtype).kind
    if np.dtype(dtype) == np.uint8 or kind in "SV":
        return "bytes"
    return "float" if kind == "f" else "int64"


def convert_encoding_flags(datasets) -> list[str]:
    """``python -m pipelines.convert`` flags giving the same Example forms as :func:`seed_form`."""
    tensor = [name.lstrip("/") for name in datasets if seed_form(datasets[name][0]) == "bytes"]
    flags = ["--encoding", "list"]
    if tensor:
        flags += ["--feature_encodings", ",".join(f"{n}=tensor" for n in tensor)]
    return flags


def chunk_rows_for(rbytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    return max(1, chunk_bytes // max(1, rbytes))


def iter_h5_chunks(
    path: str, chunk_rows: int | None = None, start: int = 0, stop: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Yields ``{feature name: array of the chunk's rows}`` for rows ``[start, stop)`` of every
    top-level dataset of ``path``, ``chunk_rows`` rows at a time (default: about 16 MB)."""
    import h5py

    with h5py.File(path, "r") as f:
        names = sorted(k for k in f if isinstance(f[k], h5py.Dataset))
        n = f[names[0]].shape[0]
        stop = n if stop is None else min(stop, n)
        if chunk_rows is None:
            rb = sum(f[k].dtype.itemsize * int(np.prod(f[k].shape[1:], dtype=np.int64)) for k in names)
            chunk_rows = chunk_rows_for(rb)
        for a in range(start, stop, chunk_rows):
            b = min(a + chunk_rows, stop)
            yield {k: f[k][a:b] for k in names}


def h5_num_rows(path: str) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        return f[sorted(f.keys())[0]].shape[0]


def make_row_example_fn():
    """Returns ``to_example(columns, i) -> serialized tf.train.Example`` of row ``i``: the per-row code
    a hand-written loop has (seed 000), with the feature forms of :func:`seed_form`."""
    import tensorflow as tf

    def to_example(columns: dict[str, np.ndarray], i: int) -> bytes:
        feature = {}
        for name, col in columns.items():
            value = col[i]
            form = seed_form(col.dtype)
            if form == "bytes":
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.tobytes()]))
            elif form == "float":
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(value)))
            else:
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(value)))
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    return to_example


_LEN = struct.Struct("<Q")


def count_frames(path: str) -> int:
    """Number of records of an uncompressed TFRecord file, by walking the frame headers (no CRC check)."""
    n = 0
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            header = f.read(12)
            if len(header) < 12:
                raise ValueError(f"{path}: truncated frame header at byte {pos}")
            length = _LEN.unpack_from(header)[0]
            pos += 16 + length
            f.seek(pos)
            n += 1
    if pos != size:
        raise ValueError(f"{path}: truncated record at the end")
    return n


def count_gzip_frames(path: str) -> int:
    """Number of records of a gzip TFRecord file, by walking the frame headers of its decompressed stream."""
    import gzip

    n = 0
    with gzip.open(path, "rb") as f:
        while True:
            header = f.read(12)
            if not header:
                return n
            if len(header) < 12:
                raise ValueError(f"{path}: truncated frame header after record {n}")
            length = _LEN.unpack_from(header)[0]
            if len(f.read(length + 4)) != length + 4:
                raise ValueError(f"{path}: truncated record {n}")
            n += 1


def tfrecord_files(directory: str) -> list[str]:
    """Uncompressed TFRecord files under ``directory`` (recursively), sorted."""
    out = []
    for pattern in ("*.tfrecord", "*.tfrecords", "*.tfrecord-*"):
        out += glob.glob(os.path.join(directory, "**", pattern), recursive=True)
    return sorted(set(out))


def dir_bytes(directory: str) -> int:
    """Total size of every file under ``directory``."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def h5_row_bytes_and_rows(path: str) -> tuple[int, int]:
    """``(raw bytes of one row over every top-level dataset, number of rows)`` of the HDF5 file ``path``."""
    import h5py

    with h5py.File(path, "r") as f:
        names = sorted(k for k in f if isinstance(f[k], h5py.Dataset))
        rb = sum(f[k].dtype.itemsize * int(np.prod(f[k].shape[1:], dtype=np.int64)) for k in names)
        return rb, f[names[0]].shape[0]
