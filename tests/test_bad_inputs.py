"""Bad input gets one clear error naming the file (and dataset / row range), and no complete-looking output."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.conftest import convert


def h5_uneven(p):
    with h5py.File(p, "w") as f:
        f["a"] = np.zeros(5)
        f["g/b"] = np.zeros(6)


def h5_vlen_numeric(p):
    with h5py.File(p, "w") as f:
        d = f.create_dataset("v", (3,), dtype=h5py.vlen_dtype(np.int32))
        d[0] = [1, 2]


def fits_truncated(p):
    from astropy.io import fits

    fits.PrimaryHDU(np.arange(4000, dtype=">i4").reshape(100, 40)).writeto(p)
    p.write_bytes(p.read_bytes()[:9000])


def npz_corrupt(p):
    np.savez(p, a=np.arange(10))
    data = bytearray(p.read_bytes())
    p.write_bytes(bytes(data[: len(data) // 2]))


def npz_truncated_member(p):
    import zipfile

    with zipfile.ZipFile(p, "w") as z:
        z.writestr("a.npy", _npy_bytes(np.arange(100.0))[:-40])


def _npy_bytes(arr):
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


CASES = {
    # name: (file name, writer, extra flags, error type, words that must appear)
    "pattern matches nothing": ("nothing-*.h5", None, [], "SourceError", ["No input file matches"]),
    "directory instead of file": ("adir", lambda p: p.mkdir(), [], "SourceError", ["directory"]),
    "not HDF5 bytes": (
        "fake.h5",
        lambda p: p.write_bytes(b"not hdf5 at all" * 10),
        [],
        "SourceError",
        ["Not a readable HDF5 file"],
    ),
    "truncated FITS": (
        "cut.fits",
        fits_truncated,
        [],
        "SourceError",
        ["HDU 'PRIMARY' declares 16,000 data bytes from byte offset 2,880, beyond the file's end (9,000 bytes)"],
    ),
    "truncated HDF5": (
        "trunc.h5",
        lambda p: (h5_uneven(p), p.write_bytes(p.read_bytes()[:700])),
        [],
        "SourceError",
        ["HDF5"],
    ),
    "mismatched leading lengths": (
        "uneven.h5",
        h5_uneven,
        ["--datasets", "/a,/g/b"],
        "SchemaError",
        ["different leading lengths", "'/a': 5", "'/g/b': 6"],
    ),
    "vlen numeric": ("vlen.h5", h5_vlen_numeric, [], "SchemaError", ["variable-length numeric", "'/v'"]),
    "object npy": (
        "obj.npy",
        lambda p: np.save(p, np.array([1, "a"], dtype=object), allow_pickle=True),
        [],
        "SchemaError",
        ["never unpickled"],
    ),
    "datetime list is fine but complex list is not": (
        "c.npy",
        lambda p: np.save(p, np.zeros(4, "c8")),
        ["--encoding", "list"],
        "SchemaError",
        ["complex numbers have no list form", "'array'"],
    ),
    "lossy cast refused": (
        "f.npy",
        lambda p: np.save(p, np.zeros(4, "f8")),
        ["--encoding", "list"],
        "SchemaError",
        ["float64 -> float32", "allow_lossy"],
    ),
    "corrupt npz": ("bad.npz", npz_corrupt, [], "SourceError", ["Not a valid .npz"]),
    "truncated npz member": ("tr.npz", npz_truncated_member, [], "SourceError", ["Truncated array data", "'a'"]),
    "unknown suffix": ("data.csv", lambda p: p.write_text("1,2"), [], "SourceError", ["--format"]),
    "datasets names a group": ("grp.h5", h5_uneven, ["--datasets", "/g"], "SourceError", ["Not a dataset", "/g"]),
    "raw: no dtype or shape": (
        "x.raw",
        lambda p: p.write_bytes(b"\0" * 12),
        [],
        "ConfigError",
        ["needs the array's dtype and shape", "--dtype", "sidecar"],
    ),
    "raw: not a whole number of rows": (
        "r.raw",
        lambda p: p.write_bytes(b"\0" * 50),
        ["--dtype", "<f4", "--shape", "-1,3"],
        "SourceError",
        ["not a whole number of rows of 12 bytes", "2 bytes remain"],
    ),
    "raw: declared shape larger than the file": (
        "big.raw",
        lambda p: p.write_bytes(b"\0" * 64),
        ["--dtype", "<f8", "--shape", "100000000,32"],
        "SourceError",
        ["25600000000 bytes", "holds 64 bytes"],
    ),
    "raw: -1 not first": (
        "m.raw",
        lambda p: p.write_bytes(b"\0" * 64),
        ["--dtype", "<f8", "--shape", "4,-1"],
        "ConfigError",
        ["only the first may be -1"],
    ),
    "raw: object dtype": (
        "o.raw",
        lambda p: p.write_bytes(b"\0" * 64),
        ["--dtype", "O", "--shape", "-1"],
        "SchemaError",
        ["Python objects"],
    ),
    "raw: offset past the end": (
        "e.raw",
        lambda p: p.write_bytes(b"\0" * 8),
        ["--dtype", "u1", "--shape", "-1", "--offset", "9"],
        "SourceError",
        ["holds 8 bytes, less than --offset 9"],
    ),
    "raw: sidecar disagrees with a flag": (
        "s.raw",
        lambda p: (p.write_bytes(b"\0" * 8), p.with_name("s.raw.json").write_text('{"dtype": "<i4", "shape": [-1]}')),
        ["--dtype", "<f4"],
        "ConfigError",
        ["--dtype '<f4' disagrees with dtype: '<i4'"],
    ),
    "raw: sidecar with an unknown key": (
        "k.raw",
        lambda p: (
            p.write_bytes(b"\0" * 8),
            p.with_name("k.raw.yaml").write_text("dtype: u1\nshape: [-1]\nendian: big\n"),
        ),
        [],
        "ConfigError",
        ["unknown keys ['endian']"],
    ),
    "packbits on floats": (
        "pf.npy",
        lambda p: np.save(p, np.zeros((4, 3), "f4")),
        ["--feature_encodings", "array=packbits"],
        "SchemaError",
        ["packbits encoding stores booleans", "'array'"],
    ),
    "packbits on a uint8 that is not 0/1": (
        "pu.npy",
        lambda p: np.save(p, np.arange(12, dtype="u1").reshape(4, 3)),
        ["--feature_encodings", "array=packbits"],
        "RecordError",
        ["other than 0 and 1", "rows='0-3'", "batch_row=0"],
    ),
    "files: a file that is not an image with --image_header": (
        "flat",
        lambda p: (p.mkdir(), (p / "a.png").write_bytes(b"x")),
        ["--format", "files", "--image_header"],
        "SourceError",
        ["not an image Pillow can identify", "a.png", "--no-image_header"],
    ),
    "files: a labels table without its header": (
        "tbl",
        lambda p: (
            p.mkdir(),
            (p / "c").mkdir(),
            (p / "c" / "a.png").write_bytes(b"x"),
            (p / "l.csv").write_text("a.png,c\n"),
        ),
        ["--format", "files", "--file_labels", "LABELS"],
        "ConfigError",
        ["header row 'file,label"],
    ),
    "unknown feature in feature_encodings": (
        "ok.npy",
        lambda p: np.save(p, np.zeros(3)),
        ["--feature_encodings", "nope=list"],
        "ConfigError",
        ["nope"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_clear_error(tmp_path, capsys, case):
    name, write, flags, error, words = CASES[case]
    path = tmp_path / name
    if write:
        write(path)
    out = tmp_path / "out"
    flags = [str(path / "l.csv") if f == "LABELS" else f for f in flags]
    pattern = (
        path / "*" / "*" if case.startswith("files: a labels") else path / "*" if case.startswith("files") else path
    )
    code, stdout, err = convert(pattern, out, *flags, capsys=capsys)
    assert code == 2, (stdout, err)
    assert err.startswith(f"error: {error}:"), err
    assert len(err.strip().splitlines()) == 1, err
    for w in words + ([name] if case != "unknown feature in feature_encodings" else []):
        assert w in err, (w, err)
    assert not (out / "metadata.json").exists()


def test_truncated_rows_of_npy_name_the_row_range(tmp_path, capsys):
    """A .npy cut short after planning: the worker's error names the file and row range."""
    path = tmp_path / "a.npy"
    np.save(path, np.arange(1000, dtype="<i8").reshape(100, 10))
    from tfrecord_etl.transforms.errors import SourceError
    from tfrecord_etl.transforms.planning import plan_inputs
    from tfrecord_etl.transforms.sources import SourceOptions

    plan = plan_inputs(str(path), SourceOptions(target_range_bytes=800, format="npy"))
    path.write_bytes(path.read_bytes()[:-500])
    with pytest.raises(SourceError, match=r"a\.npy.*rows='\d+-\d+'.*truncated"):
        [plan.source.read(r) for r in plan.ranges]


