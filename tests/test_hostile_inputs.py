"""Hostile and careless input layouts: an output directory inside the tree the input pattern matches, file and
directory symlinks leading out of (or around) the pattern's base, the same file matched twice, and what a failed
run leaves in the temporary directory."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from tests.conftest import convert
from tfrecord_etl.pipelines import common, running


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
    # as after an earlier --verbose run in this process: a run without --verbose is quiet again
    monkeypatch.setenv("TFRECORD_ETL_VERBOSE", "1")
    tree = image_tree(tmp_path / "tree", {"cat": 2})
    (tree / "cat" / "notes.png").write_bytes(b"not an image")  # fails in the pipeline, not at planning
    code, _, err = convert(tree / "*" / "*", tmp_path / "out", "--format", "files", capsys=capsys)
    assert code == 2 and "not an image Pillow can identify" in err, err
    code, _, err = convert(
        tree / "cat" / "0.png", tmp_path / "out2", "--format", "files", "--file_labels", "none", capsys=capsys
    )
    assert code == 0, err
    assert sorted(p.name for p in logs.iterdir()) == []
    for written, kept in ((b"[tfrecord-etl] shards 1/2\n", False), (b"Traceback (most recent call last):\n", True)):
        running.LAST_RUN_LOG = None
        with pytest.raises(RuntimeError):
            with running._worker_stderr_to_log():
                os.write(2, written)
                raise RuntimeError("a worker failed")
        left = list(logs.glob("tfrecord-etl-*.log"))
        assert (len(left), running.LAST_RUN_LOG is not None) == ((1, True) if kept else (0, False)), written
        if kept:
            assert left[0].read_bytes() == written and str(left[0]) == running.LAST_RUN_LOG
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
    """--container_mode datasets on 20,000 two-element datasets took 1.06 GB peak (640 MB to plan): planning held every
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
    index = make_source("hdf5", SourceOptions(container_mode="datasets")).index(str(path))
    assert index.num_rows == len(want) and len(open_counts) == 2001
    assert max(open_counts) <= 3, max(open_counts)  # planning: 2,001 open before
    assert max(cache_sizes) <= 256 * 1024  # HDF5's metadata cache bounded while walking
    assert len(pickle.dumps(index)) / index.num_rows < 40  # the planned record per dataset, in bytes
    monkeypatch.setattr(hdf5layout, "read_whole", counting(hdf5layout.read_whole, read_counts))
    cache_sizes.clear()
    code, _, err = convert(path, tmp_path / "out", "--container_mode", "datasets", "--num_shards", "1", capsys=capsys)
    assert code == 0, err
    assert len(read_counts) == len(want) and max(read_counts) <= 3, max(read_counts)  # reading: 2,500 open before
    assert max(cache_sizes) <= 256 * 1024
    got = {np.asarray(e["key"]).item().decode(): e["array"] for e in reader.iter_numpy(str(tmp_path / "out"))}
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)
        assert got[key].dtype == value.dtype
    for flags, limit in (
        (["--container_mode", "datasets"], 1000),
        (["--container_mode", "datasets"], 2200),
        ([], 1000),
    ):
        code, _, err = convert(path, tmp_path / "limited", *flags, "--max_datasets", str(limit), capsys=capsys)
        assert code == 2 and f"The file holds more than {limit:,} datasets (--max_datasets)" in err, err
        assert f"file='{path}'" in err and "raise the limit with --max_datasets N" in err
        assert not (tmp_path / "limited").exists()
    code, _, err = convert(
        path, tmp_path / "exact", "--container_mode", "datasets", "--max_datasets", str(len(want)), capsys=capsys
    )
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


# ------------------------------------------------------------------------------------------ output inside the inputs


def tree_bytes(base) -> dict:
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def label_names(out) -> list:
    import json

    return json.loads((out / "metadata.json").read_text())["files"]["label_names"]


