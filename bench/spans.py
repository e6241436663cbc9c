"""Incremental runs at scale: ``.venv/bin/python -m bench.spans [--old 100000] [--new 100] [--repeats 3]``.

Measures, in one run on one machine:

1. **Planning** an incremental run over a collection whose committed spans hold ``--old`` local files (100,000:
   100 spans of 1,000 files, each a real ``.npy`` file on disk with its ledger row: path, size, ``mtime_ns``) when
   ``--new`` files (100) arrived: ``convert --incremental --dry_run`` as a fresh process (wall time, peak RSS of
   the process tree: ``bench.measure``), and the planning alone in a fresh process (``spanrun.plan_run`` +
   planning the new files' inputs: seconds, and its peak RSS over the RSS after the imports, ``/proc``). The spans' output
   directories are not there: planning reads only ``collection.json`` and the listing of the pattern.
2. **A span's conversion** (``--input 'dated/{SPAN}/*.npy'``: the 100 new files as span 7 of a new collection)
   against a **plain conversion** of the same files (``--input 'dated/7/*.npy'``), and the **incremental run**
   that converts them (hard links ``raw/new-*.npy``) as span 100 of the 100,000-file collection (planning,
   conversion and the commit of a 15 MB ``collection.json``), alternately ``--repeats`` times each, as fresh
   processes; medians.

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
    from tfrecord_etl.transforms.collections import collection

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
        spans.append(
            {
                "span": s,
                "version": None,
                "dir": collection.span_dir_name(s),
                "date": None,
                "inputs": rows,
                "num_records": per_span,
                "schema": None,
                "metadata": "0" * 64,
                "run_id": "bench",
                "committed": "2026-01-01T00:00:00Z",
            }
        )
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(root, "dated", "7"))
    for i in range(new):  # dated/7/new-*.npy, hard-linked as raw/new-*.npy (one file, two patterns)
        path = os.path.join(root, "dated", "7", f"new-{i:04d}.npy")
        with open(path, "wb") as f:
            f.write(_npy_bytes(rng.standard_normal((new_rows, 32), dtype="<f4")))
        os.link(path, os.path.join(raw, f"new-{i:04d}.npy"))
    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.config import ConvertConfig
    from tfrecord_etl.transforms.output import schemafile

    plan = planning.plan_convert(ConvertConfig(input=os.path.join(root, "dated", "7", "new-0000.npy"), output_dir=out))
    for entry in spans:  # the new span's schema (as a span converted from these files would have)
        entry["schema"] = collection.schema_fingerprint(schemafile.schema_text(plan.specs))
    coll = collection.empty(os.path.join(raw, "*.npy"))
    coll["spans"] = spans
    with open(collection.path_of(out), "w") as f:
        json.dump(coll, f, indent=1)
    return os.path.join(raw, "*.npy"), out


def measure(cmd: list[str], work: str, name: str) -> dict:
    """``cmd`` as a fresh process under ``bench.measure``: wall seconds, peak RSS bytes."""
    log, out = os.path.join(work, f"{name}.log"), os.path.join(work, f"{name}.json")
    subprocess.run(
        [sys.executable, "-m", "bench.measure", "--log", log, "--json", out, "--", *cmd],
        cwd=ROOT,
        check=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    result = json.load(open(out))
    if result["returncode"] != 0:
        raise SystemExit(f"{name} failed: see {log}\n" + open(log).read()[-2000:])
    result["output"] = open(log).read()
    return result


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def plan_in_process(pattern: str, out: str) -> dict:
    """Planning the incremental run in this process (run it fresh: ``--plan_only``): seconds, the RSS before it
    (imports done), the peak RSS (``VmHWM``) after it, and the files in the span."""
    from tfrecord_etl.transforms import planning, spanrun
    from tfrecord_etl.transforms.config import ConvertConfig

    cfg = ConvertConfig(input=pattern, output_dir=out, incremental=True)
    before = _rss_kib("VmRSS:")
    started = time.perf_counter()
    run = spanrun.plan_run(cfg)
    planning.plan_inputs(run.cfg.input, planning.source_options(run.cfg), run.files)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "rss_before_mib": before / 1024,
        "peak_mib": _rss_kib("VmHWM:") / 1024,
        "files": len(run.files),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spans")
    ap.add_argument("--old", type=int, default=100_000)
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--new_rows", type=int, default=5_000, help="rows of 32 float32 in each new file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    ap.add_argument("--plan_only", nargs=2, metavar=("PATTERN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.plan_only:
        print(json.dumps(plan_in_process(*args.plan_only)))
        return 0
    work = args.dir or tempfile.mkdtemp(prefix="bench-spans-")
    started = time.perf_counter()
    pattern, out = make_collection(work, args.old, args.new, args.new_rows)
    print(
        f"setup: {args.old:,} old files in {args.old // 1000} committed spans, {args.new} new files of "
        f"{args.new_rows:,} x 32 float32 ({time.perf_counter() - started:.1f} s)"
    )
    plan = json.loads(
        subprocess.run(
            [sys.executable, "-m", "bench.spans", "--plan_only", pattern, out],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()[-1]
    )
    assert plan["files"] == args.new, plan
    print(
        f"planning (fresh process, spanrun.plan_run + plan_inputs of the new files, imports excluded): "
        f"{plan['seconds']:.2f} s; RSS {plan['rss_before_mib']:.0f} MiB after the imports, peak "
        f"{plan['peak_mib']:.0f} MiB: planning adds {plan['peak_mib'] - plan['rss_before_mib']:.0f} MiB"
    )
    dry = measure(
        [
            sys.executable,
            "-m",
            "pipelines.convert",
            "--input",
            pattern,
            "--output_dir",
            out,
            "--incremental",
            "--dry_run",
            *BEAM,
        ],
        work,
        "dry",
    )
    print(
        f"convert --incremental --dry_run (fresh process, imports included): {dry['wall_s']:.2f} s, "
        f"peak RSS {dry['peak_rss_bytes'] / 2**20:.0f} MiB"
    )
    saved = open(os.path.join(out, "collection.json"), "rb").read()
    times: dict[str, list[float]] = {"incremental": [], "span": [], "plain": []}
    dated, new_span = os.path.join(work, "dated"), args.old // 1000
    import shutil

    for r in range(args.repeats):  # alternately, so that the machine's load falls on all three alike
        run = measure(
            [
                sys.executable,
                "-m",
                "pipelines.convert",
                "--input",
                pattern,
                "--output_dir",
                out,
                "--incremental",
                *BEAM,
            ],
            work,
            f"incremental{r}",
        )
        assert f"span: {new_span} in" in run["output"], run["output"][-500:]
        times["incremental"].append(run["wall_s"])
        shutil.rmtree(os.path.join(out, f"span-{new_span}"))  # back to the collection before the span
        with open(os.path.join(out, "collection.json"), "wb") as f:
            f.write(saved)
        coll_dir = os.path.join(work, f"span{r}")
        run = measure(
            [
                sys.executable,
                "-m",
                "pipelines.convert",
                "--input",
                os.path.join(dated, "{SPAN}", "*.npy"),
                "--output_dir",
                coll_dir,
                *BEAM,
            ],
            work,
            f"span{r}",
        )
        assert "span: 7 in" in run["output"], run["output"][-500:]
        times["span"].append(run["wall_s"])
        plain_dir = os.path.join(work, f"plain{r}")
        times["plain"].append(
            measure(
                [
                    sys.executable,
                    "-m",
                    "pipelines.convert",
                    "--input",
                    os.path.join(dated, "7", "*.npy"),
                    "--output_dir",
                    plain_dir,
                    *BEAM,
                ],
                work,
                f"plain{r}",
            )["wall_s"]
        )
        shutil.rmtree(coll_dir)
        shutil.rmtree(plain_dir)
    med = {k: statistics.median(v) for k, v in times.items()}
    shown = {k: ", ".join(f"{t:.2f}" for t in v) for k, v in times.items()}
    print(
        f"span conversion ({{SPAN}} pattern, {args.new} files, into a new collection): median {med['span']:.2f} s "
        f"({shown['span']})"
    )
    print(f"plain conversion of the same files: median {med['plain']:.2f} s ({shown['plain']})")
    print(f"span / plain: {med['span'] / med['plain']:.3f}")
    print(
        f"incremental run (the same files as span {new_span} of the collection of {args.old:,} files: planning, "
        f"conversion, commit of its collection.json): median {med['incremental']:.2f} s ({shown['incremental']}), "
        f"{med['incremental'] - med['plain']:+.2f} s over the plain conversion"
    )
    if not args.dir:
        import shutil

        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
