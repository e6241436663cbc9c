"""ArraysExampleGen -> StatisticsGen -> SchemaGen under TFX's AirflowDagRunner on a real Airflow 2 (run by
configs/tfx/run_tfx_airflow_test.sh in .venv-tfx-airflow, which has apache-airflow 2.x beside tfx 1.21; skipped
where Airflow is not installed).

The DAG file configs/tfx/airflow_dags/tfx_arrays_dag.py (AirflowDagRunner(AirflowPipelineConfig(...)).run(...)) over
two spans of HDF5 inputs (``span-{SPAN}/data.h5``); a fresh AIRFLOW_HOME with a SQLite database (``airflow db
migrate``), then ``airflow dags test`` runs the three tasks in one process (the DAG file, which imports TFX and
TensorFlow, has ``AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT`` = 300 s to import, not Airflow's 30; a DAG that does not load
fails the test with its import error). Checked: Airflow ran each task once,
successfully, in DAG order; the three TFX executions in ML Metadata under Airflow's run id; TFX's driver took the
latest span (2); every example read back exactly against that span's source (plain TensorFlow and our decoder); the
statistics count every example of each split and SchemaGen typed the features. Then a run over a broken file: the
task fails with our one-line SourceError, the tasks after it are upstream_failed and ``dags test`` exits 1.
"""

import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tfx")
pytest.importorskip("airflow")

from test_tfx_pipeline import make_span, plain_tf_read  # (configs/tfx is on sys.path under pytest)

from tfrecord_etl.tfx import read_split, split_files

HERE = os.path.dirname(os.path.abspath(__file__))
DAG_FILE = os.path.join(HERE, "airflow_dags", "tfx_arrays_dag.py")
REPO = os.path.dirname(os.path.dirname(HERE))  # the airflow command imports tfrecord_etl from this checkout
DAG_ID = "tfrecord_etl_tfx"
TASKS = ["ArraysExampleGen", "StatisticsGen", "SchemaGen"]


IMPORT_ERRORS = os.path.join(REPO, "configs", "airflow", "dag_import_errors.py")
# Airflow's default of 30 s for a DAG file's import: this one imports TFX and TensorFlow, 12 s on a quiet machine
IMPORT_TIMEOUT = os.environ.get("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT") or "300"


def _airflow(args, env, log, status=0, timeout=600) -> subprocess.CompletedProcess:
    """Runs the venv's ``airflow`` command, its output appended to ``log``; fails the test with its tail unless it
    exits with ``status``, and with the DAG file's import error (configs/airflow/dag_import_errors.py) when Airflow
    says only that the DAG could not be found."""
    command = [os.path.join(os.path.dirname(sys.executable), "airflow"), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}\n")
    why = ""
    if done.returncode != status and "could not be found" in done.stdout + done.stderr:
        dags = args[args.index("-S") + 1] if "-S" in args else env["AIRFLOW__CORE__DAGS_FOLDER"]
        why = subprocess.run(
            [sys.executable, IMPORT_ERRORS, dags], env=env, capture_output=True, text=True, timeout=timeout
        ).stderr
    assert done.returncode == status, f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}\n{why}"
    return done


def test_a_dag_that_does_not_load_fails_with_its_import_error(tmp_path):
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow_home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
    }
    log = str(tmp_path / "airflow.log")
    _airflow(["db", "migrate"], env, log)
    cases = [  # (the DAG file's code after its import of airflow, the import timeout, Airflow's error)
        ('raise RuntimeError("no such table")', IMPORT_TIMEOUT, "RuntimeError: no such table"),
        ("import time\n\ntime.sleep(30)", "2", "DagBag import timeout for {dag} after 2.0s"),
    ]
    for i, (body, timeout, error) in enumerate(cases):
        dag = tmp_path / "dags" / f"broken_{i}.py"
        dag.parent.mkdir(exist_ok=True)
        dag.write_text(f"from airflow import DAG\n\n{body}\n")
        with pytest.raises(AssertionError) as failed:
            args = ["dags", "test", "broken", "2026-11-27", "-S", str(dag)]
            _airflow(args, {**env, "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": timeout}, log)
        message = str(failed.value)
        assert "Dag 'broken' could not be found; either it does not exist or it failed to parse" in message
        assert f"[dag-import-errors] {dag} does not import (dagbag_import_timeout {float(timeout):g} s):" in message
        assert error.format(dag=dag) in message


