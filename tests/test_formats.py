"""The input format is told by the file's first bytes (each source's magic in the registry), then its suffix;
--format always wins; a pattern matching files of several formats is an error listing them. Real files: MINC1 and
MINC2 .mnc (nibabel's test data), NetCDF-3 and netCDF-4 .cdf (arm-pyart's test data), compared with SciPy / h5py.
"""

from __future__ import annotations

import json
import os
import pathlib

import h5py
import numpy as np
import pytest
import scipy
from scipy.io import netcdf_file, savemat

from tests.conftest import convert, fixture_file, run_command
from tfrecord_etl.transforms import reader, sources
from tfrecord_etl.transforms.errors import SourceError, UnreadFormatError
from tfrecord_etl.transforms.output import metadata
from tfrecord_etl.transforms.sources import SourceOptions

SCIPY_MAT = os.path.join(os.path.dirname(scipy.__file__), "io", "matlab", "tests", "data")


def hdf5_file(path, userblock: int = 0):
    with h5py.File(path, "w", userblock_size=userblock) as f:
        f["x"] = np.arange(12.0).reshape(6, 2)
    return path


def netcdf3_file(path):
    with netcdf_file(path, "w") as f:
        f.createDimension("t", 4)
        f.createVariable("v", "i4", ("t",))[:] = np.arange(4)
    return path


def test_the_content_decides_the_format_whatever_the_suffix(tmp_path):
    made = {
        "netcdf4.cdf": ("hdf5", lambda p: hdf5_file(p)),  # netCDF-4 named .cdf: was NetCDF-3 by suffix
        "minc2.mnc": ("hdf5", lambda p: hdf5_file(p)),
        "minc1.mnc": ("netcdf3", netcdf3_file),
        "data.loom": ("hdf5", lambda p: hdf5_file(p)),
        "block.h5ad": ("hdf5", lambda p: hdf5_file(p, 1024)),
        "deep.xyz": ("hdf5", lambda p: hdf5_file(p, 8192)),  # unknown suffix: 512 * 2**n offsets probed
        "array.dat": ("npy", lambda p: np.save(open(p, "wb"), np.arange(3))),
        "archive.data": ("npz", lambda p: np.savez(open(p, "wb"), a=np.arange(3))),
        "v5.mat": ("matlab", lambda p: savemat(p, {"a": np.arange(3)})),
        "v5.bin": ("matlab", lambda p: savemat(p, {"a": np.arange(3)})),
        "classic.nc": ("netcdf3", netcdf3_file),
        "netcdf4.nc": ("hdf5", lambda p: hdf5_file(p)),
        "table.dat": ("parquet", lambda p: parquet_file(p)),  # PAR1, whatever raw's suffix says
        "table.bin": ("parquet", lambda p: feather_file(p)),  # Feather v2 = Arrow IPC file: ARROW1
        "image.dat": ("fits", lambda p: fits_file(pathlib.Path(p))),  # the content wins over raw's suffix
    }
    for name, (fmt, make) in made.items():
        make(str(tmp_path / name))
        assert sources.format_of(str(tmp_path / name), SourceOptions()) == fmt, name
    v4 = os.path.join(SCIPY_MAT, "testdouble_4.2c_SOL2.mat")  # v4 has no magic: the .mat suffix decides
    assert sources.format_of(v4, SourceOptions()) == "matlab"
    v73 = os.path.join(SCIPY_MAT, "testhdf5_7.4_GLNX86.mat")  # HDF5 after a 512-byte user block
    assert sources.format_of(v73, SourceOptions()) == "hdf5"
    assert sources.format_of(str(tmp_path / "v5.mat"), SourceOptions(format="raw")) == "raw"  # --format wins
    (tmp_path / "notes.xyz").write_bytes(b"hello" * 1000)
    with pytest.raises(
        SourceError,
        match=r"Cannot tell the input format from the file's first bytes or its suffix"
        r".*notes\.xyz.*pass --format one of",
    ):
        sources.format_of(str(tmp_path / "notes.xyz"), SourceOptions())


