#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, fetch the real demo input, convert it on DirectRunner,
# read the output back with tf.data and print a summary.
#   ./run_local.sh [INPUT_PATTERN] [extra convert flags...]
# Default input: pvlib 0.16.1's LinkeTurbidities.h5 (/LinkeTurbidity: 2160 x 4320 x 12 uint8, gzip, 112 MB raw).
source "$(dirname "${BASH_SOURCE[0]}")/.ci/env.sh"
cd "$ROOT"
INPUT="${1:-$FIXTURES/pvlib/data/LinkeTurbidities.h5}"
shift || true
OUT="${OUT:-$ROOT/out/demo}"
export HOME="${BEAM_HOME:-$HOME}"
"$PY" -m pipelines.convert --config configs/local.yaml --input "$INPUT" --output_dir "$OUT" --overwrite "$@"
"$PY" -m pipelines.inspect "$OUT" --tf_read
