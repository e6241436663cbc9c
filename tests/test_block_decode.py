"""codec.block.BlockDecoder: a block of records decoded at once equals the per-record decoder
(codec.decode_example_lenient) stacked, value for value, dtype for dtype (byte order included), for every encoding
and dtype the writer takes, for records of another writer's layout, and for records that share a layout's length
but not its varint widths. No Beam, no TensorFlow: the records come from the codec's own writer."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tfrecord_etl.transforms.codec import FeatureSpec, decode_example_lenient, encode_batch
from tfrecord_etl.transforms.codec.block import MIN_BLOCK, BlockDecoder, stack
from tfrecord_etl.transforms.codec.encodings import check_spec
from tfrecord_etl.transforms.codec.wire import encode_varint, length_delimited_field
from tfrecord_etl.transforms.errors import RecordError, SchemaError

ROWS = 40


def values(dtype: str, shape: tuple, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = rows * int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        flat[:3] = [0, 1, info.max][: len(flat[:3])]  # varints of several widths
    elif dt.kind == "f":
        flat = rng.standard_normal(n).astype(dt) * 1e3
        if n > 2:
            flat[1], flat[2] = np.nan, -0.0
    elif dt.kind == "c":
        flat = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    elif dt.kind == "S":
        flat = np.array(
            [bytes(rng.integers(1, 255, rng.integers(0, dt.itemsize + 1), dtype=np.uint8)) for _ in range(n)], dtype=dt
        )
    elif dt.kind == "U":
        flat = np.array(
            ["".join(chr(c) for c in rng.integers(32, 0x2FF, rng.integers(0, dt.itemsize // 4 + 1))) for _ in range(n)],
            dtype=dt,
        )
    elif dt.kind == "V":
        flat = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    else:  # datetime64 / timedelta64
        flat = rng.integers(-(2**40), 2**40, n).astype(dt)
    return flat.reshape(rows, *shape)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype (byte order included), shape and bytes (NaN payloads and -0.0 too); object arrays by value."""
    if a.dtype != b.dtype or a.dtype.str != b.dtype.str or a.shape != b.shape:
        return False
    if a.dtype == object:
        return all(
            same(np.asarray(x), np.asarray(y)) if isinstance(x, np.ndarray) else x == y
            for x, y in zip(a.ravel().tolist(), b.ravel().tolist())
        )
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def check_blocks(records: list[bytes], specs, max_features=None):
    """Decodes ``records`` as blocks of one length (in record order within each) and one by one; both must equal
    the per-record decoder, feature by feature."""
    want = [decode_example_lenient(r, specs, max_features) for r in records]
    decoder = BlockDecoder(specs, max_features)
    by_length = collections.defaultdict(list)
    for i, r in enumerate(records):
        by_length[len(r)].append(i)
    for length, rows in by_length.items():
        block = np.frombuffer(b"".join(records[i] for i in rows), np.uint8).reshape(len(rows), length)
        got = decoder.decode(block[:, :])
        for spec in specs:
            expected = stack(spec, [want[i][spec.name] for i in rows])
            assert same(got[spec.name], expected), (spec, got[spec.name][:2], expected[:2])
    for i, r in enumerate(records):
        one = decoder.decode_one(r)
        for spec in specs:
            assert same(
                np.asarray(one[spec.name]) if not isinstance(one[spec.name], np.ndarray) else one[spec.name],
                want[i][spec.name],
            ), (spec, i)
    return decoder


