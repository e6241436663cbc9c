"""The same convert (bench.datagen's ``large`` rows: 12,808 bytes each) on DirectRunner (multi_processing, 2
workers), a Flink session cluster (parallelism 2), a standalone Spark cluster (2 workers) and Prism, alternated in
the same run: whole job and work span as ratios to DirectRunner's, peak RSS of each JVM and each SDK harness.

    bash configs/engines/setup_flink.sh && bash configs/engines/setup_spark.sh
    GOBIN=$PWD/.engines/prism go install github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0   # for Prism
    PYTHONPATH=$PWD .venv/bin/python -m bench.engines --gb 2 --repeats 2 --workdir /tmp/engines-bench

Whole job: the command's wall time (launcher start to exit, planning and job submission included); work span:
what the command prints (first shard started to last shard written). Peak RSS: VmHWM of the launcher and every
process below it (DirectRunner's workers, Prism and its harnesses), of every JVM of the cluster and of every SDK
harness process, sampled every 0.5 s while the job runs (a harness that lives shorter than that can be missed).
The clusters are started once, before the first job, and are not in the times.

``--store s3``: the input and the outputs on SeaweedFS (configs/engines/stores.py; ``bash
configs/engines/setup_s3.sh``), reached through a counting proxy (configs/engines/faultproxy.py, no faults) that
every process of the job uses as its endpoint (the launcher, DirectRunner's workers, the cluster's worker pool):
the bytes the store sent per input byte and received per output byte are reported next to the times, and the
bytes it wrote per output byte (what it received plus the objects it wrote by a server-side copy: the commit's
temporary -> final name). Each output is deleted after its run; ``--drop_local_input`` deletes the generated local
input once uploaded (sizes the disk cannot hold twice). The store runs on the same cores as the job.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

from bench import datagen
from bench.common import LAYOUTS, row_bytes
from configs.engines import engines

DIRECT = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
PRISM = engines.ENGINES / "prism" / "prism"


class RssSampler(threading.Thread):
    """Peak VmHWM (MB) per named process while running; ``pids()`` is called at every sample (harnesses come and
    go)."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.peaks, self.stop = pids, {}, threading.Event()

    def run(self):
        while not self.stop.is_set():
            for name, pid in self.pids():
                mb = engines.peak_rss_mb(pid)
                if mb is not None:
                    self.peaks[name] = max(self.peaks.get(name, 0.0), mb)
            self.stop.wait(0.5)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    found, todo = [], [pid]
    while todo:
        kids = engines.children(todo.pop())
        found += kids
        todo += kids
    return found


def launcher_tree(kind: str):
    """For engines that run inside the launcher (DirectRunner's worker processes, Prism and its harnesses): the
    launcher as ``launcher`` and each process below it as ``KIND-PID`` (a java/prism binary or a Python harness)."""

    def pids(launcher: int):
        named = [("launcher", launcher)]
        for p in descendants(launcher):
            try:
                exe = os.path.basename(os.readlink(f"/proc/{p}/exe"))
            except OSError:
                continue
            named.append((f"{'prism' if exe == 'prism' else kind}-{p}", p))
        return named

    return pids


def run_convert(inp: str, out, flags: list[str], pids, env_extra: dict | None = None) -> dict:
    """One convert; ``pids(launcher_pid)`` names the processes whose peak RSS is sampled; ``out`` a local folder
    (emptied first) or a remote url (a new one per run)."""
    if isinstance(out, pathlib.Path):
        shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(engines.ROOT), TF_CPP_MIN_LOG_LEVEL="3", **(env_extra or {}))
    t = time.perf_counter()
    proc = subprocess.Popen(
        [
            engines.PYTHON,
            "-m",
            "tfrecord_etl.pipelines.convert",
            "--input",
            inp,
            "--output_dir",
            str(out),
            "--num_shards",
            "8",
            *flags,
        ],
        cwd=engines.ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = RssSampler(lambda: pids(proc.pid))
    sampler.start()
    stdout, stderr = proc.communicate()
    whole = time.perf_counter() - t
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"convert failed ({proc.returncode}): {' '.join(flags)}\n{stderr[-3000:]}")
    span = re.search(r"work span: ([0-9.]+) s", stdout)
    return {"whole_s": whole, "span_s": float(span.group(1)) if span else None, "rss_mb": sampler.peaks}


def store_size(store, path: str) -> int:
    """Size in bytes of the object at the path-style ``/bucket/key`` (0 when it is gone)."""
    bucket, _, key = path.lstrip("/").partition("/")
    try:
        return int(store.client().head_object(Bucket=bucket, Key=urllib.parse.unquote(key))["ContentLength"])
    except Exception:  # noqa: BLE001 - a temporary copied then deleted
        return 0