def test_arrays_example_gen_under_tfx_airflow_dag_runner(tmp_path):
    from google.protobuf import text_format
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

    input_base = str(tmp_path / "data")
    sources = {span: make_span(input_base, span) for span in (1, 2)}
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow_home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.dirname(DAG_FILE),
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": IMPORT_TIMEOUT,
        "TFRECORD_ETL_TFX_INPUT": input_base,
        "TFRECORD_ETL_TFX_ROOT": str(tmp_path / "tfx"),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    }
    log = str(tmp_path / "airflow.log")
    _airflow(["db", "migrate"], env, log)
    listed = _airflow(["tasks", "list", DAG_ID, "-S", DAG_FILE], env, log)
    assert listed.stdout.split() == sorted(TASKS)
    _airflow(["dags", "test", DAG_ID, "2026-11-27", "-S", DAG_FILE], env, log)

    # Airflow's own record (its SQLite database: `dags test` runs the DAG without serializing it, so the CLI's
    # list-runs does not know it): one successful run, each task once and successful, finished in DAG order
    with sqlite3.connect(str(tmp_path / "airflow_home" / "airflow.db")) as db:
        ((dag_id, state, run_id),) = db.execute("SELECT dag_id, state, run_id FROM dag_run").fetchall()
        assert (dag_id, state) == (DAG_ID, "success")
        tasks = db.execute("SELECT task_id, state, try_number FROM task_instance ORDER BY end_date").fetchall()
    assert tasks == [(task, "success", 1) for task in TASKS]

    # TFX's record in ML Metadata (the legacy launcher AirflowComponent uses)
    connection = metadata_store_pb2.ConnectionConfig()
    connection.sqlite.filename_uri = str(tmp_path / "tfx" / "mlmd.sqlite")
    store = metadata_store.MetadataStore(connection)
    executions = store.get_executions()
    assert sorted(e.properties["component_id"].string_value for e in executions) == sorted(TASKS)
    assert {e.properties["state"].string_value for e in executions} == {"complete"}
    assert {e.properties["run_id"].string_value for e in executions} == {run_id}  # TFX's run id is Airflow's
    (gen_run,) = [e for e in executions if e.properties["component_id"].string_value == "ArraysExampleGen"]
    config = json.loads(gen_run.properties["input_config"].string_value)
    assert config["splits"] == [{"name": "all", "pattern": "span-2/*.h5"}]  # resolved by TFX's driver
    (examples,) = store.get_artifacts_by_type("Examples")
    assert examples.custom_properties["span"].int_value == 2  # the latest span
    assert examples.uri.startswith(str(tmp_path / "tfx" / "pipeline_root" / "ArraysExampleGen" / "examples"))

    src = sources[2]
    seen = {}
    for split in ("train", "eval"):
        plain = plain_tf_read(split_files(examples.uri, split))
        ours = {int(e["id"][()]): e for e in read_split(examples.uri, split)}
        assert sorted(plain) == sorted(ours)
        for i, (image, x) in plain.items():
            np.testing.assert_array_equal(image, src["image"][i - 2000])
            np.testing.assert_array_equal(ours[i]["image"], src["image"][i - 2000])
            assert x == src["x"][i - 2000] and ours[i]["x"][()] == src["x"][i - 2000]
        seen[split] = len(plain)
    assert sum(seen.values()) == len(src["id"]) and all(seen.values())

    (stats,) = store.get_artifacts_by_type("ExampleStatistics")
    for split, count in seen.items():
        raw = open(os.path.join(stats.uri, f"Split-{split}", "FeatureStats.pb"), "rb").read()
        assert statistics_pb2.DatasetFeatureStatisticsList.FromString(raw).datasets[0].num_examples == count
    (schema_artifact,) = store.get_artifacts_by_type("Schema")
    schema = text_format.Parse(open(os.path.join(schema_artifact.uri, "schema.pbtxt")).read(), schema_pb2.Schema())
    assert {f.name: f.type for f in schema.feature} == {
        "image": schema_pb2.BYTES,
        "x": schema_pb2.FLOAT,
        "id": schema_pb2.INT,
    }

    # a bad input: `dags test` of another logical date exits 1, the ExampleGen task fails with our one-line error
    # naming the file, the tasks after it are upstream_failed
    bad = tmp_path / "bad"
    (bad / "span-1").mkdir(parents=True)
    (bad / "span-1" / "broken.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)  # an HDF5 signature, no file
    failed = _airflow(
        ["dags", "test", DAG_ID, "2026-11-28", "-S", DAG_FILE],
        {**env, "TFRECORD_ETL_TFX_INPUT": str(bad), "TFRECORD_ETL_TFX_ROOT": str(bad / "tfx")},
        log,
        status=1,
    )
    assert "SourceError: Not a readable HDF5 file: " in failed.stdout + failed.stderr
    assert f"[file='{bad / 'span-1' / 'broken.h5'}']" in failed.stdout + failed.stderr
    with sqlite3.connect(str(tmp_path / "airflow_home" / "airflow.db")) as db:
        states = db.execute("SELECT state FROM dag_run ORDER BY execution_date").fetchall()
        assert states == [("success",), ("failed",)]
        tasks = db.execute("SELECT task_id, state FROM task_instance WHERE run_id != ?", (run_id,)).fetchall()
    assert sorted(tasks) == [
        ("ArraysExampleGen", "failed"),
        ("SchemaGen", "upstream_failed"),
        ("StatisticsGen", "upstream_failed"),
    ]
    # TFX's legacy launcher registers the execution and its output artifact before the executor runs and records no
    # failure: the execution stays "new" (RUNNING), the artifact is never marked LIVE and its directory stays empty
    connection.sqlite.filename_uri = str(bad / "tfx" / "mlmd.sqlite")
    failed_store = metadata_store.MetadataStore(connection)
    (execution,) = failed_store.get_executions()
    assert execution.properties["state"].string_value == "new"
    assert execution.last_known_state == metadata_store_pb2.Execution.RUNNING
    (artifact,) = failed_store.get_artifacts_by_type("Examples")
    assert artifact.state != metadata_store_pb2.Artifact.LIVE and os.listdir(artifact.uri) == []
