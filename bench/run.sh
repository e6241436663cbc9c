#!/usr/bin/env bash
# The benchmark from a fresh clone in one command: sets up .venv (as run_tests.sh does), adds the
# bench extra (matplotlib for the PNG chart, psutil for process-tree RSS) when missing, then runs
#   python -m bench.run "$@"      e.g.  bench/run.sh --repeat 3     or     bench/run.sh --scale 0.02 --only small
source "$(dirname "${BASH_SOURCE[0]}")/../.ci/env.sh"
cd "$ROOT"
if ! "$PY" -c "import matplotlib, psutil" 2>/dev/null; then
  echo "[setup] installing the bench extra (matplotlib, psutil) into .venv" >&2
  "$PY" -m pip install -q -e "$ROOT[bench]"
fi
exec "$PY" -m bench.run "$@"
