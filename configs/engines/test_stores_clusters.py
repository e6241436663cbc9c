"""The terabyte configuration on Flink and Spark clusters that share no disk with the launcher: the JobManager,
TaskManagers, job server and worker pool (Flink), the master, workers, executors, job server and pool (Spark) in a
private mount namespace where the launcher's files are not; inputs and outputs on SeaweedFS (``s3://``, both
engines; ``gs://`` on Flink is test_stores_clusters_gs.py). See test_stores.py for the stores, the isolation and the
checks (storecases.terabyte_configuration). Modules of their own so that the engines stage runs them beside the
others (a module per pytest-xdist worker).

    PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_stores_clusters.py
"""

from __future__ import annotations

import pytest

from configs.engines.storecases import needs, terabyte_configuration

pytestmark = pytest.mark.timeout(1200)


@pytest.mark.parametrize(
    "engine,store",
    [pytest.param(e, s, id=f"{e}-{s}", marks=needs(s, e)) for e, s in [("flink", "s3"), ("spark", "s3")]],
)
def test_the_terabyte_configuration_on_a_cluster_is_byte_identical(
    engine, store, request, isolation, seaweed, fakegcs, store_inputs, reference, tmp_path
):
    """storecases.terabyte_configuration on an isolated Flink or Spark cluster."""
    terabyte_configuration(engine, store, request, isolation, seaweed, fakegcs, store_inputs, reference, tmp_path)
