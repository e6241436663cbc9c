"""reader.RandomAccess's indices (ra[i], ra.batch, ra.__getitems__, reader.get): integers of every NumPy width,
negative from the end; slices and boolean masks of len(ra) values; everything else (floats, bools, strings, 2-D
arrays, integers out of range whatever their dtype) refused with a TypeError or IndexError naming the index, its
type and what to pass, never read as another record."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import convert
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.reading.indices import ACCEPTED

ROWS = 300  # more than an int8 or a uint8 holds


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ra_indices")
    np.savez(tmp / "in.npz", id=np.arange(ROWS, dtype=np.int64))
    assert convert(tmp / "in.npz", tmp / "out", "--num_shards", "2", "--index")[0] == 0
    return str(tmp / "out")


@pytest.fixture(scope="module")
def ra(out):
    return reader.RandomAccess(out)


def _ids(batch) -> list[int]:
    return batch["id"].tolist()


FLOATS = (
    "RandomAccess indices of dtype float64 (1.9 at position 1) are not integers: an index is never rounded or "
    f"truncated to a record; {ACCEPTED}"
)


@pytest.mark.parametrize(
    "fetch",
    [
        lambda ra: ra.batch([2, 1.9]),
        lambda ra: ra.__getitems__([2, 1.9]),
        lambda ra: ra[np.array([2, 1.9])],
        lambda ra: ra[[2.0, 1.9]],
    ],
    ids=["batch", "getitems", "array", "list"],
)
def test_float_indices_are_refused_not_truncated(ra, fetch):
    with pytest.raises(TypeError) as e:
        fetch(ra)
    assert str(e.value) == FLOATS
    with pytest.raises(TypeError) as e:
        ra[1.5]
    assert str(e.value) == f"RandomAccess index 1.5 (float) is not an integer: {ACCEPTED}"
    with pytest.raises(TypeError) as e:
        ra.batch(np.array([3.0]))  # a whole float too: an index is an integer
    assert str(e.value).startswith("RandomAccess indices of dtype float64 (3.0 at position 0) are not integers")


def test_a_boolean_mask_of_len_values_selects_its_records_and_other_lengths_are_refused(ra):
    mask = np.zeros(ROWS, bool)
    mask[[5, 0, 299]] = True
    assert _ids(ra[mask]) == _ids(ra.batch(mask)) == [0, 5, 299]
    assert [int(r["id"]) for r in ra.__getitems__(mask.tolist())] == [0, 5, 299]
    for short in (np.array([True, False, True]), [True, True]):
        with pytest.raises(IndexError) as e:
            ra[short]
        assert str(e.value) == (
            f"RandomAccess boolean mask of {len(short)} values for an output of 300 records: a mask takes one "
            "value per record (len(ra) = 300); for some records, pass their integer indices"
        )
    for flag in (True, np.bool_(False), np.array(True)):
        with pytest.raises(TypeError, match=r"^RandomAccess index .* is a bool, not a record number: pass an int"):
            ra[flag]
    assert _ids(ra.batch([])) == [] and _ids(ra.batch(np.array([], np.float64))) == []


def test_indices_of_two_dimensions_are_refused_not_flattened(ra):
    for two_d in (np.array([[1, 2], [3, 4]]), [[1, 2], [3, 4]]):
        with pytest.raises(TypeError) as e:
            ra[two_d]
        assert str(e.value) == (
            f"RandomAccess indices of shape (2, 2) ({type(two_d).__name__}): a batch takes a 1-D list of indices, "
            "its rows in that order; pass np.ravel(indices) for one batch of them all, or one row at a time"
        )
    with pytest.raises(TypeError, match=r"^RandomAccess indices \[\[1, 2\], \[3\]\] are not a flat list of ints"):
        ra.batch([[1, 2], [3]])


@pytest.mark.parametrize(
    "index, shown",
    [
        ("3", "'3' (str)"),
        (None, "None (NoneType)"),
        (b"3", "b'3' (bytes)"),
        (np.float32(2), "np.float32(2.0) (float32)"),
    ],
)
def test_an_index_that_is_not_an_integer_is_named_with_its_type(ra, index, shown):
    with pytest.raises(TypeError) as e:
        ra[index]
    assert str(e.value) == f"RandomAccess index {shown} is not an integer: {ACCEPTED}"
    with pytest.raises(TypeError) as e:
        ra.batch([0, None])
    assert str(e.value) == f"RandomAccess index None (NoneType) at position 1 is not an integer: {ACCEPTED}"


def test_slices_index_as_a_list_would(ra):
    ids = list(range(ROWS))
    for s in (slice(1, 4), slice(None, None, -1), slice(-3, None), slice(298, 500), slice(5, 2), slice(None, 10, 3)):
        assert _ids(ra[s]) == ids[s]
        assert _ids(ra.batch(s)) == ids[s]
    assert [int(r["id"]) for r in ra.__getitems__(slice(1, 4))] == [1, 2, 3]
    assert _ids(ra[range(3, 0, -1)]) == [3, 2, 1]


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_negative_numpy_integers_index_from_the_end_like_python_ints(out, ra, dtype):
    assert int(ra[dtype(-1)]["id"]) == 299 and int(ra[dtype(-3)]["id"]) == 297
    assert _ids(ra.batch(np.array([-1, 0, -100], dtype))) == [299, 0, 200]
    assert int(ra[np.array(-2, dtype)]["id"]) == 298  # a 0-d array: one record, as NumPy takes it
    assert int(reader.get(out, dtype(-1))["id"]) == 299


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_unsigned_numpy_integers_index_their_record(ra, dtype):
    assert int(ra[dtype(200)]["id"]) == 200
    assert _ids(ra[np.array([200, 0], dtype)]) == [200, 0]


def test_out_of_range_indices_name_the_index_its_type_and_the_range(ra):
    cases = [
        (lambda: ra[300], "RandomAccess index 300 (int)"),
        (lambda: ra[-301], "RandomAccess index -301 (int)"),
        (lambda: ra[np.uint64(2**63)], f"RandomAccess index {2**63} (uint64)"),
        (lambda: ra[np.array([0, 2**63], np.uint64)], f"RandomAccess index {2**63} (uint64) at position 1"),
        (lambda: ra[np.array([2**64 - 1], np.uint64)], f"RandomAccess index {2**64 - 1} (uint64) at position 0"),
        (lambda: ra.batch([0, 2**64]), f"RandomAccess index {2**64} (int) at position 1"),
        (lambda: ra.__getitems__([np.int8(-128), np.int16(-301)]), "RandomAccess index -301 (int16) at position 1"),
    ]
    for fetch, named in cases:
        with pytest.raises(IndexError) as e:
            fetch()
        value = named.split()[2]
        assert str(e.value) == (
            f"{named} is out of range: record {value} of an output of 300 records (pass -300 <= i < 300)"
        )
