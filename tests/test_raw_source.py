"""--format raw: raw binary arrays of fixed-size rows, on matplotlib's own raw sample files
(the EEG and membrane recordings and the MRI slice of its mri_with_eeg / membrane examples) and generated ones:
exact round trips through our reader and plain TensorFlow, both writers, sidecars, verify, inspect, augment joins."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, fixture_file, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.sources.options_raw import RawOptions

SAMPLE = "matplotlib/mpl-data/sample_data"


def tf_rows(out, dtype, shape):
    """Every record's ``array`` read with plain TensorFlow (decode_raw of the little-endian tensor bytes)."""
    import tensorflow as tf

    files = sorted(str(p) for p in out.iterdir() if p.name.endswith((".tfrecord", ".tfrecord.gz")))
    comp = "GZIP" if files[0].endswith(".gz") else ""
    spec = {"array": tf.io.FixedLenFeature([], tf.string)}
    out = [
        tf.io.decode_raw(
            tf.io.parse_single_example(r, spec)["array"], getattr(tf, np.dtype(dtype).name), little_endian=True
        )
        .numpy()
        .reshape(shape)
        for r in tf.data.TFRecordDataset(files, compression_type=comp)
    ]
    return np.stack(out) if out else np.zeros((0, *shape), dtype)


def tf_list_rows(out, dtype):
    """Every record's ``array`` (a float32 or int64 list) read with plain TensorFlow, cast back to ``dtype``."""
    import tensorflow as tf

    files = sorted(str(p) for p in out.iterdir() if p.name.endswith(".tfrecord"))
    spec = {"array": tf.io.VarLenFeature(tf.float32 if np.dtype(dtype).kind == "f" else tf.int64)}
    return np.stack(
        [
            tf.sparse.to_dense(tf.io.parse_single_example(r, spec)["array"]).numpy()
            for r in tf.data.TFRecordDataset(files)
        ]
    ).astype(dtype)


def read_back(out):
    return np.stack([e["array"] for e in reader.iter_numpy(str(out))])


@pytest.mark.parametrize("writer", ["planned", "beam"])
def test_matplotlib_eeg_recording_round_trips(tmp_path, capsys, writer):
    """mri_with_eeg.py reads eeg.dat as np.fromfile(f, dtype=float).reshape(800, 4)."""
    src = fixture_file(f"{SAMPLE}/eeg.dat")
    want = np.fromfile(src, dtype="<f8").reshape(800, 4)
    out = tmp_path / "out"
    code, _, err = convert(
        src,
        out,
        "--dtype",
        "<f8",
        "--shape",
        "-1,4",
        "--num_shards",
        "3",
        "--writer",
        writer,
        "--provenance",
        capsys=capsys,
    )
    assert code == 0, err
    got = reader.iter_numpy(str(out))
    if writer == "beam":  # unordered: put the rows back in order by provenance
        got = sorted(got, key=lambda e: int(e["_source/row"]))
    got = np.stack([e["array"] for e in got])
    assert got.dtype == np.dtype("<f8") and np.array_equal(got, want)
    if writer == "planned":
        assert np.array_equal(tf_rows(out, "<f8", (4,)), want)