def test_an_output_the_input_pattern_would_match_is_refused_for_every_source(tmp_path, capsys):
    """--format files --input 'tree/*/*' --output_dir tree/out: the first run wrote its shards where the pattern
    matches; the identical second run read them as images of a class 'out', deleted them as an earlier run's
    files, then failed. --output_dir tree/cat --overwrite wrote into an input class folder with exit 0."""
    import h5py

    tree = image_tree(tmp_path / "tree", {"cat": 3, "dog": 3})
    before = tree_bytes(tree)
    for _ in range(2):  # the identical command twice: refused both times, before anything is written
        code, _, err = convert(tree / "*" / "*", tree / "out", "--format", "files", capsys=capsys)
        assert code == 2 and "--input matches the files this run writes in --output_dir" in err, err
        assert f"'{tree}/out/data-00000-of-0000" in err and f"outside '{tree}'" in err
        assert not (tree / "out").exists() and tree_bytes(tree) == before
    code, _, err = convert(tree / "*" / "*", tree / "cat", "--format", "files", "--overwrite", capsys=capsys)
    assert code == 2 and "An input file is inside --output_dir" in err and f"{tree}/cat/0.png" in err, err
    assert tree_bytes(tree) == before
    code, _, err = convert(
        tree / "*" / "*", tmp_path / "out", "--format", "files", "--dead_letter_dir", tree / "dead", capsys=capsys
    )
    assert code == 2 and "--input matches the files this run writes in --dead_letter_dir" in err, err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "labels.csv").write_text("file,label\n0.png,a\n1.png,a\n2.png,b\n")
    code, _, err = convert(
        tree / "cat" / "*",
        tmp_path / "out",
        "--format",
        "files",
        "--file_labels",
        tmp_path / "out" / "labels.csv",
        "--overwrite",
        capsys=capsys,
    )
    assert code == 2 and "An input file is inside --output_dir" in err and "labels.csv" in err, err
    # the same layout with another source
    (tmp_path / "h5" / "a").mkdir(parents=True)
    with h5py.File(tmp_path / "h5" / "a" / "x.h5", "w") as f:
        f["x"] = np.arange(10)
    code, _, err = convert(tmp_path / "h5" / "*" / "*", tmp_path / "h5" / "out", "--format", "hdf5", capsys=capsys)
    assert code == 2 and "--input matches the files this run writes" in err, err
    # a pattern that cannot match the output may write inside the tree, and run again
    for _ in range(2):
        code, _, err = convert(tree / "*" / "*.png", tree / "out", "--format", "files", capsys=capsys)
        assert code == 0, err
        assert label_names(tree / "out") == ["cat", "dog"]
    assert {k: v for k, v in tree_bytes(tree).items() if not k.startswith("out/")} == before


# ------------------------------------------------------------------------------------------ symbolic links


def test_class_folder_symlinks_inside_the_tree_are_followed_and_outside_ones_refused(tmp_path, capsys):
    """A class folder 'dog -> ../shared_dog' was skipped without a word (3 of 6 files, label_names only cat)."""
    from tfrecord_etl.transforms import reader

    image_tree(tmp_path, {"shared_dog": 3})
    tree = image_tree(tmp_path / "tree", {"cat": 3})
    (tree / "dog").symlink_to("../shared_dog")  # leads outside the pattern's base 'tree'
    code, _, err = convert(tree / "*" / "*", tmp_path / "out", "--format", "files", capsys=capsys)
    assert code == 2 and "Symbolic links the pattern matches lead outside its base directory" in err, err
    assert f"'{tree}/dog' -> '{tmp_path}/shared_dog'" in err and "--follow_symlinks" in err
    assert not (tmp_path / "out").exists()
    code, _, err = convert(tree / "*" / "*", tmp_path / "out", "--format", "files", "--follow_symlinks", capsys=capsys)
    assert code == 0, err
    got = {
        np.asarray(e["filename"]).item().decode(): np.asarray(e["image"]).item()
        for e in reader.iter_numpy(str(tmp_path / "out"))
    }
    assert label_names(tmp_path / "out") == ["cat", "dog"] and len(got) == 6
    for i in range(3):
        assert got[f"dog/{i}.png"] == (tmp_path / "shared_dog" / f"{i}.png").read_bytes()
    common.preload_tensorflow()
    import tensorflow as tf  # plain TensorFlow reads the same bytes

    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "filename": tf.io.FixedLenFeature([], tf.string),
        "label/text": tf.io.FixedLenFeature([], tf.string),
    }
    shards = sorted(str(p) for p in (tmp_path / "out").glob("*.tfrecord"))
    parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(shards)]
    assert {e["filename"].numpy().decode(): e["image"].numpy() for e in parsed} == got
    assert sorted(e["label/text"].numpy().decode() for e in parsed) == ["cat"] * 3 + ["dog"] * 3
    # the same link inside the tree: followed without a flag
    inner = image_tree(tmp_path / "inner", {"cat": 3, "shared/dog": 3})
    (inner / "dog").symlink_to("shared/dog")
    code, _, err = convert(inner / "*" / "*", tmp_path / "inner_out", "--format", "files", capsys=capsys)
    assert code == 0, err
    assert label_names(tmp_path / "inner_out") == ["cat", "dog"]
    assert len(list(reader.iter_numpy(str(tmp_path / "inner_out")))) == 6


