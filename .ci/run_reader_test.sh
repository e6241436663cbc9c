#!/usr/bin/env bash
# End-to-end test of the light reader: PyTorch reads an output with the reader's install only.
#   1. builds the reader venv with torch 2.13.0, pytest and pytest-timeout, once per machine: it lives in
#      ${TFRECORD_ETL_CACHE:-~/.cache/tfrecord-etl}/venv-reader-<hash of the pins> (READER_VENV=DIR uses another),
#      outside the checkout, so every clean clone on the same machine reuses it. pip takes torch's CPU build from
#      the machine's disk when PIP_FIND_LINKS has it (about 1.5 minutes); otherwise PyPI's build with its CUDA
#      packages (4.8 GB, about 8 minutes: the libraries must be present for `import torch`, unused on CPU);
#   2. installs this checkout into it as a user does, `pip install .` (the base requirements: NumPy and
#      google-crc32c; no Beam, no TensorFlow, no pyarrow, no h5py), from a copy so the checkout stays clean, each
#      run replacing the last run's copy;
#   3. the project's .venv converts the output of tests/test_torch_io.py (strings, floats, images, bools, train/test
#      splits, index files), then .venv-reader runs tests/test_torch_io.py on it: RandomAccess, iter_numpy, get,
#      the README's DataLoader recipe, and a DataLoader with 2 workers in a fresh interpreter outside the checkout
#      (the installed copy), every value exact against the converted arrays.
# Part of .ci/run (TFRECORD_ETL_READER=0 skips it). Needs the project's .venv (./run_tests.sh makes it).
# KEEP_WORK=1 keeps the work dir.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
started=$(date +%s)

if [ ! -x "$PY" ]; then
  echo "[reader-test] $PY is missing: run ./run_tests.sh first" >&2
  exit 1
fi
# PyTorch's CPU build (on this machine's disk), and the test tools at the project venv's versions
READER_PACKAGES="torch==2.13.0 $("$PY" -c 'import importlib.metadata as m; print(" ".join(
    f"{d}=={m.version(d)}" for d in ("pytest", "pytest-timeout")))')"
pins="$(echo "$READER_PACKAGES" | sha1sum | cut -c1-12)"
RVENV="${READER_VENV:-${TFRECORD_ETL_CACHE:-$HOME/.cache/tfrecord-etl}/venv-reader-$pins}"
stamp="$RVENV/.installed-$pins"
if [ ! -f "$stamp" ]; then
  echo "[reader-test] building $RVENV ($READER_PACKAGES)" >&2
  rm -rf "$RVENV"
  "${PYTHON:-python3}" -m venv "$RVENV"
  log="$(mktemp)"
  # shellcheck disable=SC2086
  if ! "$RVENV/bin/python" -m pip install -q $READER_PACKAGES > "$log" 2>&1; then
    tail -40 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  echo "[reader-test] $RVENV built in $(( $(date +%s) - started )) s" >&2
  touch "$stamp"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/tfrecord-etl-reader.XXXXXX")"
trap '[ "${KEEP_WORK:-0}" = 1 ] && echo "[reader-test] kept $WORK" >&2 || rm -rf "$WORK"' EXIT

# the reader's install of this checkout: a copy without the venvs, fixtures and caches (configs/devlinks.sh's links
# kept as links), then `pip install .`
"$PY" - "$ROOT" "$WORK/src" <<'EOF'
import shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2], symlinks=True, ignore=shutil.ignore_patterns(
    ".venv*", ".git", ".fixtures", "out", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", "tests", "bench"))
EOF
# this copy replaces the last run's, then its base requirements (nothing to do once they are there)
"$RVENV/bin/python" -m pip install -q --no-deps --force-reinstall "$WORK/src" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }
# (read outside the checkout: `python -c` puts the working directory first on sys.path, where an editable
# install's tfrecord_etl.egg-info would answer with the checkout's requirements instead of the installed copy's)
mapfile -t requirements < <(cd "$WORK" && "$RVENV/bin/python" -c "import importlib.metadata as m
print('\n'.join(r for r in m.requires('tfrecord-etl') if 'extra ==' not in r))")
"$RVENV/bin/python" -m pip install -q "${requirements[@]}" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }
(cd "$WORK" && "$RVENV/bin/python" -c "import importlib.metadata as m, tfrecord_etl; print('[reader-test] installed', \
m.version('tfrecord-etl'), 'in', tfrecord_etl.__path__[0], 'requires', [r for r in m.requires('tfrecord-etl') \
if 'extra ==' not in r])" >&2)

# the output, converted by the project's venv (the same flags and seeded arrays as tests/test_torch_io.py)
(cd "$ROOT" && TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c "import sys; from tests.test_torch_io import make_mixed; \
make_mixed(sys.argv[1])" "$WORK/mixed" > "$WORK/convert.log" 2>&1) || { tail -30 "$WORK/convert.log" >&2; exit 1; }

cd "$ROOT"
TFRECORD_ETL_TORCH_OUTPUT="$WORK/mixed/out" "$RVENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_torch_io.py "$@"
echo "[reader-test] done in $(( $(date +%s) - started )) s" >&2
