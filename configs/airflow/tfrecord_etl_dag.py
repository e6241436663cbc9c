"""Airflow DAG ``tfrecord_etl``: convert -> augment -> verify, each a BeamRunPythonPipelineOperator task.

Needs apache-airflow 3.x with apache-airflow-providers-apache-beam (6.3.1 tested) and
apache-airflow-providers-google (the Beam operator imports it even for DirectRunner), in Airflow's own
environment. The pipelines run in the project's environment: ``py_interpreter`` is the project's venv
python (``TFRECORD_ETL_PYTHON``, default ``<repo>/.venv/bin/python``), where this project is installed.

Trigger with a run configuration, e.g.::

    airflow dags trigger tfrecord_etl --conf '{"input": "gs://b/raw/*.h5", "output_dir": "gs://b/tfr/run-1",
        "augmented_dir": "gs://b/tfr/run-1-aug", "runner": "DataflowRunner",
        "beam_options": {"project": "P", "region": "us-central1", "temp_location": "gs://b/tmp"},
        "convert_options": {"config": "/path/to/tfrecord-etl/configs/dataflow.yaml"}}'

Retries are safe: re-running convert or augment with the same options replaces the output of a crashed
or completed attempt (see the README's crash-safety notes). configs/airflow/run_airflow_test.sh runs this
DAG end to end with ``airflow dags test`` on small data.
"""
from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.sdk import DAG, Param

PROJECT_ROOT = os.environ.get("TFRECORD_ETL_ROOT",
                              os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PYTHON = os.environ.get("TFRECORD_ETL_PYTHON", os.path.join(PROJECT_ROOT, ".venv", "bin", "python"))

# The operator always appends --runner=... and --labels=... (Beam flags). pipelines.verify is not a Beam
# pipeline and its parser refuses unknown flags, so the verify task drops those two before calling it.
# Once `python -m pipelines.verify` accepts Beam flags (parse_known_args), use py_options=["-m",
# "pipelines.verify"] instead.
VERIFY = ("import sys; from pipelines import common, verify; "
          "sys.exit(common.run_main(verify.main, [a for a in sys.argv[1:] "
          "if a.split('=', 1)[0] not in ('--runner', '--labels')]))")


def pipeline_task(task_id: str, module: str, pipeline_options: str) -> BeamRunPythonPipelineOperator:
    """A task running ``python -m MODULE`` (a Beam pipeline of this project) with the DAG's runner, the
    shared ``beam_options`` and its own flags (``pipeline_options``, a template rendering to a dict)."""
    return BeamRunPythonPipelineOperator(
        task_id=task_id,
        py_interpreter=PYTHON,
        py_options=["-m"],
        py_file=module,
        runner="{{ params.runner }}",
        default_pipeline_options="{{ params.beam_options }}",
        pipeline_options=pipeline_options,
    )


with DAG(
    dag_id="tfrecord_etl",
    description="NumPy arrays (HDF5/.npz/.npy) -> TFRecord shards -> new fields -> verified",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,  # dict params render as dicts, not as their str()
    tags=["tfrecord-etl", "beam"],
    params={
        "input": Param("data/*.h5", type="string", description="input file pattern (local, gs://, s3://)"),
        "output_dir": Param("out/converted", type="string", description="convert output directory"),
        "augmented_dir": Param("out/augmented", type="string", description="augment output directory"),
        "runner": Param("DirectRunner", type="string",
                        description="Beam runner: DirectRunner, DataflowRunner, FlinkRunner, PortableRunner, ..."),
        "beam_options": Param({}, type="object", description="Beam flags for every task, e.g. "
                              "{'project': 'P', 'region': 'R', 'temp_location': 'gs://b/tmp'} or "
                              "{'direct_running_mode': 'multi_processing', 'direct_num_workers': 2}"),
        "convert_options": Param({"compression": "gzip"}, type="object",
                                 description="more convert flags, e.g. {'config': '/abs/configs/dataflow.yaml'}"),
        "augment_options": Param({"constants": "etl_source=airflow"}, type="object",
                                 description="augment flags, e.g. {'join_input': 'labels.npy', "
                                             "'join_fields': 'array=label'}"),
    },
) as dag:
    convert = pipeline_task("convert", "pipelines.convert",
                            "{{ dict(params.convert_options, input=params.input, output_dir=params.output_dir) }}")
    augment = pipeline_task("augment", "pipelines.augment",
                            "{{ dict(params.augment_options, input=params.output_dir, "
                            "output_dir=params.augmented_dir) }}")
    verify = BeamRunPythonPipelineOperator(
        task_id="verify",
        py_interpreter=PYTHON,
        py_options=["-c", VERIFY],
        py_file="{{ params.augmented_dir }}",  # the positional TARGET of python -m pipelines.verify
        runner="{{ params.runner }}",
    )
    convert >> augment >> verify
