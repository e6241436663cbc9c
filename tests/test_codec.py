"""The pure codec: exact round trips for every dtype and byte order, refusals, the wire-format reader."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from tfrecord_etl.transforms import codec
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import RecordError, SchemaError

NUMERIC = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]
TEXT = ["S5", "U3", "V4"]
TIME = ["M8[D]", "m8[s]"]


def sample(dtype: np.dtype, shape=(7, 2, 3)) -> np.ndarray:
    rng = np.random.default_rng(0)
    n = int(np.prod(shape))
    if dtype.kind == "b":
        return (rng.integers(0, 2, n) > 0).reshape(shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        vals = rng.integers(info.min, info.max, n, dtype=np.dtype(dtype).newbyteorder("="), endpoint=True)
        vals[:2] = [info.min, info.max]
        return vals.reshape(shape).astype(dtype)
    if dtype.kind == "f":
        vals = rng.standard_normal(n).astype(dtype.newbyteorder("="))
        vals[:3] = [np.nan, np.inf, -0.0]
        return vals.reshape(shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).reshape(shape).astype(dtype)
    if dtype.kind == "S":
        return np.array([b"ab", b"", b"x\x00y", b"hello"] * n, dtype=dtype)[:n].reshape(shape)
    if dtype.kind == "U":
        return np.array(["é", "", "日本語", "ab"] * n, dtype=dtype)[:n].reshape(shape)
    if dtype.kind == "V":
        return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)
    if dtype.kind in "Mm":
        return rng.integers(-(10**6), 10**6, n).astype(dtype.newbyteorder("=")).reshape(shape).astype(dtype)
    raise AssertionError(dtype)


def round_trip(array: np.ndarray, encoding: str, allow_lossy=()):
    spec = FeatureSpec("f", codec.normalize_dtype(array.dtype), array.shape[1:], encoding)
    records = codec.encode_batch({"f": array}, [spec], len(array), allow_lossy)
    assert len(records) == len(array)
    return spec, [codec.decode_example(r, [spec])["f"] for r in records]


def assert_exact(src: np.ndarray, rows) -> None:
    le = src.dtype.newbyteorder("<") if src.dtype.itemsize > 1 or src.dtype.kind in "Mm" else src.dtype
    for i, row in enumerate(rows):
        assert row.dtype == le, (row.dtype, le)
        assert row.shape == src.shape[1:]
        assert row.tobytes() == np.ascontiguousarray(src[i]).astype(le).tobytes()


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("dt", NUMERIC + TEXT + TIME)
def test_tensor_round_trip_is_exact_for_every_dtype_and_byte_order(dt, order):
    dtype = np.dtype(dt).newbyteorder(order) if np.dtype(dt).itemsize > 1 else np.dtype(dt)
    src = sample(dtype)
    _, rows = round_trip(src, "tensor")
    assert_exact(src, rows)


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("dt", ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "f2", "f4", "S5", "U3", "V4", "M8[D]"])
def test_list_round_trip_is_exact_where_lossless(dt, order):
    dtype = np.dtype(dt).newbyteorder(order) if np.dtype(dt).itemsize > 1 else np.dtype(dt)
    src = sample(dtype)
    _spec, rows = round_trip(src, "list")
    assert_exact(src, rows)


@pytest.mark.parametrize("dt,words", [("f8", "float64 -> float32"), ("u8", "uint64 -> int64")])
def test_lossy_list_cast_is_refused_unless_allowed_by_name(dt, words):
    src = sample(np.dtype(dt))
    with pytest.raises(SchemaError, match=words) as err:
        round_trip(src, "list")
    assert "allow_lossy: [f]" in str(err.value)
    _, rows = round_trip(src, "list", allow_lossy=["f"])  # allowed: the documented cast happens
    if dt == "f8":
        np.testing.assert_array_equal(rows[3], src[3].astype(np.float32).astype(np.float64))
    else:
        np.testing.assert_array_equal(rows[3], src[3].astype(np.int64).astype(np.uint64))


def test_complex_list_and_unsupported_dtypes_are_refused():
    with pytest.raises(SchemaError, match="complex numbers have no list form"):
        round_trip(sample(np.dtype("c8")), "list")
    with pytest.raises(SchemaError, match="object"):
        codec.normalize_dtype(np.dtype(object), "x")
    if hasattr(np, "float128") and np.dtype(np.longdouble).itemsize == 16:
        with pytest.raises(SchemaError, match="float128"):
            codec.normalize_dtype(np.dtype(np.longdouble), "x")


def test_variable_shape_and_dtype_round_trip():
    arrays = [np.arange(6, dtype=">i4").reshape(2, 3), np.float64(2.5) * np.ones(()), np.array([b"a", b"bc"])]
    spec = FeatureSpec("array", None, None, "tensor")
    records = codec.encode_batch({"array": arrays}, [spec], 3)
    back = [codec.decode_example(r, [spec])["array"] for r in records]
    for a, b in zip(arrays, back):
        assert b.shape == a.shape and b.dtype == a.dtype.newbyteorder("<") if a.dtype.itemsize > 1 else True
        assert b.tobytes() == a.astype(b.dtype).tobytes()


def test_vlen_bytes_list_round_trip():
    spec = FeatureSpec("s", codec.VLEN_BYTES, (2,), "list")
    col = np.array([[b"", b"abc\x00"], [b"x" * 1000, b"y"]], dtype=object)
    records = codec.encode_batch({"s": col}, [spec], 2)
    back = [codec.decode_example(r, [spec])["s"] for r in records]
    assert back[0].tolist() == [b"", b"abc\x00"] and back[1].tolist() == [b"x" * 1000, b"y"]


def test_column_shape_mismatch_is_refused():
    spec = FeatureSpec("f", "<f4", (3,), "tensor")
    with pytest.raises(SchemaError, match=r"expected \(2, 3\)"):
        codec.encode_batch({"f": np.zeros((2, 4), "<f4")}, [spec], 2)


def test_drop_features_keeps_other_entries_byte_identical_and_concatenation_merges():
    a = FeatureSpec("a", "<i8", (), "list")
    b = FeatureSpec("b", "|S3", (), "tensor")
    rec = codec.encode_batch({"a": np.array([5]), "b": np.array([b"xyz"])}, [a, b], 1)[0]
    dropped = codec.drop_features(rec, ["a"])
    assert set(codec.split_features(dropped)) == {"b"}
    assert codec.decode_example(dropped, [b])["b"].tobytes() == b"xyz"
    extra = codec.encode_batch({"a": np.array([7])}, [a], 1)[0]
    merged = dropped + extra
    assert codec.decode_example(merged, [a, b])["a"] == 7


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.dtype(d) for d in ["<i2", ">i8", "<u4", ">f4", "<f8", "|b1", ">c16"]]),
        hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
    )
)
def test_property_tensor_round_trip(array):
    _, rows = round_trip(array, "tensor")
    assert_exact(array, rows)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_raises_only_record_error_on_random_bytes(data):
    spec = FeatureSpec("f", "<i8", (2,), "list")
    try:
        codec.parse_example(data)
        codec.decode_example(data, [spec])
    except RecordError:
        pass


def test_varint_decoding_handles_negative_and_large_values():
    spec = FeatureSpec("f", "<i8", (4,), "list")
    src = np.array([[-1, 2**63 - 1, -(2**63), 0]], dtype="<i8")
    rec = codec.encode_batch({"f": src}, [spec], 1)[0]
    np.testing.assert_array_equal(codec.decode_example(rec, [spec])["f"], src[0])


def _first_bad(records, max_features):
    for i, r in enumerate(records):
        try:
            codec.check_example_frame(r, max_features)
        except RecordError:
            return i
    return None


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 12),
    mutations=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 400), st.integers(0, 255)), max_size=4),
    cut=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.integers(0, 400))),
    max_features=st.sampled_from([None, 2, 3]),
)
def test_batch_framing_check_agrees_with_the_per_record_check(rows, mutations, cut, max_features):
    """check_example_frames (one walk + one NumPy comparison, used by augment) refuses exactly the batches the
    per-record check refuses, naming the same first bad record."""
    specs = [
        FeatureSpec("x", "<f4", (3,), "list"),
        FeatureSpec("id", "<i8", (), "list"),
        FeatureSpec("name", "bytes", (), "list"),
    ]
    columns = {
        "x": np.arange(rows * 3, dtype="<f4").reshape(rows, 3),
        "id": np.arange(rows, dtype="<i8"),
        "name": np.array([b"n%d" % (i % 2) for i in range(rows)], dtype=object),
    }
    records = [bytearray(r) for r in codec.encode_columns(columns, specs, rows).records()]
    for i, pos, value in mutations:
        if i < rows and pos < len(records[i]):
            records[i][pos] = value
    if cut is not None and cut[0] < rows:
        records[cut[0]] = records[cut[0]][: cut[1]]
    records = [bytes(r) for r in records]
    expected = _first_bad(records, max_features)
    if expected is None:
        codec.check_example_frames(records, max_features)
    else:
        with pytest.raises(RecordError) as err:
            codec.check_example_frames(records, max_features)
        assert err.value.context["record"] == expected