def test_convert_verify_and_augment_join_read_files_by_content(tmp_path, capsys):
    """Was: 'Not a readable NetCDF-3 file' (.cdf netCDF-4) and 'Cannot tell the input format' (.mnc)."""
    from tfrecord_etl.pipelines import augment, verify

    hdf5_file(tmp_path / "in.cdf")
    code, _, err = convert(tmp_path / "in.cdf", tmp_path / "out", capsys=capsys)
    assert code == 0, err
    np.testing.assert_array_equal(
        [e["x"] for e in reader.iter_numpy(str(tmp_path / "out"))], np.arange(12.0).reshape(6, 2)
    )
    code, out, err = run_command(verify.main, [tmp_path / "out", "--source", tmp_path / "in.cdf"], capsys)
    assert code == 0, out + err
    with h5py.File(tmp_path / "extra.mnc", "w") as f:  # a MINC2-named HDF5 join source, joined by position
        f["y"] = np.arange(6, dtype=np.int64) * 10
    code, out, err = run_command(
        augment.main,
        [
            "--input",
            tmp_path / "out",
            "--output_dir",
            tmp_path / "joined",
            "--join_input",
            tmp_path / "extra.mnc",
            "--join_by",
            "position",
        ],
        capsys,
    )
    assert code == 0, out + err
    got = list(reader.iter_numpy(str(tmp_path / "joined")))
    assert [int(e["y"]) for e in got] == [0, 10, 20, 30, 40, 50]


def test_a_pattern_of_several_formats_is_an_error_listing_them(tmp_path, capsys):
    hdf5_file(tmp_path / "a.h5")
    np.savez(tmp_path / "b.npz", x=np.arange(3))
    code, _, err = convert(tmp_path / "*", tmp_path / "out", capsys=capsys)
    assert code == 2 and "The pattern matches files of 2 formats (hdf5: 1 file(s), e.g." in err
    assert "a.h5" in err and "npz: 1 file(s)" in err and "b.npz" in err and "--format" in err
    mats = tmp_path / "mats"
    mats.mkdir()
    savemat(mats / "v5.mat", {"x": np.arange(3.0)})  # the same suffix, two formats (v5 and v7.3)
    (mats / "v73.mat").write_bytes(open(os.path.join(SCIPY_MAT, "testhdf5_7.4_GLNX86.mat"), "rb").read())
    code, _, err = convert(mats / "*.mat", tmp_path / "out2", capsys=capsys)
    assert code == 2 and "2 formats (hdf5: 1 file(s)" in err and "matlab: 1 file(s)" in err
    (tmp_path / "notes.txt").write_text("not data")
    (tmp_path / "b.npz").unlink()
    code, _, err = convert(tmp_path / "*", tmp_path / "out3", capsys=capsys)
    assert code == 2 and "Cannot tell the input format" in err and "notes.txt" in err
    assert "the other files are hdf5" in err and "--format hdf5" in err
    code, _, err = convert(tmp_path / "*", tmp_path / "out4", "--format", "hdf5", capsys=capsys)  # --format wins
    assert code == 2 and "notes.txt" in err and "Not a readable HDF5 file" in err


def test_a_format_that_disagrees_with_the_content_says_what_the_file_is(tmp_path, capsys):
    netcdf3_file(tmp_path / "x.nc")
    code, _, err = convert(tmp_path / "x.nc", tmp_path / "a", "--format", "hdf5", capsys=capsys)
    assert code == 2 and "it is a NetCDF-3 file: use --format netcdf3" in err
    hdf5_file(tmp_path / "y.nc")
    code, _, err = convert(tmp_path / "y.nc", tmp_path / "b", "--format", "netcdf3", capsys=capsys)
    assert code == 2 and "it is an HDF5 file (.h5, netCDF-4, MATLAB v7.3): use --format hdf5" in err


MINC = "nibabel/tests/data/"
SONDE = "pyart/testing/data/"


