#!/usr/bin/env bash
# ArraysExampleGen in a TFX pipeline orchestrated by Airflow 2 (TFX's AirflowDagRunner), offline:
#   1. builds .venv-tfx-airflow (TFX_AIRFLOW_VENV=DIR uses another): a small venv layered on the TFX venv that
#      run_tfx_test.sh built (TFX_VENV, default .venv-tfx; a .pth adds its site-packages after the venv's own), with
#      apache-airflow 2.x installed by pip's resolver against everything the TFX venv holds. TFX 1.21's Airflow
#      support needs Airflow 2 (its `airflow` extra pins apache-airflow<3; it imports airflow.operators.python_operator),
#      while configs/airflow/ runs Airflow 3 in .venv-airflow, so this is a third venv; layered, it costs ~180 MB and
#      ~15 s instead of a second multi-GB TFX install. Rebuilt when the packages or the TFX venv's stamp change;
#   2. runs configs/tfx/test_tfx_airflow.py with it: `airflow db migrate` (SQLite), `airflow dags test` of
#      configs/tfx/airflow_dags/tfx_arrays_dag.py (ArraysExampleGen -> StatisticsGen -> SchemaGen), exact read-back;
#      DAG files get AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT (default 300 s here) to import, and one that does not load
#      has its import error printed.
# Called by run_tfx_test.sh after its own tests (TFRECORD_ETL_TFX_AIRFLOW=0 skips it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TVENV="${TFX_VENV:-$ROOT/.venv-tfx}"
AVENV="${TFX_AIRFLOW_VENV:-$ROOT/.venv-tfx-airflow}"
AIRFLOW_PACKAGES="apache-airflow==2.11.2"
started=$(date +%s)
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONWARNINGS=ignore
# The DAG file imports TFX and TensorFlow: 12 s on a quiet machine, past Airflow's default 30 s on a busy one, and the
# DAG is then "not found". 300 s, as docs/scale.md tells users; a DAG that does not load fails the test with its
# import error (configs/airflow/dag_import_errors.py).
export AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT="${AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT:-300}"
PY="$AVENV/bin/python"

if ! ls "$TVENV"/.installed-* > /dev/null 2>&1; then
  echo "[tfx-airflow-test] $TVENV is not built: run configs/tfx/run_tfx_test.sh first" >&2
  exit 1
fi
tsite="$("$TVENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
stamp="$AVENV/.installed-$( (echo "$AIRFLOW_PACKAGES $tsite"; ls "$TVENV"/.installed-*) | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[tfx-airflow-test] building $AVENV ($AIRFLOW_PACKAGES over $TVENV)" >&2
  rm -rf "$AVENV"
  "$("$TVENV/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv "$AVENV"
  asite="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # addsitedir (not a bare path line) so the TFX venv's own .pth files run too: the glibc shim, the editable install
  echo "import site; site.addsitedir('$tsite')" > "$asite/zz_tfx_venv.pth"
  log="$(mktemp)"
  # shellcheck disable=SC2086
  if ! { "$PY" -m pip install -q $AIRFLOW_PACKAGES && "$PY" -m pip check; } > "$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -40 >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  "$PY" -c "import airflow, tfx, tfrecord_etl.tfx; from tfx.orchestration.airflow import airflow_dag_runner"
  echo "[tfx-airflow-test] $AVENV built in $(( $(date +%s) - started )) s, $(du -sh "$AVENV" | cut -f1)" >&2
  rm -f "$AVENV"/.installed-*
  touch "$stamp"
fi

cd "$ROOT"
"$PY" -m pytest -q -p no:cacheprovider configs/tfx/test_tfx_airflow.py
echo "[tfx-airflow-test] PASSED in $(( $(date +%s) - started )) s" >&2
