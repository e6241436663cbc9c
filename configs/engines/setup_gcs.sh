#!/usr/bin/env bash
# Builds fake-gcs-server (the GCS JSON API server most GCS client libraries test against) for the engines stage's
# gs:// tests: `go install github.com/fsouza/fake-gcs-server@v1.56.1` from the Go module proxy into
# .engines/fake-gcs-server/ (git-ignored). Reused when the binary there reports that module version
# (`go version -m`); Go's module and build caches make a rebuild in a clean clone seconds; a new machine downloads
# and compiles for about 4 minutes. Prints the binary's path on stdout. FAKE_GCS_VERSION=vX.Y.Z another release.
# Part of configs/engines/run_engines_test.sh (TFRECORD_ETL_GCS=0 skips it and configs/engines/test_gcs.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODULE="github.com/fsouza/fake-gcs-server"
VERSION="${FAKE_GCS_VERSION:-v1.56.1}"
DIR="$ROOT/.engines/fake-gcs-server"
BIN="$DIR/fake-gcs-server"

if [ -x "$BIN" ] && go version -m "$BIN" 2> /dev/null | grep -qE "^\s+mod\s+$MODULE\s+$VERSION(\s|$)"; then
  echo "[gcs] reusing $BIN ($VERSION)" >&2
  echo "$BIN"
  exit 0
fi
if ! command -v go > /dev/null; then
  echo "[gcs] 'go' is not on PATH: install Go (https://go.dev/doc/install) or skip the gs:// engine tests with TFRECORD_ETL_GCS=0" >&2
  exit 1
fi
started=$(date +%s)
mkdir -p "$DIR"
tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "[gcs] building $MODULE@$VERSION into $DIR (first time on a machine: downloads the modules)" >&2
if ! GOBIN="$tmp" go install -trimpath "$MODULE@$VERSION" > "$tmp/go-install.log" 2>&1; then
  tail -40 "$tmp/go-install.log" >&2
  echo "[gcs] go install failed (output above)" >&2
  exit 1
fi
mv -f "$tmp/fake-gcs-server" "$BIN"
echo "[gcs] built $BIN in $(( $(date +%s) - started )) s" >&2
echo "$BIN"
