"""Relative paths resolved by the launcher: a worker whose working directory is not the launcher's (a Flink
TaskManager, a Spark executor, an SDK harness of an EXTERNAL or DOCKER environment) names the same files.

Before, such a worker read ``--input rel/x.npy`` as another file (``InputChangedError``: "it is gone") and wrote
``--output_dir out/x`` into a directory of its own (a lost lock), leaving folders where it ran. Here the pipeline runs
in the launcher's process (in-memory DirectRunner) after a hook has moved the process to another directory, as a
remote worker would be: the output must be exact and nothing may appear in that other directory."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, run_command
from tfrecord_etl.pipelines import augment as augment_main, common, convert as convert_main
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.config import ConvertConfig, validate
from tfrecord_etl.transforms.config.localpaths import absolute_paths
from tfrecord_etl.transforms.storage.fileio import absolute


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """The launcher in ``tmp_path/launch``, the pipeline run from ``tmp_path/worker`` (returned)."""
    launch, worker = tmp_path / "launch", tmp_path / "worker"
    (launch / "in").mkdir(parents=True)
    worker.mkdir()
    monkeypatch.chdir(launch)
    run_pipeline = common.run_pipeline

    def in_another_directory(p):
        os.chdir(worker)
        try:
            return run_pipeline(p)
        finally:
            os.chdir(launch)

    monkeypatch.setattr(common, "run_pipeline", in_another_directory)
    return worker


def test_convert_and_augment_with_relative_paths_run_where_the_workers_cwd_differs(elsewhere, capsys):
    x = np.arange(40, dtype="<i8").reshape(20, 2)
    np.save("in/x.npy", x)
    np.save("in/j.npy", np.arange(20, dtype="<f4") / 4)
    code, _, err = run_command(
        convert_main.main,
        ["--input", "in/x.npy", "--output_dir", "out/x", "--dead_letter_dir", "dead", "--num_shards", "2", *BEAM_FLAGS],
        capsys,
    )
    assert code == 0, err
    code, _, err = run_command(
        augment_main.main,
        [
            "--input",
            "out/x",
            "--output_dir",
            "./out/aug",
            "--join_input",
            "in/../in/j.npy",
            "--join_fields",
            "array=j",
            *BEAM_FLAGS,
        ],
        capsys,
    )
    assert code == 0, err
    rows = list(reader.iter_numpy("out/aug"))
    np.testing.assert_array_equal(np.stack([r["array"] for r in rows]), x)
    np.testing.assert_array_equal(np.array([r["j"] for r in rows]), np.arange(20, dtype="<f4") / 4)
    assert sorted(os.listdir("out/x")) == [
        ".tf-etl-run.json",
        "data-00000-of-00002.tfrecord",
        "data-00001-of-00002.tfrecord",
        "metadata.json",
        "schema.pbtxt",
    ]
    assert os.listdir(elsewhere) == []  # nothing written where the "worker" ran
    assert not os.path.exists("dead")  # no dead letter: the dead letter directory is made only for one


def test_every_local_path_option_is_made_absolute(tmp_path, monkeypatch):
    """Against the working directory, lexically; remote paths, absolute ones and file_labels' words as given."""
    monkeypatch.chdir(tmp_path)
    cfg = absolute_paths(
        validate(
            ConvertConfig,
            {
                "input": "raw/{YYYY}-{MM}-{DD}/*.h5",
                "output_dir": "./coll/",
                "dead_letter_dir": "../dead",
                "file_labels": "labels.csv",
            },
        )
    )
    assert (cfg.input, cfg.output_dir, cfg.dead_letter_dir, cfg.file_labels) == (
        f"{tmp_path}/raw/{{YYYY}}-{{MM}}-{{DD}}/*.h5",
        f"{tmp_path}/coll/",
        f"{tmp_path.parent}/dead",
        f"{tmp_path}/labels.csv",
    )
    same = validate(ConvertConfig, {"input": "gs://b/x/*.h5", "output_dir": "/abs/out", "file_labels": "dir"})
    assert absolute_paths(same) is same
    assert [absolute(p) for p in ("s3://b/k", "/a/./b", "")] == ["s3://b/k", "/a/./b", ""]
