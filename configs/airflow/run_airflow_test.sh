#!/usr/bin/env bash
# End-to-end test of configs/airflow/tfrecord_etl_dag.py with a real Airflow, offline:
#   1. builds .venv-airflow (a separate venv: Airflow's pins clash with the project's) with apache-airflow 3.3.2,
#      apache-airflow-providers-apache-beam 6.3.1 and apache-airflow-providers-google (the Beam operator
#      imports it even for DirectRunner); first time about 3.5 minutes and 2.2 GB, then reused;
#   2. AIRFLOW_HOME in a temp dir: `airflow db migrate` (sqlite), the DAG file copied into its dags folder;
#   3. generates a small HDF5 input and runs `airflow dags test tfrecord_etl` (convert -> augment -> verify on
#      DirectRunner, each task a BeamRunPythonPipelineOperator running the project's .venv python);
#   4. checks every task succeeded and the outputs read back.
# Opt-in CI stage: TFRECORD_ETL_AIRFLOW=1 bash .ci/run. Needs the project's .venv (./run_tests.sh makes it).
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
  # shellcheck disable=SC2086
  if ! { "$AVENV/bin/python" -m pip install -q --upgrade pip && "$AVENV/bin/python" -m pip install -q $AIRFLOW_PACKAGES; } \
      > "$log" 2>&1; then
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
trap '[ "${KEEP_WORK:-0}" = 1 ] && echo "[airflow-test] kept $WORK" >&2 || rm -rf "$WORK"' EXIT
export AIRFLOW_HOME="$WORK/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$AIRFLOW_HOME/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW_LOG_LEVEL:-ERROR}"
export PYTHONWARNINGS=ignore              # e.g. "Could not import graphviz" on every CLI call
export TFRECORD_ETL_ROOT="$ROOT"         # the DAG runs `python -m pipelines.*` from here
export TFRECORD_ETL_PYTHON="$PY"         # ... with the project's venv python (py_interpreter)
export TF_CPP_MIN_LOG_LEVEL=3
mkdir -p "$AIRFLOW__CORE__DAGS_FOLDER"
cp "$ROOT/configs/airflow/tfrecord_etl_dag.py" "$AIRFLOW__CORE__DAGS_FOLDER/"

echo "[airflow-test] airflow db migrate (AIRFLOW_HOME=$AIRFLOW_HOME)" >&2
"$AVENV/bin/airflow" db migrate > "$WORK/migrate.log" 2>&1 || { tail -50 "$WORK/migrate.log" >&2; exit 1; }
"$AVENV/bin/airflow" dags list-import-errors > "$WORK/import-errors.log" 2>&1 || true
if grep -q "tfrecord_etl_dag.py" "$WORK/import-errors.log"; then
  cat "$WORK/import-errors.log" >&2
  exit 1
fi

echo "[airflow-test] generating a small input" >&2
mkdir -p "$WORK/data"
"$PY" - "$WORK/data" <<'PYEOF'
import sys
import h5py
import numpy as np
d = sys.argv[1]
ids = np.arange(500, dtype="<i8")
with h5py.File(f"{d}/in.h5", "w") as f:
    f.create_dataset("id", data=ids, chunks=(100,))
    f.create_dataset("x", data=np.stack([ids, ids / 2, -ids], axis=1).astype(">f4"), chunks=(100, 3),
                     compression="gzip")
np.save(f"{d}/labels.npy", (ids * 10).astype("<i4"))
PYEOF

conf=$("$PY" -c 'import json, sys; w = sys.argv[1]; print(json.dumps({
    "input": f"{w}/data/in.h5", "output_dir": f"{w}/out/converted", "augmented_dir": f"{w}/out/augmented",
    "runner": "DirectRunner",
    "beam_options": {"direct_running_mode": "multi_processing", "direct_num_workers": 2},
    "convert_options": {"compression": "gzip", "num_shards": 2, "config": sys.argv[2]},
    "augment_options": {"join_input": f"{w}/data/labels.npy", "join_fields": "array=label",
                        "constants": "etl_source=airflow"}}))' "$WORK" "$ROOT/configs/local.yaml")
echo "[airflow-test] airflow dags test tfrecord_etl --conf $conf" >&2
set +e
AIRFLOW__LOGGING__LOGGING_LEVEL=INFO "$AVENV/bin/airflow" dags test tfrecord_etl --conf "$conf" \
  > "$WORK/dags-test.log" 2>&1
code=$?
set -e
# the JSON line of a CLI call's output (warnings may come before it)
json_line() { grep -E '^\[' | tail -1; }
"$AVENV/bin/airflow" dags list-runs tfrecord_etl -o json 2>/dev/null | json_line > "$WORK/runs.json" || true
run_id=$("$PY" -c 'import json, sys; runs = json.load(open(sys.argv[1])); print(runs[0]["run_id"] if runs else "")' \
  "$WORK/runs.json" 2>/dev/null || true)
states="[]"
if [ -n "$run_id" ]; then
  states=$("$AVENV/bin/airflow" tasks states-for-dag-run tfrecord_etl "$run_id" -o json 2>/dev/null | json_line || true)
fi
echo "[airflow-test] task states: $states" >&2
if [ $code -ne 0 ] || ! "$PY" -c '
import json, sys
states = {t["task_id"]: t["state"] for t in json.loads(sys.argv[1])}
runs = json.load(open(sys.argv[2]))
ok = runs and runs[0]["state"] == "success" and all(states.get(t) == "success" for t in ("convert", "augment", "verify"))
sys.exit(0 if ok else 1)' "$states" "$WORK/runs.json"; then
  grep -E "Running command|ERROR|error:|Traceback|Error" "$WORK/dags-test.log" | tail -40 >&2 || true
  tail -40 "$WORK/dags-test.log" >&2
  echo "[airflow-test] FAILED: airflow dags test exited $code; runs: $(cat "$WORK/runs.json")" >&2
  exit 1
fi
grep -E "Running command: " "$WORK/dags-test.log" | sed -E 's/.*Running command: /[airflow-test] ran: /' | cut -c1-400 >&2 || true

echo "[airflow-test] checking the outputs" >&2
"$PY" - "$WORK/out" "$WORK/dags-test.log" <<'PYEOF'
import json
import re
import sys

out, log = sys.argv[1], open(sys.argv[2]).read()
from transforms import reader
conv = list(reader.iter_numpy(f"{out}/converted"))
aug = list(reader.iter_numpy(f"{out}/augmented"))
assert len(conv) == len(aug) == 500, (len(conv), len(aug))
assert [int(e["id"]) for e in aug] == list(range(500))
assert [int(e["label"]) for e in aug] == [10 * i for i in range(500)]
assert re.search(r"OK: \S*out/augmented: output, 500 records", log), "no verify report in the task log"
assert re.search(r"wrote 500 examples in 2 shards, \d+ bytes \(gzip\) to \S*out/converted", log)
print("[airflow-test] outputs OK:", json.load(open(f"{out}/augmented/metadata.json"))["num_records"], "records")
PYEOF
echo "[airflow-test] PASSED in $(( $(date +%s) - started )) s" >&2
