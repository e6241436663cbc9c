"""--format nifti: NIfTI-1 and NIfTI-2 images (.nii, .nii.gz, .hdr/.img pairs), nibabel's own test files and files
nibabel writes here: one Example per volume, compared exactly with nibabel.load (our reader and plain TensorFlow),
both writers, row ranges that read only their volumes, verify --source, inspect, and the refusals (truncated
files, offsets inside the header, gzip bombs, absurd dimensions) by type and message."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, fixture_file, run_command
from tfrecord_etl.transforms import reader, sources
from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources import RowRange, SourceOptions, make_source
from tfrecord_etl.transforms.sources.nifti_options import NiftiOptions
from tfrecord_etl.transforms.storage import fileio

nib = pytest.importorskip("nibabel")

REAL = ["anatomical.nii", "functional.nii", "example4d.nii.gz", "example_nifti2.nii.gz", "standard.nii.gz"]
REAL += ["reoriented_anat_moved.nii"]
KINDS = {  # name -> (image class, file name)
    "nii": ("Nifti1Image", "img.nii"),
    "nii.gz": ("Nifti1Image", "img.nii.gz"),
    "nifti2": ("Nifti2Image", "img.nii"),
    "pair": ("Nifti1Pair", "img.hdr"),
    "pair2": ("Nifti2Pair", "img.hdr"),
}


def volumes(image, scaled=False):
    """nibabel's values of ``image`` as our Examples hold them: one per volume (axis 3), else one."""
    data = np.asanyarray(image.dataobj) if scaled else image.dataobj.get_unscaled()
    return np.moveaxis(data, 3, 0) if data.ndim > 3 else data[np.newaxis]


def examples(out):
    return list(reader.iter_numpy(str(out)))


def write(path, data, kind="nii", affine=None, slope=None, inter=None, units=("mm", "sec")):
    cls = getattr(nib, KINDS[kind][0])
    image = cls(data, np.diag([2.0, 3.0, 4.0, 1.0]) if affine is None else affine, dtype=data.dtype)
    image.header.set_xyzt_units(*units)
    if slope is not None:
        image.header.set_slope_inter(slope, inter)
    nib.save(image, str(path))
    return path


def source(scaling="raw"):
    return make_source("nifti", SourceOptions(formats=(NiftiOptions(nifti_scaling=scaling),)))


@pytest.mark.parametrize("name", REAL)
def test_nibabels_own_files_convert_with_default_options_as_nibabel_reads_them(tmp_path, capsys, name):
    from tfrecord_etl.pipelines import verify

    path = fixture_file(f"nibabel/tests/data/{name}")
    assert sources.format_of(str(path), SourceOptions()) == "nifti"
    out = tmp_path / "out"
    code, _, err = convert(str(path), out, capsys=capsys)
    assert code == 0, err
    image, got = nib.load(str(path)), examples(out)
    want = volumes(image)
    assert len(got) == len(want)
    for example, volume in zip(got, want):
        assert example["data"].dtype == volume.dtype.newbyteorder("=") and np.array_equal(example["data"], volume)
        assert np.array_equal(example["affine"], image.affine)
        assert np.array_equal(example["zooms"], np.asarray(image.header.get_zooms(), "f8"))
        xyz, t = image.header.get_xyzt_units()
        assert (example["xyz_unit"], example["t_unit"]) == (xyz.encode(), t.encode())
        # the scaling nibabel's dataobj applies (functional.nii is scaled: 0.0754... and 100.76...)
        assert (example["scl_slope"], example["scl_inter"]) == (image.dataobj.slope, image.dataobj.inter)
    code, stdout, _ = run_command(verify.main, [out, "--source", path], capsys)
    assert code == 0 and f"exact values against the source ({len(want)} of {len(want)} rows compared" in stdout


def test_plain_tensorflow_reads_the_voxels_of_a_real_4d_run(tmp_path, capsys):
    import tensorflow as tf

    path = fixture_file("nibabel/tests/data/functional.nii")  # big-endian int16 (17, 21, 3, 20)
    out = tmp_path / "out"
    code, _, err = convert(str(path), out, "--encoding", "tensor", "--num_shards", "3", capsys=capsys)
    assert code == 0, err
    files = sorted(str(p) for p in out.iterdir() if p.name.endswith(".tfrecord"))
    spec = {"data": tf.io.FixedLenFeature([], tf.string), "affine": tf.io.FixedLenFeature([], tf.string)}
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files)]
    got = np.stack([tf.io.decode_raw(r["data"], tf.int16).numpy().reshape(17, 21, 3) for r in rows])
    image = nib.load(str(path))
    assert np.array_equal(got, volumes(image))
    assert np.array_equal(tf.io.decode_raw(rows[0]["affine"], tf.float64).numpy().reshape(4, 4), image.affine)


