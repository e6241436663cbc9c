#!/usr/bin/env bash
# End-to-end test of the Airflow DAGs in configs/airflow/ with a real Airflow, offline:
#   1. builds .venv-airflow (a separate venv: Airflow's pins clash with the project's; AIRFLOW_VENV=DIR uses
#      another) with apache-airflow 3.3.2, apache-airflow-providers-apache-beam 6.3.1 and
#      apache-airflow-providers-google (the Beam operator imports it even for DirectRunner), installed by
#      .ci/pip_install.sh (uv); first time about a minute (2-3 with an empty uv cache), 1.6 GB, then reused;
#   2. AIRFLOW_HOME in a temp dir: `airflow db migrate` (sqlite), the DAG files and tfrecord_etl_tasks.py copied
#      into its dags folder; every DAG must import (dag_import_errors.py prints the error of one that does not,
#      also when a DAG is not found later), within AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT (300 s here, Airflow's 30 s
#      can pass on a busy machine);
#   3. check_dags.py, its three stages at once (below): `airflow dags test` of tfrecord_etl (one file), tfrecord_etl_daily (three logical dates, one
#      twice) and tfrecord_etl_incremental (three days' files, a fourth day added, nothing new), each task a
#      BeamRunPythonPipelineOperator running the project's .venv python on DirectRunner; then the collections
#      are read back exactly (our reader and plain TensorFlow), the re-run must rewrite the same shard bytes and
#      touch no other span, the run with nothing new must write nothing.
# Part of .ci/run (TFRECORD_ETL_AIRFLOW=0 skips it). Needs the project's .venv (./run_tests.sh makes it).
# CHECK_DAGS_ONLY=manual,daily,incremental runs some stages; KEEP_WORK=1 keeps the work dir.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$ROOT/.venv/bin/python"
AVENV="${AIRFLOW_VENV:-$ROOT/.venv-airflow}"
AIRFLOW_PACKAGES="apache-airflow==3.3.2 apache-airflow-providers-apache-beam==6.3.1 apache-airflow-providers-google"
started=$(date +%s)

if [ ! -x "$PY" ]; then
  echo "[airflow-test] $PY is missing: run ./run_tests.sh first" >&2
  exit 1
fi
stamp="$AVENV/.installed-$(echo "$AIRFLOW_PACKAGES" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[airflow-test] building $AVENV ($AIRFLOW_PACKAGES; first time: minutes, ~2 GB)" >&2
  "${PYTHON:-python3}" -m venv "$AVENV"
  log="$(mktemp)"
  # (.ci/pip_install.sh: uv, or pip with TFRECORD_ETL_INSTALLER=pip)
  # shellcheck disable=SC2086
  if ! bash "$ROOT/.ci/pip_install.sh" "$AVENV/bin/python" -q $AIRFLOW_PACKAGES > "$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -40 >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  echo "[airflow-test] $AVENV built in $(( $(date +%s) - started )) s" >&2
  rm -f "$AVENV"/.installed-*
  touch "$stamp"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/tfrecord-etl-airflow.XXXXXX")"
# (the stages below run in the background: stopped with this script, whichever way it ends)
trap 'rc=$?; jobs -p | xargs -r kill 2> /dev/null || true
  [ "${KEEP_WORK:-0}" = 1 ] && echo "[airflow-test] kept $WORK" >&2 || rm -rf "$WORK"; exit $rc' EXIT
export AIRFLOW_HOME="$WORK/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$AIRFLOW_HOME/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
# Airflow gives a DAG file 30 s to import by default; tfrecord_etl's DAGs import in about 2 s, TFX's in 12 s on a quiet
# machine, and a busy one (the stages at once, other jobs) can pass 30 s: the DAG then "could not be found". 300 s
# (the docs say the same to users: docs/scheduled.md); a DAG that does not load has its import error printed.
export AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT="${AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT:-300}"
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW_LOG_LEVEL:-ERROR}"
export PYTHONWARNINGS=ignore              # e.g. "Could not import graphviz" on every CLI call
export TFRECORD_ETL_ROOT="$ROOT"
export TFRECORD_ETL_PYTHON="$PY"         # the tasks' python (py_interpreter): the project's venv
export TF_CPP_MIN_LOG_LEVEL=3
export TFRECORD_ETL_RETRIES=0             # a failing task fails the test now, not after a retry delay
export TFRECORD_ETL_START_DATE=2026-11-01
mkdir -p "$AIRFLOW__CORE__DAGS_FOLDER"
cp "$ROOT"/configs/airflow/tfrecord_etl_*.py "$AIRFLOW__CORE__DAGS_FOLDER/"

echo "[airflow-test] airflow db migrate (AIRFLOW_HOME=$AIRFLOW_HOME)" >&2
"$AVENV/bin/airflow" db migrate > "$WORK/migrate.log" 2>&1 || { tail -50 "$WORK/migrate.log" >&2; exit 1; }
# every DAG file must import: Airflow's DagBag parses them as `dags test` will, and prints each file's error if not
if ! "$AVENV/bin/python" "$ROOT/configs/airflow/dag_import_errors.py" "$AIRFLOW__CORE__DAGS_FOLDER"; then
  echo "[airflow-test] FAILED: a DAG file does not import (its error above)" >&2
  exit 1
fi

cd "$ROOT"  # `python -m tfrecord_etl...` in the tasks finds this checkout first, wherever .venv installed it from
# The three stages at once, each with an AIRFLOW_HOME of its own (a copy of the migrated one: its sqlite database,
# and airflow.cfg with the paths moved) and a work folder of its own: they share nothing but the DAG files. Their
# DAG runs are mostly interpreters starting (Airflow, then Beam and TensorFlow in each task), so on 2 cores the
# stage takes about half as long as one stage after another. AIRFLOW_STAGES_AT_ONCE=1 runs them one after another.
stages="${CHECK_DAGS_ONLY:-manual,daily,incremental}"
names=() pids=()
for stage in ${stages//,/ }; do
  home="$WORK/$stage/airflow"
  mkdir -p "$home"
  cp -r "$AIRFLOW_HOME/dags" "$AIRFLOW_HOME/airflow.db" "$home/"
  sed "s#$AIRFLOW_HOME#$home#g" "$AIRFLOW_HOME/airflow.cfg" > "$home/airflow.cfg"
  (
    export AIRFLOW_HOME="$home" AIRFLOW__CORE__DAGS_FOLDER="$home/dags"
    rc=0
    "$PY" "$ROOT/configs/airflow/check_dags.py" --airflow "$AVENV/bin/airflow" --work "$WORK/$stage" \
      --only "$stage" || rc=$?
    echo "$rc" > "$WORK/$stage.rc"
  ) > "$WORK/$stage.log" 2>&1 &
  names+=("$stage") pids+=($!)
  if [ "${AIRFLOW_STAGES_AT_ONCE:-3}" = 1 ]; then wait "${pids[-1]}"; fi
done
wait
failed=()
for stage in "${names[@]}"; do
  cat "$WORK/$stage.log" >&2
  [ "$(cat "$WORK/$stage.rc" 2>/dev/null)" = 0 ] || failed+=("$stage")
done
if [ "${#failed[@]}" != 0 ]; then
  echo "[airflow-test] FAILED: ${failed[*]} (logs above)" >&2
  exit 1
fi
echo "[airflow-test] PASSED in $(( $(date +%s) - started )) s" >&2