def remove_output(store, prefix: str) -> None:
    """Deletes the objects under ``prefix`` in the bucket ``bench`` (an output this benchmark wrote)."""
    client = store.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket="bench", Delete={"Objects": keys})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.engines", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gb", type=float, default=2.0, help="input size in GB (decimal)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--engines", default="direct,flink,spark,prism")
    ap.add_argument("--workdir", required=True, help="inputs, outputs, cluster logs (not the repository)")
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--store", choices=["local", "s3"], default="local", help="where the input and outputs are")
    ap.add_argument(
        "--drop_local_input",
        action="store_true",
        help="with --store s3: delete the generated local input once it is uploaded (large sizes, a small disk)",
    )
    args = ap.parse_args(argv)
    work = pathlib.Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rows = int(args.gb * 1e9 // row_bytes(LAYOUTS["large"]))
    inp = str(work / f"large-{rows}.h5")
    datagen.ensure("large", inp, rows, keep=True)
    names = args.engines.split(",")
    clusters, flags, pids = [], {}, {}
    store = proxy = None
    env_extra: dict = {}
    try:
        if args.store == "s3":
            from configs.engines import faultproxy, stores

            input_bytes = os.path.getsize(inp)
            store = stores.SeaweedFS(work / "seaweedfs").start()
            clusters.append(store)
            store.bucket("bench")
            store.client().upload_file(inp, "bench", f"in/{pathlib.Path(inp).name}")
            if args.drop_local_input:  # the store's copy is the input now; the disk is needed for the outputs
                os.unlink(inp)
            proxy = faultproxy.FaultProxy(("127.0.0.1", store.s3_port)).start()
            env_extra = store.env(proxy.url)
            inp = f"s3://bench/in/{pathlib.Path(inp).name}"
        if "direct" in names:
            flags["direct"], pids["direct"] = DIRECT, launcher_tree("worker")
        if "flink" in names:
            c = engines.FlinkCluster(work / "flink", taskmanagers=2, slots=1, pool_env=env_extra or None).start()
            clusters.append(c)
            flags["flink"] = c.flags(2)
            pids["flink"] = lambda _launcher, c=c: (
                [("jobmanager", c.jobmanager.pid), ("job-server", c.job_server.pid)]
                + [(f"taskmanager-{i}", tm.pid) for i, tm in enumerate(c.tms)]
                + [(f"harness-{p}", p) for p in engines.harness_pids(c.pool)]
            )
        if "spark" in names:
            c = engines.SparkCluster(work / "spark", workers=2, cores=1, pool_env=env_extra or None).start()
            clusters.append(c)
            flags["spark"] = c.flags()
            pids["spark"] = lambda _launcher, c=c: (
                [("master", c.master.pid), ("job-server", c.job_server.pid)]
                + [(f"worker-{i}", w.pid) for i, w in enumerate(c.workers)]
                + [(f"executor-{p}", p) for p in c.executors()]
                + [(f"harness-{p}", p) for p in engines.harness_pids(c.pool)]
            )
        if "prism" in names:
            if not PRISM.exists():
                raise SystemExit(
                    f"{PRISM} is missing: GOBIN=$PWD/.engines/prism go install "
                    "github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0"
                )
            flags["prism"] = ["--runner=PrismRunner", f"--prism_location={PRISM}", "--environment_type=LOOPBACK"]
            pids["prism"] = launcher_tree("harness")
        results = {n: [] for n in flags}
        for r in range(args.repeats):
            for n in list(flags) if r % 2 == 0 else list(reversed(flags)):  # alternated
                if store is None:
                    res = run_convert(inp, work / f"out-{n}", flags[n], pids[n])
                else:
                    proxy.reset_counts()
                    out = f"s3://bench/out-{n}-{r}"
                    res = run_convert(inp, out, [*flags[n], *store.flags(proxy.url)], pids[n], env_extra)
                    written = sum(
                        s["bytes"]
                        for s in json.loads(
                            store.client().get_object(Bucket="bench", Key=f"out-{n}-{r}/metadata.json")["Body"].read()
                        )["shards"]
                    )
                    res["sent_per_input_byte"] = proxy.from_store / input_bytes
                    res["received_per_output_byte"] = proxy.to_store / written
                    # the commit's server-side copies (temporary -> final name): bytes the store writes again
                    copied = sum(store_size(store, path) for path in set(proxy.copies))
                    res["stored_per_output_byte"] = (proxy.to_store + copied) / written
                    remove_output(store, f"out-{n}-{r}/")  # what this run wrote, so the next one has the disk
                results[n].append(res)
                print(
                    f"{n} #{r}: whole {res['whole_s']:.1f} s, span {res['span_s']} s, "
                    + (
                        f"store sent {res['sent_per_input_byte']:.3f}x the input, received "
                        f"{res['received_per_output_byte']:.3f}x the output (written {res['stored_per_output_byte']:.3f}x "
                        "with the commit's server-side copies), "
                        if store is not None
                        else ""
                    )
                    + f"peak RSS {json.dumps({k: round(v) for k, v in res['rss_mb'].items()})}",
                    flush=True,
                )
    finally:
        if proxy is not None:
            proxy.stop()
        for c in clusters:
            c.stop()
    base_whole = statistics.median(x["whole_s"] for x in results["direct"]) if "direct" in results else None
    base_span = statistics.median(x["span_s"] for x in results["direct"]) if "direct" in results else None
    print(
        f"\n{rows:,} rows, {rows * row_bytes(LAYOUTS['large']) / 1e9:.2f} GB; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other work on the machine is in these numbers)"
    )
    print("engine | whole job s (ratio) | work span s (ratio) | peak RSS MB (max per process kind)")

    def ratio(x, base):  # no ratio without a DirectRunner run in the same invocation
        return f" ({x / base:.2f}x)" if base else ""

    for n, res in results.items():
        whole = statistics.median(x["whole_s"] for x in res)
        span = statistics.median(x["span_s"] for x in res)
        kinds = {}
        for x in res:
            for k, v in x["rss_mb"].items():
                kind = re.sub(r"-\d+$", "", k)
                kinds[kind] = max(kinds.get(kind, 0), v)
        store_cols = ""
        if args.store == "s3":
            sent = statistics.median(x["sent_per_input_byte"] for x in res)
            received = statistics.median(x["received_per_output_byte"] for x in res)
            stored = statistics.median(x["stored_per_output_byte"] for x in res)
            store_cols = (
                f" | store sent {sent:.3f}x input, received {received:.3f}x output, wrote {stored:.3f}x output "
                "(server-side copies included)"
            )
        print(
            f"{n} | {whole:.1f}{ratio(whole, base_whole)} | {span:.1f}{ratio(span, base_span)} | "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(kinds.items()))
            + store_cols
        )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
