"""The shape of the convert pipeline: what its launcher builds before the first shard starts (start-up cost that is
ours: every applied transform costs Beam's construction and runner set-up)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest


def _reshuffles_outside_create(p) -> list[str]:
    """Full labels of the ``Reshuffle`` transforms of ``p`` not applied inside a ``Create`` (``Create`` of more
    than one value redistributes them itself)."""
    import apache_beam as beam
    from apache_beam.pipeline import PipelineVisitor

    found = []

    class Visitor(PipelineVisitor):
        def enter_composite_transform(self, node):
            self.visit_transform(node)

        def visit_transform(self, node):
            if isinstance(node.transform, beam.Reshuffle):
                parent, inside = node.parent, False
                while parent is not None:
                    inside |= isinstance(parent.transform, beam.Create)
                    parent = parent.parent
                if not inside:
                    found.append(node.full_label)

    p.visit(Visitor())
    return found


@pytest.mark.parametrize("writer", ["planned", "beam"])
def test_shard_plans_and_row_ranges_are_shuffled_once(tmp_path, writer):
    import apache_beam as beam

    from tfrecord_etl.pipelines import convert
    from tfrecord_etl.transforms.config import ConvertConfig

    path = tmp_path / "in.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = np.arange(4000.0).reshape(1000, 4), np.arange(1000)
    cfg = ConvertConfig(
        input=str(path), output_dir=str(tmp_path / "out"), num_shards=4, target_range_mb=0.004, writer=writer
    )
    plan = convert.build_plan(cfg)
    assert len(plan.inputs.ranges) > 1 and (writer == "beam" or len(plan.shards) == 4)
    p = beam.Pipeline()
    convert.build_pipeline(p, cfg, plan)
    assert _reshuffles_outside_create(p) == []
    creates = []
    p.visit(
        type(
            "V",
            (beam.pipeline.PipelineVisitor,),
            {
                "enter_composite_transform": lambda self, n: (
                    creates.append(n) if isinstance(n.transform, beam.Create) else None
                ),
                "visit_transform": lambda self, n: None,
            },
        )()
    )
    assert any(c.transform.reshuffle and len(c.transform.values) > 1 for c in creates)  # the spreading is Create's
