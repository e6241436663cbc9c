#!/usr/bin/env bash
# Fetches (once) a Flink session cluster's distribution and Beam's Flink job server into .engines/flink/.
#
#   bash configs/engines/setup_flink.sh      # idempotent: a second run only checks the stamp file
#
# Versions: Beam's newest Flink runner that Maven Central serves here with all its dependencies is
# beam-runners-flink-1.16:2.50.0 (the -job-server jars and the 1.17-1.20 runners at 2.55-2.77 are refused), so
# the cluster is Flink 1.16.3 and the job server is Beam 2.50.0's FlinkJobServerDriver run from the runner jar
# and its dependencies; the pipelines' Python SDK stays 2.77 (the portable Runner/Fn API bridges the skew).
# Flink's distribution comes from PyPI: the apache-flink wheel holds bin/ and conf/, apache-flink-libraries
# lib/ (flink-dist). Downloads go through pip's and Maven's own caches (~/.cache/pip, ~/.m2); the extracted
# distribution stays in .engines/flink/ (git-ignored) and is reused when its stamp matches.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
FLINK_VERSION="${TFRECORD_ETL_FLINK_VERSION:-1.16.3}"
BEAM_JOB_SERVER="${TFRECORD_ETL_FLINK_BEAM:-org.apache.beam:beam-runners-flink-1.16:2.50.0}"
DEST="$ROOT/.engines/flink"
STAMP="$DEST/.ready-$FLINK_VERSION-${BEAM_JOB_SERVER//:/_}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -f "$STAMP" ] && { echo "flink: $DEST ready (Flink $FLINK_VERSION, $BEAM_JOB_SERVER)"; exit 0; }

fail() { echo "setup_flink.sh: FAILED: $*" >&2; exit 1; }
run() { "$@" || fail "$(printf '%q ' "$@")"; }
# shellcheck source=configs/engines/maven_jars.sh
source "$ROOT/configs/engines/maven_jars.sh"
command -v java >/dev/null || fail "java is not on PATH (Flink and the job server need Java 11 or 17)"
command -v mvn >/dev/null || fail "mvn is not on PATH (the job server comes from Maven Central)"

rm -rf "$DEST/dl" "$DEST/home" "$DEST/jobserver"
mkdir -p "$DEST/dl" "$DEST/home" "$DEST/jobserver"
# apache-flink has no wheel for Python 3.11 at 1.16 and its sdist does not build there; only bin/ and conf/ are
# needed (shell scripts), so take the cp39 wheel, whatever the Python here is.
run "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.9 --platform manylinux1_x86_64 \
    "apache-flink==$FLINK_VERSION" -d "$DEST/dl"
run "$PY" -m pip download -q --no-deps --no-build-isolation "apache-flink-libraries==$FLINK_VERSION" -d "$DEST/dl"
run "$PY" - "$DEST" <<'PYEOF'
import pathlib, shutil, sys, tarfile, zipfile
dest = pathlib.Path(sys.argv[1]); home = dest / "home"
wheel = next((dest / "dl").glob("apache_flink-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        parts = info.filename.split("/")
        if len(parts) >= 3 and parts[0] == "pyflink" and parts[1] in ("bin", "conf") and not info.is_dir():
            target = home.joinpath(*parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(info))
            target.chmod(0o755 if parts[1] == "bin" else 0o644)
sdist = next((dest / "dl").glob("apache-flink-libraries-*.tar.gz"))
with tarfile.open(sdist) as t:
    for m in t.getmembers():
        parts = m.name.split("/")
        if len(parts) >= 4 and parts[1] == "deps" and parts[2] in ("lib", "opt", "bin", "plugins") and m.isfile():
            target = home.joinpath(*parts[2:])
            target.parent.mkdir(parents=True, exist_ok=True)
            with t.extractfile(m) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
(home / "log").mkdir(exist_ok=True)
assert list((home / "lib").glob("flink-dist*.jar")), "no flink-dist jar in apache-flink-libraries"
PYEOF
maven_jars "$BEAM_JOB_SERVER" "$DEST/jobserver" flink-job-server
rm -rf "$DEST/dl"
touch "$STAMP"
echo "flink: $DEST ready (Flink $FLINK_VERSION, $BEAM_JOB_SERVER)"
