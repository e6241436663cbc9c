"""The rough edges a new user meets first; each test failed on the code before its fix."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, convert, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.output import metadata


def inspect(*args, capsys):
    from tfrecord_etl.pipelines import inspect as inspect_module

    return run_command(inspect_module.main, [str(a) for a in args], capsys)


def verify(*args, capsys):
    from tfrecord_etl.pipelines import verify as verify_module

    return run_command(verify_module.main, [str(a) for a in args], capsys)


@pytest.fixture
def varying(tmp_path, capsys):
    np.savez(tmp_path / "var.npz", a=np.zeros((2, 3)), b=np.ones(5), c=np.arange(4.0).reshape(2, 2))
    assert convert(tmp_path / "var.npz", tmp_path / "out", "--npz_mode", "arrays", capsys=capsys)[0] == 0
    return tmp_path / "out"


def test_an_unfinished_reader_generator_prints_nothing_at_exit(varying):
    """Was: 'TypeError: catching classes that do not inherit from BaseException' at interpreter exit."""
    code = f"from tfrecord_etl.transforms import reader; it = reader.iter_numpy({str(varying)!r}); next(it)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_tf_read_of_varying_shapes_counts_them_and_batching_them_is_a_clear_error(varying, capsys):
    """Was: a raw TensorFlow traceback (Cannot add tensor to the batch) from inspect --tf_read."""
    code, out, err = inspect(varying, "--tf_read", "--json", capsys=capsys)
    assert code == 0, err
    assert '"tf_read_records": 3' in out
    with pytest.raises(SchemaError, match=r"Cannot batch: the shape of \['array'\] varies"):
        reader.to_tf_dataset(str(varying), batch_size=2)
    assert len(list(reader.to_tf_dataset(str(varying), batch_size=2, features=["key"]))) == 2


def test_float128_in_npz_arrays_mode_names_the_member(tmp_path, capsys):
    np.savez(tmp_path / "f.npz", a=np.zeros(3), big=np.zeros(4, np.longdouble))
    code, _, err = convert(tmp_path / "f.npz", tmp_path / "out", "--npz_mode", "arrays", capsys=capsys)
    assert code == 2 and "float128" in err and "member 'big'" in err


@pytest.mark.parametrize(
    "name,words", [("in.h5", "an HDF5 file"), ("in.npz", "a zip archive (.npz)"), ("in.npy", "a .npy array")]
)
def test_inspect_and_verify_on_an_array_file_say_what_it_is(tmp_path, capsys, name, words):
    """Was: 'Length CRC mismatch: corrupt data or wrong compression'. inspect describes the inputs convert reads,
    verify says what the file is."""
    import h5py

    path = tmp_path / name
    if name.endswith(".h5"):
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(10)
    elif name.endswith(".npz"):
        np.savez(path, x=np.arange(10))
    else:
        np.save(path, np.arange(10))
    code, out, err = inspect(path, capsys=capsys)
    if name.endswith(".h5"):  # inspect lists an HDF5 file's datasets instead (see the tree test)
        assert code == 0 and "/x" in out and "group 1: 10 rows, 1 dataset" in out
    else:  # inspect says what convert makes of it (tests/test_formats.py)
        assert code == 0 and "convert makes 10 Examples, one per row" in out, err
    code, out, _ = verify(path, capsys=capsys)
    assert code == 1 and f"it starts like {words}" in out


def test_inspect_and_verify_on_a_directory_of_outputs_list_them(varying, tmp_path, capsys):
    """Was: 'No input file matches out/*' (inspect) and 'No metadata.json' (verify)."""
    parent = tmp_path / "outs"
    parent.mkdir()
    os.rename(varying, parent / "first")
    assert convert(tmp_path / "var.npz", parent / "second", "--npz_mode", "arrays", capsys=capsys)[0] == 0
    for run in (inspect, verify):
        code, out, err = run(parent, capsys=capsys)
        assert code == 2, out + err
        assert "Not an output directory: it holds 2 output directories (first, second)" in err


def test_skipped_hdf5_datasets_are_one_warning_line_per_file(tmp_path, caplog):
    """Was: one WARNING line per skipped scalar or dimension-scale dataset (19 for one NetCDF file)."""
    import h5py

    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.sources import SourceOptions

    with h5py.File(tmp_path / "nc.h5", "w") as f:
        f["data"] = np.zeros((4, 3))
        for i in range(5):
            f[f"s{i}"] = np.float64(i)
        for name in ("lat", "lon"):
            f[name] = np.arange(3.0)
            f[name].make_scale(name)
        f["nv"] = np.zeros(2, "f4")  # a netCDF-4 dimension with no variable: a placeholder, never data
        f["nv"].make_scale("This is a netCDF dimension but not a netCDF variable         2")
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        plan = planning.plan_inputs(str(tmp_path / "nc.h5"), SourceOptions())
    assert [s.name for s in plan.specs] == ["data"]
    lines = [r.getMessage() for r in caplog.records if "Skipping" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "5 scalar (/s0, /s1, /s2, ...)" in lines[0] and "1 netcdf-dimension (/nv)" in lines[0]
    groups = [r.getMessage() for r in caplog.records if "row groups" in r.getMessage()]
    assert len(groups) == 1 and "3 rows on dimension '/lat'" in groups[0], groups  # coordinates: groups of their own


def test_yaml_takes_the_flags_comma_syntax_and_a_typo_key_gets_a_suggestion(tmp_path, capsys):
    import h5py

    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["X"], f["obs"], f["other"] = np.zeros((3, 2)), np.ones(3), np.arange(4)
    (tmp_path / "a.yaml").write_text(f"input: {tmp_path / 'in.h5'}\noutput_dir: {tmp_path / 'o'}\ndatasets: /X,/obs\n")
    from tfrecord_etl.pipelines import convert as convert_module

    code, _, err = run_command(
        convert_module.main,
        ["--config", tmp_path / "a.yaml", "--runner=DirectRunner", "--direct_running_mode=in_memory"],
        capsys,
    )
    assert code == 0, err
    assert [s.name for s in metadata.load(str(tmp_path / "o"))["features"]] == ["X", "obs"]
    (tmp_path / "b.yaml").write_text(f"input: {tmp_path / 'in.h5'}\noutput_dir: {tmp_path / 'p'}\ndataset: /X\n")
    code, _, err = run_command(convert_module.main, ["--config", tmp_path / "b.yaml"], capsys)
    assert code == 2 and "unknown key 'dataset' (did you mean 'datasets'?)" in err


def test_inspect_an_hdf5_file_lists_its_tree_and_row_groups(tmp_path, capsys, caplog):
    """Before: the hint named h5ls, which is not installed with the project; a container file's 'lengths differ'
    error was one line of ~1,200 characters."""
    import h5py

    path = tmp_path / "adata.h5"
    with h5py.File(path, "w") as f:  # the shape of an AnnData file: obs x var matrix, per-obs and per-var tables
        f.create_dataset("X", data=np.zeros((50, 8), "<f4"), chunks=(10, 8), compression="gzip")
        for i in range(9):
            f[f"obs/col{i}"] = np.arange(50)
        f["var/names"] = np.array([b"g%d" % i for i in range(8)])
        f["uns/version"] = np.int64(1)
        f["linked"] = h5py.SoftLink("/X")
        f["lat"] = np.arange(4.0)
        f["lat"].make_scale("lat")
    code, out, err = inspect(path, capsys=capsys)
    assert code == 0, err
    assert "/X" in out and "float32" in out and "[50, 8]" in out and "chunks [10, 8], deflate" in out
    assert "/linked -> /X (soft link, not followed)" in out and "[scalar: skipped by convert]" in out
    assert "[coordinate variable]" in out
    assert "group 1: 50 rows, 10 datasets, 5200 bytes  ->  --row_group 1 or --datasets /X,/obs/col0," in out
    assert "8 rows, 1 dataset, 16 bytes  ->  --row_group 3 or --datasets /var/names" in out
    code, out, _ = inspect(path, "--json", capsys=capsys)
    import json

    tree = json.loads(out)
    assert tree["row_groups"][0]["rows"] == 50 and len(tree["row_groups"][0]["datasets"]) == 10
    names = tree["row_groups"][0]["datasets"] + tree["row_groups"][2]["datasets"]
    code, _, err = convert(path, tmp_path / "bad", "--datasets", ",".join(names), capsys=capsys)
    assert code == 2 and "and 5 more" in err and "tfrecord-etl inspect" in err and len(err) < 600
    flag = tree["row_groups"][0]["flag"].split(" ", 1)[1]
    code, _, err = convert(path, tmp_path / "out", "--datasets", flag, capsys=capsys)
    assert code == 0, err
    # with no --datasets the largest row group (X and the obs columns) is converted, the others named
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        code, _, err = convert(path, tmp_path / "default", capsys=capsys)
    assert code == 0, err
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "holds 3 row groups: converting group 1: 50 rows, 10 dataset(s)" in said and "--row_group 3" in said
    assert metadata.load(str(tmp_path / "default"))["features"] == metadata.load(str(tmp_path / "out"))["features"]


@pytest.mark.timeout(60)
def test_the_hdf5_tree_visits_a_hard_link_cycle_once(tmp_path, capsys):
    """The tree shares the source's walk: a group hard-linked into itself is listed once, not looped over."""
    import h5py

    with h5py.File(tmp_path / "loop.h5", "w") as f:
        f["g/x"] = np.arange(6)
        f["g/loop"] = f["g"]  # a hard link to an ancestor
    code, out, err = inspect(tmp_path / "loop.h5", capsys=capsys)
    assert code == 0, err
    assert out.count("/g/x ") == 1 and "6 rows, 1 dataset, 48 bytes  ->  --row_group 1 or --datasets /g/x" in out
