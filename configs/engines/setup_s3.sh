#!/usr/bin/env bash
# Builds SeaweedFS (a distributed object store with an S3 gateway, Apache-2.0) for the engines stage's s3:// tests,
# offline after the first time, into .engines/seaweedfs/weed (git-ignored):
#   `go install` refuses the module (its go.mod has replace directives), so: `go mod download -json MODULE@VERSION`
#   (the Go module proxy), a writable copy of the module folder it names, `go build -trimpath ./weed` inside it.
# Reused while .engines/seaweedfs/.version names the same version, so a second run does nothing. -trimpath keeps
# Go's build cache (GOCACHE, default ~/.cache/go-build) valid for any copy's folder: a clean clone on a machine that
# built it once links the binary in about a minute; a new machine downloads ~600 MB of modules into GOMODCACHE and
# compiles for ~11 minutes on 2 cores (233 MB binary).
# Prints the binary's path on stdout. SEAWEEDFS_VERSION=v0.0.0-... another pseudo-version.
# Part of configs/engines/run_engines_test.sh (TFRECORD_ETL_S3=0 skips it and configs/engines/test_s3.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODULE="github.com/seaweedfs/seaweedfs"
VERSION="${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
DIR="$ROOT/.engines/seaweedfs"
BIN="$DIR/weed"

if [ -x "$BIN" ] && [ "$(cat "$DIR/.version" 2> /dev/null)" = "$VERSION" ]; then
  echo "[s3] reusing $BIN ($VERSION)" >&2
  echo "$BIN"
  exit 0
fi
if ! command -v go > /dev/null; then
  echo "[s3] 'go' is not on PATH: install Go (https://go.dev/doc/install) or skip the s3:// engine tests with TFRECORD_ETL_S3=0" >&2
  exit 1
fi
started=$(date +%s)
mkdir -p "$DIR"
tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
trap 'chmod -R u+w "$tmp" 2> /dev/null; rm -rf "$tmp"' EXIT
echo "[s3] building $MODULE@$VERSION into $DIR (first time on a machine: downloads the modules, ~11 min of compiling)" >&2
src="$(go mod download -json "$MODULE@$VERSION" | "${PYTHON:-python3}" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
cp -r "$src" "$tmp/src"
chmod -R u+w "$tmp/src"
# the binary into the temp dir, then a rename: an interrupted build never leaves a half-written binary at $BIN
if ! (cd "$tmp/src" && go build -trimpath -o "$tmp/weed" ./weed) > "$tmp/build.log" 2>&1; then
  tail -40 "$tmp/build.log" >&2
  echo "[s3] go build failed (output above)" >&2
  exit 1
fi
mv -f "$tmp/weed" "$BIN"
echo "$VERSION" > "$DIR/.version"
echo "[s3] built $BIN in $(( $(date +%s) - started )) s" >&2
echo "$BIN"
