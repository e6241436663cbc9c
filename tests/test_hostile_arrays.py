"""Hostile .npy/.npz inputs (hostile groups 12-15): lying headers, zip bombs, duplicate
members, and the streaming npz reader (each byte of a member decompressed once when ranges come in order).

Inputs are generated here and small: a "huge" size is a header that lies, never real bytes.
"""

from __future__ import annotations

import io
import pickle
import tracemalloc
import zipfile

import numpy as np
import pytest

from tests.conftest import convert, run_command
from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.planning import plan_inputs
from tfrecord_etl.transforms.sources import NpzSource, RowRange, SourceOptions
from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions


def npy_header(shape, dtype="<f8", fortran=False) -> bytes:
    """The bytes of a .npy header (magic, version 1.0, dict padded to 64 bytes) declaring ``shape``."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.dtype(dtype).str, "fortran_order": fortran, "shape": tuple(shape)}
    )
    return buf.getvalue()


def npy_bytes(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def peak_bytes(fn):
    """(result or raised exception, peak traced bytes) of ``fn()``: numpy and Python allocations."""
    tracemalloc.start()
    try:
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - the caller asserts the type
            result = e
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def bomb_npz(path, nbytes, name="a.npy"):
    """An npz whose one member is ``nbytes`` of float64 zeros, deflated (ratio about 1000)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open(name, "w", force_zip64=True) as m:
            m.write(npy_header((nbytes // 8,)))
            chunk = bytes(2**20)
            for _ in range(nbytes // len(chunk)):
                m.write(chunk)


MB = 2**20

try:  # the moto S3 server fixture, when the test extra is installed
    from tests.test_s3 import BUCKET, s3
except pytest.skip.Exception:

    @pytest.fixture
    def s3():
        pytest.skip("the moto S3 server is in the test extra: pip install -e .[test]")


# ---------------------------------------------------------------- 13: declared sizes vs bytes present


@pytest.mark.timeout(60)
def test_npy_header_declaring_10e12_rows_is_refused_before_planning(tmp_path):
    """Hostile group 13: a 128-byte .npy declaring 10**12 rows fails at planning, naming declared vs present."""
    path = tmp_path / "huge.npy"
    path.write_bytes(npy_header((10**12,)))
    assert path.stat().st_size == 128
    with pytest.raises(SourceError):  # once untraced: the modules planning imports (Beam's, 70 MB) are not the input's
        plan_inputs(str(path), SourceOptions())
    err, peak = peak_bytes(lambda: plan_inputs(str(path), SourceOptions()))
    assert isinstance(err, SourceError), err
    assert "huge.npy" in str(err) and f"{128 + 8 * 10**12} bytes" in str(err) and "holds 128 bytes" in str(err)
    assert peak < 20 * MB, peak


def test_npy_header_declaring_more_rows_than_present_is_one_line(tmp_path, capsys):
    """Hostile group 13: convert of a .npy whose data is shorter than its header says: exit 2, one line."""
    path = tmp_path / "short.npy"
    path.write_bytes(npy_bytes(np.arange(1000.0))[:-800])
    code, out, err = convert(path, tmp_path / "out", capsys=capsys)
    assert code == 2, (out, err)
    assert err.startswith("error: SourceError: Truncated array data: the .npy header declares shape (1000,)")
    assert "8128 bytes with the header" in err and "holds 7328 bytes" in err and "short.npy" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_lying_headers_on_s3_are_refused_from_the_object_size(s3, tmp_path):
    """Hostile group 13: on s3:// the declared sizes are checked against the object's size too (.npy and an
    npz member), before planning."""
    from tfrecord_etl.pipelines import common

    client, flags = s3
    common.configure_filesystems(flags)
    client.put_object(Bucket=BUCKET, Key="lie/huge.npy", Body=npy_header((10**12,)))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("big.npy", npy_header((10**12,)) + bytes(80))
    client.put_object(Bucket=BUCKET, Key="lie/lie.npz", Body=buf.getvalue())
    with pytest.raises(SourceError, match=r"declares shape \(1000000000000,\).*holds 128 bytes.*s3://.*huge\.npy"):
        plan_inputs(f"s3://{BUCKET}/lie/huge.npy", SourceOptions())
    with pytest.raises(SourceError, match=r"holds 208 bytes.*s3://.*lie\.npz.*member='big'"):
        plan_inputs(f"s3://{BUCKET}/lie/lie.npz", SourceOptions())


@pytest.mark.timeout(60)
def test_npz_member_header_larger_than_member_is_refused(tmp_path):
    """Hostile group 13: an npz member whose .npy header declares 10**12 rows but holds 10 is refused."""
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ok.npy", npy_bytes(np.arange(10.0)))
        z.writestr("big.npy", npy_header((10**12,)) + bytes(80))
    err, peak = peak_bytes(lambda: plan_inputs(str(path), SourceOptions()))
    assert isinstance(err, SourceError), err
    assert "member='big'" in str(err) and "lie.npz" in str(err)
    assert f"{128 + 8 * 10**12} bytes" in str(err) and "holds 208 bytes" in str(err)
    assert peak < 20 * MB, peak


@pytest.mark.timeout(60)
def test_npy_zero_width_rows_10e15_do_not_explode_planning(tmp_path):
    """Hostile group 13: shape (10**15, 0) (no data bytes at all) is refused fast, naming --max_empty_rows."""
    path = tmp_path / "empty.npy"
    path.write_bytes(npy_header((10**15, 0)))
    err, peak = peak_bytes(lambda: plan_inputs(str(path), SourceOptions()))
    assert isinstance(err, SourceError), err
    assert "1000000000000000 rows" in str(err) and "--max_empty_rows" in str(err) and "empty.npy" in str(err)
    assert peak < 20 * MB, peak
    # below the limit such a file is legal: one small range, the rows are empty arrays
    path.write_bytes(npy_header((1000, 0)))
    plan = plan_inputs(str(path), SourceOptions())
    assert plan.num_rows == 1000 and len(plan.ranges) == 1
    assert plan.source.read(plan.ranges[0])["array"].shape == (1000, 0)


@pytest.mark.timeout(60)
def test_npz_zero_width_rows_10e15_do_not_explode_planning(tmp_path):
    """Hostile group 13: an npz member of shape (10**15, 0) is refused fast; the flag raises the limit."""
    path = tmp_path / "empty.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("e.npy", npy_header((10**15, 0)))
    err, peak = peak_bytes(lambda: plan_inputs(str(path), SourceOptions()))
    assert isinstance(err, SourceError) and "--max_empty_rows" in str(err) and "empty.npz" in str(err), err
    assert peak < 20 * MB, peak
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("e.npy", npy_header((2000, 0)))
    with pytest.raises(SourceError, match=r"2000 rows.*limit of 1000 empty rows"):
        plan_inputs(str(path), SourceOptions(max_empty_rows=1000))
    assert plan_inputs(str(path), SourceOptions(max_empty_rows=2000)).num_rows == 2000


def test_stored_member_with_lying_directory_sizes_is_refused(tmp_path):
    """Hostile group 13: a stored member whose zip directory sizes disagree is refused (not read past its end)."""
    path = tmp_path / "stored.npz"
    np.savez(path, a=np.arange(10.0))
    data = bytearray(path.read_bytes())
    central = data.rindex(b"PK\x01\x02")
    data[central + 24 : central + 28] = (10**6).to_bytes(4, "little")  # uncompressed size in the directory
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"Stored \(uncompressed\) member declares 1000000 bytes.*member='a'"):
        plan_inputs(str(path), SourceOptions())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix,mode", [(".npy", "rows"), (".npy", "files"), (".npz", "rows")])
def test_fifo_input_is_refused_without_opening(tmp_path, suffix, mode):
    """Hostile group 13: a FIFO named like an input is refused at planning (opening it would block forever)."""
    import os

    path = tmp_path / f"pipe{suffix}"
    os.mkfifo(path)
    options = (
        SourceOptions(formats=(NumpyOptions(npy_mode=mode),))
        if suffix == ".npy"
        else SourceOptions(formats=(NumpyOptions(npz_mode=mode),))
    )
    with pytest.raises(SourceError, match=r"Not a regular file \(a FIFO\): refused, never opened.*pipe"):
        plan_inputs(str(path), options)


@pytest.mark.parametrize(
    "patch,words",
    [
        ("method", "That compression method is not supported"),
        ("encrypted", "is encrypted, password required"),
    ],
)
def test_unreadable_member_kind_is_one_error(tmp_path, patch, words):
    """Hostile group 16: an npz member with an unknown compression method (Deflate64 id 9) or the encrypted flag
    is a SourceError naming file and member, not a NotImplementedError/RuntimeError traceback."""
    path = tmp_path / "w.npz"
    np.savez_compressed(path, a=np.arange(10.0))
    d = bytearray(path.read_bytes())
    local, central = d.index(b"PK\x03\x04"), d.rindex(b"PK\x01\x02")
    if patch == "method":
        d[local + 8 : local + 10] = d[central + 10 : central + 12] = (9).to_bytes(2, "little")
    else:
        d[local + 6] |= 1
        d[central + 8] |= 1
    path.write_bytes(bytes(d))
    with pytest.raises(SourceError, match=f"Cannot read member: .*{words}.*w\\.npz.*member='a'"):
        plan_inputs(str(path), SourceOptions())


# ---------------------------------------------------------------- 14: zip bombs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["rows", "arrays"])
def test_zip_bomb_member_is_refused_by_ratio(tmp_path, mode):
    """Hostile group 14: a deflated member of zeros (ratio ~1000) is refused before inflating, naming member,
    ratio and --max_compression_ratio, in both npz modes, with bounded memory."""
    path = tmp_path / "bomb.npz"
    bomb_npz(path, 64 * MB)
    assert path.stat().st_size < MB // 4
    err, peak = peak_bytes(lambda: plan_inputs(str(path), SourceOptions(formats=(NumpyOptions(npz_mode=mode),))))
    assert isinstance(err, SourceError), err
    text = str(err)
    assert "bomb.npz" in text and "member='a'" in text and "--max_compression_ratio 500" in text
    assert "Member expands" in text and "to 67108992)" in text
    assert peak < 8 * MB, peak


def test_zip_bomb_is_one_line_from_the_command(tmp_path, capsys):
    """Hostile group 14: convert of a zip-bomb npz exits 2 with one line naming the flag; nothing written."""
    path = tmp_path / "bomb.npz"
    bomb_npz(path, 8 * MB)
    code, out, err = convert(path, tmp_path / "out", capsys=capsys)
    assert code == 2 and err.startswith("error: SourceError: Member expands"), (out, err)
    assert "--max_compression_ratio" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_raised_ratio_streams_a_highly_compressed_member_in_bounded_memory(tmp_path):
    """Hostile group 14: with --max_compression_ratio raised, a 32 MiB member of zeros is read range by range
    with memory of about one range (1 MiB), never the whole member."""
    path = tmp_path / "zeros.npz"
    bomb_npz(path, 32 * MB)
    with pytest.raises(SourceError, match="Member expands"):
        plan_inputs(str(path), SourceOptions())
    plan = plan_inputs(
        str(path), SourceOptions(target_range_bytes=MB, formats=(NumpyOptions(max_compression_ratio=5000),))
    )
    assert len(plan.ranges) == 32

    def read_all():
        rows = 0
        for rr in plan.ranges:
            col = plan.source.read(rr)["a"]
            assert not col.any()
            rows += len(col)
        return rows

    rows, peak = peak_bytes(read_all)
    assert rows == 4 * MB
    assert peak < 8 * MB, peak
    plan.source.close()


def test_many_small_bomb_members_are_refused_by_the_archive_ratio(tmp_path):
    """Hostile group 14: 64 members of 1 MiB zeros each (under the per-member floor) are refused as a whole."""
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(64):
            z.writestr(f"m{i}.npy", npy_header((MB // 8 - 16,)) + bytes(MB - 128))
    assert all(i.file_size <= MB for i in zipfile.ZipFile(path).infolist())
    with pytest.raises(
        SourceError,
        match=r"The archive expands \d+x in total .* --max_compression_ratio 500.*"
        r"many\.npz",
    ):
        plan_inputs(str(path), SourceOptions(formats=(NumpyOptions(npz_mode="arrays"),)))
    assert (
        plan_inputs(
            str(path), SourceOptions(formats=(NumpyOptions(npz_mode="arrays", max_compression_ratio=2000),))
        ).num_rows
        == 64
    )


def test_ratio_flag_reaches_convert(tmp_path, capsys):
    """Hostile group 14: --max_compression_ratio is a convert flag; raised, the same file converts exactly."""
    path = tmp_path / "zeros.npz"
    bomb_npz(path, 2 * MB)
    out = tmp_path / "out"
    code, stdout, err = convert(path, out, "--max_compression_ratio", "5000", capsys=capsys)
    assert code == 0, err
    import json

    meta = json.loads((out / "metadata.json").read_text())
    assert meta["num_records"] == 2 * MB // 8
    # verify --source re-reads the source with the convert's own limit (from metadata.json options)
    from tfrecord_etl.pipelines import verify as verify_module

    code, stdout, err = run_command(verify_module.main, [out, "--source", path], capsys)
    assert code == 0 and f"{2 * MB // 8} of {2 * MB // 8} rows compared" in stdout, (stdout, err)


# ---------------------------------------------------------------- 12: duplicate npz member names


@pytest.mark.parametrize("mode", ["rows", "arrays"])
def test_duplicate_npz_member_names_are_refused(tmp_path, mode):
    """Hostile group 12: two members named 'a.npy' (zipfile allows it) are refused, naming file and member,
    instead of losing the first member's data and showing the second twice."""
    path = tmp_path / "dup.npz"
    with pytest.warns(UserWarning, match="Duplicate name"):
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("a.npy", npy_bytes(np.arange(4.0)))
            z.writestr("a.npy", npy_bytes(np.arange(4.0) + 10))
    with pytest.raises(SourceError, match=r"two members named 'a\.npy'.*file='.*dup\.npz'.*member='a'"):
        plan_inputs(str(path), SourceOptions(formats=(NumpyOptions(npz_mode=mode),)))


# ---------------------------------------------------------------- 15: streaming decompression


def _npz(path, compressed, arrays):
    (np.savez_compressed if compressed else np.savez)(path, **arrays)


def _count_decompressed(monkeypatch):
    """Counts the bytes every zip decompressor of zipfile produces (from now on)."""
    produced = [0]
    real = zipfile._get_decompressor

    class Counting:
        def __init__(self, inner):
            self._inner = inner

        def decompress(self, *args, **kwargs):
            out = self._inner.decompress(*args, **kwargs)
            produced[0] += len(out)
            return out

        def __getattr__(self, name):
            return getattr(self._inner, name)

    def wrapped(compress_type):
        d = real(compress_type)
        return None if d is None else Counting(d)

    monkeypatch.setattr(zipfile, "_get_decompressor", wrapped)
    return produced


@pytest.mark.parametrize("compressed", [True, False], ids=["deflated", "stored"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "random-order"])
def test_streaming_reader_is_exact(tmp_path, compressed, order, shuffle):
    """Hostile group 15: the streaming npz reader returns exactly np.load's rows for ranges read in order or
    in random order (rewinds), deflated and stored members, C and Fortran order, and survives pickling."""
    rng = np.random.default_rng(7)
    arrays = {
        "x": np.asarray(rng.standard_normal((997, 3, 5)).astype("<f4"), order=order),
        "y": np.asarray(rng.integers(0, 2**40, (997, 2)), order=order),
        "z": np.arange(997, dtype="<u2"),
    }
    path = tmp_path / "s.npz"
    _npz(path, compressed, arrays)
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=1000))
    ranges = list(plan.ranges)
    assert len(ranges) > 50
    if shuffle:
        rng.shuffle(ranges)
    source = plan.source
    got = {k: np.empty_like(v, order="C") for k, v in arrays.items()}
    for i, rr in enumerate(ranges):
        if i == len(ranges) // 2:
            source = pickle.loads(pickle.dumps(source))  # as Beam ships it to a worker, mid-way
        cols = source.read(rr)
        for k in arrays:
            assert cols[k].dtype == arrays[k].dtype
            got[k][rr.start : rr.stop] = cols[k]
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k], v)
    source.close()


@pytest.mark.parametrize("order", ["C", "F"])
def test_ranges_in_order_decompress_each_byte_once(tmp_path, monkeypatch, order):
    """Hostile group 15: reading a compressed member's 100+ ranges in order decompresses it about once
    (it was once per range: quadratic). Fortran order keeps a decompressor per column, each forked from the
    previous column's as it passes its column's start, so at most twice (the fork chain's pass, then each
    column's own), whatever the number of columns (here 40) or ranges."""
    x = np.asarray(np.random.default_rng(1).standard_normal((2000, 40)), order=order)
    path = tmp_path / "c.npz"
    np.savez_compressed(path, x=x)
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=5000))
    assert len(plan.ranges) >= 100
    produced = _count_decompressed(monkeypatch)
    inflated = [0]  # bytes our forked column inflaters produce (Fortran order)
    from tfrecord_etl.transforms.sources import zipmember

    real_produce = zipmember.Inflater._produce

    def counting_produce(self, n):
        out = real_produce(self, n)
        inflated[0] += len(out)
        return out

    monkeypatch.setattr(zipmember.Inflater, "_produce", counting_produce)
    out = np.concatenate([plan.source.read(rr)["x"] for rr in plan.ranges])
    np.testing.assert_array_equal(out, x)
    passes = 1 if order == "C" else 2
    total = produced[0] + inflated[0]
    assert x.nbytes <= total < passes * x.nbytes * 1.05 + 64 * 1024, (produced[0], inflated, x.nbytes)
    plan.source.close()