def test_existing_output_dir_is_refused_unless_overwrite(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.arange(10))
    out = tmp_path / "out"
    assert convert(tmp_path / "a.npy", out, capsys=capsys)[0] == 0
    # the same command again (an Airflow retry) is allowed; another config is not
    assert convert(tmp_path / "a.npy", out, capsys=capsys)[0] == 0
    code, _, err = convert(tmp_path / "a.npy", out, "--compression", "gzip", capsys=capsys)
    assert code == 2 and "complete output of another run" in err and "--overwrite" in err
    assert convert(tmp_path / "a.npy", out, "--compression", "gzip", "--overwrite", capsys=capsys)[0] == 0
    (out / "metadata.json").unlink()
    (out / "notes.txt").write_text("mine")
    code, _, err = convert(tmp_path / "a.npy", out, capsys=capsys)
    assert code == 2 and "holds files tfrecord-etl did not write (notes.txt)" in err
    assert (out / "notes.txt").exists()
    assert convert(tmp_path / "a.npy", out, "--overwrite", capsys=capsys)[0] == 0
    # --overwrite replaces only our files: the user's notes.txt stays (hostile group 1)
    assert (out / "notes.txt").read_text() == "mine" and (out / "metadata.json").exists()


@pytest.mark.parametrize(
    "yaml_text,words",
    [
        ("input: [unclosed", "Invalid YAML"),
        ("colour: blue\n", "unknown key 'colour'"),
        ("num_shards: many\n", "'num_shards'"),
        ("compression: lz4\n", "'compression'"),
        ("- a list\n", "mapping"),
    ],
)
def test_invalid_config_is_one_line(tmp_path, capsys, yaml_text, words):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import convert as convert_module

    code, _, err = run_command(
        convert_module.main, ["--config", cfg, "--input", "x.npy", "--output_dir", tmp_path / "o"], capsys
    )
    assert code == 2 and err.startswith("error: ConfigError") and words in err, err
    assert len(err.strip().splitlines()) == 1


def test_missing_input_is_one_line(tmp_path, capsys):
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import convert as convert_module

    code, _, err = run_command(convert_module.main, ["--output_dir", tmp_path / "o"], capsys)
    assert code == 2 and "missing required key 'input' (--input)" in err
