#!/usr/bin/env bash
# Several checkouts (git worktrees) sharing one venv: makes THIS checkout's code the one Python imports when the
# checkout's root is first on sys.path (PYTHONPATH=$PWD, the working directory of `python -m` and `python -c`,
# pytest's rootdir).
#
# Why: the repo's transforms/ and pipelines/ folders are the packages tfrecord_etl.transforms and
# tfrecord_etl.pipelines by setup.py's package_dir. An install knows that mapping; a venv's editable install
# (`pip install -e`, what .ci/env.sh does) knows it for the checkout it was made from only, so another checkout's
# `import tfrecord_etl.transforms.reader` would silently load the installed checkout's reader.py. This script writes
# two relative symlinks, ignored by git, that give this checkout's tfrecord_etl/ the same two subpackages:
#   tfrecord_etl/transforms -> ../transforms     tfrecord_etl/pipelines -> ../pipelines
# Run it once per checkout (it changes nothing when the links are there); `configs/devlinks.sh --remove` removes
# them. It never replaces a file or folder it did not write. See docs/development.md, "Several checkouts, one venv".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for name in transforms pipelines; do
  link="$ROOT/tfrecord_etl/$name"
  if [ -L "$link" ] && [ "$(readlink "$link")" = "../$name" ]; then
    if [ "${1:-}" = "--remove" ]; then
      rm "$link"
      echo "removed tfrecord_etl/$name"
    fi
    continue
  fi
  if [ -e "$link" ] || [ -L "$link" ]; then
    echo "error: $link exists and is not the link ../$name this script writes: left alone. Hint: move it away," \
      "then run configs/devlinks.sh again" >&2
    exit 2
  fi
  if [ "${1:-}" != "--remove" ]; then
    ln -s "../$name" "$link"
    echo "linked tfrecord_etl/$name -> ../$name"
  fi
done
