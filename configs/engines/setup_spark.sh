#!/usr/bin/env bash
# Fetches (once) a standalone Spark distribution and Beam's Spark job server into .engines/spark/.
#
#   bash configs/engines/setup_spark.sh      # idempotent: a second run only checks the stamp file
#
# Versions: Beam's newest Spark 3 runner that Maven Central serves here with its dependencies is
# beam-runners-spark-3:2.50.0 (the -job-server jars, and the runner at 2.55-2.77, are refused); it declares Spark
# 3.2.2 "provided", so the job server runs on the Spark jars of the pyspark wheel: pyspark 3.3.4 (Scala 2.12, the
# first Spark line that supports Java 17, the Java here). The pipelines' Python SDK stays 2.77. Downloads go
# through pip's and Maven's caches; the distribution stays in .engines/spark/ (git-ignored), reused when its
# stamp matches.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SPARK_VERSION="${TFRECORD_ETL_SPARK_VERSION:-3.3.4}"
BEAM_JOB_SERVER="${TFRECORD_ETL_SPARK_BEAM:-org.apache.beam:beam-runners-spark-3:2.50.0}"
DEST="$ROOT/.engines/spark"
STAMP="$DEST/.ready-$SPARK_VERSION-${BEAM_JOB_SERVER//:/_}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -f "$STAMP" ] && { echo "spark: $DEST ready (Spark $SPARK_VERSION, $BEAM_JOB_SERVER)"; exit 0; }

fail() { echo "setup_spark.sh: FAILED: $*" >&2; exit 1; }
run() { "$@" || fail "$(printf '%q ' "$@")"; }
# shellcheck source=configs/engines/maven_jars.sh
source "$ROOT/configs/engines/maven_jars.sh"
command -v java >/dev/null || fail "java is not on PATH (Spark and the job server need Java 17)"
command -v mvn >/dev/null || fail "mvn is not on PATH (the job server comes from Maven Central)"

rm -rf "$DEST/py" "$DEST/jobserver"
mkdir -p "$DEST/jobserver"
# pyspark bundles Spark (bin/spark-class, jars/); --no-deps --target: not into .venv (py4j is not needed to run
# the master and workers).
run "$PY" -m pip install -q --no-deps --target "$DEST/py" "pyspark==$SPARK_VERSION"
[ -x "$DEST/py/pyspark/bin/spark-class" ] || fail "no bin/spark-class in the pyspark wheel under $DEST/py"
maven_jars "$BEAM_JOB_SERVER" "$DEST/jobserver" spark-job-server
touch "$STAMP"
echo "spark: $DEST ready (Spark $SPARK_VERSION, $BEAM_JOB_SERVER)"
