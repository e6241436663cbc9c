"""OutputCommit, the settings of an output's commit: given by keyword only, frozen, pickled with the commit's DoFn."""

import dataclasses
import pickle

import pytest

from tfrecord_etl.transforms.beam import commit as beam_commit
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.output import outdir
from tfrecord_etl.transforms.output.commit import OutputCommit

SPECS = (FeatureSpec("x", "<f4", (3,), "tensor"),)
SETTINGS = {
    "output_dir": "out",
    "specs": SPECS,
    "compression": "gzip",
    "expected_rows": 10,
    "sources": ({"path": "a.npy", "rows": 10},),
    "writer": "planned",
    "options": {"input": "a.npy"},
}


def test_output_commit_takes_keywords_only():
    """Before: 13 positional arguments (a swapped pair went unnoticed); now each setting is named."""
    with pytest.raises(TypeError):
        OutputCommit(*SETTINGS.values())  # type: ignore[misc]
    commit = OutputCommit(**SETTINGS, tfds_name="mnist")
    assert (commit.expected_rows, commit.tfds_name, commit.split_names) == (10, "mnist", ())
    assert commit.replaced == outdir.Replacement() and commit.described == {} and commit.codec is None


def test_output_commit_is_frozen_and_pickles():
    commit = OutputCommit(**SETTINGS, split_names=("train", "test"), replaced=outdir.Replacement(("a",), "7"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        commit.expected_rows = 11  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(commit)) == commit
    assert beam_commit.OutputCommit is OutputCommit  # the Beam transforms take it from the output layer