@pytest.mark.parametrize(
    "relative,fmt",
    [
        (MINC + "minc1_1_scale.mnc", "netcdf3"),
        (MINC + "minc1_4d.mnc", "netcdf3"),
        (MINC + "minc2_1_scale.mnc", "hdf5"),
        (MINC + "minc2_4d.mnc", "hdf5"),
        (SONDE + "example_arm_sonde.cdf", "netcdf3"),
        (SONDE + "example_interpolatedsonde.cdf", "hdf5"),
    ],
)
def test_real_mnc_and_cdf_files_convert_by_content_exactly(tmp_path, relative, fmt):
    """MINC1 is NetCDF-3 and MINC2 HDF5 under one suffix; ARM's .cdf files are NetCDF-3 or netCDF-4."""
    from tfrecord_etl.pipelines import verify

    path = fixture_file(relative)
    assert sources.format_of(str(path), SourceOptions()) == fmt
    out = tmp_path / "out"
    code, _, err = convert(path, out)
    assert code == 0, err
    examples = list(reader.iter_numpy(str(out)))
    names = [s.name for s in metadata.load(str(out))["features"]]
    assert examples and names
    for name in names:
        if fmt == "hdf5":
            with h5py.File(path) as f:
                expected = f["/" + name][()]
        else:
            with netcdf_file(path, "r", mmap=False, maskandscale=False) as f:
                expected = f.variables[name].data.copy()
        got = np.stack([e[name] for e in examples])
        assert got.dtype == expected.dtype.newbyteorder("<") and got.tobytes() == expected.astype(got.dtype).tobytes()
    code, _, err = run_command(verify.main, [str(out), "--source", str(path)])
    assert code == 0, err


SCIPY_IO = os.path.join(os.path.dirname(scipy.__file__), "io", "tests", "data")


@pytest.mark.parametrize(
    "name",
    ["testdouble_4.2c_SOL2.mat", "testmatrix_4.2c_SOL2.mat", "testmulti_4.2c_SOL2.mat", "teststring_4.2c_SOL2.mat"],
)
def test_inspect_reads_matlab_v4_files_as_convert_does(tmp_path, capsys, name):
    """Was: 'RecordError: Length CRC mismatch' (a v4 .mat has no magic; inspect took it for a TFRecord file)."""
    from tfrecord_etl.pipelines import inspect

    path = os.path.join(SCIPY_MAT, name)
    code, out, err = run_command(inspect.main, [path, "--json"], capsys)
    assert code == 0, err
    tree = json.loads(out)
    assert tree["format"] == "MATLAB v4-v7 .mat"
    code, _, err = convert(path, tmp_path / "out", capsys=capsys)
    assert code == 0, err
    converted = {"/" + s.name for s in metadata.load(str(tmp_path / "out"))["features"]}
    assert converted == set(tree["row_groups"][0]["datasets"])  # the default group is what convert converted


def test_inspect_describes_every_other_input_convert_reads(tmp_path, capsys):
    """.npy, .npz and raw files (a layout sidecar) were 'Not a TFRecord file'; ENVI cubes 'Length CRC mismatch'.
    A TFRecord file with a raw suffix stays a TFRecord file."""
    from tests.test_envi_source import write_envi
    from tfrecord_etl.pipelines import inspect

    np.save(tmp_path / "a.npy", np.arange(12, dtype="<i4").reshape(6, 2))
    np.savez(tmp_path / "b.npz", x=np.arange(5.0), y=np.zeros((5, 3), np.uint8))
    np.arange(8, dtype="<f8").tofile(tmp_path / "c.raw")
    (tmp_path / "c.raw.json").write_text('{"dtype": "<f8", "shape": [-1, 4]}')
    write_envi(tmp_path / "d.img", np.zeros((5, 4, 3), np.int16))
    expected = {
        "a.npy": ("npy", 6, [("array", "<i4", [2])]),
        "b.npz": ("npz", 5, [("x", "<f8", []), ("y", "|u1", [3])]),
        "c.raw": ("raw", 2, [("array", "<f8", [4])]),
        "d.img": ("envi", 3, None),
    }
    for name, (fmt, examples, features) in expected.items():
        code, out, err = run_command(inspect.main, [tmp_path / name, "--json"], capsys)
        assert code == 0, (name, err)
        got = json.loads(out)
        assert (got["format"], got["examples"]) == (fmt, examples), name
        if features is not None:
            assert [(f["name"], f["dtype"], f["shape"]) for f in got["features"]] == features, name
        code, text, _ = run_command(inspect.main, [tmp_path / name], capsys)
        assert code == 0 and f"format {fmt}" in text and f"convert makes {examples} Examples" in text
    code, _, err = convert(tmp_path / "a.npy", tmp_path / "out", "--num_shards", "1", capsys=capsys)
    assert code == 0, err
    (tmp_path / "shard.bin").write_bytes(next((tmp_path / "out").glob("data-*")).read_bytes())
    code, out, err = run_command(inspect.main, [tmp_path / "shard.bin"], capsys)
    assert code == 0 and "6 examples in 1 shards" in out, err


