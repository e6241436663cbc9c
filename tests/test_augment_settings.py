"""``AugmentPlan`` as a settings object: built by keyword only, checked at construction (a plan built by hand fails
in the launcher, not on a worker), and shipped through Beam's pickler to a worker that augments the same bytes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from apache_beam.internal import pickler

from tfrecord_etl.transforms import augment, codec
from tfrecord_etl.transforms.codec import FeatureSpec

LABEL = FeatureSpec("label", "<i8", (), "list")


def plan(**changes):
    base = {
        "collection": augment.InputCollection("in", (), (), True),
        "output_dir": "out",
        "mode": "rewrite",
        "output_compression": "none",
        "new_specs": (LABEL,),
        "constants": (("label", np.array(5, "<i8")),),
    }
    return augment.AugmentPlan(**{**base, **changes})


def test_augment_plan_is_built_by_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        augment.AugmentPlan(augment.InputCollection("in", (), (), True), "out", "rewrite", "none", (LABEL,))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"mode": "append"}, "mode 'append' is not one of ('rewrite', 'sidecar')"),
        ({"output_compression": "gz"}, "output_compression 'gz' is not one of ('none', 'gzip', 'zlib')"),
        ({"batch_size": 0}, "batch_size 0 is not a positive number of records"),
        ({"fn_batch": True}, "fn_specs and fn_batch need fn"),
        ({"replace": ("other",)}, "replace names ['other'], which are not new features"),
        ({"mode": "sidecar", "drop_keys": ("label",)}, "drop_keys need mode 'rewrite'"),
    ],
)
def test_augment_plan_refuses_settings_that_cannot_run(changes, message):
    with pytest.raises(ValueError, match="^Invalid AugmentPlan: ") as info:
        plan(**changes)
    assert message in str(info.value)


def test_augment_plan_pickles_and_augments_the_same_bytes_on_a_worker():
    here = plan(replace=("label",), drop_keys=("label",))
    there = pickler.loads(pickler.dumps(here))
    assert dataclasses.replace(there, constants=()) == dataclasses.replace(here, constants=())
    record = codec.encode_batch(
        {"label": np.array([1]), "x": np.array([2])}, [LABEL, LABEL.__class__("x", "<i8", (), "list")], 1
    )[0]
    ours = augment.BatchAugmenter(here).augment([record], "f.tfrecord", 0)
    theirs = augment.BatchAugmenter(there).augment([record], "f.tfrecord", 0)
    assert ours == theirs and codec.parse_example(ours[0])["label"][1].tolist() == [5]
