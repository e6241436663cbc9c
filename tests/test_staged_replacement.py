"""A run that replaces an output writes the new generation beside the old one and commits by replacing
``metadata.json``; only then are the old files deleted. A kill at any moment (the launcher with SIGKILL at a chosen
stage, through ``outdir.failpoint``), a full disk or too little free space leaves the old output complete and
readable, or the new one; an immediate re-run is exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, ROOT, convert
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import outdir


def make_h5(path, rows, start):
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(start, start + rows, dtype="<i8")
        f["x"] = np.arange(start, start + rows, dtype="<f4")[:, None] * np.ones(4, "<f4")
    return path


def ids(out):
    """The ``id`` of every example, with our reader and with plain TensorFlow over metadata.json's shard list."""
    import tensorflow as tf

    ours = [int(e["id"]) for e in reader.iter_numpy(str(out))]
    meta = json.loads((out / "metadata.json").read_text())
    comp = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}[meta["compression"]]
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    plain = [
        int(tf.io.parse_single_example(r, spec)["id"])
        for r in tf.data.TFRecordDataset([str(out / s["file"]) for s in meta["shards"]], comp)
    ]
    assert plain == ours
    return ours


def listed(out):
    meta = json.loads((out / "metadata.json").read_text())
    return {s["file"] for s in meta["shards"]} | {s["index"] for s in meta["shards"] if "index" in s}


def run_convert_process(inp, out, *flags, failpoint=None):
    """``python -m pipelines.convert`` as a process (in-process DirectRunner), killed at ``failpoint``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(outdir.FAILPOINT_ENV, None)
    if failpoint:
        env[outdir.FAILPOINT_ENV] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "pipelines.convert", "--input", str(inp), "--output_dir", str(out), *flags, *BEAM_FLAGS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inputs")
    return make_h5(tmp / "old.h5", 300, 0), make_h5(tmp / "new.h5", 450, 10_000)


@pytest.mark.parametrize("stage", ["prepared", "before-commit", "committed"])
def test_a_launcher_killed_during_overwrite_leaves_the_old_output_or_the_new(inputs, tmp_path, stage):
    old, new = inputs
    out = tmp_path / "out"
    assert run_convert_process(old, out, "--num_shards", "2").returncode == 0
    before = listed(out)
    killed = run_convert_process(new, out, "--num_shards", "3", "--overwrite", failpoint=stage)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    if stage == "committed":
        assert ids(out) == list(range(10_000, 10_450))  # the new output, committed before the kill
    else:
        assert ids(out) == list(range(300)) and listed(out) <= set(os.listdir(out))  # the old one, complete
        assert listed(out) == before
    rerun = run_convert_process(new, out, "--num_shards", "3", "--overwrite")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert ids(out) == list(range(10_000, 10_450))
    names = set(os.listdir(out))
    assert names == listed(out) | {"metadata.json", "schema.pbtxt", outdir.MARKER_FILE}, sorted(names)


def test_overwrite_alternates_generations_and_deletes_the_old_after_commit(inputs, tmp_path, capsys):
    """Same shard count twice: the second run cannot take the committed names, so it writes the other
    generation's (``data-g1-...``); the third goes back. Each leaves exactly its own files."""
    old, new = inputs
    out = tmp_path / "out"
    assert convert(old, out, "--num_shards", "2", capsys=capsys)[0] == 0
    assert listed(out) == {"data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord"}
    code, _, err = convert(new, out, "--num_shards", "2", "--overwrite", "--index", capsys=capsys)
    assert code == 0, err
    assert listed(out) == {
        "data-g1-00000-of-00002.tfrecord",
        "data-g1-00001-of-00002.tfrecord",
        "data-g1-00000-of-00002.idx",
        "data-g1-00001-of-00002.idx",
    }
    assert "keeping the complete output" in err and "removing 2 files of the output this run replaced" in err
    assert set(os.listdir(out)) == listed(out) | {"metadata.json", "schema.pbtxt", outdir.MARKER_FILE}
    assert ids(out) == list(range(10_000, 10_450))
    assert reader.get(str(out), 449)["id"] == 10_449  # the index files of the new generation
    code, _, err = convert(old, out, "--num_shards", "2", "--overwrite", capsys=capsys)  # same options: a re-run
    assert code == 0, err
    assert listed(out) == {"data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord"}
    assert set(os.listdir(out)) == listed(out) | {"metadata.json", "schema.pbtxt", outdir.MARKER_FILE}
    assert ids(out) == list(range(300))


def test_too_little_free_space_is_refused_before_anything_is_deleted(inputs, tmp_path, capsys, monkeypatch):
    import collections
    import shutil

    old, new = inputs
    out = tmp_path / "out"
    assert convert(old, out, capsys=capsys)[0] == 0
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    code, _, err = convert(new, out, "--overwrite", capsys=capsys)
    assert code != 0 and "Not enough free space: the run writes at least" in err
    assert "beside the current output" in err and "Traceback" not in err
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before


@pytest.mark.timeout(300)
def test_a_full_disk_during_overwrite_keeps_the_old_output(tmp_path, capsys):
    from tests.test_hostile_config import tiny_tmpfs

    small = tmp_path / "small.npy"
    np.save(small, np.random.default_rng(1).random((50, 32)))  # 12.8 KB
    big = tmp_path / "big.npy"
    np.save(big, np.random.default_rng(0).random((1000, 32)))  # 256 KB: does not fit beside it
    with tiny_tmpfs(tmp_path / "mnt", "96k") as mnt:
        out = mnt / "out"
        assert convert(small, out, "--compression", "gzip", capsys=capsys)[0] == 0
        first = list(reader.iter_numpy(str(out)))
        code, _, err = convert(big, out, "--compression", "gzip", "--overwrite", capsys=capsys)
        assert code != 0 and "No space left on device" in err
        again = list(reader.iter_numpy(str(out)))
        assert len(again) == len(first) == 50
        for a, b in zip(first, again):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])