def test_arrays_mode_reads_members_exactly(tmp_path):
    """Hostile group 15: arrays mode through the kept-open archive: every member whole and exact (0-d too)."""
    members = {
        "a": np.arange(12.0).reshape(3, 4),
        "b": np.array(5, dtype="<i4"),
        "c": np.asfortranarray(np.arange(6, dtype="<i8").reshape(2, 3)),
    }
    path = tmp_path / "m.npz"
    np.savez_compressed(path, **members)
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=1, formats=(NumpyOptions(npz_mode="arrays"),)))
    keys, arrays = [], []
    for rr in reversed(plan.ranges):
        cols = plan.source.read(rr)
        keys += cols["key"]
        arrays += cols["array"]
    assert sorted(keys) == [b"a", b"b", b"c"]
    for k, arr in zip(keys, arrays):
        np.testing.assert_array_equal(arr, members[k.decode()])
        assert arr.shape == members[k.decode()].shape


def test_convert_then_verify_source_on_compressed_npz(tmp_path, capsys):
    """Hostile group 15: convert (planned writer, small ranges) and verify --source agree exactly on a
    compressed npz read through the streaming reader."""
    from tfrecord_etl.pipelines import verify as verify_module

    rng = np.random.default_rng(3)
    path = tmp_path / "v.npz"
    np.savez_compressed(
        path, x=rng.standard_normal((3000, 8)).astype("<f4"), f=np.asfortranarray(rng.integers(0, 9, (3000, 3)))
    )
    out = tmp_path / "out"
    code, _, err = convert(path, out, "--target_range_mb", "0.01", "--num_shards", "3", capsys=capsys)
    assert code == 0, err
    code, stdout, err = run_command(verify_module.main, [out, "--source", path], capsys)
    assert code == 0, (stdout, err)
    assert "OK" in stdout and "3000 of 3000 rows compared" in stdout


