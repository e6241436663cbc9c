"""--format envi: ENVI image cubes (raw bytes described by a .hdr header), generated here and by Spectral Python
(SPy, an independent ENVI writer): exact round trips through our reader and plain TensorFlow, the three interleaves,
both row kinds (--envi_rows), and the refusals by type and message."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import convert, fixture_file
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import ConfigError, SourceError
from tfrecord_etl.transforms.sources import RowRange, SourceOptions, make_source
from tfrecord_etl.transforms.sources.envi import parse_header
from tfrecord_etl.transforms.sources.envi_options import EnviOptions

CODES = {"u1": 1, "i2": 2, "i4": 3, "f4": 4, "f8": 5, "c8": 6, "c16": 9, "u2": 12, "u4": 13, "i8": 14, "u8": 15}
STORE = {"bsq": (2, 0, 1), "bil": (0, 2, 1), "bip": (0, 1, 2)}  # (lines, samples, bands) -> the file's axis order


def write_envi(path, cube, interleave="bsq", big_endian=False, offset=0, extra="", header=None):
    """``cube`` (lines, samples, bands) as an ENVI file at ``path`` and its header ``<stem>.hdr``."""
    lines, samples, bands = cube.shape
    stored = np.ascontiguousarray(cube.transpose(STORE[interleave]))
    stored = stored.astype(stored.dtype.newbyteorder(">" if big_endian else "<"))
    path.write_bytes(b"\0" * offset + stored.tobytes())
    text = header or (
        f"ENVI\ndescription = {{generated\n  for a test}}\nsamples = {samples}\nlines = {lines}\nbands = {bands}\n"
        f"header offset = {offset}\nfile type = ENVI Standard\ndata type = {CODES[cube.dtype.str[1:]]}\n"
        f"interleave = {interleave}\nbyte order = {int(big_endian)}\n{extra}"
    )
    path.with_suffix(".hdr").write_text(text)
    return path


def cube_of(dtype, shape=(5, 4, 3)):
    values = np.arange(np.prod(shape)).reshape(shape) * 7 - 20
    if np.dtype(dtype).kind == "u":
        values = np.abs(values)
    if np.dtype(dtype).kind == "c":
        return (values + 1j * values[::-1]).astype(dtype)
    return values.astype(dtype)


def tf_rows(out, dtype, shape):
    """Every record's ``array`` read with plain TensorFlow (decode_raw of the little-endian tensor bytes)."""
    import tensorflow as tf

    files = sorted(str(p) for p in out.iterdir() if p.name.endswith(".tfrecord"))
    spec = {"array": tf.io.FixedLenFeature([], tf.string)}
    tf_dtype = getattr(tf, np.dtype(dtype).name)
    return np.stack(
        [
            tf.io.decode_raw(tf.io.parse_single_example(r, spec)["array"], tf_dtype, little_endian=True)
            .numpy()
            .reshape(shape)
            for r in tf.data.TFRecordDataset(files)
        ]
    )


@pytest.mark.parametrize(
    "interleave, dtype, big_endian",
    [("bsq", "f4", False), ("bil", "i2", True), ("bip", "u2", False), ("bsq", "c8", True), ("bip", "f8", True)],
)
def test_storage_rows_round_trip_exactly(tmp_path, capsys, interleave, dtype, big_endian):
    cube = cube_of(dtype)
    src = write_envi(tmp_path / "cube.img", cube, interleave, big_endian, offset=16 if big_endian else 0)
    out = tmp_path / "out"
    code, _, err = convert(str(src), out, "--num_shards", "2", "--encoding", "tensor", capsys=capsys)
    assert code == 0, err
    want = cube.transpose(STORE[interleave])  # one Example per band (bsq) or per line (bil, bip)
    got = np.stack([e["array"] for e in reader.iter_numpy(str(out))])
    assert got.dtype == np.dtype(dtype).newbyteorder("=") and np.array_equal(got, want)
    assert np.array_equal(tf_rows(out, dtype, want.shape[1:]), want)


@pytest.mark.parametrize("interleave", ["bsq", "bip"])
def test_pixel_rows_are_each_pixels_spectrum(tmp_path, capsys, interleave):
    cube = cube_of("i4", (6, 5, 4))
    src = write_envi(tmp_path / "scene.bsq", cube, interleave, big_endian=True)
    out = tmp_path / "out"
    code, _, err = convert(str(src), out, "--format", "envi", "--envi_rows", "pixels", capsys=capsys)
    assert code == 0, err
    got = np.stack([e["array"] for e in reader.iter_numpy(str(out))])
    assert np.array_equal(got, cube.reshape(30, 4))  # pixel (line, sample) in row-major order, its 4 bands
    import tensorflow as tf  # small integer vectors are stored as int64 lists (the auto encoding)

    spec = {"array": tf.io.FixedLenFeature([4], tf.int64)}
    files = sorted(str(p) for p in out.iterdir() if p.name.endswith(".tfrecord"))
    plain = np.stack([tf.io.parse_single_example(r, spec)["array"].numpy() for r in tf.data.TFRecordDataset(files)])
    assert np.array_equal(plain, cube.reshape(30, 4))