def fits_file(path):
    path.write_bytes(b"SIMPLE  =                    T".ljust(80) + b"END".ljust(80) + b" " * (2880 - 160))


def edf_file(path):
    path.write_bytes(b"0       " + b" " * 248)


def wav_file(path):
    from scipy.io import wavfile

    wavfile.write(path, 8000, np.arange(100, dtype=np.int16))


def parquet_file(path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2, 3]}), path)


def feather_file(path, version=2):
    import pyarrow as pa
    import pyarrow.feather as feather

    feather.write_feather(pa.table({"x": [1, 2, 3]}), path, version=version)


def idl_file(path):
    path.write_bytes(open(os.path.join(SCIPY_IO, "scalar_float32.sav"), "rb").read())


UNREAD_FILES = {  # name -> (writer, what the message says it is, a word of its way out)
    "image.fits.gz": (lambda p: p.write_bytes(b"\x1f\x8b\x08" + bytes(40)), "a gzip-compressed FITS file", "gunzip"),
    "sleep.edf": (edf_file, "an EDF/BDF recording", "pyedflib"),
    "sound.wav": (wav_file, "a WAV audio file", "scipy.io.wavfile.read"),
    "sound.bin": (wav_file, "a WAV audio file", "scipy.io.wavfile.read"),
    "table.feather": (lambda p: feather_file(p, version=1), "a Feather v1 file", "pyarrow.feather.write_feather"),
    "vars.sav": (idl_file, "an IDL SAVE file", "scipy.io.readsav"),
}


@pytest.mark.parametrize("name", sorted(UNREAD_FILES))
def test_formats_we_do_not_read_are_named_with_the_way_out(tmp_path, capsys, name):
    """Was: convert 'Cannot tell the input format ... name it .h5/.nc/...', inspect 'Length CRC mismatch'."""
    from tfrecord_etl.pipelines import inspect

    write, label, way_out = UNREAD_FILES[name]
    path = tmp_path / name
    write(path)
    for code, _, err in (
        convert(path, tmp_path / "out", capsys=capsys),
        run_command(inspect.main, [path], capsys),
    ):
        assert code == 2 and err.count("\n") == 1, err
        assert f"UnreadFormatError: The file is {label}: a format recognised but not read by tfrecord-etl" in err
        assert str(path) in err and way_out in err and "Cannot tell" not in err
    code, _, err = convert(path, tmp_path / "out", "--format", "hdf5", capsys=capsys)  # --format still wins
    assert code == 2 and "UnreadFormatError" not in err
    if not name.endswith(".gz"):
        assert f"it is {label}, which tfrecord-etl does not read" in err


def test_a_pattern_with_a_file_we_do_not_read_names_it(tmp_path, capsys):
    hdf5_file(tmp_path / "a.h5")
    wav_file(tmp_path / "b.wav")
    code, _, err = convert(tmp_path / "*", tmp_path / "out", capsys=capsys)
    assert code == 2 and "The file is a WAV audio file" in err and "b.wav" in err


@pytest.mark.parametrize(
    "name,label",
    [
        ("array_float32_2d.sav", "an IDL SAVE file"),
        ("test-44100Hz-2ch-32bit-float-le.wav", "a WAV audio file"),
    ],
)
def test_real_files_we_do_not_read_are_named(tmp_path, capsys, name, label):
    """SciPy's own test files (its readsav and wavfile tests)."""
    from tfrecord_etl.pipelines import inspect

    path = os.path.join(SCIPY_IO, name)
    code, _, err = run_command(inspect.main, [path], capsys)
    assert code == 2 and f"The file is {label}" in err
    with pytest.raises(UnreadFormatError, match=f"The file is {label}"):
        sources.format_of(str(path), SourceOptions())
