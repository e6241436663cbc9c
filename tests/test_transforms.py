"""The PTransforms on their own, with Beam's TestPipeline and assert_that."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tfrecord_etl.transforms import codec, planning
from tfrecord_etl.transforms.beam import encode as beam_encode, read as beam_read


def test_read_from_npy_and_encode_examples(tmp_path):
    arr = np.arange(50 * 2, dtype=">i4").reshape(50, 2)
    np.save(tmp_path / "a.npy", arr)
    read = beam_read.ReadFromNpy(str(tmp_path / "a.npy"), target_range_bytes=80)
    assert len(read.plan.ranges) == 5
    specs = planning.choose_encodings(read.plan.specs, "list", {})

    def decode(record):
        return tuple(codec.decode_example(record, specs)["array"].tolist())

    with TestPipeline(
        options=beam.options.pipeline_options.PipelineOptions(
            ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
        )
    ) as p:
        batches = p | read
        rows = batches | beam.Map(lambda b: b[0].num_rows)
        assert_that(rows | "Sum" >> beam.CombineGlobally(sum), equal_to([50]), label="AllRows")
        records = batches | beam_encode.EncodeExamples(specs)
        assert_that(records | beam.Map(decode), equal_to([tuple(r) for r in arr.tolist()]), label="Exact")
