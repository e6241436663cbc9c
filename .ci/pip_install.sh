#!/usr/bin/env bash
# Installs packages into a venv with the stages' installer: `.ci/pip_install.sh VENV_PYTHON PIP_ARGS...`, the
# arguments as `pip install` takes them. The installer is uv (PyPI's `uv`, pinned below; `uv pip install`: the same
# requirements, resolved like pip (the Airflow venv: the same 274 packages at the same versions), downloaded in
# parallel and linked from uv's cache at ~/.cache/uv, compiled to .pyc as pip does), itself installed with pip the first time into
# ${TFRECORD_ETL_CACHE:-~/.cache/tfrecord-etl}/uv-<version> (a few seconds), then reused by every clone on the machine.
# TFRECORD_ETL_INSTALLER=pip installs with the venv's own pip instead (upgraded first), as the stages did before.
set -euo pipefail
UV_VERSION=0.13.9
python="$1"
shift
if [ "${TFRECORD_ETL_INSTALLER:-uv}" = pip ]; then
  "$python" -m pip install -q --upgrade pip
  exec "$python" -m pip install "$@"
fi
tool="${TFRECORD_ETL_CACHE:-$HOME/.cache/tfrecord-etl}/uv-$UV_VERSION"
if [ ! -x "$tool/bin/uv" ]; then
  rm -rf "$tool"
  "${PYTHON:-python3}" -m venv "$tool" >&2
  "$tool/bin/python" -m pip install -q "uv==$UV_VERSION" >&2
fi
# --compile-bytecode: the .pyc files written at install, as pip does; without them, where PYTHONDONTWRITEBYTECODE is set
# (this project's machines set it), every process compiles TensorFlow's, Beam's and Airflow's modules afresh at each
# import (measured: the suite 2,042 s instead of 948 s, its benchmark tests 2.5x slower)
exec "$tool/bin/uv" pip install --compile-bytecode --python "$python" "$@"