DTYPES = ["u1", "i1", ">i2", "u2", "i4", "u4", "<i8", "u8", ">f4", "f8", "c8", ">c16"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_stored_dtype_round_trips_exactly(tmp_path, capsys, dtype):
    rng = np.random.default_rng(len(dtype))
    data = (rng.standard_normal((4, 3, 2, 5)) * 100).astype(dtype)
    if np.dtype(dtype).kind == "c":
        data = data + 1j * data[::-1]
    path = write(tmp_path / "img.nii", data.astype(dtype))
    out = tmp_path / "out"
    code, _, err = convert(str(path), out, capsys=capsys)
    assert code == 0, err
    got = np.stack([e["data"] for e in examples(out)])
    want = volumes(nib.load(str(path)))
    assert got.dtype == want.dtype.newbyteorder("=") and np.array_equal(got, want)


def test_rgb_voxels_are_one_feature_per_channel(tmp_path, capsys):
    rgb = np.zeros((3, 4, 2), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    rgb["R"], rgb["G"], rgb["B"] = 1, np.arange(24).reshape(3, 4, 2), 200
    path = write(tmp_path / "rgb.nii", rgb)
    out = tmp_path / "out"
    code, _, err = convert(str(path), out, capsys=capsys)
    assert code == 0, err
    (got,) = examples(out)
    stored = nib.load(str(path)).dataobj.get_unscaled()
    for channel in "RGB":
        assert np.array_equal(got[f"data/{channel}"], stored[channel])


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("writer", ["planned", "beam"])
def test_every_container_with_both_writers_and_ranges_of_two_volumes(tmp_path, capsys, kind, writer):
    data = np.arange(6 * 5 * 4 * 9, dtype="<i4").reshape(6, 5, 4, 9)
    path = write(tmp_path / KINDS[kind][1], data, kind)
    out = tmp_path / "out"
    flags = ("--writer", writer, "--target_range_mb", "0.001", "--num_shards", "2")  # 1 KiB: one volume a range
    code, _, err = convert(str(tmp_path / "*"), out, *flags, "--format", "nifti", capsys=capsys)
    assert code == 0, err
    got = np.stack([e["data"] for e in examples(out)])
    if writer == "beam":  # Beam's sink may write the shards' records in another order
        got = got[np.argsort(got[:, 0, 0, 0])]
    assert np.array_equal(got, volumes(nib.load(str(path))))


def test_a_pair_is_converted_from_its_hdr_without_format(tmp_path, capsys):
    path = write(tmp_path / "img.hdr", np.arange(24, dtype="f4").reshape(2, 3, 4), "pair")
    assert sources.format_of(str(path), SourceOptions()) == "nifti"
    out = tmp_path / "out"
    code, _, err = convert(str(path), out, capsys=capsys)
    assert code == 0, err
    assert np.array_equal(examples(out)[0]["data"], np.arange(24, dtype="f4").reshape(2, 3, 4))


def test_scaling_travels_beside_the_stored_values_or_is_applied_on_request(tmp_path, capsys):
    data = np.arange(3 * 2 * 2 * 4, dtype="i2").reshape(3, 2, 2, 4) - 20
    path = write(tmp_path / "scaled.nii.gz", data, slope=0.25, inter=-3.0)
    image = nib.load(str(path))
    out = tmp_path / "raw"
    assert convert(str(path), out, capsys=capsys)[0] == 0
    got = examples(out)
    assert np.array_equal(np.stack([e["data"] for e in got]), volumes(image))
    assert got[0]["data"].dtype == np.int16 and (got[0]["scl_slope"], got[0]["scl_inter"]) == (0.25, -3.0)
    assert np.array_equal(got[1]["data"] * got[1]["scl_slope"] + got[1]["scl_inter"], volumes(image, True)[1])
    out = tmp_path / "applied"
    assert convert(str(path), out, "--nifti_scaling", "apply", capsys=capsys)[0] == 0
    got = examples(out)
    want = volumes(image, scaled=True)
    assert got[0]["data"].dtype == want.dtype and np.array_equal(np.stack([e["data"] for e in got]), want)
    assert "scl_slope" not in got[0]


def test_a_row_range_reads_only_its_volumes(tmp_path, monkeypatch):
    data = np.arange(8 * 8 * 8 * 50, dtype="<f8").reshape(8, 8, 8, 50)  # 4 KiB a volume, 200 KiB the image
    path = write(tmp_path / "run.nii", data)
    opened = []
    original = fileio.open_read

    def counting(p):
        stream = original(p)
        read = stream.read
        stream_bytes = []

        def counted(n=-1):
            chunk = read(n)
            stream_bytes.append(len(chunk))
            return chunk

        stream.read = counted
        opened.append(stream_bytes)
        return stream

    src = source()
    src.index(str(path))
    monkeypatch.setattr(fileio, "open_read", counting)
    got = src.read(RowRange(str(path), 40, 42))["data"]
    assert np.array_equal(got, np.moveaxis(data[..., 40:42], 3, 0))
    assert sum(sum(b) for b in opened) < 2 * 4096 + 2048  # the header (once) and the two volumes, no more


def test_a_gzipped_image_is_decompressed_once_by_ranges_read_in_order(tmp_path, monkeypatch):
    data = np.arange(4 * 4 * 4 * 30, dtype="<i2").reshape(4, 4, 4, 30)
    path = write(tmp_path / "run.nii.gz", data)
    src = source()
    index = src.index(str(path))
    assert index.sequential and index.num_rows == 30
    ranges = sources.plan_row_ranges(index, 3 * 128)
    got = [src.read(rr)["data"] for rr in ranges]
    assert len(ranges) > 5 and np.array_equal(np.concatenate(got), np.moveaxis(data, 3, 0))
    assert src._local.image.stream.tell() == 352 + data.nbytes  # one stream, moved forward only


def test_inspect_shows_what_convert_makes_of_a_file(tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect

    path = fixture_file("nibabel/tests/data/example4d.nii.gz")
    code, stdout, err = run_command(inspect.main, [path], capsys)
    assert code == 0, err
    assert "format nifti (NIfTI-1/-2 images" in stdout and "convert makes 2 Examples" in stdout
    assert "data                         <i2        [128, 96, 24]" in stdout
    assert "nifti: version 1" in stdout and 'descrip "FSL3.3"' in stdout


def test_verify_source_finds_a_changed_volume(tmp_path, capsys):
    from tfrecord_etl.pipelines import verify

    data = np.zeros((3, 3, 3, 4), "u1")
    path = write(tmp_path / "a.nii", data)
    out = tmp_path / "out"
    assert convert(str(path), out, capsys=capsys)[0] == 0
    data[1, 1, 1, 2] = 7
    write(path, data)
    code, stdout, _ = run_command(verify.main, [out, "--source", path], capsys)
    assert code == 1 and "differs at index (1, 1, 1): 0 in the output, 7 in the source" in stdout


# --- refusals -------------------------------------------------------------------------------------------------


def header_bytes(data_shape=(4, 4, 4), dtype="i2", kind="nii"):
    """A NIfTI file's bytes as nibabel writes it (zeros for voxels)."""
    cls = getattr(nib, KINDS[kind][0])
    return cls(np.zeros(data_shape, dtype), np.eye(4)).to_bytes()


def patched(raw: bytes, offset: int, value: bytes) -> bytes:
    return raw[:offset] + value + raw[offset + len(value) :]


def refused(path, *words):
    with pytest.raises(SourceError) as e:
        source().index(str(path))
    message = str(e.value)
    assert str(path) in message and all(w in message for w in words), message
    return message


def test_a_truncated_file_is_refused_from_its_size(tmp_path):
    path = tmp_path / "cut.nii"
    path.write_bytes(header_bytes()[:-10])
    refused(path, "The file holds 470 bytes, but its NIfTI header declares [4, 4, 4] of int16 (128 bytes)", "truncated")


def test_absurd_dimensions_are_refused_before_allocating(tmp_path):
    raw = bytearray(header_bytes())
    dims = np.array([7] + [32767] * 7, "<i2").tobytes()
    path = tmp_path / "huge.nii"
    path.write_bytes(patched(bytes(raw), 40, dims))
    refused(path, "[32767, 32767, 32767, 32767, 32767, 32767, 32767]", "truncated, or absurd dimensions")


def test_voxels_inside_the_header_are_refused(tmp_path):
    path = tmp_path / "offset.nii"
    path.write_bytes(patched(header_bytes(), 108, np.array([100.0], "<f4").tobytes()))  # vox_offset
    refused(path, "puts the voxels at byte offset 100, inside the header (352 bytes)")


def test_a_gzip_bomb_is_refused_by_its_declared_size(tmp_path):
    raw = header_bytes((8, 8, 8))
    raw = patched(raw, 40, np.array([3, 1000, 1000, 1000], "<i2").tobytes())  # 2 GB of int16 declared
    path = tmp_path / "bomb.nii.gz"
    path.write_bytes(gzip.compress(raw))
    refused(path, "more than --max_compression_ratio 500 (a gzip bomb, or absurd dimensions)")


def test_a_gzip_stream_shorter_than_declared_is_refused_by_its_trailer(tmp_path):
    raw = header_bytes((16, 16, 16))
    path = tmp_path / "short.nii.gz"
    path.write_bytes(gzip.compress(raw[:-100]))
    refused(path, "The gzip stream decompresses to 8,444 bytes (its trailer), but its NIfTI header declares")


def test_a_corrupt_gzip_stream_is_refused_naming_the_rows(tmp_path):
    raw = np.random.default_rng(0).integers(0, 255, 352 + 16**3 * 2, dtype="u1").tobytes()
    raw = header_bytes((16, 16, 16))[:352] + raw[352:]
    packed = bytearray(gzip.compress(raw, 1))
    packed[len(packed) // 2 : len(packed) // 2 + 64] = bytes(64)  # a hole in the deflate stream
    path = tmp_path / "corrupt.nii.gz"
    path.write_bytes(bytes(packed))
    src = source()
    src.index(str(path))
    with pytest.raises(SourceError) as e:
        src.read(RowRange(str(path), 0, 1))
    assert f"Cannot read the voxels of rows 0-0 of '{path}'" in str(e.value)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda raw: raw[:300], "Not a NIfTI file: no 'n+1'/'ni1' at byte 344"),
        (lambda raw: patched(raw, 70, np.array([1234], "<i2").tobytes()), "nibabel refuses the NIfTI header"),
        (lambda raw: patched(raw, 40, np.array([3, 4, 0, 4], "<i2").tobytes()), "shape [4, 0, 4]: no voxels"),
    ],
)
def test_bad_headers_are_one_line_naming_the_file(tmp_path, edit, words):
    path = tmp_path / "bad.nii"
    path.write_bytes(edit(header_bytes()))
    message = refused(path, words)
    assert "\n" not in message


def test_a_pair_without_its_img_is_refused(tmp_path):
    path = tmp_path / "lonely.hdr"
    path.write_bytes(fixture_file("nibabel/tests/data/nifti2.hdr").read_bytes())
    refused(path, f"No data file beside the NIfTI pair's header: {tmp_path / 'lonely.img'} does not exist")


def test_a_gzipped_nifti_is_told_by_content_whatever_its_name(tmp_path):
    path = tmp_path / "scan.dat"  # raw's suffix: the content inside the gzip stream wins
    path.write_bytes(fixture_file("nibabel/tests/data/example_nifti2.nii.gz").read_bytes())
    assert sources.format_of(str(path), SourceOptions()) == "nifti"
    other = tmp_path / "notes.gz"
    other.write_bytes(gzip.compress(b"not an image" * 100))
    with pytest.raises(SourceError, match="Cannot tell the input format"):
        sources.format_of(str(other), SourceOptions())


def test_an_image_of_five_axes_gives_one_example_per_time_point(tmp_path, capsys):
    field = np.arange(4 * 3 * 2 * 5 * 3, dtype="<f4").reshape(4, 3, 2, 5, 3)  # a vector (3) per voxel, 5 times
    path = write(tmp_path / "field.nii.gz", field)
    out = tmp_path / "out"
    assert convert(str(path), out, "--target_range_mb", "0.0002", capsys=capsys)[0] == 0
    got = examples(out)
    assert len(got) == 5 and got[0]["data"].shape == (4, 3, 2, 3) and got[0]["zooms"].shape == (5,)
    assert np.array_equal(np.stack([e["data"] for e in got]), np.moveaxis(field, 3, 0))


def test_augment_joins_the_volumes_of_an_image(tmp_path, capsys):
    from tfrecord_etl.pipelines import augment

    np.save(tmp_path / "labels.npy", np.arange(6, dtype="<i8"))
    assert convert(tmp_path / "labels.npy", tmp_path / "src", capsys=capsys)[0] == 0
    data = np.arange(2 * 2 * 2 * 6, dtype="<i2").reshape(2, 2, 2, 6)
    path = write(tmp_path / "run.nii", data)
    argv = ["--input", tmp_path / "src", "--output_dir", tmp_path / "side", "--mode", "sidecar"]
    argv += ["--join_input", path, "--join_fields", "data=volume", *BEAM_FLAGS]
    code, _, err = run_command(augment.main, argv, capsys)
    assert code == 0, err
    merged = list(reader.iter_numpy_merged(str(tmp_path / "src"), str(tmp_path / "side")))
    assert np.array_equal(np.stack([e["volume"] for e in merged]), np.moveaxis(data, 3, 0))