def test_augment_overwrite_killed_before_commit_keeps_its_old_output(inputs, tmp_path):
    old, _ = inputs
    coll = tmp_path / "coll"
    assert run_convert_process(old, coll, "--num_shards", "2").returncode == 0
    out = tmp_path / "aug"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")

    def augment(constant, failpoint=None):
        e = dict(env, **({outdir.FAILPOINT_ENV: failpoint} if failpoint else {}))
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pipelines.augment",
                "--input",
                str(coll),
                "--output_dir",
                str(out),
                "--constants",
                f"k={constant}",
                "--overwrite",
                *BEAM_FLAGS,
            ],
            cwd=ROOT,
            env=e,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert augment(1).returncode == 0
    assert {int(e["k"]) for e in reader.iter_numpy(str(out))} == {1}
    assert augment(2, failpoint="before-commit").returncode == -signal.SIGKILL
    assert {int(e["k"]) for e in reader.iter_numpy(str(out))} == {1} and ids(out) == list(range(300))
    done = augment(2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert {int(e["k"]) for e in reader.iter_numpy(str(out))} == {2} and ids(out) == list(range(300))
    assert set(os.listdir(out)) == listed(out) | {"metadata.json", "schema.pbtxt", outdir.MARKER_FILE}


def test_a_tfds_split_rerun_is_staged_and_loads(inputs, tmp_path, capsys):
    """Replacing a TFDS split writes it under the other generation's names; TFDS's file template records them,
    so ``builder_from_directory`` loads both splits."""
    tfds = pytest.importorskip("tensorflow_datasets")
    old, new = inputs
    out = tmp_path / "ds"
    for inp, split in ((old, "train"), (new, "test")):
        code, _, err = convert(inp, out, "--tfds_name", "arrays", "--split", split, "--encoding", "list", capsys=capsys)
        assert code == 0, err
    code, _, err = convert(
        new, out, "--tfds_name", "arrays", "--split", "test", "--encoding", "list", "--overwrite", capsys=capsys
    )
    assert code == 0, err
    assert any(n.startswith("arrays-g1-test.tfrecord-") for n in listed(out))
    assert any(n.startswith("arrays-train.tfrecord-") for n in listed(out))
    assert set(os.listdir(out)) == listed(out) | {
        "metadata.json",
        "schema.pbtxt",
        outdir.MARKER_FILE,
        "dataset_info.json",
        "features.json",
    }
    builder = tfds.builder_from_directory(str(out))
    test = [int(e["id"]) for e in tfds.as_numpy(builder.as_dataset(split="test"))]
    train = [int(e["id"]) for e in tfds.as_numpy(builder.as_dataset(split="train"))]
    assert test == list(range(10_000, 10_450)) and train == list(range(300))


def test_generation_names():
    assert outdir.generation_name("data-00000-of-00004.tfrecord.gz", 1) == "data-g1-00000-of-00004.tfrecord.gz"
    assert outdir.generation_name("data-00000-of-00004.tfrecord.gz", 0) == "data-00000-of-00004.tfrecord.gz"
    assert outdir.generation_name("penguin.tfrecord", 1) == "penguin-g1.tfrecord"
    assert outdir.generation_prefix("my-data", 1) + "-00000" == outdir.generation_name("my-data-00000", 1)
    assert outdir.generation_prefix("data", 1) + "-00000" == outdir.generation_name("data-00000", 1)


def test_a_failed_run_keeps_only_its_committed_shards_unlisted_beside_the_old_output(inputs, tmp_path, capsys):
    """A run that fails (a corrupt chunk, no --dead_letter_dir) after some of its shards were renamed into place:
    it removes its temporaries before it lets the lock go and keeps the shards it committed, with their receipts,
    for ``--resume`` (tests/test_resume.py): metadata.json does not list them, so the directory's output is the old
    one, and the last line says how to resume. The next run without ``--resume`` removes them by name."""
    from tests.test_reliability import corrupt_h5

    old, _ = inputs
    out = tmp_path / "out"
    assert convert(old, out, "--num_shards", "2", capsys=capsys)[0] == 0
    before = set(os.listdir(out)) - {outdir.MARKER_FILE}
    corrupt_h5(tmp_path / "bad.h5")  # rows 300-399 of 1000 unreadable: shards 0-2 of 10 are written first
    code, _, err = convert(tmp_path / "bad.h5", out, "--num_shards", "10", "--overwrite", capsys=capsys)
    assert code == 2 and "Cannot read rows 300-399" in err, err
    assert err.strip().splitlines()[-1].endswith("the same command with --resume writes only the missing ones")
    kept = set(os.listdir(out)) - {outdir.MARKER_FILE} - before
    assert kept == {f"data-0000{i}-of-00010.tfrecord" for i in range(3)} | {
        f".tf-etl-done-0000{i}.json" for i in range(3)
    }
    assert ids(out) == list(range(300))
    code, _, err = convert(old, out, "--num_shards", "2", capsys=capsys)
    assert code == 0 and "removing 6 files of an earlier run that did not complete" in err, err
    assert not set(os.listdir(out)) & kept
