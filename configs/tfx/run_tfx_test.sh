#!/usr/bin/env bash
# End-to-end test of tfrecord_etl.tfx (ArraysExampleGen) in a real TFX 1.21 pipeline, offline:
#   1. builds .venv-tfx (a separate venv: TFX's pins, e.g. pyarrow<19, clash with the project's .venv; TFX_VENV=DIR
#      uses another) with tfx==1.21.0 and this checkout with its pipelines (install -e .[beam], so the test runs
#      the code it checks out), installed with uv (.ci/pip_install.sh);
#      the first time minutes and several GB, then reused while the stamp (packages + setup.py) is unchanged.
#      TFX 1.21's ml-metadata and tensorflow-data-validation publish Linux wheels only as manylinux_2_39: on an older
#      glibc (Debian 12 has 2.36) pip refuses them, so they are downloaded for that tag and installed with
#      `installer`, and glibc_compat.py makes their extensions load (see that file: six symbols of glibc 2.38 / GCC 13-14);
#   2. runs configs/tfx/test_tfx_pipeline.py with the venv's pytest: ArraysExampleGen -> StatisticsGen ->
#      SchemaGen -> ExampleValidator -> Transform on LocalDagRunner with a SQLite ML Metadata store, two spans, a
#      cached rerun, exact read-back; and configs/tfx/test_tfx_placeholders.py ({SPAN}/{VERSION}, dates, range
#      configs, a span resolver);
#   3. runs configs/tfx/run_tfx_airflow_test.sh: the component under TFX's AirflowDagRunner on Airflow 2
#      (TFRECORD_ETL_TFX_AIRFLOW=0 skips it).
# Part of .ci/run (TFRECORD_ETL_TFX=0 skips it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TVENV="${TFX_VENV:-$ROOT/.venv-tfx}"
TFX_PACKAGES="tfx==1.21.0 pytest==8.0.0 pytest-timeout==2.4.0"
NEW_GLIBC_WHEELS="ml-metadata==1.21.0 tensorflow-data-validation==1.21.0"
started=$(date +%s)
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONWARNINGS=ignore
PY="$TVENV/bin/python"

stamp="$TVENV/.installed-$( (echo "$TFX_PACKAGES $NEW_GLIBC_WHEELS $ROOT"; cat "$ROOT/setup.py" \
  "$ROOT/configs/tfx/glibc_compat.py") | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[tfx-test] building $TVENV ($TFX_PACKAGES; first time: minutes, several GB)" >&2
  rm -rf "$TVENV"
  "${PYTHON:-python3}" -m venv "$TVENV"
  log="$(mktemp)"
  # shellcheck disable=SC2086
  if ! {
      "$PY" -m pip install -q --upgrade pip installer &&
      # the wheels tagged manylinux_2_39: pip's own install on glibc >= 2.39, else downloaded for that tag
      { "$PY" -m pip install -q --no-deps $NEW_GLIBC_WHEELS || {
          wheels="$(mktemp -d)" &&
          "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_39_x86_64 \
            --python-version "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" -d "$wheels" \
            $NEW_GLIBC_WHEELS &&
          ls "$wheels"/*.whl | xargs -n1 "$PY" -m installer &&
          rm -rf "$wheels"; }; } &&
      # TFX and this checkout with the stages' installer (.ci/pip_install.sh: uv; TFRECORD_ETL_INSTALLER=pip: pip).
      # uv resolves every package against the index for this machine's platform, so it would refuse the two wheels
      # above: they are left out of its resolution (--excludes) and their own requirements passed instead (read
      # from their installed metadata), which installs the same packages at the same versions as pip (the freezes
      # compared: 206 packages). pip sees the installed wheels and needs neither.
      printf '%s\n' $NEW_GLIBC_WHEELS | sed 's/==.*//' > "$TVENV/new-glibc-wheels.txt" &&
      "$PY" -c 'import importlib.metadata as m, sys
for name in sys.argv[1:]:
    print("\n".join(r for r in m.requires(name) or [] if "extra ==" not in r))' \
        $(cat "$TVENV/new-glibc-wheels.txt") > "$TVENV/new-glibc-requirements.txt" &&
      if [ "${TFRECORD_ETL_INSTALLER:-uv}" = pip ]; then
        "$PY" -m pip install -q $TFX_PACKAGES
      else
        bash "$ROOT/.ci/pip_install.sh" "$PY" -q --excludes "$TVENV/new-glibc-wheels.txt" \
          -r "$TVENV/new-glibc-requirements.txt" $TFX_PACKAGES
      fi &&
      bash "$ROOT/.ci/pip_install.sh" "$PY" -q -e "$ROOT[beam]"
    } > "$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -40 >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  probe="import ml_metadata.metadata_store, tensorflow_data_validation"
  if ! "$PY" -c "$probe" > /dev/null 2>&1; then  # glibc / libstdc++ older than the manylinux_2_39 wheels need
    "$PY" "$ROOT/configs/tfx/glibc_compat.py" patch \
      "$site/ml_metadata/metadata_store/pywrap/metadata_store_extension.so" \
      "$site/tensorflow_data_validation/pywrap/tensorflow_data_validation_extension.so" >&2
    "$PY" "$ROOT/configs/tfx/glibc_compat.py" shim "$site" > /dev/null
    if ! out="$("$PY" -c "$probe" 2>&1)"; then
      echo "$out" | tail -5 >&2
      echo "[tfx-test] ML Metadata / TFDV do not import" >&2
      exit 1
    fi
  fi
  echo "[tfx-test] $TVENV built in $(( $(date +%s) - started )) s, $(du -sh "$TVENV" | cut -f1)" >&2
  rm -f "$TVENV"/.installed-*
  touch "$stamp"
fi

cd "$ROOT"
"$PY" -m pytest -q -p no:cacheprovider configs/tfx/test_tfx_pipeline.py configs/tfx/test_tfx_placeholders.py
if [ "${TFRECORD_ETL_TFX_AIRFLOW:-1}" != 0 ]; then TFX_VENV="$TVENV" bash configs/tfx/run_tfx_airflow_test.sh; fi
echo "[tfx-test] PASSED in $(( $(date +%s) - started )) s" >&2
