"""ArraysExampleGen against our convert and the route TFX users take today (convert, then ImportExampleGen).

    .venv-tfx/bin/python -m bench.tfx_examplegen --rows 8000 [--repeat 2] [--workdir /tmp/tfx-bench]

Runs in the TFX venv (configs/tfx/run_tfx_test.sh builds it). Input: the benchmark's large-row HDF5 file
(``bench.datagen`` ``large``: image uint8[64,64,3] + emb float32[128] + id int64, 12,808 bytes a row). Each case is
one process, timed from start to exit (imports and pipeline set-up included, as a user pays them), on DirectRunner
with the same Beam flags (``--direct_running_mode``: 2 worker processes, or in_memory):

* ``convert_gzip``: ``python -m pipelines.convert --compression gzip`` (our planned writer, gzip shards);
* ``examplegen``: a TFX pipeline of one ``ArraysExampleGen`` (TFX's hash split train 2 / eval 1, Reshuffle, gzip
  ``Split-*``) on LocalDagRunner with a SQLite ML Metadata store;
* ``convert_then_import``: ``convert --compression gzip`` then a TFX pipeline of one ``ImportExampleGen`` over its
  shards (TFX reads them, splits and writes them again): the route without ArraysExampleGen.

Prints one line per case (seconds, MB/s of array bytes) and the ratios examplegen / convert_gzip and
examplegen / convert_then_import, each the median of ``--repeat`` runs.
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

BEAM_FLAGS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]

PIPELINE = r'''
import os, sys
from tfx.orchestration import metadata, pipeline
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.proto import example_gen_pb2
kind, input_base, root, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
if kind == "examplegen":
    from tfrecord_etl.tfx import ArraysExampleGen
    gen = ArraysExampleGen(input_base=input_base)
else:
    from tfx.components import ImportExampleGen
    gen = ImportExampleGen(input_base=input_base, input_config=example_gen_pb2.Input(splits=[
        example_gen_pb2.Input.Split(name="single_split", pattern="*.tfrecord.gz")]))
LocalDagRunner().run(pipeline.Pipeline(
    pipeline_name="bench", pipeline_root=os.path.join(root, "pipeline_root"), components=[gen], enable_cache=False,
    metadata_connection_config=metadata.sqlite_metadata_connection_config(os.path.join(root, "mlmd.sqlite")),
    beam_pipeline_args=flags))
'''


def timed(cmd: list[str], env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--direct_running_mode", default="multi_processing", choices=["multi_processing", "in_memory"],
                    help="DirectRunner's mode for every case (2 workers in multi_processing)")
    ap.add_argument("--only", default="convert_gzip,examplegen,convert_then_import",
                    help="comma-separated cases to run")
    args = ap.parse_args(argv)
    flags = BEAM_FLAGS if args.direct_running_mode == "multi_processing" else [
        "--runner=DirectRunner", "--direct_running_mode=in_memory"]
    from bench import datagen
    work = args.workdir or tempfile.mkdtemp(prefix="tfx-bench-")
    data_dir = os.path.join(work, "data")
    os.makedirs(data_dir, exist_ok=True)
    h5 = os.path.join(data_dir, "large.h5")
    datagen.ensure("large", h5, args.rows, keep=True)
    array_mb = os.path.getsize(h5) / 1e6
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    py = sys.executable
    results: dict[str, list[float]] = {case: [] for case in args.only.split(",")}
    script = os.path.join(work, "tfx_pipeline.py")
    with open(script, "w") as f:
        f.write(PIPELINE)
    for _ in range(args.repeat):
        for case in results:
            out = os.path.join(work, "out", case)
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            only_h5 = os.path.join(work, "h5only")
            os.makedirs(only_h5, exist_ok=True)
            if not os.path.exists(os.path.join(only_h5, "large.h5")):
                os.link(h5, os.path.join(only_h5, "large.h5"))
            convert = [py, "-m", "pipelines.convert", "--input", h5, "--output_dir", os.path.join(out, "converted"),
                       "--compression", "gzip", *flags]
            if case == "convert_gzip":
                seconds = timed(convert, env)
            elif case == "examplegen":
                seconds = timed([py, script, "examplegen", only_h5, out, *flags], env)
            else:
                seconds = timed(convert, env) + timed(
                    [py, script, "import", os.path.join(out, "converted"), out, *flags], env)
            results[case].append(seconds)
            print(f"{case:22s} {seconds:7.1f} s  {array_mb / seconds:6.1f} MB/s", flush=True)
    med = {case: statistics.median(v) for case, v in results.items()}
    summary = {"rows": args.rows, "array_mb": round(array_mb, 1), "median_s": {k: round(v, 2) for k, v in med.items()},
               "runs": results, "beam_flags": flags}
    for other in ("convert_gzip", "convert_then_import"):
        if "examplegen" in med and other in med:
            summary[f"examplegen_over_{other}"] = round(med["examplegen"] / med[other], 2)
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
