"""augment's join source takes convert's format options (--envi_rows, --dtype/--shape, --npy_mode, ...): joined
exactly (our reader and plain TensorFlow), the bad values and the options a join cannot use refused in one line
naming the flag, and --help listing them under their format's group."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, run_command
from tests.test_envi_source import cube_of, write_envi
from tfrecord_etl.transforms import reader


def _collection(tmp_path, capsys, rows):
    """A converted collection of ``rows`` records (feature ``array``: the row index)."""
    np.save(tmp_path / "x.npy", np.arange(rows, dtype="<i8"))
    assert convert(tmp_path / "x.npy", tmp_path / "src", capsys=capsys)[0] == 0
    return tmp_path / "src"


def _augment(tmp_path, capsys, *flags):
    from tfrecord_etl.pipelines import augment as augment_main

    argv = ["--input", tmp_path / "src", "--output_dir", tmp_path / "side", "--mode", "sidecar", *flags, *BEAM_FLAGS]
    return run_command(augment_main.main, argv, capsys)


def _plain_tf(out_dir, name, tf_type, shape):
    """Feature ``name`` of every record of the sidecar's shards, parsed with plain tf.train.Example parsing."""
    import tensorflow as tf

    files = sorted(str(p) for p in out_dir.iterdir() if p.name.endswith(".tfrecord"))
    spec = {name: tf.io.FixedLenFeature(shape, tf_type)}
    return np.stack([tf.io.parse_single_example(r, spec)[name].numpy() for r in tf.data.TFRecordDataset(files)])


def test_an_envi_cube_joins_one_pixel_per_record_with_envi_rows_pixels(tmp_path, capsys):
    cube = cube_of("i4", (4, 5, 3))  # 20 pixels of 3 bands
    write_envi(tmp_path / "scene.bsq", cube, "bsq", big_endian=True)
    _collection(tmp_path, capsys, 20)
    join = ["--join_input", tmp_path / "scene.bsq", "--join_fields", "array=spectrum"]
    code, _, err = _augment(tmp_path, capsys, *join)  # storage rows: 3 bands, not 20 rows
    assert code != 0 and "3 rows" in err and "20 records" in err, err
    code, _, err = _augment(tmp_path, capsys, *join, "--envi_rows", "pixels")
    assert code == 0, err
    want = cube.reshape(20, 3)
    got = np.stack([e["spectrum"] for e in reader.iter_numpy_merged(str(tmp_path / "src"), str(tmp_path / "side"))])
    assert got.dtype == want.dtype and np.array_equal(got, want)
    import tensorflow as tf  # small integer vectors: int64 lists (the auto encoding)

    assert np.array_equal(_plain_tf(tmp_path / "side", "spectrum", tf.int64, [3]), want)


def test_a_raw_file_without_a_sidecar_joins_with_dtype_and_shape(tmp_path, capsys):
    values = (np.arange(24).reshape(12, 2) * 1000).astype(">u2")
    (tmp_path / "pairs.raw").write_bytes(b"HEAD" + values.tobytes())
    _collection(tmp_path, capsys, 12)
    join = ["--join_input", tmp_path / "pairs.raw", "--join_fields", "array=pair"]
    code, _, err = _augment(tmp_path, capsys, *join, "--dtype", ">u2", "--shape", "-1,2", "--offset", "4")
    assert code == 0, err
    got = np.stack([e["pair"] for e in reader.iter_numpy_merged(str(tmp_path / "src"), str(tmp_path / "side"))])
    assert np.array_equal(got, values)
    import tensorflow as tf

    assert np.array_equal(_plain_tf(tmp_path / "side", "pair", tf.int64, [2]), values.astype("i8"))


