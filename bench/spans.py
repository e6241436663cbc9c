"""Incremental runs at scale: ``.venv/bin/python -m bench.spans [--old 100000] [--new 100] [--repeats 3]``.

Measures, in one run on one machine:

1. **Planning** an incremental run over a collection whose committed spans hold ``--old`` local files (100,000:
   100 spans of 1,000 files, each a real ``.npy`` file on disk with its ledger row: path, size, ``mtime_ns``) when
   ``--new`` files (100) arrived: ``convert --incremental --dry_run`` as a fresh process (wall time, peak RSS of
   the process tree: ``bench.measure``), and the planning alone in this process (``spanrun.plan_run`` + planning
   the new files' inputs: seconds, and the peak of Python allocations, ``tracemalloc``). The spans' output
   directories are not there: planning reads only ``collection.json`` and the listing of the pattern.
2. **A span's conversion** (``convert --incremental``: the 100 new files become span 100 of that collection, the
   collection committed) against a **plain conversion** of the same 100 files (``--input 'raw/new-*.npy'`` into an
   empty directory), alternately ``--repeats`` times each, as fresh processes; medians.

Targets: planning <= 10 s and <= 200 MB; a span's conversion within 10% of the plain one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAM = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def _npy_bytes(array: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def make_collection(root: str, old: int, new: int, new_rows: int) -> tuple[str, str]:
    """``root/raw`` with ``old`` small .npy files held by committed spans (``root/out/collection.json``) and
    ``new`` larger ones (``new-*.npy``) no span holds; returns ``(pattern, collection dir)``."""
    from tfrecord_etl.transforms import collection
    raw, out = os.path.join(root, "raw"), os.path.join(root, "out")
    os.makedirs(raw)
    os.makedirs(out)
    small = _npy_bytes(np.arange(4, dtype="<f4")[None, :])
    spans, per_span = [], 1000
    for s in range(max(1, old // per_span)):
        rows = []
        for i in range(per_span):
            path = os.path.join(raw, f"old-{s:04d}-{i:04d}.npy")
            with open(path, "wb") as f:
                f.write(small)
            st = os.stat(path)
            rows.append({"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "version": None})
        spans.append({"span": s, "version": None, "dir": collection.span_dir_name(s), "date": None, "inputs": rows,
                      "num_records": per_span, "schema": None, "metadata": "0" * 64, "run_id": "bench",
                      "committed": "2026-01-01T00:00:00Z"})
    rng = np.random.default_rng(0)
    for i in range(new):
        with open(os.path.join(raw, f"new-{i:04d}.npy"), "wb") as f:
            f.write(_npy_bytes(rng.standard_normal((new_rows, 32), dtype="<f4")))
    from tfrecord_etl.transforms import metadata, planning
    from tfrecord_etl.transforms.config import ConvertConfig
    plan = planning.plan_convert(ConvertConfig(input=os.path.join(raw, "new-0000.npy"), output_dir=out))
    for entry in spans:  # the new span's schema (as a span converted from these files would have)
        entry["schema"] = collection.schema_fingerprint(metadata.schema_text(plan.specs))
    coll = collection.empty(os.path.join(raw, "*.npy"))
    coll["spans"] = spans
    with open(collection.path_of(out), "w") as f:
        json.dump(coll, f, indent=1)
    return os.path.join(raw, "*.npy"), out


def measure(cmd: list[str], work: str, name: str) -> dict:
    """``cmd`` as a fresh process under ``bench.measure``: wall seconds, peak RSS bytes."""
    log, out = os.path.join(work, f"{name}.log"), os.path.join(work, f"{name}.json")
    subprocess.run([sys.executable, "-m", "bench.measure", "--log", log, "--json", out, "--", *cmd], cwd=ROOT,
                   check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    result = json.load(open(out))
    if result["returncode"] != 0:
        raise SystemExit(f"{name} failed: see {log}\n" + open(log).read()[-2000:])
    result["output"] = open(log).read()
    return result


def plan_in_process(pattern: str, out: str) -> tuple[float, int, int]:
    """``(seconds, peak traced bytes, files in the span)`` of planning the incremental run here."""
    import tracemalloc
    from tfrecord_etl.transforms import planning, spanrun
    from tfrecord_etl.transforms.config import ConvertConfig
    cfg = ConvertConfig(input=pattern, output_dir=out, incremental=True)
    tracemalloc.start()
    started = time.perf_counter()
    run = spanrun.plan_run(cfg)
    planning.plan_inputs(run.cfg.input, planning.source_options(run.cfg), run.files)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, len(run.files)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spans")
    ap.add_argument("--old", type=int, default=100_000)
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--new_rows", type=int, default=5_000, help="rows of 32 float32 in each new file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="bench-spans-")
    started = time.perf_counter()
    pattern, out = make_collection(work, args.old, args.new, args.new_rows)
    print(f"setup: {args.old:,} old files in {args.old // 1000} committed spans, {args.new} new files of "
          f"{args.new_rows:,} x 32 float32 ({time.perf_counter() - started:.1f} s)")
    seconds, peak, n = plan_in_process(pattern, out)
    assert n == args.new, n
    print(f"planning in-process (spanrun.plan_run + plan_inputs of the new files): {seconds:.2f} s, "
          f"peak Python allocations {peak / 2**20:.1f} MiB")
    dry = measure([sys.executable, "-m", "pipelines.convert", "--input", pattern, "--output_dir", out,
                   "--incremental", "--dry_run", *BEAM], work, "dry")
    print(f"convert --incremental --dry_run (fresh process, imports included): {dry['wall_s']:.2f} s, "
          f"peak RSS {dry['peak_rss_bytes'] / 2**20:.0f} MiB")
    saved = open(os.path.join(out, "collection.json"), "rb").read()
    span_times, plain_times = [], []
    for r in range(args.repeats):
        span = measure([sys.executable, "-m", "pipelines.convert", "--input", pattern, "--output_dir", out,
                        "--incremental", *BEAM], work, f"span{r}")
        assert f"span: {args.old // 1000} in" in span["output"], span["output"][-500:]
        span_times.append(span["wall_s"])
        plain_dir = os.path.join(work, f"plain{r}")
        plain = measure([sys.executable, "-m", "pipelines.convert", "--input", os.path.join(work, "raw", "new-*.npy"),
                         "--output_dir", plain_dir, *BEAM], work, f"plain{r}")
        plain_times.append(plain["wall_s"])
        import shutil  # back to the collection before the span: the next repeat converts the same span again
        shutil.rmtree(os.path.join(out, f"span-{args.old // 1000}"))
        shutil.rmtree(plain_dir)
        with open(os.path.join(out, "collection.json"), "wb") as f:
            f.write(saved)
    s, p = statistics.median(span_times), statistics.median(plain_times)
    print(f"span conversion (--incremental, {args.new} new files, collection of {args.old:,} files): median "
          f"{s:.2f} s of {', '.join(f'{t:.2f}' for t in span_times)}")
    print(f"plain conversion of the same files: median {p:.2f} s of {', '.join(f'{t:.2f}' for t in plain_times)}")
    print(f"span / plain: {s / p:.3f}")
    if not args.dir:
        import shutil
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
