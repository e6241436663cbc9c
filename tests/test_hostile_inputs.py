"""Hostile and careless input layouts: an output directory inside the tree the input pattern matches, file and
directory symlinks leading out of (or around) the pattern's base, the same file matched twice, and what a failed
run leaves in the temporary directory."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from tests.conftest import convert
from tfrecord_etl.pipelines import common


def image_tree(base, classes: dict[str, int]):
    """``base/CLASS/i.png`` for ``{CLASS: count}``: small PNGs, each distinct; returns ``base``."""
    from PIL import Image
    for name, count in classes.items():
        (base / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            value = (sum(name.encode()) + 37 * i) % 256
            Image.fromarray(np.full((3, 4, 3), value, np.uint8)).save(base / name / f"{i}.png")
    return base


# ------------------------------------------------------------------------------------------ runner logs

def test_a_failed_run_leaves_no_empty_runner_log(tmp_path, capsys, monkeypatch):
    """A failed run kept its runner log even when it held nothing (every failing run left an empty
    /tmp/tfrecord-etl-*.log); a log holding more than our echoed progress lines is kept and named."""
    logs = tmp_path / "tmp"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    tree = image_tree(tmp_path / "tree", {"cat": 2})
    (tree / "cat" / "notes.png").write_bytes(b"not an image")  # fails in the pipeline, not at planning
    code, _, err = convert(tree / "*" / "*", tmp_path / "out", "--format", "files", capsys=capsys)
    assert code == 2 and "not an image Pillow can identify" in err, err
    code, _, err = convert(tree / "cat" / "0.png", tmp_path / "out2", "--format", "files", "--file_labels", "none",
                           capsys=capsys)
    assert code == 0, err
    assert sorted(p.name for p in logs.iterdir()) == []
    for written, kept in ((b"[tfrecord-etl] shards 1/2\n", False), (b"Traceback (most recent call last):\n", True)):
        common.LAST_RUN_LOG = None
        with pytest.raises(RuntimeError):
            with common._worker_stderr_to_log():
                os.write(2, written)
                raise RuntimeError("a worker failed")
        left = list(logs.glob("tfrecord-etl-*.log"))
        assert (len(left), common.LAST_RUN_LOG is not None) == ((1, True) if kept else (0, False)), written
        if kept:
            assert left[0].read_bytes() == written and common.LAST_RUN_LOG == str(left[0])
            left[0].unlink()
    capsys.readouterr()


# ------------------------------------------------------------------------------------------ HDF5 datasets mode

def many_datasets(path, n=2000, cells=500):
    """``n`` datasets of two int64 values at the root, and a cell array ``/c`` of ``cells`` references into
    ``/#refs#``; returns ``{key: array}`` of what datasets mode converts."""
    import h5py
    want = {}
    with h5py.File(path, "w") as f:
        for i in range(n):
            f[f"d{i:05d}"] = want[f"/d{i:05d}"] = np.array([i, -i], "<i8")
        refs = f.create_group("#refs#")
        targets = []
        for k in range(cells):
            targets.append(refs.create_dataset(f"r{k}", data=np.full(3, k, "<i2")).ref)
            want[f"/c{{{k + 1}}}"] = np.full(3, k, "<i2")
        f.create_dataset("c", data=np.array(targets), dtype=h5py.ref_dtype)
    return want


def test_datasets_mode_keeps_a_small_record_per_dataset_and_max_datasets_limits_it(tmp_path, capsys, monkeypatch):
    """--hdf5_mode datasets on 20,000 two-element datasets took 1.06 GB peak (640 MB to plan): planning held every
    dataset open (about 16 KB each) and readers kept every dataset they read open. Now at most a few are open at a
    time, the plan holds a name and a size per dataset, and --max_datasets bounds the walk."""
    import pickle

    import h5py
    from tfrecord_etl.transforms import reader
    from tfrecord_etl.transforms.sources import SourceOptions, hdf5layout, make_source
    path = tmp_path / "many.h5"
    want = many_datasets(path)
    open_counts, cache_sizes, read_counts = [], [], []

    def counting(function, counts):
        def wrapped(dset, *args):
            counts.append(h5py.h5f.get_obj_count(dset.file.id, h5py.h5f.OBJ_DATASET))
            cache_sizes.append(dset.file.id.get_mdc_config().max_size)
            return function(dset, *args)
        return wrapped
    monkeypatch.setattr(hdf5layout, "kind_of", counting(hdf5layout.kind_of, open_counts))
    index = make_source("hdf5", SourceOptions(hdf5_mode="datasets")).index(str(path))
    assert index.num_rows == len(want) and len(open_counts) == 2001
    assert max(open_counts) <= 3, max(open_counts)  # planning: 2,001 open before
    assert max(cache_sizes) <= 256 * 1024  # HDF5's metadata cache bounded while walking
    assert len(pickle.dumps(index)) / index.num_rows < 40  # the planned record per dataset, in bytes
    monkeypatch.setattr(hdf5layout, "read_whole", counting(hdf5layout.read_whole, read_counts))
    cache_sizes.clear()
    code, _, err = convert(path, tmp_path / "out", "--hdf5_mode", "datasets", "--num_shards", "1", capsys=capsys)
    assert code == 0, err
    assert len(read_counts) == len(want) and max(read_counts) <= 3, max(read_counts)  # reading: 2,500 open before
    assert max(cache_sizes) <= 256 * 1024
    got = {np.asarray(e["key"]).item().decode(): e["array"] for e in reader.iter_numpy(str(tmp_path / "out"))}
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)
        assert got[key].dtype == value.dtype
    for flags, limit in ((["--hdf5_mode", "datasets"], 1000), (["--hdf5_mode", "datasets"], 2200), ([], 1000)):
        code, _, err = convert(path, tmp_path / "limited", *flags, "--max_datasets", str(limit), capsys=capsys)
        assert code == 2 and f"The file holds more than {limit:,} datasets (--max_datasets)" in err, err
        assert f"file='{path}'" in err and "raise the limit with --max_datasets N" in err
        assert not (tmp_path / "limited").exists()
    code, _, err = convert(path, tmp_path / "exact", "--hdf5_mode", "datasets", "--max_datasets", str(len(want)),
                           capsys=capsys)
    assert code == 0, err


def test_the_hdf5_walk_keeps_only_the_groups_it_is_in_open(tmp_path):
    """The walk remembered each group it had visited by its open ObjectID, so every group of the file stayed open
    until the walk ended (20,000 groups of one dataset: +36 MB to plan)."""
    import h5py
    from tfrecord_etl.transforms.sources import hdf5layout
    with h5py.File(tmp_path / "groups.h5", "w") as f:
        for i in range(500):
            f[f"g{i:03d}/sub/d"] = np.arange(2)
        f["g000/link"] = f["g001"]  # a second hard link to a group: visited once
    with h5py.File(tmp_path / "groups.h5", "r") as f:
        counts, paths = [], []
        for path, _, obj in hdf5layout.walk(f):
            counts.append(h5py.h5f.get_obj_count(f.id, h5py.h5f.OBJ_GROUP))
            paths.append(path)
            del obj
    assert len(paths) == 3 * 500 and "/g000/link/sub/d" in paths and "/g001" not in paths  # (reached first by link)
    assert max(counts) <= 4, max(counts)  # the file, the groups being walked, the object