def test_a_cube_spectral_python_wrote_reads_as_spectral_python_reads_it(tmp_path, capsys):
    envi = pytest.importorskip("spectral.io.envi")
    cube = cube_of("f4", (7, 6, 5))
    envi.save_image(str(tmp_path / "spy.hdr"), cube, interleave="bil", byteorder=1, ext=".img")
    spy = np.asarray(envi.open(str(tmp_path / "spy.hdr"), str(tmp_path / "spy.img")).load())
    assert np.array_equal(spy, cube)
    out = tmp_path / "out"
    code, _, err = convert(str(tmp_path / "*"), out, "--format", "envi", capsys=capsys)  # the .hdr is skipped
    assert code == 0, err
    got = np.stack([e["array"] for e in reader.iter_numpy(str(out))])
    assert np.array_equal(got, spy.transpose(0, 2, 1))  # bil: per line, bands x samples


def source(rows="storage"):
    return make_source("envi", SourceOptions(formats=(EnviOptions(envi_rows=rows),)))


def test_the_header_beside_the_full_name_wins_and_keys_are_read_loosely():
    text = "ENVI\n; a comment\nSamples   =  4\nwavelength = {\n 400.0,\n 500.0 }\nBYTE ORDER = 0\n"
    assert parse_header(text, "h.hdr") == {"samples": "4", "wavelength": "{ 400.0, 500.0 }", "byte order": "0"}


@pytest.mark.parametrize(
    "header, message",
    [
        ("IDL\nsamples = 1\n", "Not an ENVI header: its first line is not 'ENVI'"),
        ("ENVI\nsamples 4\n", "Line 2 of the ENVI header is not 'key = value': 'samples 4'"),
        ("ENVI\nsamples = 4\nsamples = 5\n", "The ENVI header gives 'samples' twice (again on line 3)"),
        ("ENVI\ndescription = {never\nclosed\n", "The value of 'description' (line 2) opens '{' and never closes it"),
        ("ENVI\nsamples = 4\nlines = 5\nbands = 3\n", "The ENVI header has no 'data type'"),
        ("ENVI\nsamples = 4\nlines = 5\nbands = 3\ndata type = 7\n", "data type 7 is not one this reader knows"),
        ("ENVI\nsamples = 4\nlines = 5\nbands = 3\ndata type = 4\ninterleave = bxq\n", "interleave is 'bxq'"),
        ("ENVI\nsamples = 0\nlines = 5\nbands = 3\ndata type = 4\n", "'samples' is 0, less than 1"),
        ("ENVI\nsamples = four\nlines = 5\nbands = 3\ndata type = 4\n", "'samples' is 'four', not an integer"),
        ("ENVI\nsamples = 4\nlines = 5\nbands = 3\ndata type = 4\nbyte order = 2\n", "byte order is 2"),
    ],
)
def test_a_bad_header_is_a_source_error_naming_it(tmp_path, header, message):
    src = write_envi(tmp_path / "cube.img", cube_of("f4"), header=header)
    with pytest.raises(SourceError) as e:
        source().index(str(src))
    assert message in str(e.value) and str(tmp_path / "cube.hdr") in str(e.value)


def test_a_file_whose_size_differs_from_its_header_is_refused_before_reading(tmp_path):
    src = write_envi(tmp_path / "cube.img", cube_of("i2"))
    src.write_bytes(src.read_bytes()[:-2])
    with pytest.raises(SourceError) as e:
        source().index(str(src))
    assert (
        "The file holds 118 bytes, but its ENVI header declares 120 (0 bytes of header offset, then [3, 5, 4]"
        in str(e.value)
    )
    assert str(src) in str(e.value) and "belongs to this data file" in str(e.value)


def test_no_header_names_both_places_looked(tmp_path):
    src = tmp_path / "cube.img"
    src.write_bytes(b"\0" * 8)
    with pytest.raises(SourceError) as e:
        source().index(str(src))
    assert f"looked for {src}.hdr and {tmp_path / 'cube.hdr'}" in str(e.value)


def test_pixels_of_a_bil_file_are_refused_with_what_to_do(tmp_path, capsys):
    src = write_envi(tmp_path / "cube.bil", cube_of("u1"), "bil")
    with pytest.raises(ConfigError) as e:
        source("pixels").index(str(src))
    assert "a bil file stores each pixel's bands a line apart" in str(e.value)
    assert "--envi_rows storage" in str(e.value)
    code, _, err = convert(str(src), tmp_path / "out", "--envi_rows", "pixels", capsys=capsys)
    assert code != 0 and "a bil file stores each pixel's bands a line apart" in err
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_a_row_range_reads_only_its_rows(tmp_path):
    cube = cube_of("u8", (9, 4, 2))
    src = write_envi(tmp_path / "cube.bip", cube, "bip", big_endian=True)
    assert np.array_equal(source().read(RowRange(str(src), 3, 7))["array"], cube[3:7])
    assert np.array_equal(source("pixels").read(RowRange(str(src), 5, 11))["array"], cube.reshape(36, 2)[5:11])


def test_an_analyze_pair_is_not_taken_for_envi(tmp_path):
    """Analyze 7.5 and NIfTI-1 pairs also name their files .hdr/.img; their header is binary (nibabel's own test
    file analyze.hdr here)."""
    analyze = tmp_path / "brain.img"
    analyze.write_bytes(b"\0" * 64)
    (tmp_path / "brain.hdr").write_bytes(fixture_file("nibabel/tests/data/analyze.hdr").read_bytes())
    with pytest.raises(SourceError) as e:
        source().index(str(analyze))
    assert f"The ENVI header is not text (byte offset 113) [file='{tmp_path / 'brain.hdr'}'" in str(e.value)
    assert "an Analyze 7.5 or NIfTI-1 pair (.hdr/.img) has a binary header" in str(e.value)