DTYPES = [
    "|b1",
    "|u1",
    "|i1",
    "<u2",
    "<i2",
    "<u4",
    "<i4",
    "<u8",
    "<i8",
    "<f2",
    "<f4",
    "<f8",
    "<c8",
    "<c16",
    "|S3",
    "<U2",
    "|V4",
    "<M8[s]",
    "<m8[ms]",
]
ENCODINGS = ["tensor", "list", "zlib", "packbits"]
SHAPES = [(), (3,), (2, 0), (2, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_encoding_dtype_and_shape_equals_the_per_record_decoder(dtype, encoding, shape):
    spec = FeatureSpec("v", dtype, shape, encoding)
    try:
        check_spec(spec, allow_lossy=("v",))
    except SchemaError:
        pytest.skip("not an encoding of this dtype")
    arr = values(dtype, shape, ROWS, seed=len(dtype) + len(shape))
    if encoding == "packbits" and dtype == "|u1":
        arr = arr % 2
    id_spec = FeatureSpec("id", "<i8", (), "list")
    records = encode_batch({"v": arr, "id": np.arange(ROWS) * 37}, [spec, id_spec], ROWS, allow_lossy=("v",))
    decoder = check_blocks(records, [spec, id_spec])
    if encoding in ("tensor", "packbits") or (encoding == "list" and np.dtype(dtype).kind == "f"):
        assert any("v" in (layout.vector if layout else {}) for layout in decoder._layouts.values()) or 0 in shape, (
            "the fixed-layout feature was not gathered for the block"
        )


@pytest.mark.parametrize("dtype", ["|u1", "<f8", "<U3", "|S2"])
def test_big_endian_sources_decode_little_endian_and_equal(dtype):
    """The writer stores little-endian bytes whatever the source's byte order; both decoders give the same."""
    arr = values(dtype, (4,), ROWS, seed=3)
    big = arr.astype(arr.dtype.newbyteorder(">")) if arr.dtype.itemsize > 1 and dtype[1] != "S" else arr
    spec = FeatureSpec("v", dtype, (4,), "tensor")
    records = encode_batch({"v": big}, [spec], ROWS)
    check_blocks(records, [spec])
    got = BlockDecoder([spec]).decode(np.frombuffer(b"".join(records), np.uint8).reshape(ROWS, -1))["v"]
    assert got.dtype.str == np.dtype(dtype).str and same(got, arr)


def test_varying_shapes_dtypes_strings_and_varlen_decode_per_record_in_a_block():
    rng = np.random.default_rng(5)
    rows = 24
    specs = [
        FeatureSpec("ragged", "<f4", (None, 2), "tensor"),
        FeatureSpec("any", None, None, "tensor"),
        FeatureSpec("names", "bytes", (2,), "list"),
        FeatureSpec("vl", "<i8", (None,), "varlen"),
        FeatureSpec("fixed", "<f4", (3,), "list"),
    ]
    columns = {
        "ragged": [rng.standard_normal((i % 3, 2)).astype("<f4") for i in range(rows)],
        "any": [np.arange(i % 4, dtype=["<i2", ">f8", "|u1"][i % 3]) for i in range(rows)],
        "names": np.array([[b"a" * (i % 5), b"b"] for i in range(rows)], dtype=object),
        "vl": [np.arange(i % 3, dtype="<i8") for i in range(rows)],
        "fixed": rng.standard_normal((rows, 3)).astype("<f4"),
    }
    records = encode_batch(columns, specs, rows)
    check_blocks(records, specs)
    same_length = [r for r in records if len(r) == len(records[0])]
    assert len(same_length) >= 1


def feature(name: str, body: bytes) -> bytes:
    """A Features map entry ``name -> Feature(body)`` (body: a Feature message's bytes)."""
    return length_delimited_field(1, length_delimited_field(1, name.encode()) + length_delimited_field(2, body))


def int_list(*values, packed=True) -> bytes:
    if packed:
        inner = length_delimited_field(1, b"".join(encode_varint(v & 0xFFFFFFFFFFFFFFFF) for v in values))
    else:  # unpacked: one varint field per value (wire type 0), what some writers emit
        inner = b"".join(encode_varint(1 << 3) + encode_varint(v & 0xFFFFFFFFFFFFFFFF) for v in values)
    return length_delimited_field(3, inner)


def example(*entries: bytes) -> bytes:
    return length_delimited_field(1, b"".join(entries))


def test_foreign_layouts_fall_back_to_the_per_record_decoder():
    specs = [FeatureSpec("a", "<i8", (2,), "list"), FeatureSpec("b", "<f4", (None,), "varlen")]
    floats = length_delimited_field(2, length_delimited_field(1, np.array([1.5, -2], "<f4").tobytes()))
    records = []
    for i in range(12):
        a = feature("a", int_list(i, 300 + i, packed=i % 2 == 0))
        swapped = length_delimited_field(
            1, length_delimited_field(2, int_list(i, i)) + length_delimited_field(1, b"a")
        )  # value before key
        extra = feature("zz", int_list(7))  # a feature not read
        records.append(
            [
                example(a, feature("b", floats)),
                example(a) + example(feature("b", floats), extra),  # two Features: protobuf merges them
                example(swapped),  # no "b": varlen -> empty
                example(feature("a", int_list(1, 2)), feature("a", int_list(3, 4))),
            ][i % 4]
        )  # later wins
    records += [records[0]] * MIN_BLOCK  # a run of one layout after the others
    check_blocks(records, specs)


def test_rows_of_one_length_with_other_varint_widths_are_decoded_exactly():
    """1+3 and 2+2 varint bytes make records of one length: the layout of the first holds for neither other."""
    spec = FeatureSpec("a", "<i8", (2,), "list")
    records = [
        example(feature("a", int_list(1, 20000))),
        example(feature("a", int_list(200, 300))),
        example(feature("a", int_list(20000, 1))),
        example(feature("a", int_list(5, 70000))),
    ] * 3
    assert len({len(r) for r in records}) == 1
    check_blocks(records, [spec])


def test_values_out_of_range_raise_the_per_record_error_with_the_row():
    spec = FeatureSpec("a", "|b1", (), "list")  # a bool list holding 5: one varint byte, as 0 and 1
    records = [example(feature("a", int_list(i % 2))) for i in range(10)] + [example(feature("a", int_list(5)))]
    records += [example(feature("a", int_list(1)))] * 5
    block_records = [r for r in records if len(r) == len(records[-1])]
    block = np.frombuffer(b"".join(block_records), np.uint8).reshape(len(block_records), -1)
    with pytest.raises(RecordError, match="holds values out of range for \\|b1") as e:
        BlockDecoder([spec]).decode(block)
    assert e.value.context["record"] == block_records.index(records[10])
    with pytest.raises(RecordError, match="out of range"):
        BlockDecoder([spec]).decode_one(records[10])


def test_a_missing_feature_and_a_wrong_kind_raise_as_the_per_record_decoder():
    spec = FeatureSpec("a", "<i8", (), "list")
    ok = [example(feature("a", int_list(i))) for i in range(8)]
    for bad, message in (
        (example(feature("b", int_list(1))), "'a' is missing"),
        (
            example(feature("a", length_delimited_field(2, length_delimited_field(1, b"\0\0\0\0")))),
            "holds a float list",
        ),
    ):
        records = ok + [bad]
        with pytest.raises(RecordError, match=message):
            decode_example_lenient(bad, [spec])
        for length in {len(r) for r in records}:
            rows = [r for r in records if len(r) == length]
            block = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), length)
            if bad in rows:
                with pytest.raises(RecordError, match=message) as e:
                    BlockDecoder([spec]).decode(block)
                assert e.value.context["record"] == rows.index(bad)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=3, max_size=3), min_size=1, max_size=30),
    st.lists(st.floats(width=32, allow_nan=True), min_size=2, max_size=2),
    st.sampled_from(["<i8", "<u8", "<M8[us]"]),
)
def test_random_int_and_float_rows_equal_the_per_record_decoder(ints, floats, dtype):
    arr = np.array(ints, dtype=np.int64)
    if dtype == "<u8":
        arr = arr.view("<u8")
    elif dtype != "<i8":
        arr = arr.view(dtype)
    rows = len(ints)
    specs = [FeatureSpec("i", dtype, (3,), "list"), FeatureSpec("f", "<f4", (2,), "list")]
    records = encode_batch(
        {"i": arr, "f": np.tile(np.array(floats, "<f4"), (rows, 1))}, specs, rows, allow_lossy=("i",)
    )
    check_blocks(records * 2, specs)
