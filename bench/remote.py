"""Object storage measurements: egress of converting from s3:// and the time to plan many remote files,
against a moto S3 server in its own process behind ``bench.s3proxy`` (in a third process: it counts the bytes the
server sends and adds ``--latency_ms`` to every request, a real object store's round trip).

    .venv/bin/python -m bench.remote [--rows 8192] [--big_rows 65536] [--files 1000,10000] [--latency_ms 20]
        [--threads 8] [--planning_only] [--beam_stream] [--server 'COMMAND with {port}' --access_key KEY]

Egress: chunked+gzip HDF5, contiguous HDF5, .npy, stored and deflated .npz, each converted to a local directory
(in-process runner, 2 shards); egress / file size, connections and wall time remote vs the same file local.
Large file (``--big_rows``, 0 to skip): the issue's 257 MiB chunked HDF5 file (65,536 rows of 4,096 uint8 + an
int64 label, chunks of 256 rows) with 2 worker processes and 4 shards, remote vs local.
Planning: ``planning.plan_inputs`` of each ``--files`` count of small .npy and HDF5 files, per ``--threads``
setting; wall, launcher CPU, the CPU of the moto server and the proxy, requests and egress bytes, per file (the
server and the proxy share the 2 cores with the launcher, so the wall time is CPU-bound there).
``--beam_stream`` measures Beam's own S3 stream instead of ours (the before figures). ``--server`` runs another
S3 server instead of moto (moto copies the whole object for every ranged GET: 0.24 s per GET of a 257 MiB object),
e.g. s3rver from npm, which streams ranges from disk (docs/scale.md, "Scale").
Also the section ``remote`` of ``bench/run.sh --only remote`` (not in the default set: it needs the s3 extra, boto3 and
moto[server]).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
BUCKET = "bench-remote"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


class Proxy:
    """``bench.s3proxy`` in its own process; ``counts()`` -> (egress bytes, ingress bytes, connections, requests)."""

    def __init__(self, upstream: int, latency_ms: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.s3proxy", str(upstream), "--latency_ms", str(latency_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self.proc.stdout.readline())

    def _ask(self, line: str) -> list[int]:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return [int(v) for v in self.proc.stdout.readline().split()]

    def counts(self) -> list[int]:
        return self._ask("counts")

    def reset(self) -> None:
        self._ask("reset")

    def close(self) -> None:
        self.proc.terminate()


def egress_inputs(rows: int) -> dict[str, bytes]:
    import h5py

    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (rows, 4096), dtype=np.uint8)
    img[:, 2048:] = 0
    label = np.arange(rows, dtype="<i8")
    out = {}
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f.create_dataset("img", data=img, chunks=(256, 4096), compression="gzip")
        f.create_dataset("label", data=label, chunks=(256,), compression="gzip")
    out["chunked_gzip.h5"] = buf.getvalue()
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f["img"], f["label"] = img, label
    out["contiguous.h5"] = buf.getvalue()
    buf = io.BytesIO()
    np.save(buf, img)
    out["img.npy"] = buf.getvalue()
    buf = io.BytesIO()
    np.savez(buf, img=img, label=label)
    out["stored.npz"] = buf.getvalue()
    buf = io.BytesIO()
    np.savez_compressed(buf, img=img, label=label)
    out["deflated.npz"] = buf.getvalue()
    return out


def big_input(rows: int) -> bytes:
    """The issue's large case: ``rows`` rows of 4,096 random uint8 + an int64 label, chunks of 256 rows, no filter."""
    import h5py

    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        img = f.create_dataset("img", (rows, 4096), np.uint8, chunks=(256, 4096))
        for start in range(0, rows, 8192):
            stop = min(rows, start + 8192)
            img[start:stop] = rng.integers(0, 256, (stop - start, 4096), dtype=np.uint8)
        f.create_dataset("label", data=np.arange(rows, dtype="<i8"), chunks=(256,))
    return buf.getvalue()


def small_file(fmt: str, i: int) -> bytes:
    buf = io.BytesIO()
    if fmt == "h5":
        import h5py

        with h5py.File(buf, "w") as f:
            f["x"], f["y"] = np.arange(400, dtype="<f4").reshape(100, 4) + i, np.arange(100)
    else:
        np.save(buf, np.arange(400, dtype="<f4").reshape(100, 4) + i)
    return buf.getvalue()


