"""What the tfrecord-etl Airflow DAGs share: the DAG settings, the params, the pipeline task and its chain.

Imported by the DAG files beside it (``tfrecord_etl_dag.py``: manual runs, ``tfrecord_etl_daily_dag.py``: one
span a day, ``tfrecord_etl_incremental_dag.py``: only new files); copy it into the dags folder with them (Airflow
puts the dags folder on ``sys.path``). Needs apache-airflow 3.x with apache-airflow-providers-apache-beam (6.3.1
tested) and apache-airflow-providers-google (the Beam operator imports it even for DirectRunner), in Airflow's
own environment. The pipelines run in the project's environment: ``py_interpreter`` is the project's venv python
(``TFRECORD_ETL_PYTHON``, default ``<repo>/.venv/bin/python``), where this project is installed (a wheel, or
``pip install -e`` of a checkout as ./run_tests.sh does); the tasks run ``python -m tfrecord_etl.pipelines.X``, so
they do not depend on the worker's working directory.

Settings read from the environment of the DAG processor and the workers when the DAG files are parsed:

- ``TFRECORD_ETL_ROOT``: the checkout whose ``.venv`` is the default python (default: two folders above this file);
- ``TFRECORD_ETL_PYTHON``: the project's python (default ``$TFRECORD_ETL_ROOT/.venv/bin/python``);
- ``TFRECORD_ETL_RETRIES`` (default 2) and ``TFRECORD_ETL_RETRY_DELAY_S`` (seconds, default 300): every task's
  retries. A retry is safe: convert and augment replace the output of a crashed or completed attempt, and a
  span is re-converted byte for byte from the same inputs;
- ``TFRECORD_ETL_MAX_ACTIVE_RUNS`` (default 1): runs of one DAG at a time (two runs may not commit the same span;
  the collection's compare-and-swap refuses the second);
- ``TFRECORD_ETL_START_DATE`` (default 2026-11-01, UTC): the first data interval a catch-up schedules;
- the schedules: ``TFRECORD_ETL_SCHEDULE`` and ``TFRECORD_ETL_INCREMENTAL_SCHEDULE`` (see the DAG files).
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.sdk import DAG, Param

PROJECT_ROOT = os.environ.get(
    "TFRECORD_ETL_ROOT", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
PYTHON = os.environ.get("TFRECORD_ETL_PYTHON", os.path.join(PROJECT_ROOT, ".venv", "bin", "python"))
RETRIES = int(os.environ.get("TFRECORD_ETL_RETRIES", "2"))
RETRY_DELAY = dt.timedelta(seconds=float(os.environ.get("TFRECORD_ETL_RETRY_DELAY_S", "300")))
MAX_ACTIVE_RUNS = int(os.environ.get("TFRECORD_ETL_MAX_ACTIVE_RUNS", "1"))
START_DATE = dt.datetime.fromisoformat(os.environ.get("TFRECORD_ETL_START_DATE", "2026-11-01")).replace(tzinfo=dt.UTC)
EPOCH = dt.date(1970, 1, 1)


def span_number(day) -> int:
    """The span of a day: days since 1970-01-01, as TFX's ExampleGen maps ``{YYYY}{MM}{DD}`` to a span
    (``tfx/components/example_gen/utils.py: date_to_span_number``) and as convert's ``--span YYYY-MM-DD`` does.

    ``day``: a ``date``/``datetime`` or a ``YYYY-MM-DD`` string (e.g. ``{{ data_interval_start | ds }}``).
    Raises ValueError for another string.
    """
    if isinstance(day, str):
        day = dt.date.fromisoformat(day)
    if isinstance(day, dt.datetime):
        day = day.date()
    return (day - EPOCH).days


def params(input_help: str, input_default: str, output_default: str, augmented_default: str) -> dict:
    """The params of every DAG: ``input`` (its help and default per DAG), ``output_dir``, ``augmented_dir``,
    ``runner``, ``beam_options`` (Beam flags for every task), ``convert_options`` and ``augment_options``."""
    return {
        "input": Param(input_default, type="string", description=input_help),
        "output_dir": Param(output_default, type="string", description="convert output directory"),
        "augmented_dir": Param(augmented_default, type="string", description="augment output directory"),
        "runner": Param(
            "DirectRunner",
            type="string",
            description="Beam runner: DirectRunner, DataflowRunner, FlinkRunner, PortableRunner, ...",
        ),
        "beam_options": Param(
            {},
            type="object",
            description="Beam flags for every task, e.g. "
            "{'project': 'P', 'region': 'R', 'temp_location': 'gs://b/tmp'} or "
            "{'direct_running_mode': 'multi_processing', 'direct_num_workers': 2}",
        ),
        "convert_options": Param(
            {"compression": "gzip"},
            type="object",
            description="more convert flags, e.g. {'config': '/abs/configs/dataflow.yaml'}",
        ),
        "augment_options": Param(
            {"constants": "etl_source=airflow"},
            type="object",
            description="augment flags, e.g. {'join_input': 'labels.npy', 'join_fields': 'array=label'}",
        ),
    }


def etl_dag(dag_id: str, description: str, schedule, catchup: bool, dag_params: dict, **kwargs) -> DAG:
    """A DAG with the project's settings: retries with a delay, ``max_active_runs``, dict params rendered as
    dicts (``render_template_as_native_obj``), and the ``span_number`` macro for templates."""
    return DAG(
        dag_id=dag_id,
        description=description,
        schedule=schedule,
        start_date=START_DATE,
        catchup=catchup,
        max_active_runs=MAX_ACTIVE_RUNS,
        default_args={"retries": RETRIES, "retry_delay": RETRY_DELAY},
        render_template_as_native_obj=True,  # dict params render as dicts, not as their str()
        user_defined_macros={"span_number": span_number},
        tags=["tfrecord-etl", "beam"],
        params=dag_params,
        **kwargs,
    )


def pipeline_task(
    task_id: str, module: str, pipeline_options: str, runner: str = "{{ params.runner }}"
) -> BeamRunPythonPipelineOperator:
    """A task running ``python -m MODULE`` (a command of this project) with ``runner``, the shared
    ``beam_options`` and its own flags (``pipeline_options``: a template rendering to a dict; the operator adds
    ``--labels``)."""
    return BeamRunPythonPipelineOperator(
        task_id=task_id,
        py_interpreter=PYTHON,
        py_options=["-m"],
        py_file=module,
        runner=runner,
        default_pipeline_options="{{ params.beam_options }}",
        pipeline_options=pipeline_options,
    )


def convert_augment_verify(convert_flags: str = "", augment_flags: str = "", verify_flags: str = ""):
    """The chain ``convert >> augment >> verify`` on the DAG's params, each task given more flags as the
    keyword arguments of a template's ``dict(...)`` (e.g. ``"span=data_interval_start | ds"``).

    verify runs where the task runs (it is not a Beam pipeline): its runner is DirectRunner whatever
    ``params.runner`` is (with DataflowRunner the operator would wait for a Dataflow job that never exists), and
    it ignores the Beam flags it is given (``beam_options``, ``--labels``), which still configure its file
    systems.
    """

    def options(base: str, flags: str) -> str:  # a template rendering to a dict: Jinja's dict(BASE, FLAGS)
        return "{{ dict(" + base + (", " + flags if flags else "") + ") }}"

    convert = pipeline_task(
        "convert",
        "tfrecord_etl.pipelines.convert",
        options("params.convert_options, input=params.input, output_dir=params.output_dir", convert_flags),
    )
    augment = pipeline_task(
        "augment",
        "tfrecord_etl.pipelines.augment",
        options("params.augment_options, input=params.output_dir, output_dir=params.augmented_dir", augment_flags),
    )
    verify = pipeline_task(
        "verify",
        "tfrecord_etl.pipelines.verify",
        options("target=params.augmented_dir", verify_flags),
        runner="DirectRunner",
    )
    convert >> augment >> verify
    return convert, augment, verify
