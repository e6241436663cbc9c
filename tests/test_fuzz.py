"""Fuzzing the readers of untrusted bytes: the TFRecord framing reader, the Example decoder, the metadata loader.

Property: on random and mutated input they return or raise one of the documented errors (RecordError,
SchemaError, IncompleteOutputError), never anything else, never hang and never crash the interpreter
(a segfault would end the pytest process). Unmutated input must round-trip exactly (the oracle that
keeps the mutations honest).

Bounded for CI: TFRECORD_ETL_FUZZ_EXAMPLES examples per property (default 150, the file runs in about
10 s). A longer developer run, without the per-test time limit:

    TFRECORD_ETL_FUZZ_EXAMPLES=100000 .venv/bin/python -m pytest tests/test_fuzz.py -q -p no:timeout
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import IncompleteOutputError, RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata, schemafile, tfrecord

EXAMPLES = int(os.environ.get("TFRECORD_ETL_FUZZ_EXAMPLES", "150"))
LONG_RUN = "TFRECORD_ETL_FUZZ_EXAMPLES" in os.environ
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=5000,
    derandomize=not LONG_RUN,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
pytestmark = pytest.mark.timeout(0 if LONG_RUN else 120)

DOCUMENTED = (RecordError, SchemaError, IncompleteOutputError)


# ----------------------------------------------------------------------------------------------
# Mutations
# ----------------------------------------------------------------------------------------------


def _mutation():
    """One mutation of a byte string: (kind, position fraction, value)."""
    return st.tuples(
        st.sampled_from(["flip", "set", "truncate", "insert", "delete", "duplicate", "length"]),
        st.floats(0, 1),
        st.integers(0, 2**64 - 1),
    )


def mutate(data: bytes, mutations) -> bytes:
    """Applies mutations; ``length`` rewrites the first frame header at the position with a valid length CRC."""
    buf = bytearray(data)
    for kind, where, value in mutations:
        pos = min(len(buf), int(where * len(buf)))
        if kind == "flip" and buf:
            pos = min(pos, len(buf) - 1)
            buf[pos] ^= 1 << (value % 8)
        elif kind == "set" and buf:
            buf[min(pos, len(buf) - 1)] = value % 256
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = value.to_bytes(8, "little")[: 1 + value % 8]
        elif kind == "delete":
            del buf[pos : pos + 1 + value % 16]
        elif kind == "duplicate":
            buf[pos:pos] = buf[pos : pos + 1 + value % 32]
        elif kind == "length" and len(buf) >= pos + 12:  # a frame header with a valid CRC over any length
            length = struct.pack("<Q", value >> (value % 64))
            buf[pos : pos + 12] = length + struct.pack("<I", tfrecord.masked_crc(length))
    return bytes(buf)


def wrap(data: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(data, mtime=0)
    if compression == "zlib":
        return zlib.compress(data)
    return data


def read_all(data: bytes, compression: str) -> list[bytes]:
    stream = tfrecord.open_decompressed(io.BytesIO(data), compression)
    return [r for _, _, r in tfrecord.iter_records(stream, "fuzz")]


# ----------------------------------------------------------------------------------------------
# TFRecord framing
# ----------------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=4096), st.sampled_from(tfrecord.COMPRESSIONS))
@example(b"\x1f\x8b" + b"\x00" * 30, "gzip")
@example(b"x\x9c" + b"\xff" * 30, "zlib")
def test_framing_reader_on_random_bytes(data, compression):
    try:
        read_all(data, compression)
    except RecordError:
        pass


@FUZZ
@given(
    records=st.lists(st.binary(max_size=300), max_size=6),
    compression=st.sampled_from(tfrecord.COMPRESSIONS),
    before=st.lists(_mutation(), max_size=3),
    after=st.lists(_mutation(), max_size=3),
)
def test_framing_reader_on_mutated_frames(records, compression, before, after):
    framed = tfrecord.frame_records(records)
    assert read_all(wrap(framed, compression), compression) == records  # the oracle: unmutated round trip
    data = mutate(wrap(mutate(framed, before), compression), after)  # mutate the frames, then the stream
    try:
        got = read_all(data, compression)
    except RecordError as e:
        assert "fuzz" in str(e) and "record=" in str(e)  # names the file and the record index
        return
    if not before and not after:
        assert got == records


@FUZZ
@given(st.integers(27, 2**64 - 1), st.sampled_from(tfrecord.COMPRESSIONS))  # 30 bytes follow the header
@example(2**63 - 1, "none")
@example(2**64 - 1, "zlib")
@example(2**40, "gzip")
def test_framing_reader_on_huge_lengths_with_valid_crc(length, compression):
    head = struct.pack("<Q", length)
    data = wrap(head + struct.pack("<I", tfrecord.masked_crc(head)) + b"abc" * 10, compression)
    # a length over the record size limit (--max_record_mb) is refused before anything is read for it
    with pytest.raises(RecordError, match="Truncated record|Cannot read record|over the record size limit"):
        read_all(data, compression)


# ----------------------------------------------------------------------------------------------
# Example decoder
# ----------------------------------------------------------------------------------------------

DTYPES = ["|b1", "|i1", "<i2", "<i8", "|u1", "<u4", "<u8", "<f2", "<f4", "<f8", "<c8", "|S3", "<U2", "|V2", "<M8[D]"]


@st.composite
def specs_and_columns(draw):
    """1-3 features of random dtype, encoding and shape (fixed or varying), and 1-3 rows of values."""
    rows = draw(st.integers(1, 3))
    specs, columns = [], {}
    for i in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(DTYPES + ["bytes"]))
        kind = "bytes" if dtype == "bytes" else np.dtype(dtype).kind
        encoding = "list" if dtype == "bytes" else draw(st.sampled_from(["tensor", "list"]))
        if (encoding == "list" and kind in "cV") or (encoding == "list" and dtype in ("<u8", "<f8")):
            encoding = "tensor"
        shape = draw(st.lists(st.integers(0, 3), max_size=2).map(tuple))
        varying = draw(st.booleans()) and dtype != "bytes"
        name = f"f{i}"
        if dtype == "bytes":
            specs.append(FeatureSpec(name, dtype, (), "list"))
            columns[name] = [draw(st.binary(max_size=5)) for _ in range(rows)]
            continue
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)

        def values(shape, rng=rng, dtype=dtype, kind=kind):  # bound now: called in this iteration only
            raw = rng.integers(0, 256, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, dtype=np.uint8)
            arr = (raw % 2 if kind == "b" else raw).view(dtype).reshape(shape)
            if kind == "U":
                arr = np.array(["é", "ab", "", "z"] * (arr.size + 1), dtype=dtype)[: arr.size].reshape(shape)
            if kind == "M":
                arr = (raw.view("<i8") % 10**6).view(dtype).reshape(shape) if arr.size else arr
            return arr

        if varying:
            specs.append(FeatureSpec(name, dtype, (None,) * len(shape), encoding))
            columns[name] = [values(tuple((d + r) % 4 for d in shape)) for r in range(rows)]
        else:
            specs.append(FeatureSpec(name, dtype, shape, encoding))
            columns[name] = values((rows, *shape))
    return specs, columns, rows


def _equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object or b.dtype == object:
        return a.shape == b.shape and a.tolist() == b.tolist()
    return a.shape == b.shape and a.dtype.str == b.dtype.str and a.tobytes() == b.tobytes()


@FUZZ
@given(st.binary(max_size=512), st.sampled_from(DTYPES + ["bytes"]), st.booleans())
@example(b"\n\x0b\n\t\n\x01f\x12\x04\x12\x02\n\x03", "<f4", False)  # a FloatList of 3 bytes
def test_decoder_on_random_bytes(data, dtype, varying):
    encoding = "list" if dtype == "bytes" else "tensor"
    spec = FeatureSpec("f", dtype, (None,) if varying and dtype != "bytes" else (2,), encoding)
    try:
        codec.parse_example(data)
    except RecordError:
        pass
    try:
        codec.decode_example(data, [spec])
        codec.decode_example_lenient(data, [spec])
    except (RecordError, SchemaError):
        pass


@FUZZ
@given(specs_and_columns(), st.lists(_mutation(), min_size=1, max_size=3))
def test_decoder_on_mutated_examples(case, mutations):
    specs, columns, rows = case
    records = codec.encode_batch(columns, specs, rows)
    for r, record in enumerate(records):  # the oracle: unmutated records decode to the same values
        decoded = codec.decode_example(record, specs)
        for spec in specs:
            col = columns[spec.name]
            want = (
                np.asarray(col[r], dtype=object)
                if spec.dtype == "bytes"
                else col[r, ...]
                if isinstance(col, np.ndarray)
                else np.asarray(col[r])
            )  # [r, ...] keeps the bytes
            assert _equal(decoded[spec.name], want), (spec, decoded[spec.name], want)
    bad = mutate(records[0], [m for m in mutations if m[0] != "length"])
    try:
        codec.parse_example(bad)
    except RecordError:
        pass
    try:
        codec.decode_example(bad, specs)
    except (RecordError, SchemaError):
        pass


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"a", b"b", b"a/shape", b"a/dtype"]), st.sampled_from([1, 2, 3]), st.binary(max_size=24)
        ),
        max_size=4,
    ),
    st.sampled_from(
        [
            FeatureSpec("a", None, None, "tensor"),
            FeatureSpec("a", "<i4", (None, 2), "tensor"),
            FeatureSpec("a", "<U2", (None,), "list"),
            FeatureSpec("a", "|S2", (2,), "list"),
        ]
    ),
)
@example([(b"a", 1, b"\n\x00\n\x00"), (b"a/shape", 3, b"\n\x02\x01\x02")], FeatureSpec("a", "<i4", (None, 2), "tensor"))
@example([(b"a", 1, b"\n\x01x"), (b"a/shape", 3, b"\n\x02\x7f\x7e")], FeatureSpec("a", None, None, "tensor"))
@example([(b"a", 1, b"\n\x02\xff\xfe"), (b"a/shape", 3, b"\n\x01\x01")], FeatureSpec("a", "<U2", (None,), "list"))
@example(
    [(b"a", 1, b"\n\x00"), (b"a/dtype", 1, b"\n\x03zzz"), (b"a/shape", 3, b"")], FeatureSpec("a", None, None, "tensor")
)
def test_decoder_on_structurally_valid_examples_with_hostile_values(entries, spec):
    """Well-formed Examples whose values lie: negative or huge shapes, bad dtype strings, bad UTF-8,
    several values where one is expected."""
    features = b""
    for name, kind, payload in entries:  # Feature{kind: List{payload}}
        feature = codec.length_delimited_field(kind, payload)
        features += codec.length_delimited_field(
            1, codec.length_delimited_field(1, name) + codec.length_delimited_field(2, feature)
        )
    record = codec.length_delimited_field(1, features)
    try:
        codec.decode_example(record, [spec])
    except (RecordError, SchemaError):
        pass


# ----------------------------------------------------------------------------------------------
# Metadata loader
# ----------------------------------------------------------------------------------------------

VALID_META = {
    "format": "tfrecord-etl/1",
    "tool_version": "0.1.0",
    "created": "2026-01-01T00:00:00Z",
    "compression": "gzip",
    "features": [
        {"name": "x", "dtype": "<f4", "shape": [2, 3], "encoding": "tensor"},
        {"name": "s", "dtype": "bytes", "shape": [], "encoding": "list"},
        {"name": "v", "dtype": None, "shape": None, "encoding": "tensor"},
    ],
    "shards": [{"file": "data-00000-of-00001.tfrecord.gz", "records": 3, "bytes": 100}],
    "num_records": 3,
    "sources": [{"path": "in.h5", "rows": 3}],
    "writer": "planned",
    "options": {"input": "in.h5"},
}

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "",
            ".",
            "..",
            "../x",
            "/etc/passwd",
            "a/../../b",
            "..\\x",
            "x\x00",
            "<f4",
            "|O",
            "O",
            "bytes",
            "tensor",
            "list",
            "V0",
            "(2,)i4",
            "M8[xx]",
            "U0",
        ]
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
PATHS = st.sampled_from(
    [
        ("format",),
        ("compression",),
        ("features",),
        ("features", 0),
        ("features", 0, "name"),
        ("features", 0, "dtype"),
        ("features", 0, "shape"),
        ("features", 0, "shape", 0),
        ("features", 1, "encoding"),
        ("features", 2, "dtype"),
        ("features", 2, "shape"),
        ("shards",),
        ("shards", 0),
        ("shards", 0, "file"),
        ("shards", 0, "records"),
        ("num_records",),
        ("options",),
    ]
)


def _set(obj, path, value):
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


@pytest.fixture(scope="module")
def meta_dir():
    with tempfile.TemporaryDirectory() as d:
        yield d


def load_bytes(directory: str, data: bytes):
    with open(os.path.join(directory, metadata.METADATA_FILE), "wb") as f:
        f.write(data)
    return metadata.load(directory)


def check_loaded(directory: str, meta: dict) -> None:
    """What a successful load promises: shard paths inside the directory, usable feature specs."""
    for path in metadata.shard_paths(directory, meta):
        assert os.path.dirname(os.path.abspath(path)) == os.path.abspath(directory), path
    for spec in meta["features"]:
        assert isinstance(spec, FeatureSpec) and isinstance(spec.name, str)
        schemafile.example_features(spec)
        try:
            codec.decode_example(b"", [spec])
        except (RecordError, SchemaError):
            pass


@FUZZ
@given(st.binary(max_size=600))
@example(b"[" * 100_000)
@example(b'{"format": "tfrecord-etl/1", "features": ' + b"[" * 50_000)
@example(b"\xff\xfe{}")
def test_metadata_loader_on_random_bytes(meta_dir, data):
    try:
        check_loaded(meta_dir, load_bytes(meta_dir, data))
    except SchemaError:
        pass


@FUZZ
@given(st.lists(st.tuples(PATHS, JSON_VALUES), min_size=1, max_size=3), st.lists(_mutation(), max_size=2))
def test_metadata_loader_on_mutated_metadata(meta_dir, edits, mutations):
    meta = json.loads(json.dumps(VALID_META))
    check_loaded(meta_dir, load_bytes(meta_dir, json.dumps(meta).encode()))  # the oracle: valid loads
    for path, value in edits:
        try:
            _set(meta, path, value)
        except (KeyError, IndexError, TypeError):
            pass
    data = mutate(json.dumps(meta).encode(), [m for m in mutations if m[0] != "length"])
    try:
        check_loaded(meta_dir, load_bytes(meta_dir, data))
    except SchemaError:
        pass


def test_metadata_loader_without_the_file_is_incomplete(tmp_path):
    with pytest.raises(IncompleteOutputError, match="incomplete"):
        metadata.load(str(tmp_path))
