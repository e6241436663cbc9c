#!/usr/bin/env bash
# Builds Beam's Prism runner (the Go portable runner) for the engines stage, offline after the first time:
#   `go install github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0` from the Go module proxy into .engines/prism/
#   (git-ignored). Reused when the binary there already reports that module version (`go version -m`), so a second
#   run does nothing. Go's own caches (GOMODCACHE, default ~/go/pkg/mod; GOCACHE, default ~/.cache/go-build) keep
#   the downloaded modules and the compiled packages: a clean clone on the same machine builds in ~10 s; a new
#   machine first downloads ~870 MB of modules (module cache) and compiles them: ~4.5 minutes of CPU.
# Prints the binary's path on stdout. PRISM_DIR=DIR builds elsewhere; PRISM_VERSION=vX.Y.Z another Beam release
# (it must match the installed apache-beam: Prism and the Python SDK speak the same Beam version).
# Part of configs/engines/run_engines_test.sh (TFRECORD_ETL_PRISM=0 skips it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${PRISM_VERSION:-v2.77.0}"
DIR="${PRISM_DIR:-$ROOT/.engines/prism}"
BIN="$DIR/prism"
MODULE="github.com/apache/beam/sdks/v2"

if [ -x "$BIN" ] && go version -m "$BIN" 2>/dev/null | grep -qE "^\s+mod\s+$MODULE\s+$VERSION(\s|$)"; then
  echo "[prism] reusing $BIN ($VERSION)" >&2
  echo "$BIN"
  exit 0
fi
if ! command -v go > /dev/null; then
  echo "[prism] 'go' is not on PATH: install Go (https://go.dev/doc/install) or skip Prism with TFRECORD_ETL_PRISM=0" >&2
  exit 1
fi
started=$(date +%s)
echo "[prism] building $MODULE/go/cmd/prism@$VERSION into $DIR (first time on a machine: downloads the modules)" >&2
mkdir -p "$DIR"
tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log="$tmp/go-install.log"
# GOBIN into a temp dir, then a rename: an interrupted build never leaves a half-written binary at $BIN
if ! GOBIN="$tmp" go install "$MODULE/go/cmd/prism@$VERSION" > "$log" 2>&1; then
  tail -40 "$log" >&2
  echo "[prism] go install failed (output above)" >&2
  exit 1
fi
mv -f "$tmp/prism" "$BIN"
echo "[prism] built $BIN in $(( $(date +%s) - started )) s" >&2
echo "$BIN"
