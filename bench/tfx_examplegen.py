"""ArraysExampleGen against our convert and the route TFX users take today (convert, then ImportExampleGen).

    .venv-tfx/bin/python -m bench.tfx_examplegen --rows 41000 [--repeat 2] [--workdir /tmp/tfx-bench]

Runs in the TFX venv (configs/tfx/run_tfx_test.sh builds it), on the checkout it is run from (every case's process
gets ``PYTHONPATH`` = this checkout, whatever the venv has installed). Input: the benchmark's large-row HDF5 file
(``bench.datagen`` ``large``: image uint8[64,64,3] + emb float32[128] + id int64, 12,808 bytes a row; 41,000 rows
are 525 MB). Each case is one process on DirectRunner with the same Beam flags (``--direct_running_mode``: 2
worker processes, or in_memory):

* ``convert_gzip``: ``python -m pipelines.convert --compression gzip`` (our planned writer, gzip shards);
* ``examplegen``: a TFX pipeline of one ``ArraysExampleGen`` (TFX's default hash split train 2 / eval 1) on
  LocalDagRunner with a SQLite ML Metadata store: our planned writer into ``Split-*``;
* ``examplegen_tfx_writer``: the same component with TFX's own base ``Do`` (our records, TFX's hash split, its
  Reshuffle and Beam's zlib ``WriteToTFRecord``): how ArraysExampleGen wrote before it had its own ``Do``;
* ``convert_then_import``: ``convert --compression gzip`` then a TFX pipeline of one ``ImportExampleGen`` over its
  shards (TFX reads them, splits and writes them again): the route without ArraysExampleGen.

Two times per case: ``process``, from start to exit (imports, TFX's launcher and ML Metadata included, as a user
pays them), and ``work``: the component's executor ``Do`` from its start to its return (the ExampleGen cases), or
``pipelines.convert.main`` after its imports (convert); ``convert_then_import`` adds the two. Prints a table of the
medians of ``--repeat`` runs, with each case's ratio to ``convert_gzip`` (process and work), and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEAM_FLAGS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
CASES = ("convert_gzip", "examplegen", "examplegen_tfx_writer", "convert_then_import")

PIPELINE = r"""
import os, sys, time
from tfx.orchestration import metadata, pipeline
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.proto import example_gen_pb2
kind, input_base, root, timing, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]


def timed(cls):  # the executor's Do, from its start to its return, appended to the timing file
    do = cls.Do
    def Do(self, *args, **kwargs):
        started = time.perf_counter()
        do(self, *args, **kwargs)
        with open(timing, "a") as f:
            f.write(f"{time.perf_counter() - started}\n")
    cls.Do = Do
    return cls


if kind.startswith("examplegen"):
    from tfrecord_etl.tfx import ArraysExampleGen, Executor
    if kind == "examplegen":
        timed(Executor)
        gen = ArraysExampleGen(input_base=input_base)
    else:
        from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
        from tfx.dsl.components.base import executor_spec

        class TfxWriterExecutor(Executor):
            Do = BaseExampleGenExecutor.Do

        class TfxWriterExampleGen(ArraysExampleGen):
            EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(timed(TfxWriterExecutor))

        gen = TfxWriterExampleGen(input_base=input_base)
else:
    from tfx.components import ImportExampleGen
    from tfx.components.example_gen.import_example_gen.executor import Executor
    timed(Executor)
    gen = ImportExampleGen(input_base=input_base, input_config=example_gen_pb2.Input(splits=[
        example_gen_pb2.Input.Split(name="single_split", pattern="*.tfrecord.gz")]))
LocalDagRunner().run(pipeline.Pipeline(
    pipeline_name="bench", pipeline_root=os.path.join(root, "pipeline_root"), components=[gen], enable_cache=False,
    metadata_connection_config=metadata.sqlite_metadata_connection_config(os.path.join(root, "mlmd.sqlite")),
    beam_pipeline_args=flags))
"""

CONVERT = r"""
import sys, time
from tfrecord_etl.pipelines import convert
started = time.perf_counter()
code = convert.main(sys.argv[2:])
with open(sys.argv[1], "a") as f:
    f.write(f"{time.perf_counter() - started}\n")
sys.exit(code)
"""


def timed(cmd: list[str], env: dict, timing: str) -> tuple[float, float]:
    """``(process seconds, work seconds)`` of one case's process; work is what it appended to ``timing``."""
    if os.path.exists(timing):
        os.remove(timing)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    with open(timing) as f:
        work = sum(float(line) for line in f if line.strip())
    return seconds, work