def test_failed_read_closes_and_reopens_the_archive(tmp_path):
    """Hostile group 15: a read error names file and rows, and the next read reopens the archive cleanly."""
    path = tmp_path / "r.npz"
    np.savez_compressed(path, x=np.arange(1000.0))
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=800))
    source: NpzSource = plan.source
    with pytest.raises(SourceError, match=r"Truncated array data.*r\.npz, member 'x'.*rows='2000-2099'"):
        source.read(RowRange(str(path), 2000, 2100, ("x.npy",)))
    np.testing.assert_array_equal(source.read(plan.ranges[1])["x"], np.arange(100.0, 200.0))
    source.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["npy", "npz"])
def test_device_input_is_refused_without_reading(fmt):
    """Hostile group 13: a device (/dev/zero, endless) given as an npy/npz input is refused, never read."""
    with pytest.raises(SourceError, match=r"Not a regular file \(a device\): refused, never opened.*/dev/zero"):
        plan_inputs("/dev/zero", SourceOptions(format=fmt))


def test_fortran_member_with_many_columns_is_exact(tmp_path):
    """Hostile group 15: a deflated Fortran-order member with more columns than MAX_COLUMN_STREAMS (257 here)
    falls back to one stream per member and is still exact, in order and reversed."""
    from tfrecord_etl.transforms.sources import MAX_COLUMN_STREAMS

    x = np.asfortranarray(np.arange(120 * (MAX_COLUMN_STREAMS + 1), dtype="<i4").reshape(120, -1))
    path = tmp_path / "wide.npz"
    np.savez_compressed(path, x=x)
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=20 * x.shape[1] * 4))
    assert len(plan.ranges) == 6
    for ranges in (plan.ranges, plan.ranges[::-1]):
        got = np.empty_like(x, order="C")
        for rr in ranges:
            got[rr.start : rr.stop] = plan.source.read(rr)["x"]
        np.testing.assert_array_equal(got, x)
    plan.source.close()


@pytest.mark.parametrize("order", ["C", "F"])
def test_corrupt_deflated_member_is_a_source_error(tmp_path, order):
    """Hostile group 15: bytes clobbered inside a deflated member (sizes unchanged) are detected by the
    streaming reader (invalid deflate data or the zip CRC-32, checked by the stream reaching the member's
    end), in C order (zipfile's stream) and Fortran order (the forked column inflaters): never silent."""
    x = np.asarray(np.random.default_rng(5).standard_normal((400, 3)), order=order)
    path = tmp_path / "cut.npz"
    np.savez_compressed(path, x=x)
    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=1200))
    data = bytearray(path.read_bytes())
    start = data.index(b"PK\x03\x04") + 30 + len("x.npy") + 200
    data[start : start + 4000] = bytes(4000)  # clobber the deflate stream, sizes unchanged
    path.write_bytes(bytes(data))
    plan.source.close()
    with pytest.raises(SourceError, match=r"Cannot read rows \d+-\d+ of '.*cut\.npz'.*(CRC|invalid|Error)"):
        for rr in plan.ranges:
            plan.source.read(rr)
