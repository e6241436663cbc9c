"""An Airflow 2 DAG built by TFX's AirflowDagRunner: ArraysExampleGen -> StatisticsGen -> SchemaGen.

Each TFX component becomes one Airflow task (TFX's ``AirflowComponent``, a ``PythonOperator`` that launches the
component in the task's process with TFX's legacy launcher); ML Metadata is a SQLite file. Configured by the
environment, so configs/tfx/test_tfx_airflow.py can point it at its own data:

  TFRECORD_ETL_TFX_INPUT   the input base: span-{SPAN}/*.h5 (TFX's driver takes the latest span)
  TFRECORD_ETL_TFX_ROOT    the pipeline root; the MLMD store is ROOT/mlmd.sqlite

Run it with ``airflow dags test tfrecord_etl_tfx DATE`` (every task in one process, no scheduler). Needs a venv
with tfx 1.21 and apache-airflow 2.x (TFX's Airflow support imports Airflow 2 modules and its extra pins
apache-airflow<3): configs/tfx/run_tfx_airflow_test.sh builds one.
"""

import datetime
import os

from tfx import v1 as tfx_v1
from tfx.orchestration import metadata as tfx_metadata, pipeline as tfx_pipeline
from tfx.orchestration.airflow.airflow_dag_runner import AirflowDagRunner, AirflowPipelineConfig
from tfx.proto import example_gen_pb2

from tfrecord_etl.tfx import ArraysExampleGen

DAG_ID = "tfrecord_etl_tfx"
ROOT = os.environ.get("TFRECORD_ETL_TFX_ROOT", "/tmp/tfrecord_etl_tfx")


def build_pipeline(input_base: str, root: str) -> tfx_pipeline.Pipeline:
    """The TFX pipeline of this DAG (its name is the DAG id)."""
    example_gen = ArraysExampleGen(
        input_base=input_base,
        input_config=example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name="all", pattern="span-{SPAN}/*.h5")]
        ),
        source_options={"feature_encodings": {"image": "tensor", "x": "list", "id": "list"}},
    )
    stats = tfx_v1.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema = tfx_v1.components.SchemaGen(statistics=stats.outputs["statistics"])
    return tfx_pipeline.Pipeline(
        pipeline_name=DAG_ID,
        pipeline_root=os.path.join(root, "pipeline_root"),
        components=[example_gen, stats, schema],
        enable_cache=False,
        metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(os.path.join(root, "mlmd.sqlite")),
        beam_pipeline_args=["--direct_running_mode=in_memory", "--direct_num_workers=1"],
    )


DAG = AirflowDagRunner(
    AirflowPipelineConfig(
        airflow_dag_config={"schedule": None, "start_date": datetime.datetime(2026, 1, 1), "catchup": False}
    )
).run(build_pipeline(os.environ.get("TFRECORD_ETL_TFX_INPUT", os.path.join(ROOT, "data")), ROOT))