@pytest.mark.parametrize("header", [True, False])
def test_a_file_symlink_out_of_the_tree_is_not_followed_without_the_flag(tmp_path, capsys, header):
    """--format files --no-image_header followed cat/passwd.png -> /etc/passwd into the shard, exit 0; a symlink to
    an image outside the tree was read silently."""
    secret = tmp_path / "elsewhere" / "passwd"
    secret.parent.mkdir()
    secret.write_bytes(b"root:x:0:0:SECRET-BYTES-NEVER-TO-BE-READ:/root:/bin/bash\n")
    image_tree(tmp_path / "elsewhere", {"img": 1})
    tree = image_tree(tmp_path / "tree", {"cat": 2})
    (tree / "cat" / "passwd.png").symlink_to(secret if not header else tmp_path / "elsewhere" / "img" / "0.png")
    flags = ["--format", "files"] + ([] if header else ["--no-image_header"])
    code, _, err = convert(tree / "*" / "*", tmp_path / "out", *flags, capsys=capsys)
    assert code == 2 and f"'{tree}/cat/passwd.png' -> " in err and "not followed" in err, err
    assert not (tmp_path / "out").exists()
    code, _, err = convert(tree / "*" / "*", tmp_path / "out", *flags, "--follow_symlinks", capsys=capsys)
    assert code == 0, err  # named by the flag: read
    (tree / "cat" / "passwd.png").unlink()
    (tree / "cat" / "gone.png").symlink_to(tmp_path / "nothing-here.png")
    code, _, err = convert(tree / "*" / "*", tmp_path / "out2", *flags, capsys=capsys)
    assert code == 2 and "point to nothing" in err and f"'{tree}/cat/gone.png'" in err, err


def test_a_symlink_loop_ends_the_walk_with_a_warning(tmp_path, capsys, caplog):
    from tfrecord_etl.transforms.collections import matching
    from tfrecord_etl.transforms.storage import fileio

    tree = image_tree(tmp_path / "tree", {"cat": 2})
    (tree / "cat" / "up").symlink_to("..")
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        files = matching.match_inputs(str(tree) + "/**.png")
    assert [p for p, _ in files] == [f"{tree}/cat/0.png", f"{tree}/cat/1.png"]
    assert f"'{tree}/cat/up'" in caplog.text and "loop" in caplog.text
    assert [p for p, _ in files] == [p for p, _ in fileio.match(str(tree) + "/**.png")]  # as Beam without links


# ------------------------------------------------------------------------------------------ one file, two names


def test_the_same_file_matched_twice_is_refused_naming_both(tmp_path, capsys):
    """--input 'twice/*.h5' with b.h5 a symlink to a.h5 gave 4,000 examples from 2,000 rows, no warning."""
    import h5py

    (tmp_path / "twice").mkdir()
    with h5py.File(tmp_path / "twice" / "a.h5", "w") as f:
        f["x"] = np.arange(2000)
    (tmp_path / "twice" / "b.h5").symlink_to("a.h5")
    code, _, err = convert(tmp_path / "twice" / "*.h5", tmp_path / "out", capsys=capsys)
    assert code == 2 and "Files matched under two names (1)" in err, err
    assert f"'{tmp_path}/twice/a.h5' and '{tmp_path}/twice/b.h5' are the same file" in err
    assert not (tmp_path / "out").exists()
    code, _, err = convert(tmp_path / "twice" / "b.h5", tmp_path / "out", capsys=capsys)  # named alone: read
    assert code == 0, err
    (tmp_path / "hard").mkdir()
    os.link(tmp_path / "twice" / "a.h5", tmp_path / "hard" / "c.h5")
    os.link(tmp_path / "twice" / "a.h5", tmp_path / "hard" / "d.h5")
    code, _, err = convert(tmp_path / "hard" / "*.h5", tmp_path / "out2", capsys=capsys)
    assert code == 2 and f"'{tmp_path}/hard/c.h5' and '{tmp_path}/hard/d.h5' are the same file" in err, err
    tree = image_tree(tmp_path / "tree", {"cat": 2})
    (tree / "kitten").symlink_to("cat")  # a class folder reached twice
    code, _, err = convert(tree / "*" / "*", tmp_path / "out3", "--format", "files", capsys=capsys)
    assert code == 2 and "Files matched under two names (2)" in err, err
    assert f"'{tree}/cat/0.png' and '{tree}/kitten/0.png'" in err
