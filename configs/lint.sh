#!/usr/bin/env bash
# Lint, format check and type check: what .ci/run's lint stage runs (seconds). Settings in pyproject.toml.
#   configs/lint.sh          check only: ruff check, ruff format --check, mypy over the public API; exit 1 on a finding
#   configs/lint.sh --fix    apply ruff's fixes (the safe ones and pyproject's extend-safe-fixes) and its format,
#                            then check (what is left needs a hand)
# LINT_BIN=DIR takes ruff and mypy from DIR (default: the checkout's .venv/bin).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BIN=${LINT_BIN:-$ROOT/.venv/bin}

if [ "${1:-}" = --fix ]; then
    "$BIN/ruff" check --fix --quiet . || true  # what cannot be fixed is listed by the check below
    "$BIN/ruff" format --quiet .
    exec bash "$ROOT/configs/lint.sh"
elif [ $# -gt 0 ]; then
    echo "usage: configs/lint.sh [--fix]" >&2
    exit 2
fi

status=0
echo "ruff check"
"$BIN/ruff" check --output-format concise . || status=1
echo "ruff format --check"
"$BIN/ruff" format --check . || status=1

# mypy reads the package as tfrecord_etl: a tree of links (tfrecord_etl/'s files, transforms/ and pipelines/ as
# tfrecord_etl.transforms and .pipelines) beside its cache, outside the checkout.
WORK=${TFRECORD_ETL_CACHE:-$HOME/.cache/tfrecord-etl}/lint-$(printf %s "$ROOT" | sha256sum | cut -c1-12)
rm -rf "$WORK/src" && mkdir -p "$WORK/src/tfrecord_etl"
for f in "$ROOT"/tfrecord_etl/*.py; do ln -s "$f" "$WORK/src/tfrecord_etl/"; done
ln -s "$ROOT/transforms" "$WORK/src/tfrecord_etl/transforms"
ln -s "$ROOT/pipelines" "$WORK/src/tfrecord_etl/pipelines"
echo "mypy (the public API)"
# The modules that define tfrecord_etl.__all__ (tfrecord_etl/__init__.py's _PUBLIC).
(cd "$WORK/src" && "$BIN/mypy" --config-file "$ROOT/pyproject.toml" --cache-dir "$WORK/mypy-cache" \
    -m tfrecord_etl \
    -m tfrecord_etl.transforms.convert -p tfrecord_etl.transforms.augment -p tfrecord_etl.transforms.config \
    -p tfrecord_etl.transforms.planning -m tfrecord_etl.transforms.beam_io -p tfrecord_etl.transforms.beam \
    -m tfrecord_etl.transforms.reader \
    -m tfrecord_etl.transforms.reading.reader \
    -p tfrecord_etl.transforms.codec -m tfrecord_etl.transforms.sources -m tfrecord_etl.transforms.errors) || status=1
exit $status
