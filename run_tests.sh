#!/usr/bin/env bash
# Sets up .venv and the real input files when missing, then runs the test suite on two pytest-xdist workers
# (`-n 2 --dist loadgroup`: a module's tests on one worker, the tests that start process pools one after another on
# one worker; tests/conftest.py). TFRECORD_ETL_TEST_WORKERS sets the number of workers (`auto`: one per CPU; 0: all in
# this process, serially). Extra arguments go to pytest and win, e.g. ./run_tests.sh -k codec -x, or
# ./run_tests.sh -n 0 tests/test_codec.py for one file serially (docs/development.md, "Tests").
source "$(dirname "${BASH_SOURCE[0]}")/.ci/env.sh"
cd "$ROOT"
exec "$PY" -m pytest -n "${TFRECORD_ETL_TEST_WORKERS:-2}" --dist loadgroup "$@"