def cpu_seconds(pids) -> float:
    """User + system CPU seconds of the processes ``pids`` and their children so far."""
    import psutil

    procs = [psutil.Process(pid) for pid in pids]
    procs += [c for p in list(procs) for c in p.children(recursive=True)]
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192, help="rows of the egress inputs (4 KiB each)")
    ap.add_argument("--big_rows", type=int, default=65536, help="rows of the large chunked HDF5 file (0: skip)")
    ap.add_argument(
        "--files", default="1000,10000", help="counts of small files for the planning measurement (0: skip)"
    )
    ap.add_argument("--latency_ms", type=float, default=20.0, help="added to every request by the proxy")
    ap.add_argument("--threads", default="8", help="planning.PLAN_THREADS settings to measure")
    ap.add_argument("--planning_only", action="store_true", help="measure only the planning of small files")
    ap.add_argument("--beam_stream", action="store_true", help="read through Beam's S3 stream (the before figures)")
    ap.add_argument(
        "--server",
        help="a shell command starting another S3 server on 127.0.0.1:{port} instead of "
        "moto (its process group is stopped at the end)",
    )
    ap.add_argument("--access_key", default="S3RVER", help="access key id and secret of --server")
    args = ap.parse_args(argv)
    os.environ.update(CREDENTIALS)
    import boto3
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrecord_etl.pipelines import common, convert as convert_module
    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.sources import SourceOptions
    from tfrecord_etl.transforms.storage import fileio, remote

    if args.beam_stream:
        fileio._range_reader = lambda path: None
    if args.server:  # another S3 server on 127.0.0.1, started by its own command (e.g. s3rver, see docs/scale.md)
        port = free_port()
        server = subprocess.Popen(
            args.server.format(port=port),
            shell=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.environ.update({"AWS_ACCESS_KEY_ID": args.access_key, "AWS_SECRET_ACCESS_KEY": args.access_key})
    else:
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    wait_for(port)
    proxy = Proxy(port, args.latency_ms)
    tmp = tempfile.mkdtemp(prefix="bench-remote-")
    try:
        direct = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1")
        direct.create_bucket(Bucket=BUCKET)
        key = args.access_key if args.server else "testing"
        flags = [
            f"--s3_endpoint_url=http://127.0.0.1:{proxy.port}",
            f"--s3_access_key_id={key}",
            f"--s3_secret_access_key={key}",
            "--s3_region_name=us-east-1",
        ]
        FileSystems.set_options(PipelineOptions(flags))
        run = ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--num_shards", "2"]
        print(f"egress ({'Beam stream' if args.beam_stream else 'bounded reads'}, latency {args.latency_ms:g} ms)")
        print("| input | file MiB | egress MiB | egress / file | connections | remote s | local s |")
        print("|---|---|---|---|---|---|---|")
        for name, data in (egress_inputs(args.rows) if not args.planning_only else {}).items():
            direct.put_object(Bucket=BUCKET, Key=f"egress/{name}", Body=data)
            local = os.path.join(tmp, name)
            with open(local, "wb") as f:
                f.write(data)
            t = time.perf_counter()
            assert (
                common.run_main(
                    convert_module.main, ["--input", local, "--output_dir", os.path.join(tmp, "local_" + name), *run]
                )
                == 0
            )
            local_s = time.perf_counter() - t
            proxy.reset()
            t = time.perf_counter()
            assert (
                common.run_main(
                    convert_module.main,
                    [
                        "--input",
                        f"s3://{BUCKET}/egress/{name}",
                        "--output_dir",
                        os.path.join(tmp, "remote_" + name),
                        *run,
                        *flags,
                    ],
                )
                == 0
            )
            remote_s = time.perf_counter() - t
            egress, _, connections, _ = proxy.counts()
            print(
                f"| {name} | {len(data) / 2**20:.1f} | {egress / 2**20:.1f} | {egress / len(data):.2f}x | "
                f"{connections} | {remote_s:.2f} | {local_s:.2f} |",
                flush=True,
            )
        if args.big_rows and not args.planning_only:
            data = big_input(args.big_rows)
            direct.put_object(Bucket=BUCKET, Key="big/big.h5", Body=data)
            local = os.path.join(tmp, "big.h5")
            with open(local, "wb") as f:
                f.write(data)
            two = [
                "--runner=DirectRunner",
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=2",
                "--num_shards",
                "4",
            ]
            t = time.perf_counter()
            assert (
                common.run_main(
                    convert_module.main, ["--input", local, "--output_dir", os.path.join(tmp, "local_big"), *two]
                )
                == 0
            )
            local_s = time.perf_counter() - t
            proxy.reset()
            t = time.perf_counter()
            assert (
                common.run_main(
                    convert_module.main,
                    [
                        "--input",
                        f"s3://{BUCKET}/big/big.h5",
                        "--output_dir",
                        os.path.join(tmp, "remote_big"),
                        *two,
                        *flags,
                    ],
                )
                == 0
            )
            remote_s = time.perf_counter() - t
            egress, _, connections, _ = proxy.counts()
            # the server's own time for one 1 MiB ranged GET of this object and of a 4 MiB one, straight to moto
            # (no proxy, no added latency): moto copies the whole object for every ranged GET
            direct.put_object(Bucket=BUCKET, Key="big/small.bin", Body=data[: 4 * 2**20])
            per_get = {}
            for key in ("big/big.h5", "big/small.bin"):
                times = []
                for i in range(4):
                    t = time.perf_counter()
                    direct.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={i * 2**20}-{(i + 1) * 2**20 - 1}")[
                        "Body"
                    ].read()
                    times.append(time.perf_counter() - t)
                per_get[key] = sorted(times)[1]
            print(f"\nlarge file: {len(data) / 2**20:.0f} MiB chunked HDF5, 2 worker processes, 4 shards")
            print(
                "| egress MiB | egress / file | connections | remote s | local s | remote / local | "
                "server s per 1 MiB GET (this object / a 4 MiB one) |"
            )
            print("|---|---|---|---|---|---|---|")
            print(
                f"| {egress / 2**20:.1f} | {egress / len(data):.2f}x | {connections} | {remote_s:.2f} | "
                f"{local_s:.2f} | {remote_s / local_s:.2f}x | {per_get['big/big.h5']:.3f} / "
                f"{per_get['big/small.bin']:.3f} |",
                flush=True,
            )
            del data
        others = [server.pid, proxy.proc.pid]
        print(f"\nplanning small files ({args.latency_ms:g} ms per request)")
        print(
            "| format | files | threads | wall s | ms per file | launcher CPU ms per file | "
            "server + proxy CPU ms per file | requests per file | egress bytes per file | connections |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for files in [int(n) for n in args.files.split(",") if int(n)]:
            for fmt in ("npy", "h5"):
                with concurrent.futures.ThreadPoolExecutor(8) as pool:  # the same objects, more of them
                    list(
                        pool.map(
                            lambda i, files=files, fmt=fmt: direct.put_object(
                                Bucket=BUCKET, Key=f"plan{files}/f{i:05d}.{fmt}", Body=small_file(fmt, i)
                            ),
                            range(files),
                        )
                    )
                for threads in [int(t) for t in args.threads.split(",")]:
                    planning.inputs.PLAN_THREADS = threads  # where index_concurrently reads it
                    remote.CLIENTS.clear()
                    proxy.reset()
                    t, c, o = time.perf_counter(), time.process_time(), cpu_seconds(others)
                    plan = planning.plan_inputs(
                        f"s3://{BUCKET}/plan{files}/*.{fmt}", SourceOptions("hdf5" if fmt == "h5" else "npy")
                    )
                    wall, cpu = time.perf_counter() - t, time.process_time() - c
                    other = cpu_seconds(others) - o
                    assert plan.num_rows == 100 * files
                    egress, _, connections, requests = proxy.counts()
                    print(
                        f"| {fmt} | {files:,} | {threads} | {wall:.2f} | {1000 * wall / files:.1f} | "
                        f"{1000 * cpu / files:.1f} | {1000 * other / files:.1f} | {requests / files:.3f} | "
                        f"{egress / files:,.0f} | {connections} |",
                        flush=True,
                    )
    finally:
        proxy.close()
        if args.server:
            os.killpg(server.pid, 15)
        else:
            server.terminate()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
