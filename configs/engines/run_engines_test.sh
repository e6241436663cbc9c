#!/usr/bin/env bash
# The engines stage: the pipelines on real Beam engines on this machine, on loopback (tests in configs/engines/):
#   1. runs every configs/engines/setup_NAME.sh present (Prism: setup_prism.sh builds Beam's Go runner with
#      `go install`), each skipped with TFRECORD_ETL_NAME=0 (TFRECORD_ETL_PRISM=0, ...), which also leaves out
#      configs/engines/test_NAME.py. A setup script fetches and builds what its engine needs into the git-ignored
#      .engines/ (reused when present; downloads go through each tool's own cache: Go's module and build caches,
#      ~/.m2, pip's cache) and may leave processes running for the tests (a cluster): they are stopped when the
#      stage ends. It may write what the tests need to know (ports, paths) under $ENGINES_RUN_DIR;
#   2. runs `.venv/bin/python -m pytest configs/engines` with the project's .venv (no venv of its own), on two
#      pytest-xdist workers, a module per worker at a time;
#   3. stops every process it started, when the tests pass, fail or the stage is interrupted: each setup script
#      and pytest run in a process group of their own (setsid), and the EXIT trap sends SIGTERM to every such
#      group, then SIGKILL to what is still there 10 s later. Daemons that call setsid themselves must be stopped
#      by their setup script's own stop hook: a file $ENGINES_RUN_DIR/stop-NAME.sh, run by the trap first.
# Part of .ci/run (TFRECORD_ETL_ENGINES=0 skips it). Needs the project's .venv (./run_tests.sh makes it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$ROOT/.venv/bin/python"
started=$(date +%s)
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONWARNINGS=ignore

if [ ! -x "$PY" ]; then
  echo "[engines-test] $PY is missing: run ./run_tests.sh first" >&2
  exit 1
fi
ENGINES_RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/tfrecord-etl-engines.XXXXXX")"
export ENGINES_RUN_DIR
groups=()

stop_all() {
  local rc=$? hook pg alive
  trap - EXIT INT TERM
  for hook in "$ENGINES_RUN_DIR"/stop-*.sh; do
    [ -f "$hook" ] && { bash "$hook" >&2 || echo "[engines-test] $hook failed" >&2; }
  done
  for pg in "${groups[@]}"; do kill -TERM -- "-$pg" 2> /dev/null || true; done
  for _ in $(seq 1 20); do
    alive=0
    for pg in "${groups[@]}"; do kill -0 -- "-$pg" 2> /dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for pg in "${groups[@]}"; do
    if kill -0 -- "-$pg" 2> /dev/null; then
      echo "[engines-test] process group $pg still running after SIGTERM: SIGKILL" >&2
      kill -KILL -- "-$pg" 2> /dev/null || true
    fi
  done
  rm -rf "$ENGINES_RUN_DIR"
  exit "$rc"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# runs "$@" in a process group of its own (recorded for stop_all) and returns its exit status
in_group() {
  setsid "$@" &
  local pid=$!
  groups+=("$pid")
  local rc=0
  wait "$pid" || rc=$?
  return "$rc"
}

cd "$ROOT"
ignore=()
ran=0
for setup in configs/engines/setup_*.sh; do
  [ -f "$setup" ] || continue
  name="$(basename "$setup" .sh)"
  name="${name#setup_}"
  var="TFRECORD_ETL_$(echo "$name" | tr '[:lower:]' '[:upper:]')"
  if [ "${!var:-1}" = 0 ]; then
    echo "[engines-test] $name skipped ($var=0)" >&2
    ignore+=("--ignore=configs/engines/test_$name.py")
    continue
  fi
  t0=$(date +%s)
  in_group bash "$setup" > /dev/null
  echo "[engines-test] $name ready in $(( $(date +%s) - t0 )) s" >&2
  ran=$((ran + 1))
done

rc=0
# two pytest-xdist workers, a module's tests on one of them (--dist loadfile: a module's clusters and stores are
# module-scoped fixtures, started once per module); most of a small job's time is waiting (JVMs, job submission, a
# harness starting), so two modules at once on two cores take less wall time than one after another.
# TFRECORD_ETL_ENGINE_WORKERS=0 runs them one after another. --no-loadscope-reorder: the modules in conftest's
# MODULE_ORDER, longest first (xdist's default order, by number of tests, left the stage ~200 s longer).
workers="${TFRECORD_ETL_ENGINE_WORKERS:-2}"
order=()
[ "$workers" != 0 ] && order=(--no-loadscope-reorder)
in_group "$PY" -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile "${order[@]}" --durations=0 \
  configs/engines "${ignore[@]}" || rc=$?
if [ "$rc" = 5 ]; then  # pytest: no tests collected
  if [ "$ran" = 0 ]; then  # every engine skipped
    echo "[engines-test] no engine tests to run (every engine skipped)" >&2
    rc=0
  else  # an engine was set up but none of its tests ran (a test module skipped or lost as a whole)
    echo "[engines-test] no engine test ran although $ran engine(s) were set up" >&2
  fi
fi
if [ "$rc" != 0 ]; then
  echo "[engines-test] FAILED (pytest exit $rc) after $(( $(date +%s) - started )) s" >&2
  exit "$rc"
fi
echo "[engines-test] PASSED in $(( $(date +%s) - started )) s" >&2
