"""The terabyte configuration on a Flink cluster that shares no disk with the launcher, inputs and outputs on
fake-gcs-server (``gs://``): test_stores_clusters.py's, in a module of its own so that the engines stage runs it
on one pytest-xdist worker while the ``s3://`` clusters run on the other (it is the stage's longest test).

    PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_stores_clusters_gs.py
"""

from __future__ import annotations

import pytest

from configs.engines.storecases import needs, terabyte_configuration

pytestmark = pytest.mark.timeout(1200)


@needs("gs", "flink")
def test_the_terabyte_configuration_on_flink_with_gcs_is_byte_identical(
    request, isolation, seaweed, fakegcs, store_inputs, reference, tmp_path
):
    """storecases.terabyte_configuration on an isolated Flink cluster, gs:// in and out."""
    terabyte_configuration("flink", "gs", request, isolation, seaweed, fakegcs, store_inputs, reference, tmp_path)
