"""Airflow DAG ``tfrecord_etl``: convert -> augment -> verify of one output directory, triggered by hand.

Each task is a BeamRunPythonPipelineOperator running the project's venv python (``tfrecord_etl_tasks.py``, beside
this file and copied with it into the dags folder, has the settings and what needs installing). For a schedule
see ``tfrecord_etl_daily_dag.py`` (a span a day) and ``tfrecord_etl_incremental_dag.py`` (only new files).

Trigger with a run configuration, e.g.::

    airflow dags trigger tfrecord_etl --conf '{"input": "gs://b/raw/*.h5", "output_dir": "gs://b/tfr/run-1",
        "augmented_dir": "gs://b/tfr/run-1-aug", "runner": "DataflowRunner",
        "beam_options": {"project": "P", "region": "us-central1", "temp_location": "gs://b/tmp"},
        "convert_options": {"config": "/path/to/tfrecord-etl/configs/dataflow.yaml"}}'

Retries are safe: re-running convert or augment with the same options replaces the output of a crashed
or completed attempt (see docs/reliability.md). configs/airflow/run_airflow_test.sh runs this
DAG end to end with ``airflow dags test`` on small data.
"""

from __future__ import annotations

import tfrecord_etl_tasks as tasks

with tasks.etl_dag(
    "tfrecord_etl",
    "NumPy arrays (HDF5/.npz/.npy) -> TFRecord shards -> new fields -> verified",
    schedule=None,
    catchup=False,
    dag_params=tasks.params("input file pattern (local, gs://, s3://)", "data/*.h5", "out/converted", "out/augmented"),
) as dag:
    tasks.convert_augment_verify()