def test_matplotlib_membrane_with_a_sidecar_and_the_mri_slice(tmp_path, capsys):
    """membrane.dat: np.fromfile(f, np.float32) (12,000 samples, layout from a sidecar); s1045.ima.gz: the MRI
    slice, np.frombuffer(gunzipped, np.uint16).reshape(256, 256), decompressed to a raw file (big-endian copy too)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "membrane.dat").write_bytes(fixture_file(f"{SAMPLE}/membrane.dat").read_bytes())
    (data / "membrane.dat.json").write_text(json.dumps({"dtype": "<f4", "shape": [-1]}))
    code, _, err = convert(data / "*", tmp_path / "m", "--format", "raw", capsys=capsys)  # the sidecar is skipped
    assert code == 0, err
    want = np.fromfile(data / "membrane.dat", np.float32)
    assert np.array_equal(read_back(tmp_path / "m"), want)

    mri = np.frombuffer(gzip.open(fixture_file(f"{SAMPLE}/s1045.ima.gz")).read(), np.uint16).reshape(256, 256)
    (tmp_path / "mri.raw").write_bytes(mri.tobytes())
    (tmp_path / "mri_be.raw").write_bytes(b"HDR!" * 4 + mri.astype(">u2").tobytes())
    for name, flags in (("mri.raw", ["--dtype", "<u2"]), ("mri_be.raw", ["--dtype", ">u2", "--offset", "16"])):
        out = tmp_path / name.replace(".", "_")
        code, _, err = convert(
            tmp_path / name, out, *flags, "--shape", "-1,256", "--compression", "gzip", capsys=capsys
        )
        assert code == 0, err
        assert np.array_equal(read_back(out), mri) and read_back(out).dtype == np.dtype("<u2")
        assert np.array_equal(tf_rows(out, "<u2", (256,)), mri)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [">f4", "<i2", "|u1", ">c8", "?"])
def test_generated_layouts_round_trip(tmp_path, capsys, order, dtype):
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 100, (37, 5, 3)).astype(dtype)
    header = b"x" * 24
    (tmp_path / "a.bin").write_bytes(header + arr.tobytes(order=order))
    code, _, err = convert(
        tmp_path / "a.bin",
        tmp_path / "out",
        "--dtype",
        dtype,
        "--shape",
        "-1,5,3",
        "--offset",
        "24",
        "--order",
        order,
        "--target_range_mb",
        "0.0001",
        "--num_shards",
        "4",
        capsys=capsys,
    )
    assert code == 0, err
    got = read_back(tmp_path / "out")
    assert np.array_equal(got, arr) and got.dtype == arr.dtype.newbyteorder("<")
    # the fixed row count works too, and mismatches it name both sizes
    code, _, err = convert(
        tmp_path / "a.bin",
        tmp_path / "out2",
        "--dtype",
        dtype,
        "--shape",
        "37,5,3",
        "--offset",
        "24",
        "--order",
        order,
        capsys=capsys,
    )
    assert code == 0, err


def test_directory_sidecar_yaml_and_an_empty_file(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / "raw.yaml").write_text("dtype: '>i8'\nshape: -1,2\n")
    np.arange(10, dtype=">i8").tofile(d / "a.raw")
    (d / "b.raw").write_bytes(b"")  # zero rows
    np.arange(10, 16, dtype=">i8").tofile(d / "c.raw")
    code, _, err = convert(d / "*.raw", tmp_path / "out", capsys=capsys)
    assert code == 0, err
    assert read_back(tmp_path / "out").tolist() == np.arange(16).reshape(8, 2).tolist()


def test_verify_source_and_inspect_on_a_raw_conversion(tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect as inspect_module, verify as verify_module

    arr = np.arange(300, dtype="<f4").reshape(100, 3)
    (tmp_path / "a.raw").write_bytes(arr.tobytes())
    out = tmp_path / "out"
    assert convert(tmp_path / "a.raw", out, "--dtype", "<f4", "--shape", "-1,3", capsys=capsys)[0] == 0
    code, stdout, _ = run_command(verify_module.main, [out, "--source", tmp_path / "a.raw"], capsys)
    assert code == 0, stdout
    code, stdout, _ = run_command(inspect_module.main, [out], capsys)
    assert code == 0 and "array" in stdout and "<f4" in stdout
    arr[57, 1] = -1  # the source changed after the conversion: verify finds the row
    (tmp_path / "a.raw").write_bytes(arr.tobytes())
    code, stdout, _ = run_command(verify_module.main, [out, "--source", tmp_path / "a.raw"], capsys)
    assert code == 1 and "57" in stdout


def test_augment_joins_a_raw_file_by_position(tmp_path, capsys):
    from tfrecord_etl.pipelines import augment as augment_main

    np.save(tmp_path / "x.npy", np.arange(50, dtype="<i8"))
    assert convert(tmp_path / "x.npy", tmp_path / "src", capsys=capsys)[0] == 0
    labels = (np.arange(50) % 4).astype(">u2")
    (tmp_path / "labels.raw").write_bytes(labels.tobytes())
    (tmp_path / "labels.raw.json").write_text('{"dtype": ">u2", "shape": [-1]}')
    code, _, err = run_command(
        augment_main.main,
        [
            "--input",
            tmp_path / "src",
            "--output_dir",
            tmp_path / "side",
            "--mode",
            "sidecar",
            "--join_input",
            tmp_path / "labels.raw",
            "--join_fields",
            "array=label",
            *BEAM_FLAGS,
        ],
        capsys,
    )
    assert code == 0, err
    got = [int(e["label"]) for e in reader.iter_numpy_merged(str(tmp_path / "src"), str(tmp_path / "side"))]
    assert got == labels.tolist()


def test_fifo_and_a_symlinked_sidecar_loop_are_refused(tmp_path, capsys):
    os.mkfifo(tmp_path / "p.raw")
    code, _, err = convert(tmp_path / "p.raw", tmp_path / "out", "--dtype", "u1", "--shape", "-1", capsys=capsys)
    assert code == 2 and "FIFO" in err
    (tmp_path / "q.raw").write_bytes(b"\0" * 4)
    os.mkfifo(tmp_path / "q.raw.json")
    code, _, err = convert(tmp_path / "q.raw", tmp_path / "out", capsys=capsys)
    assert code == 2 and "FIFO" in err and "q.raw.json" in err


def test_count_converts_two_arrays_back_to_back(tmp_path, capsys):
    """A GIFTI external data file (ExternalFileName/ExternalFileOffset) holds its arrays back to back: here the
    vertices (8 x 3 '<f4', RowMajorOrder) at offset 0, then the triangles (12 x 3 '>i4', ColumnMajorOrder) at
    byte 96. Each converts exactly with --offset/--count; without --count a fixed shape's hint names it."""
    from tfrecord_etl.pipelines import verify as verify_module

    coords = np.random.default_rng(3).normal(size=(8, 3)).astype("<f4")
    triangles = (np.arange(36).reshape(12, 3) * 7 - 100).astype(">i4")
    data = tmp_path / "surf.gii.dat"
    data.write_bytes(coords.tobytes() + triangles.tobytes(order="F"))
    assert data.stat().st_size == 240

    code, _, err = convert(data, tmp_path / "c", "--format", "raw", "--dtype", "<f4", "--shape", "8,3", capsys=capsys)
    assert code == 2 and "SourceError" in err and "holds 240 bytes" in err
    assert "--count 8 to read those rows and leave the 144 bytes after them" in err

    for name, flags, want in (
        ("c", ["--dtype", "<f4", "--shape", "-1,3", "--count", "8"], coords),
        (
            "t",
            [
                "--dtype",
                ">i4",
                "--shape",
                "-1,3",
                "--offset",
                "96",
                "--count",
                "12",
                "--order",
                "F",
                "--num_shards",
                "2",
            ],
            triangles,
        ),
    ):
        out = tmp_path / name
        code, _, err = convert(data, out, "--format", "raw", *flags, capsys=capsys)
        assert code == 0, err
        got = read_back(out)
        assert got.dtype == want.dtype.newbyteorder("<") and np.array_equal(got, want)
        assert np.array_equal(tf_list_rows(out, want.dtype), want)  # auto encoding: float / int64 lists
        code, stdout, _ = run_command(verify_module.main, [out, "--source", data], capsys)
        assert code == 0 and "OK" in stdout, stdout

    # a sidecar may give the count too
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "surf.gii.dat").write_bytes(data.read_bytes())
    (tmp_path / "s" / "surf.gii.dat.json").write_text('{"dtype": "<f4", "shape": [-1, 3], "count": 8}')
    code, _, err = convert(tmp_path / "s" / "surf.gii.dat", tmp_path / "sc", "--format", "raw", capsys=capsys)
    assert code == 0, err
    assert np.array_equal(read_back(tmp_path / "sc"), coords)


