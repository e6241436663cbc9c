"""A/B of this checkout against another one (e.g. a ``git worktree`` of an earlier commit) on the same inputs:
the commands' own ``work span`` (first shard started to last shard written, printed by convert and augment),
runs alternated base/head so that page-cache and machine drift hit both alike.

    git worktree add /tmp/base b64b60b
    python -m bench.ab --base /tmp/base [--repeat 5] [--small_rows 2000000] [--large_rows 84000]

Cases: convert of the benchmark's small-row and large-row HDF5 inputs (2 worker processes, uncompressed shards,
``--overwrite`` into the same directory every time, as a scheduled re-run does; ``--fresh``: into an empty one),
``augment --mode rewrite`` of the small-row collection, and reading each side's small-row output back with that
side's reader (``--read``, the default: ``iter_numpy`` unbatched, and ``to_tf_dataset(batch_size=256)``, the time
from the call to the last record, the record count checked). Prints, per case, each side's median and best span and head/base of the medians.
Both sides run with this interpreter (the same dependencies); each command runs in its checkout's folder, so
``python -m pipelines.convert`` imports that checkout's code.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench import datagen
from bench.common import AUGMENT_CONSTANT, LAYOUTS, convert_encoding_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAM = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
_SPAN = re.compile(r"^(?:work|read) span: ([0-9.]+) s", re.M)
# A read pass over OUTPUT_DIR with the reader of the checkout it runs in: prints "read span: S s (N records)".
READ = """
import sys, time
from tfrecord_etl.transforms import reader
how, output_dir, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
if how == "to_tf_dataset":
    import tensorflow  # noqa: F401 - its import (seconds) is not part of the read
started, n = time.perf_counter(), 0
if how == "iter_numpy":
    for _ in reader.iter_numpy(output_dir):
        n += 1
else:
    for batch in reader.to_tf_dataset(output_dir, batch_size=256):
        n += int(next(iter(batch.values())).shape[0])
seconds = time.perf_counter() - started
assert n == expected, f"{n} records read, {expected} written"
print(f"read span: {seconds:.3f} s ({n} records)")
"""


def span(cmd: list[str], cwd: str, sync: bool = True) -> float:
    """The work span in seconds that ``cmd`` prints, run in ``cwd``; with ``sync``, after ``os.sync()``: the runs
    write into the same directories, and a run that replaces an output keeps the old one until its commit while
    one that deletes it first discards its pages not yet written, so without a sync the previous run's writeback
    lands in one side's span and not the other's (measured: +0.2-0.3 s of ``write`` time on 1 GB)."""
    if sync:
        os.sync()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    m = _SPAN.search(proc.stdout)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"{' '.join(cmd)} in {cwd} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return float(m.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base", required=True, help="the other checkout (a folder holding its pipelines/)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per side and case (default 5)")
    ap.add_argument("--small_rows", type=int, default=2_000_000)
    ap.add_argument("--large_rows", type=int, default=84_000)
    ap.add_argument("--workdir", default=None, help="inputs and outputs (default: a temporary folder)")
    ap.add_argument("--no_sync", action="store_true", help="no os.sync() before each run (see span())")
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="delete each output before its run: every run writes into an empty directory (no output to "
        "keep until the commit), which measures the code alone; without it each run replaces the "
        "previous output, as a scheduled re-run does",
    )
    ap.add_argument("--no_read", action="store_true", help="leave out the read cases")
    ap.add_argument(
        "--only",
        default=None,
        help="run the cases whose name starts with this (e.g. read, convert); the read "
        "cases read the small-row convert's outputs, which a convert run of each side writes first if missing",
    )
    args = ap.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="tfrecord-etl-ab-")
    py = sys.executable
    inputs = {}
    for kind, rows in (("small", args.small_rows), ("large", args.large_rows)):
        path = os.path.join(work, f"{kind}_{rows}.h5")
        datagen.ensure(kind, path, rows, keep=True)
        inputs[kind] = path
    records = os.path.join(work, "records")
    subprocess.run(
        [
            py,
            "-m",
            "pipelines.convert",
            "--input",
            inputs["small"],
            "--output_dir",
            records,
            "--overwrite",
            *convert_encoding_flags(LAYOUTS["small"]),
            *BEAM,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    cases = {}
    for kind in ("small", "large"):
        cases[f"convert {kind} rows"] = lambda side, k=kind: [
            py,
            "-m",
            "pipelines.convert",
            "--input",
            inputs[k],
            "--output_dir",
            os.path.join(work, f"out_{side}_{k}"),
            "--overwrite",
            *convert_encoding_flags(LAYOUTS[k]),
            *BEAM,
        ]
    cases["augment rewrite (small rows)"] = lambda side: [
        py,
        "-m",
        "pipelines.augment",
        "--input",
        records,
        "--output_dir",
        os.path.join(work, f"aug_{side}"),
        "--overwrite",
        "--mode",
        "rewrite",
        "--constants",
        AUGMENT_CONSTANT,
        "--encoding",
        "list",
        *BEAM,
    ]
    if not args.no_read:
        for how in ("iter_numpy", "to_tf_dataset"):
            cases[f"read {how} (small rows)"] = lambda side, h=how: [
                py,
                "-c",
                READ,
                h,
                os.path.join(work, f"out_{side}_small"),
                str(args.small_rows),
            ]
    sides = {"base": os.path.abspath(args.base), "head": ROOT}
    if args.only:
        for side in sides:  # the read cases' inputs
            if not args.only.startswith("convert small") and not os.path.exists(
                os.path.join(work, f"out_{side}_small", "metadata.json")
            ):
                span(cases["convert small rows"](side), sides[side])
        cases = {name: make for name, make in cases.items() if name.startswith(args.only)}
    print(f"A/B: base {sides['base']} vs head {ROOT}, {args.repeat} alternated runs per side; inputs in {work}")
    for name, make in cases.items():
        spans = {"base": [], "head": []}
        for i in range(args.repeat):
            for side in ("base", "head") if i % 2 == 0 else ("head", "base"):
                cmd = make(side)
                if args.fresh and not name.startswith("read"):
                    shutil.rmtree(cmd[cmd.index("--output_dir") + 1], ignore_errors=True)
                spans[side].append(span(cmd, sides[side], not args.no_sync))
        med = {s: statistics.median(v) for s, v in spans.items()}
        print(
            f"{name}: base median {med['base']:.3f} s (best {min(spans['base']):.3f}), head median "
            f"{med['head']:.3f} s (best {min(spans['head']):.3f}); head/base {med['head'] / med['base']:.3f}  "
            f"[base {', '.join(f'{x:.2f}' for x in spans['base'])}; head {', '.join(f'{x:.2f}' for x in spans['head'])}]",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
