"""The byte comparisons behind the NumPy block reader's fast path: ``codec.block.Layout.matches`` (which records of a
block share the reference record's structural bytes and varint widths) and ``numpy_reader._runs`` (which frames of
a chunk share one length header). Both are compared against a plain per-row reference with a byte changed at every
position that matters, so a record is never decoded at offsets that do not hold for it. No Beam, no TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from tfrecord_etl.transforms.codec import FeatureSpec, encode_batch
from tfrecord_etl.transforms.codec.block import layout_of
from tfrecord_etl.transforms.errors import RecordError
from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.reading import numpy_reader

ROWS = 12


def reference_matches(layout, block: np.ndarray) -> np.ndarray:
    """The definition of ``Layout.matches``, one row at a time in Python."""
    ref = layout.ref.tobytes()
    out = []
    for row in block:
        rec = row.tobytes()
        ok = all(rec[a:b] == ref[a:b] for a, b in layout.ranges)
        for start, nbytes, width in layout.vector.values():
            for i in range(start, start + nbytes) if width else ():
                ok &= (rec[i] >= 0x80) == ((i - start) % width != width - 1)
        out.append(ok)
    return np.array(out)


SPECS = {  # structural byte counts that are and are not multiples of 8; with and without varint columns
    "varints": [
        FeatureSpec("id", "<i8", (), "list"),
        FeatureSpec("x", "<f4", (5,), "list"),
        FeatureSpec("v", "<i8", (3,), "list"),
    ],
    "no varints": [FeatureSpec("img", "|u1", (4, 3), "tensor"), FeatureSpec("emb", "<f4", (2,), "list")],
    "one feature": [FeatureSpec("a", "<i2", (7,), "tensor")],
}


def columns(specs, rows):
    rng = np.random.default_rng(7)
    out = {}
    for s in specs:
        if s.dtype == "<i8":  # one varint width per column: 3 bytes each (2**14 <= v < 2**21)
            out[s.name] = rng.integers(2**14, 2**21, (rows, *s.shape), dtype=np.int64)
        else:
            out[s.name] = rng.integers(0, 100, (rows, *s.shape)).astype(s.dtype)
    return out


@pytest.mark.parametrize("kind", list(SPECS))
def test_layout_matches_finds_every_changed_structural_byte_and_continuation_bit(kind):
    specs = SPECS[kind]
    records = encode_batch(columns(specs, ROWS), specs, ROWS)
    assert len({len(r) for r in records}) == 1
    block = np.frombuffer(b"".join(records), np.uint8).reshape(ROWS, -1)
    layout = layout_of(records[0], specs)
    assert layout.matches(block).all() and reference_matches(layout, block).all()
    checked = 0
    for i in range(block.shape[1]):
        for flip in (0x01, 0x80):  # a low bit (a structural byte) and the high bit (a varint's continuation)
            bad = block.copy()
            bad[3, i] ^= flip
            bad[ROWS - 1, i] ^= flip  # the last row too (the gathered copy's last columns)
            want = reference_matches(layout, bad)
            assert np.array_equal(layout.matches(bad), want), (i, flip)
            assert np.array_equal(layout.matches(bad[1:-1:2]), want[1:-1:2]), (i, flip)  # a strided block
            checked += int(not want[3])
    assert checked >= sum(b - a for a, b in layout.ranges)  # every structural byte was seen to matter


def frames_of(records) -> bytearray:
    return bytearray(tfrecord.frame_records(records))


def test_runs_split_at_a_new_length_and_refuse_any_changed_header_byte():
    spec = [FeatureSpec("a", "<i2", (7,), "tensor")]
    records = encode_batch(columns(spec, 40), spec, 40)
    longer = encode_batch({"a": np.zeros((1, 9), "<i2")}, [FeatureSpec("a", "<i2", (9,), "tensor")], 1)
    buf = frames_of(records[:25] + longer + records[25:])
    arr = np.frombuffer(buf, np.uint8)
    runs, end, _ = numpy_reader._runs(buf, len(buf), arr, 0, 1 << 20, None, "f", 0, 0)
    frame = len(records[0]) + 16
    assert end == len(buf)
    assert runs == [
        (0, len(records[0]), 25),
        (25 * frame, len(longer[0]), 1),
        (25 * frame + len(longer[0]) + 16, len(records[0]), 15),
    ]
    buf = frames_of(records)
    for j in (1, 17, 39):  # inside the first window, a later one, the last frame
        for c in range(12):  # the 8 length bytes and the 4 bytes of their CRC
            bad = bytearray(buf)
            bad[j * frame + c] ^= 0x04
            with pytest.raises(RecordError) as e:
                numpy_reader._runs(bad, len(bad), np.frombuffer(bad, np.uint8), 0, 1 << 20, None, "f", 0, 0)
            assert e.value.context["record"] == j, (j, c, e.value)