def test_count_with_the_ranged_reads_of_remote_files(tmp_path, monkeypatch):
    """Remote raw files are read with ranged reads (one per column in Fortran order) instead of np.memmap: with
    --count, the columns are count rows long and the bytes after them are never read."""
    import types

    from tfrecord_etl.transforms.sources import RowRange, SourceOptions, raw as raw_module
    from tfrecord_etl.transforms.storage import fileio

    triangles = (np.arange(36).reshape(12, 3) * 7 - 100).astype(">i4")
    path = tmp_path / "surf.gii.dat"
    path.write_bytes(b"\1" * 96 + triangles.tobytes(order="F") + b"\2" * 40)
    monkeypatch.setattr(raw_module, "fileio", types.SimpleNamespace(**{**vars(fileio), "is_local": lambda p: False}))
    source = raw_module.RawSource(
        SourceOptions("raw", formats=(RawOptions(dtype=">i4", shape=(-1, 3), offset=96, order="F", count=12),))
    )
    assert source.index(str(path)).num_rows == 12
    for start, stop in ((0, 12), (5, 9), (11, 12)):
        got = source.read(RowRange(str(path), start, stop))["array"]
        assert got.dtype == np.dtype(">i4") and np.array_equal(got, triangles[start:stop])


@pytest.mark.parametrize(
    "flags, error, words",
    [
        (
            ["--dtype", ">i4", "--shape", "-1,3", "--offset", "96", "--count", "13"],
            "SourceError",
            [
                "--count 13 rows of 12 bytes (>i4 [3]) are 156 bytes, but the file holds 144 bytes after offset 96",
                "surf.gii.dat",
            ],
        ),
        (["--dtype", "<f4", "--shape", "-1,3", "--count", "21"], "SourceError", ["252 bytes", "holds 240 bytes"]),
        (
            ["--dtype", "<f4", "--shape", "7,3", "--count", "8"],
            "ConfigError",
            ["--count 8 disagrees with --shape [7, 3]"],
        ),
        (
            ["--dtype", "<f4", "--shape", "-1,3", "--count", "-1"],
            "ConfigError",
            ["'count': Input should be greater than or equal to 0"],
        ),
    ],
)
def test_count_past_the_end_or_disagreeing_is_refused(tmp_path, capsys, flags, error, words):
    data = tmp_path / "surf.gii.dat"
    data.write_bytes(b"\0" * 240)
    code, _, err = convert(data, tmp_path / "out", "--format", "raw", *flags, capsys=capsys)
    assert code == 2 and error in err and all(w in err for w in words), err
    assert not (tmp_path / "out").exists()