def test_npy_files_mode_joins_one_file_per_record(tmp_path, capsys):
    parts = [np.full((2, 3), i, dtype="<f4") + np.arange(6, dtype="<f4").reshape(2, 3) for i in range(5)]
    (tmp_path / "parts").mkdir()
    for i, part in enumerate(parts):
        np.save(tmp_path / "parts" / f"p{i}.npy", part)
    _collection(tmp_path, capsys, 5)
    join = ["--join_input", tmp_path / "parts" / "*.npy", "--join_fields", "array=part", "--npy_mode", "files"]
    code, _, err = _augment(tmp_path, capsys, *join, "--encoding", "tensor")
    assert code == 0, err
    got = [e["part"] for e in reader.iter_numpy_merged(str(tmp_path / "src"), str(tmp_path / "side"))]
    assert len(got) == 5 and all(g.dtype == p.dtype and np.array_equal(g, p) for g, p in zip(got, parts))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--offset", "-4"], "'offset': Input should be greater than or equal to 0"),
        (["--max_compression_ratio", "0"], "'max_compression_ratio': Input should be greater than 0"),
        (["--row_group", "2", "--container_mode", "datasets"], "row_group chooses a row group in rows mode"),
        (["--row_group", "2", "--join_datasets", "/a"], "--join_datasets as its datasets"),
        (["--datasets", "/a"], "--datasets does not apply to augment: the join source's datasets are --join_datasets"),
        (["--file_labels", "none"], "--file_labels does not apply to augment: an option of a format that a join"),
    ],
)
def test_a_bad_or_refused_join_option_is_one_line_naming_the_flag(tmp_path, capsys, flags, message):
    (tmp_path / "a.npy").write_bytes(b"")
    code, _, err = _augment(tmp_path, capsys, "--join_input", tmp_path / "a.npy", *flags)
    assert code == 2 and message in err, err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    assert not (tmp_path / "side").exists()


def test_a_bad_choice_is_refused_by_the_parser_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _augment(tmp_path, capsys, "--join_input", tmp_path / "a.img", "--envi_rows", "pixel")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --envi_rows: invalid choice: 'pixel'" in err, err


def test_a_format_option_without_join_input_is_refused(tmp_path, capsys):
    _collection(tmp_path, capsys, 3)
    code, _, err = _augment(tmp_path, capsys, "--constants", "c=1", "--envi_rows", "pixels", "--dtype", "u1")
    assert code == 2 and "--dtype, --envi_rows describe the join source: they need --join_input" in err, err


def test_yaml_keys_and_old_names_reach_the_join_source(capsys, monkeypatch):
    from tfrecord_etl.transforms import renamed_flags
    from tfrecord_etl.transforms.augment import join_source_options
    from tfrecord_etl.transforms.augment.config import AugmentConfig
    from tfrecord_etl.transforms.sources.envi_options import EnviOptions
    from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions
    from tfrecord_etl.transforms.sources.options_raw import RawOptions

    monkeypatch.setattr(renamed_flags, "_WARNED_RENAMED", set())  # the deprecation line is printed once a process
    cfg = AugmentConfig(
        input="in", output_dir="out", join_input="j.h5", envi_rows="pixels", hdf5_mode="rows", join_datasets="/a,/b"
    )
    options = join_source_options(cfg)
    assert options.of(EnviOptions).envi_rows == "pixels" and options.container_mode == "rows"
    assert options.datasets == ("/a", "/b") and options.of(RawOptions).dtype is None
    assert options.of(NumpyOptions).npz_mode == "rows"
    assert "--hdf5_mode" in capsys.readouterr().err  # the deprecation line, as convert prints it


def test_help_lists_the_join_source_options_under_their_format_groups(capsys):
    from tfrecord_etl.pipelines import flaghelp

    groups = {g.title: g.flags for g in flaghelp.GROUPS["augment"]}
    assert groups["ENVI files"] == ("--envi_rows",) and "--dtype" in groups["raw files"]
    assert groups["HDF5 and containers"] == (
        "--row_group",
        "--container_mode",
        "--categoricals",
    )  # --datasets: --join_datasets
    assert "image and file collections" not in groups and "--max_compression_ratio" in groups["limits"]
    assert list(groups).index("join") < list(groups).index("ENVI files") < list(groups).index("encoding")
    assert "augment-envi_rows" in flaghelp.reference_markdown(["augment"])