def table(med: dict, array_mb: float) -> str:
    """The results as a Markdown table: seconds, MB/s and the ratio to convert_gzip, process and work."""
    base = med.get("convert_gzip")
    lines = [
        "| case | process s | work s | work MB/s | process / convert | work / convert |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for case, (proc, work) in med.items():
        ratio = (f"{proc / base[0]:.2f}x", f"{work / base[1]:.2f}x") if base else ("", "")
        lines.append(f"| {case} | {proc:.1f} | {work:.2f} | {array_mb / work:.0f} | {ratio[0]} | {ratio[1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="kept between runs: the input is generated once")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument(
        "--direct_running_mode",
        default="multi_processing",
        choices=["multi_processing", "in_memory"],
        help="DirectRunner's mode for every case (2 workers in multi_processing)",
    )
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated cases to run, of {', '.join(CASES)}")
    args = ap.parse_args(argv)
    flags = (
        BEAM_FLAGS
        if args.direct_running_mode == "multi_processing"
        else ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
    )
    from bench import datagen

    work = args.workdir or tempfile.mkdtemp(prefix="tfx-bench-")
    data_dir = os.path.join(work, "data")
    os.makedirs(data_dir, exist_ok=True)
    h5 = os.path.join(data_dir, "large.h5")
    datagen.ensure("large", h5, args.rows, keep=True)
    array_mb = os.path.getsize(h5) / 1e6
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    }
    py = sys.executable
    cases = [c for c in args.only.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}")
    results: dict[str, list[tuple[float, float]]] = {case: [] for case in cases}
    script, convert_script = os.path.join(work, "tfx_pipeline.py"), os.path.join(work, "convert_timed.py")
    for path, text in ((script, PIPELINE), (convert_script, CONVERT)):
        with open(path, "w") as f:
            f.write(text)
    timing = os.path.join(work, "timing.txt")
    only_h5 = os.path.join(work, "h5only")
    os.makedirs(only_h5, exist_ok=True)
    if not os.path.exists(os.path.join(only_h5, "large.h5")) or not os.path.samefile(
        h5, os.path.join(only_h5, "large.h5")
    ):
        if os.path.exists(os.path.join(only_h5, "large.h5")):
            os.remove(os.path.join(only_h5, "large.h5"))
        os.link(h5, os.path.join(only_h5, "large.h5"))
    print(f"[bench] {args.rows} rows, {array_mb:.0f} MB of arrays; {' '.join(flags)}; checkout {ROOT}", flush=True)
    for _ in range(args.repeat):
        for case in results:
            out = os.path.join(work, "out", case)
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            convert = [
                py,
                convert_script,
                timing,
                "--input",
                h5,
                "--output_dir",
                os.path.join(out, "converted"),
                "--compression",
                "gzip",
                *flags,
            ]
            if case == "convert_gzip":
                got = timed(convert, env, timing)
            elif case.startswith("examplegen"):
                got = timed([py, script, case, only_h5, out, timing, *flags], env, timing)
            else:
                first = timed(convert, env, timing)
                then = timed([py, script, "import", os.path.join(out, "converted"), out, timing, *flags], env, timing)
                got = (first[0] + then[0], first[1] + then[1])
            results[case].append(got)
            print(
                f"{case:22s} process {got[0]:7.1f} s  work {got[1]:7.2f} s  {array_mb / got[1]:6.0f} MB/s", flush=True
            )
    med = {
        case: (statistics.median(p for p, _ in v), statistics.median(w for _, w in v)) for case, v in results.items()
    }
    print()
    print(table(med, array_mb))
    summary = {
        "rows": args.rows,
        "array_mb": round(array_mb, 1),
        "beam_flags": flags,
        "median_process_s": {k: round(v[0], 2) for k, v in med.items()},
        "median_work_s": {k: round(v[1], 2) for k, v in med.items()},
        "runs": {k: [[round(p, 2), round(w, 2)] for p, w in v] for k, v in results.items()},
    }
    if "convert_gzip" in med:
        for case in med:
            if case != "convert_gzip":
                summary[f"{case}_over_convert_gzip"] = {
                    "process": round(med[case][0] / med["convert_gzip"][0], 2),
                    "work": round(med[case][1] / med["convert_gzip"][1], 2),
                }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
