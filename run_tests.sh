#!/usr/bin/env bash
# Sets up .venv and the real input files when missing, then runs the test suite.
# Extra arguments go to pytest, e.g. ./run_tests.sh -k codec -x
source "$(dirname "${BASH_SOURCE[0]}")/.ci/env.sh"
cd "$ROOT"
exec "$PY" -m pytest "$@"
