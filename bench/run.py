"""Benchmark of tfrecord-etl against the hand-written loop, plain Beam and the raw copy.

    .venv/bin/python -m bench.run [--scale 1.0] [--only small,large,augment,scaling,splits] [--workdir DIR] [--keep]
                                  [--rss_8gb] [--repeat 1] [--steady auto|on|off] [--results_dir DIR]
                                  [--peers] [--peer_rounds 3] [--read] [--read_rounds 3]

Generates its inputs deterministically (``bench.datagen``: fixed seeds, written in chunks), then runs
every contender as a whole separate process through ``bench.measure`` (wall time; peak RSS of every
process of the tree, from the kernel's high-water mark and psutil polling), side by side in one run:

* small rows (default 2,000,000 rows of ``/x`` float32[16] + ``/id`` int64, 144 MB raw) and large rows
  (default 84,000 rows of ``/image`` uint8[64,64,3] + ``/emb`` float32[128] + ``/id`` int64, 1.08 GB raw):
  the seed loop (``bench.seed_loop``), plain Beam (``bench.plain_beam``), ``python -m pipelines.convert``
  with ``--writer planned`` and ``--writer beam`` on DirectRunner multi_processing with 2 workers (and
  with 1 worker on small rows), and the raw copy (``bench.raw_copy``);
* augmentation, adding one int64 field (``label=7``): 1,000,000 small records and the image collection
  (the large rows converted), each with the seed loop (``bench.seed_augment``), ``python -m
  pipelines.augment --mode rewrite`` and ``--mode sidecar`` (2 workers), and the raw copy of the records;
* scaling (default 20,000,000 small rows, 1.44 GB raw): ``convert --writer planned`` with 1 and with
  2 workers, and the raw copy: the 2-vs-1-worker target needs seconds of work per worker, which the
  2M-row small section (about 1 s a worker) does not give;
* splits (1,000,000 small rows, 20,000 large rows): ``convert`` without and with ``--splits
  train=8,validation=1,test=1``, and with ``--shuffle_seed 1`` too (2 workers), with the seed loop and the raw
  copy: what splitting and the shuffle cost;
* remote (``--only remote``, needs the s3 extra): ``bench.remote``, egress and remote/local wall time of
  converting HDF5 (chunked+gzip, contiguous), .npy and .npz inputs and a 257 MiB chunked HDF5 file from a moto S3
  server behind a counting proxy that adds 20 ms to every request, and the time to plan 1,000 and 10,000 small
  remote files (about 10 minutes);
* peers (``--peers``, in virtual environments of their own that it builds: ``bench.peers``): TFDS and Ray Data
  against convert (defaults and configs/local.yaml), the seed loop and the raw copy on 2,000,000 small and 40,000
  large rows, alternated over ``--peer_rounds`` rounds, medians, every output checked value for value;
* read (``--read``, the TensorFlow-free readers in an environment of their own that it builds:
  ``bench.readsection``): every way of reading an output back (the hand-written tf.data pipeline,
  ``reader.to_tf_dataset``, ``reader.iter_numpy``, ``RandomAccess``, PyTorch over it and over the ``tfrecord``
  package, Grain, TFDS) on 1,000,000 small and 20,000 large rows and gzip small rows, against a plain read of the
  shard files, alternated over ``--read_rounds`` rounds, medians, every pass's values checked;
* with ``--rss_8gb``: one 8 GB HDF5 file converted with ``--writer planned``, for its peak RSS.

Before every measured run the page cache's dirty pages are flushed (``settle``: sync, then wait until
under 64 MB are dirty or in writeback), so no contender pays for the writeback of the previous one's
output. With ``--repeat N`` every run (full size and the 1/50 steady-state run) is made N times and
the fastest kept, as ``timeit`` does.

A contender that fails (a non-zero exit, a wrong record count, a convert that ignored ``--writer``) is
recorded as failed with the tail of its log; the others still run. Results: ``results.json``,
``results.md`` and ``results.png`` in the results directory (default ``bench/results/``, or
``WORKDIR/results`` when ``--workdir`` is given), one log per run under its ``logs/``; the
throughput targets are printed as met/missed. Units: examples/s; MB/s of raw array bytes (10**6 bytes);
peak RSS in MB (10**6 bytes).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata as importlib_metadata

from bench import datagen, peers, readsection, report, sizes
from bench.common import (
    AUGMENT_CONSTANT,
    LARGE,
    LAYOUTS,
    SMALL,
    convert_encoding_flags,
    count_frames,
    count_gzip_frames,
    dir_bytes,
    row_bytes,
    tfrecord_files,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RESULTS = os.path.join(ROOT, "bench", "results")
DEFAULT_WORKDIR = os.path.join(DEFAULT_RESULTS, "work")

SMALL_ROWS = 2_000_000
SCALING_ROWS = 20_000_000  # 1.44 GB: about 5 s of work per worker, well above start-up noise
LARGE_ROWS = 84_000  # 84,000 x 12,808 bytes = 1.076 GB (> 1 GiB)
AUGMENT_ROWS = 1_000_000
RAW_ROWS = 40_000  # uint8 [64, 64, 3]: 491 MB, the size of the sizes section's laptop-sized image file
FILES = 10_000  # PNG 64x64 RGB, about 10 KB each
RSS8_BYTES = 8 * 2**30
TINY_FRACTION = 50  # steady state: the same command on 1/50 of the rows
MIN_STEADY_DELTA_S = 0.25  # below this difference of wall times, the steady-state figure is noise (use --repeat 3)

BEAM = ["--runner=DirectRunner", "--direct_running_mode=multi_processing"]
SECTIONS = (
    "small",
    "large",
    "augment",
    "scaling",
    "raw",
    "files",
    "splits",
    "remote",
    "sizes",
    "zarr",
    "nifti",
    "parquet",
    "peers",
    "read",
)
# sizes (~10 minutes, 17 GB of inputs), remote (a moto S3 server: the s3 extra), zarr, nifti, parquet, peers (TFDS
# and Ray in environments of their own) and read (readers, the TensorFlow-free ones in an environment of their own)
# run when asked: --only sizes, --only remote, --only zarr, --only nifti, --only parquet, --peers, --read
ASKED_ONLY = ("remote", "sizes", "zarr", "nifti", "parquet", "peers", "read")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in ASKED_ONLY)
SPLITS_ROWS = {"small": 1_000_000, "large": 20_000}  # the splits section: --splits and --shuffle_seed cost


def selected_sections(args) -> list[str]:
    """The sections to run: ``--only``'s, plus ``peers`` with ``--peers`` and ``read`` with ``--read`` (either
    alone, with the default ``--only``, runs only its section). Raises SystemExit naming an unknown section."""
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    asked = [s for s in ("peers", "read") if getattr(args, s, False) and s not in sections]
    if asked:
        sections = asked if args.only == ",".join(DEFAULT_SECTIONS) else sections + asked
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        raise SystemExit(f"--only: unknown section(s) {bad}; choose from {','.join(SECTIONS)}")
    return sections


def beam_flags(workers: int) -> list[str]:
    return BEAM + [f"--direct_num_workers={workers}"]


def rows_at(default: int, scale: float) -> int:
    return max(1, round(default * scale))


class Bench:
    """One benchmark run: data, contenders, results."""

    def __init__(self, args):
        self.args = args
        self.py = sys.executable
        self.workdir = os.path.abspath(args.workdir or DEFAULT_WORKDIR)
        if args.results_dir:
            self.results_dir = os.path.abspath(args.results_dir)
        elif args.workdir:
            self.results_dir = os.path.join(self.workdir, "results")
        else:
            self.results_dir = DEFAULT_RESULTS
        self.data_dir = os.path.join(self.workdir, "data")
        self.out_dir = os.path.join(self.workdir, "out")
        self.log_dir = os.path.join(self.results_dir, "logs")
        self.home = tempfile.mkdtemp(prefix="bench-home-")
        self.steady = args.steady == "on" or (args.steady == "auto" and args.scale >= 0.1)
        self.rows: list[dict] = []
        self.section_info: dict[str, dict] = {}
        self.extras: dict = {}
        self.generated: set[str] = set()  # inputs generated (or prepared) during this run
        self.env = self._env()

    # ---------------------------------------------------------------- environment and processes

    def _env(self) -> dict:
        env = dict(os.environ)
        env.pop("TFRECORD_ETL_VERBOSE", None)
        env.update(
            {
                "HOME": self.home,
                "TF_CPP_MIN_LOG_LEVEL": "3",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])),
            }
        )
        return env

    def say(self, msg: str) -> None:
        print(msg, flush=True)

    def run_plain(self, cmd: list[str], log_name: str) -> tuple[int, str]:
        """Runs a preparation command (not measured); returns (exit code, log path)."""
        log = os.path.join(self.log_dir, log_name + ".log")
        with open(log, "wb") as f:
            code = subprocess.call(
                cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, cwd=ROOT
            )
        return code, log

    def measured(self, cmd: list[str], log_name: str) -> dict:
        """Runs ``cmd`` under ``bench.measure``; returns its measurement (see bench.measure)."""
        log = os.path.join(self.log_dir, log_name + ".log")
        js = os.path.join(self.log_dir, log_name + ".measure.json")
        wrapper = [
            self.py,
            "-m",
            "bench.measure",
            "--log",
            log,
            "--json",
            js,
            "--timeout",
            str(self.args.timeout),
            "--",
        ] + cmd
        settled = settle()
        load = os.getloadavg()[0]
        code = subprocess.call(wrapper, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL)
        if code != 0 or not os.path.exists(js):
            return {
                "returncode": -1,
                "wall_s": None,
                "log": log,
                "error": f"bench.measure exited {code}",
                "load_before": load,
                "dirty_mb_before": settled,
            }
        with open(js, encoding="utf-8") as f:
            m = json.load(f)
        os.remove(js)
        m["load_before"], m["dirty_mb_before"] = load, settled
        return m

    # ---------------------------------------------------------------- data

    def h5(self, kind: str, name: str, rows: int) -> str:
        path = os.path.join(self.data_dir, name + ".h5")
        t = time.perf_counter()
        if datagen.ensure(kind, path, rows, self.args.keep or path in self.generated):
            self.say(
                f"  generated {os.path.basename(path)}: {rows:,} rows, "
                f"{rows * row_bytes(LAYOUTS[kind]) / 1e6:,.1f} MB raw in {time.perf_counter() - t:.1f} s"
            )
        else:
            self.say(f"  kept {os.path.basename(path)}: {rows:,} rows")
        self.generated.add(path)
        return path

    def records(self, kind: str, h5_path: str, rows: int, name: str, compression: str = "none") -> str:
        """A converted collection of ``h5_path`` (the augmentation input): ``convert --writer beam`` into
        ``data/NAME/``; falls back to the seed loop (one TFRecordWriter file) if convert fails. ``compression``
        ``gzip``: ``.gz`` shards (what TFX's ExampleGen writes), written by ``convert --compression gzip``."""
        out = os.path.join(self.data_dir, name)
        stamp = os.path.join(self.data_dir, name + ".json")
        want = dict(datagen.stamp(kind, rows, datagen.SEEDS[kind]), compression=compression)
        if compression != "none":
            return self._gzip_records(kind, h5_path, rows, name, out, stamp, want)
        if (self.args.keep or out in self.generated) and datagen_stamp_ok(stamp, want) and tfrecord_files(out):
            self.say(f"  kept {name}/")
            return out
        shutil.rmtree(out, ignore_errors=True)
        if os.path.exists(stamp):
            os.remove(stamp)
        t = time.perf_counter()
        cmd = [
            self.py,
            "-m",
            "pipelines.convert",
            "--input",
            h5_path,
            "--output_dir",
            out,
            "--writer",
            "beam",
            *convert_encoding_flags(LAYOUTS[kind]),
            *beam_flags(2),
        ]
        code, log = self.run_plain(cmd, f"prepare__{name}")
        how = "convert --writer beam"
        if code != 0:
            self.say(f"  convert failed preparing {name}/ (log {report.relpath(log)}); writing it with the seed loop")
            shutil.rmtree(out, ignore_errors=True)
            cmd = [
                self.py,
                "-m",
                "bench.seed_loop",
                "--input",
                h5_path,
                "--output",
                os.path.join(out, "data-00000-of-00001.tfrecord"),
            ]
            code, log = self.run_plain(cmd, f"prepare__{name}__seed")
            how = "seed loop"
            if code != 0:
                raise SystemExit(f"cannot prepare {name}: see {log}")
        with open(stamp, "w", encoding="utf-8") as f:
            json.dump(want, f)
        self.say(f"  prepared {name}/ ({rows:,} records, {how}) in {time.perf_counter() - t:.1f} s")
        self.generated.add(out)
        return out

    def _gzip_records(self, kind, h5_path, rows, name, out, stamp, want) -> str:
        if (
            (self.args.keep or out in self.generated)
            and datagen_stamp_ok(stamp, want)
            and glob.glob(os.path.join(out, "*.gz"))
        ):
            self.say(f"  kept {name}/")
            return out
        shutil.rmtree(out, ignore_errors=True)
        cmd = [
            self.py,
            "-m",
            "pipelines.convert",
            "--input",
            h5_path,
            "--output_dir",
            out,
            "--compression",
            "gzip",
            *convert_encoding_flags(LAYOUTS[kind]),
            *beam_flags(2),
        ]
        code, log = self.run_plain(cmd, f"prepare__{name}")
        if code != 0:
            raise SystemExit(f"cannot prepare {name}: see {log}")
        with open(stamp, "w", encoding="utf-8") as f:
            json.dump(want, f)
        self.say(f"  prepared {name}/ ({rows:,} records, gzip)")
        self.generated.add(out)
        return out

    # ---------------------------------------------------------------- contenders

    def contender(
        self,
        section: str,
        key: str,
        name: str,
        role: str,
        rows: int,
        rbytes: int,
        make_cmd,
        tiny: tuple | None = None,
        expect_writer: str | None = None,
        check: str = "frames",
    ) -> dict:
        """Measures one contender. ``make_cmd(input, out_dir) -> argv``; ``tiny = (input, rows)`` for the
        steady-state run; ``check``: ``frames`` (count the records of the TFRecord files), ``metadata``
        (metadata.json's num_records, and its writer), ``augment`` (metadata.json's num_records when
        present, else the records of its TFRecord files), ``bytes`` (output size = raw bytes), ``none``."""
        out = os.path.join(self.out_dir, section, key)
        main_input = self.section_info[section]["input"]
        cmd = make_cmd(main_input, out)
        row = {
            "section": section,
            "key": key,
            "name": name,
            "role": role,
            "rows": rows,
            "raw_bytes": rows * rbytes,
            "command": shlex.join(show_path(c) for c in cmd),
        }
        self.say(f"  {name} ...")
        runs = []
        for rep in range(self.args.repeat):
            shutil.rmtree(out, ignore_errors=True)
            suffix = f"__r{rep + 1}" if self.args.repeat > 1 else ""
            m = self.measured(cmd, f"{section}__{key}{suffix}")
            m["error"] = m.get("error") or self._check(m, out, rows, rbytes, expect_writer, check)
            if m["error"] is None and "output_bytes" not in row:
                row["output_bytes"] = dir_bytes(out)
            runs.append(m)
            if not self.args.keep_outputs:
                shutil.rmtree(out, ignore_errors=True)
            if m["error"] is not None:
                break
        best = runs[-1] if runs[-1]["error"] is not None else min(runs, key=lambda r: r["wall_s"])
        best = dict(
            best,
            peak_rss_bytes=max(r.get("peak_rss_bytes") or 0 for r in runs),
            tree_rss_bytes=max(r.get("tree_rss_bytes") or 0 for r in runs),
        )
        if self.args.repeat > 1:
            row["walls_s"] = [r.get("wall_s") for r in runs]
        row.update(self._row_fields(best))
        if row["status"] == "ok":
            wall = max(row["wall_s"], 1e-9)
            row["examples_per_s"], row["mb_per_s"] = rows / wall, rows * rbytes / 1e6 / wall
            works = [w for w in (work_seconds(r.get("log")) for r in runs) if w]
            if works:  # the fastest of the runs, like the wall time
                row["work_s"] = min(works)
                row["work_examples_per_s"] = rows / row["work_s"]
                row["work_mb_per_s"] = rows * rbytes / 1e6 / row["work_s"]
        if row["status"] == "ok" and self.steady and tiny is not None:
            tiny_input, tiny_rows = tiny
            tout = out + "__tiny"
            shutil.rmtree(tout, ignore_errors=True)
            tiny_runs = []
            for rep in range(self.args.repeat):  # the fastest of as many runs as the full size had
                shutil.rmtree(tout, ignore_errors=True)
                suffix = f"__r{rep + 1}" if self.args.repeat > 1 else ""
                tm = self.measured(make_cmd(tiny_input, tout), f"{section}__{key}__tiny{suffix}")
                tm["error"] = tm.get("error") or self._check(tm, tout, tiny_rows, rbytes, expect_writer, check)
                tiny_runs.append(tm)
                shutil.rmtree(tout, ignore_errors=True)
                if tm["error"] is not None:
                    break
            tm = tiny_runs[-1] if tiny_runs[-1]["error"] is not None else min(tiny_runs, key=lambda r: r["wall_s"])
            terr = tm["error"]
            if self.args.repeat > 1:
                row["tiny_walls_s"] = [r.get("wall_s") for r in tiny_runs]
            row["tiny_rows"], row["tiny_wall_s"] = tiny_rows, tm.get("wall_s")
            if terr is None and tm.get("wall_s") is not None:
                delta = row["wall_s"] - tm["wall_s"]
                row["startup_s"] = tm["wall_s"] - tiny_rows * delta / max(1, rows - tiny_rows)
                if delta >= MIN_STEADY_DELTA_S and rows > tiny_rows:
                    row["steady_examples_per_s"] = (rows - tiny_rows) / delta
                    row["steady_mb_per_s"] = (rows - tiny_rows) * rbytes / 1e6 / delta
                else:
                    row["steady_note"] = f"wall time difference {delta:.2f} s is too small to measure"
            else:
                row["steady_note"] = f"tiny run failed: {terr}"
        self.rows.append(row)
        if row["status"] == "ok":
            steady = row.get("steady_examples_per_s")
            self.say(
                f"    {row['wall_s']:.2f} s, {row['examples_per_s']:,.0f} examples/s, {row['mb_per_s']:,.1f} MB/s"
                + (f", steady {steady:,.0f} examples/s" if steady else "")
                + f", peak RSS {row['peak_rss_mb']:,.0f} MB ({row['procs_seen']} process"
                + ("es)" if row["procs_seen"] != 1 else ")")
            )
        else:
            self.say(f"    FAILED: {row['error']}\n    log {report.relpath(row['log'])}, last lines:")
            for line in row["stderr_tail"].splitlines():
                self.say(f"      | {line}")
        return row

    def _row_fields(self, m: dict) -> dict:
        ok = m.get("error") is None
        wall = m.get("wall_s")
        return {
            "status": "ok" if ok else "failed",
            "error": m.get("error"),
            "log": m.get("log"),
            "wall_s": wall,
            "returncode": m.get("returncode"),
            "cpu_s": (m.get("cpu_user_s") or 0) + (m.get("cpu_sys_s") or 0),
            "peak_rss_mb": (m.get("peak_rss_bytes") or 0) / 1e6,
            "kernel_maxrss_mb": (m.get("kernel_maxrss_bytes") or 0) / 1e6,
            # the tree's sum is at least its largest process (polling can miss a short peak)
            "tree_rss_mb": max(m.get("tree_rss_bytes") or 0, m.get("peak_rss_bytes") or 0) / 1e6,
            "procs_seen": m.get("procs_seen"),
            "stragglers": m.get("stragglers"),
            "load_before": m.get("load_before"),
            "stderr_tail": "" if ok else tail(m.get("log")),
        }

    def _check(self, m: dict, out: str, rows: int, rbytes: int, expect_writer: str | None, check: str) -> str | None:
        """None when the run succeeded and its output is what it should be, else why not."""
        if m.get("timed_out"):
            return f"timed out after {self.args.timeout:.0f} s"
        if m.get("returncode") != 0:
            return f"exit code {m.get('returncode')}"
        try:
            if check == "frames":
                n = sum(count_frames(p) for p in tfrecord_files(out))
                if n != rows:
                    return f"wrote {n} records, expected {rows}"
            elif check == "gzip_frames":
                n = sum(count_gzip_frames(p) for p in glob.glob(os.path.join(out, "**", "*.gz"), recursive=True))
                if n != rows:
                    return f"wrote {n} records, expected {rows}"
            elif check == "bytes":
                n = dir_bytes(out)
                if n != rows * rbytes:
                    return f"wrote {n} bytes, expected {rows * rbytes}"
            elif check == "metadata":
                meta_path = os.path.join(out, "metadata.json")
                if not os.path.exists(meta_path):
                    return "no metadata.json in the output"
                with open(meta_path, encoding="utf-8") as f:
                    meta = json.load(f)
                if meta.get("num_records", rows) != rows:
                    return f"metadata.json says {meta.get('num_records')} records, expected {rows}"
                if expect_writer and meta.get("writer") != expect_writer:
                    return (
                        f"asked for --writer {expect_writer} but metadata.json says writer="
                        f"{meta.get('writer')!r} (flag not supported yet?)"
                    )
            elif check == "augment":  # the augment output's layout is its own: check what it declares
                meta_path = os.path.join(out, "metadata.json")
                if os.path.exists(meta_path):
                    with open(meta_path, encoding="utf-8") as f:
                        meta = json.load(f)
                    if meta.get("num_records", rows) != rows:
                        return f"metadata.json says {meta.get('num_records')} records, expected {rows}"
                elif tfrecord_files(out):
                    n = sum(count_frames(p) for p in tfrecord_files(out))
                    if n != rows:
                        return f"wrote {n} records, expected {rows}"
                elif not os.path.isdir(out) or not os.listdir(out):
                    return "wrote no output"
        except (OSError, ValueError) as e:
            return f"cannot check the output: {e}"
        return None

    # ---------------------------------------------------------------- sections

    def convert_cmd(self, writer: str, workers: int, layout: dict):
        extra = shlex.split(self.args.convert_flags or "")

        def make(inp, out):
            return [
                self.py,
                "-m",
                "pipelines.convert",
                "--input",
                inp,
                "--output_dir",
                out,
                "--overwrite",
                "--writer",
                writer,
                *convert_encoding_flags(layout),
                *extra,
                *beam_flags(workers),
            ]

        return make

    def rows_input(self, section: str, kind: str, default_rows: int):
        """Generates a section's HDF5 input (and its 1/50 twin for the steady state) and measures the raw
        copy of it; returns ``(rows, row bytes, tiny)`` for the section's other contenders."""
        rows = rows_at(default_rows, self.args.scale)
        rb = row_bytes(LAYOUTS[kind])
        self.say(f"[{section}] {rows:,} rows x {rb:,} bytes = {rows * rb / 1e6:,.1f} MB raw")
        path = self.h5(kind, section, rows)
        tiny = None
        if self.steady:
            tiny_rows = max(1, rows // TINY_FRACTION)
            tiny = (self.h5(kind, section + "_tiny", tiny_rows), tiny_rows)
        self.section_info[section] = {"rows": rows, "row_bytes": rb, "raw_bytes": rows * rb, "input": path}
        py = self.py
        self.contender(
            section,
            "raw",
            "raw copy",
            "raw",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.raw_copy", "--input", i, "--output", os.path.join(o, "raw.bin")],
            tiny,
            check="bytes",
        )
        return rows, rb, tiny

    def rows_section(self, section: str, layout: dict, default_rows: int) -> None:
        rows, rb, tiny = self.rows_input(section, section, default_rows)
        py = self.py
        self.contender(
            section,
            "seed",
            "seed loop",
            "seed",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.seed_loop", "--input", i, "--output", os.path.join(o, "data.tfrecord")],
            tiny,
        )
        self.contender(
            section,
            "plain_beam_2w",
            "plain Beam (2 workers)",
            "other",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.plain_beam", "--input", i, "--output_dir", o, *beam_flags(2)],
            tiny,
        )
        for writer in ("planned", "beam"):
            self.contender(
                section,
                f"convert_{writer}_2w",
                f"convert --writer {writer} (2 workers)",
                "other",
                rows,
                rb,
                self.convert_cmd(writer, 2, layout),
                tiny,
                expect_writer=writer,
                check="metadata",
            )
        if section == "small":
            for writer in ("planned", "beam"):
                self.contender(
                    section,
                    f"convert_{writer}_1w",
                    f"convert --writer {writer} (1 worker)",
                    "other",
                    rows,
                    rb,
                    self.convert_cmd(writer, 1, layout),
                    tiny,
                    expect_writer=writer,
                    check="metadata",
                )

    def new_source_section(self, section: str) -> None:
        """``raw``: a raw uint8 [64, 64, 3] file (``--format raw``) against seed 003's memmap loop; ``files``: PNG
        files in 4 class folders (``--format files``) against seed 001's loop; each with the raw copy of the
        input bytes. Inputs are generated once (``bench.seed_files make-*``)."""
        py = self.py
        if section == "raw":
            rows = rows_at(RAW_ROWS, self.args.scale)
            rb = 64 * 64 * 3
            path = os.path.join(self.data_dir, f"raw_{rows}.raw")
            if not os.path.exists(path):
                subprocess.run(
                    [py, "-m", "bench.seed_files", "make-raw", "--output", path, "--rows", str(rows)], check=True
                )
            raw_bytes, pattern = rows * rb, path
            seed = ["raw", "--input"]
            flags = ["--dtype", "|u1", "--shape", "-1,64,64,3"]
        else:
            rows = rows_at(FILES, self.args.scale)
            path = os.path.join(self.data_dir, f"files_{rows}")
            if not os.path.isdir(path):
                subprocess.run(
                    [py, "-m", "bench.seed_files", "make-files", "--output", path + ".tmp", "--files", str(rows)],
                    check=True,
                )
                os.rename(path + ".tmp", path)
            raw_bytes = dir_bytes(path)
            rb = max(1, raw_bytes // rows)
            pattern = os.path.join(path, "*", "*")
            seed = ["files", "--input"]
            flags = ["--format", "files"]
        self.say(f"[{section}] {rows:,} rows, {raw_bytes / 1e6:,.1f} MB of input")
        self.section_info[section] = {"rows": rows, "row_bytes": rb, "raw_bytes": raw_bytes, "input": path}
        self.contender(
            section,
            "raw",
            "raw copy",
            "raw",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.raw_copy", "--records", pattern, "--output", os.path.join(o, "raw.bin")],
            None,
            check="none",
        )
        self.contender(
            section,
            "seed",
            f"seed loop ({'003 memmap' if section == 'raw' else '001 files'})",
            "seed",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.seed_files", *seed, i, "--output", os.path.join(o, "data.tfrecord")],
            None,
        )
        self.contender(
            section,
            "convert_planned_2w",
            "convert --writer planned (2 workers)",
            "other",
            rows,
            rb,
            lambda i, o: [
                py,
                "-m",
                "pipelines.convert",
                "--input",
                pattern,
                "--output_dir",
                o,
                "--overwrite",
                *flags,
                *beam_flags(2),
            ],
            None,
            expect_writer="planned",
            check="metadata",
        )
        self.contender(
            section,
            "convert_planned_inproc",
            "convert --writer planned (in-process)",
            "other",
            rows,
            rb,
            lambda i, o: [
                py,
                "-m",
                "pipelines.convert",
                "--input",
                pattern,
                "--output_dir",
                o,
                "--overwrite",
                *flags,
                "--runner=DirectRunner",
                "--direct_running_mode=in_memory",
            ],
            None,
            expect_writer="planned",
            check="metadata",
        )

    def scaling_section(self) -> None:
        """2 workers vs 1 on many small rows: the planned writer only (the beam writer would take minutes
        a run at this size; its 1- and 2-worker rates are in the small section), with the raw copy."""
        rows, rb, tiny = self.rows_input("scaling", "small", SCALING_ROWS)
        for workers in (1, 2):
            self.contender(
                "scaling",
                f"convert_planned_{workers}w",
                f"convert --writer planned ({workers} worker{'s' if workers > 1 else ''})",
                "other",
                rows,
                rb,
                self.convert_cmd("planned", workers, SMALL),
                tiny,
                expect_writer="planned",
                check="metadata",
            )

    def splits_section(self, kind: str) -> None:
        """What ``--splits train=8,validation=1,test=1`` and ``--shuffle_seed`` cost against the same conversion
        without them (2 workers each, planned writer), with the seed loop and the raw copy of the input."""
        section = f"splits_{kind}"
        rows, rb, tiny = self.rows_input(section, kind, SPLITS_ROWS[kind])
        py, base = self.py, self.convert_cmd("planned", 2, LAYOUTS[kind])
        self.contender(
            section,
            "seed",
            "seed loop",
            "seed",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.seed_loop", "--input", i, "--output", os.path.join(o, "data.tfrecord")],
            tiny,
        )
        for key, name, flags, writer in (
            ("convert_2w", "convert (2 workers)", [], "planned"),
            (
                "splits_2w",
                "convert --splits train=8,validation=1,test=1 (2 workers)",
                ["--splits", "train=8,validation=1,test=1"],
                "planned",
            ),
            (
                "shuffled_2w",
                "convert --splits ... --shuffle_seed 1 (2 workers)",
                ["--splits", "train=8,validation=1,test=1", "--shuffle_seed", "1"],
                "shuffled",
            ),
        ):
            self.contender(
                section,
                key,
                name,
                "other",
                rows,
                rb,
                lambda i, o, f=flags: base(i, o) + f,
                tiny,
                expect_writer=writer,
                check="metadata",
            )

    def augment_section(self, section: str, kind: str, rows: int, h5_name: str) -> None:
        layout = LAYOUTS[kind]
        rb = row_bytes(layout)
        self.say(f"[{section}] {rows:,} records (+ one int64 field; {rows * rb / 1e6:,.1f} MB of raw array bytes)")
        h5_path = self.h5(kind, h5_name, rows)
        src = self.records(kind, h5_path, rows, f"{section}_records")
        tiny = None
        if self.steady:
            tiny_rows = max(1, rows // TINY_FRACTION)
            tiny_h5 = self.h5(kind, h5_name + "_tiny", tiny_rows)
            tiny = (self.records(kind, tiny_h5, tiny_rows, f"{section}_records_tiny"), tiny_rows)
        self.section_info[section] = {
            "rows": rows,
            "row_bytes": rb,
            "raw_bytes": rows * rb,
            "input": src,
            "input_bytes": dir_bytes(src),
        }
        py = self.py
        extra = shlex.split(self.args.augment_flags or "")

        def augment(mode):
            return lambda i, o: [
                py,
                "-m",
                "pipelines.augment",
                "--input",
                i,
                "--output_dir",
                o,
                "--mode",
                mode,
                "--constants",
                AUGMENT_CONSTANT,
                "--encoding",
                "list",
                *extra,
                *beam_flags(2),
            ]

        def shards(i):
            return os.path.join(i, "*.tfrecord")

        self.contender(
            section,
            "raw",
            "raw copy of the records",
            "raw",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.raw_copy", "--records", shards(i), "--output", os.path.join(o, "raw.bin")],
            tiny,
            check="none",
        )
        self.contender(
            section,
            "seed",
            "seed loop (parse/modify/serialize)",
            "seed",
            rows,
            rb,
            lambda i, o: [py, "-m", "bench.seed_augment", "--input", shards(i), "--output_dir", o],
            tiny,
        )
        rewrite = self.contender(
            section,
            "rewrite",
            "augment --mode rewrite (2 workers)",
            "other",
            rows,
            rb,
            augment("rewrite"),
            tiny,
            check="augment",
        )
        sidecar = self.contender(
            section,
            "sidecar",
            "augment --mode sidecar (2 workers)",
            "other",
            rows,
            rb,
            augment("sidecar"),
            tiny,
            check="augment",
        )
        # a gzip collection (TFX ExampleGen's .gz shards) augmented into gzip, against the same loop through
        # TensorFlow's GZIP reader and writer
        gz = self.records(kind, h5_path, rows, f"{section}_records_gz", "gzip")
        self.section_info[section]["gzip_input"] = gz
        self.contender(
            section,
            "seed_gzip",
            "seed loop, gzip in and out (TF GZIP reader and writer)",
            "other",
            rows,
            rb,
            lambda i, o: [
                py,
                "-m",
                "bench.seed_augment",
                "--input",
                os.path.join(gz, "*.gz"),
                "--output_dir",
                o,
                "--compression",
                "gzip",
            ],
            None,
            check="augment",
        )
        self.contender(
            section,
            "rewrite_gzip",
            "augment --mode rewrite, gzip in and out (2 workers)",
            "other",
            rows,
            rb,
            lambda i, o: augment("rewrite")(gz, o),
            None,
            check="augment",
        )
        if section == "augment_images" and rewrite["status"] == "ok" and sidecar["status"] == "ok":
            rw, sc = rewrite.get("output_bytes"), sidecar.get("output_bytes")
            if rw:
                self.extras.update({"rewrite_bytes": rw, "sidecar_bytes": sc, "sidecar_ratio": sc / rw})
                self.say(f"    sidecar/rewrite output bytes: {sc:,} / {rw:,} = {sc / rw:.2%} (must be < 5%)")

    def rss8gb_section(self) -> None:
        rb = row_bytes(LARGE)
        rows = max(1, math.ceil(RSS8_BYTES * self.args.scale / rb))
        self.say(f"[rss8gb] {rows:,} rows x {rb:,} bytes = {rows * rb / 1e9:,.2f} GB raw")
        path = self.h5("large", "rss8gb", rows)
        self.section_info["rss8gb"] = {"rows": rows, "row_bytes": rb, "raw_bytes": rows * rb, "input": path}
        self.contender(
            "rss8gb",
            "convert_planned_2w",
            "convert --writer planned (2 workers)",
            "other",
            rows,
            rb,
            self.convert_cmd("planned", 2, LARGE),
            None,
            expect_writer="planned",
            check="metadata",
        )

    # ---------------------------------------------------------------- driver

    def run(self) -> int:
        args = self.args
        shutil.rmtree(self.log_dir, ignore_errors=True)  # the logs of this run only
        for d in (self.data_dir, self.out_dir, self.log_dir):
            os.makedirs(d, exist_ok=True)
        sections = selected_sections(args)
        started = time.time()
        self.say(
            f"bench: scale {args.scale}, sections {','.join(sections)}{' + rss_8gb' if args.rss_8gb else ''}, "
            f"steady state {'on' if self.steady else 'off'}, workdir {report.relpath(self.workdir)}, "
            f"results {report.relpath(self.results_dir)}"
        )
        order = []
        try:
            if "small" in sections:
                self.rows_section("small", SMALL, SMALL_ROWS)
                order.append("small")
            if "large" in sections:
                self.rows_section("large", LARGE, LARGE_ROWS)
                order.append("large")
            if "augment" in sections:
                self.augment_section("augment_small", "small", rows_at(AUGMENT_ROWS, args.scale), "augment_small")
                self.augment_section("augment_images", "large", rows_at(LARGE_ROWS, args.scale), "large")
                order += ["augment_small", "augment_images"]
            if "scaling" in sections:
                self.scaling_section()
                order.append("scaling")
            for section in ("raw", "files"):
                if section in sections:
                    self.new_source_section(section)
                    order.append(section)
            if "splits" in sections:
                for kind in ("small", "large"):
                    self.splits_section(kind)
                    order.append(f"splits_{kind}")
            if "remote" in sections:  # bench.remote in its own process: egress and planning on a moto S3 server
                self.say("[remote] python -m bench.remote (moto S3 server behind bench.s3proxy, 20 ms a request)")
                done = subprocess.run([self.py, "-m", "bench.remote"], capture_output=True, text=True)
                table = "\n".join(
                    line for line in done.stdout.splitlines() if line.startswith(("|", "egress", "planning", "large"))
                )
                self.extras["remote"] = table if done.returncode == 0 else f"failed: {done.stderr[-2000:]}"
                order.append("remote")
            if "sizes" in sections:
                order += sizes.run_sizes(self, args.sizes, args.seed_limit_s)
            if "zarr" in sections:  # bench.zarrsection: a Zarr store against its HDF5 twin and an xarray loop
                from bench.zarrsection import zarr_section

                zarr_section(self, rows_at, beam_flags)
                order.append("zarr")
            if "nifti" in sections:  # bench.niftisection: a .nii.gz against its HDF5 twin and a nibabel loop
                from bench.niftisection import nifti_section

                nifti_section(self, rows_at, beam_flags)
                order.append("nifti")
            if "parquet" in sections:  # bench.parquetsection: a Parquet file against its HDF5 twin and a pyarrow loop
                from bench.parquetsection import parquet_section

                parquet_section(self, rows_at, beam_flags)
                order.append("parquet")
            if "peers" in sections:
                order += peers.run_peers(self, args.peers, args.peer_rounds)
            if "read" in sections:
                order += readsection.run_read(self, args.read, args.read_rounds)
            if args.rss_8gb:
                self.rss8gb_section()
                order.append("rss8gb")
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
        report.add_ratios(self.rows)
        targets = report.evaluate_targets(self.rows, self.extras)
        result = {
            "meta": self.meta(started),
            "sections": order,
            "section_info": self.section_info,
            "results": self.rows,
            "extras": self.extras,
            "targets": targets,
        }
        json_path = os.path.join(self.results_dir, "results.json")
        md_path = os.path.join(self.results_dir, "results.md")
        png_path = os.path.join(self.results_dir, "results.png")
        report.write_json(json_path, result)
        md = report.markdown(result)
        if "remote" in self.extras:
            md += "\n### remote (bench.remote)\n\n" + self.extras["remote"] + "\n"
        if "sizes" in sections:
            summ = sizes.summary(self.rows, self.section_info)
            result["sizes"] = {"summary": summ, "targets": sizes.targets(self.rows, summ)}
            report.write_json(json_path, result)
            md += "\n" + sizes.markdown(summ, result["sizes"]["targets"])
            why = sizes.draw(os.path.join(self.results_dir, "sizes.png"), summ)
            self.say(
                f"sizes chart: {report.relpath(os.path.join(self.results_dir, 'sizes.png'))}"
                if why is None
                else f"no sizes chart: {why}"
            )
        if "peers" in sections:
            md += "\n" + peers.markdown(self.rows, self.section_info)
            chart = os.path.join(self.results_dir, "peers.png")
            why = peers.draw(chart, self.rows, self.section_info)
            self.say(f"peers chart: {report.relpath(chart)}" if why is None else f"no peers chart: {why}")
        if "read" in sections:
            md += "\n" + readsection.markdown(self.rows, self.section_info)
            chart = os.path.join(self.results_dir, "read.png")
            why = readsection.draw(chart, self.rows, self.section_info)
            self.say(f"read chart: {report.relpath(chart)}" if why is None else f"no read chart: {why}")
        with open(md_path, "w", encoding="utf-8") as f:
            f.write(md)
        why_not = report.draw_png(png_path, result)
        self.say("")
        self.say(md)
        report.print_targets(targets, sys.stdout)
        if args.scale < 1 or not self.steady:
            self.say(
                "  (the targets are meant for the full sizes, --scale 1, where steady-state figures are measured; "
                "at this scale start-up dominates)"
            )
        self.say(
            f"\nwrote {report.relpath(json_path)}, {report.relpath(md_path)}"
            + (f", {report.relpath(png_path)}" if why_not is None else f" (no PNG: {why_not})")
            + f" in {time.time() - started:.0f} s"
        )
        if not args.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        if not args.keep_outputs:
            shutil.rmtree(self.out_dir, ignore_errors=True)
        try:
            os.rmdir(self.workdir)  # only when nothing is left in it
        except OSError:
            pass
        return 0

    def meta(self, started: float) -> dict:
        versions = {}
        for pkg in ("apache-beam", "tensorflow", "tfx-bsl", "numpy", "h5py", "protobuf", "google-crc32c"):
            try:
                versions[pkg] = importlib_metadata.version(pkg)
            except importlib_metadata.PackageNotFoundError:
                versions[pkg] = None
        return {
            "created": datetime.datetime.fromtimestamp(started, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "python -m bench.run " + shlex.join(sys.argv[1:]),
            "scale": self.args.scale,
            "repeat": self.args.repeat,
            "steady": self.steady,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "versions": versions,
            "git_commit": _git_commit(),
            "beam_flags_2_workers": beam_flags(2),
            "convert_flags": self.args.convert_flags,
            "augment_flags": self.args.augment_flags,
        }


_WORK_PATTERNS = (
    re.compile(r"^work span: ([0-9.]+) s", re.M),  # pipelines.convert / pipelines.augment
    re.compile(r"^(?:raw_copy|seed_loop|seed_augment|seed_zarr): .* in ([0-9.]+) s", re.M),
)


def work_seconds(log: str | None) -> float | None:
    """The contender's own measure of its work, from its log: the pipelines' ``work span`` (first shard
    started to last shard written, from Beam metrics) or the single-process loops' time after imports;
    None for contenders that report neither (plain Beam, the beam writer has a span too)."""
    if not log or not os.path.exists(log):
        return None
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for pattern in _WORK_PATTERNS:
        found = pattern.findall(text)
        if found:
            return float(found[-1])
    return None


def dirty_mb() -> float | None:
    """Dirty + Writeback page-cache memory, in MB (Linux ``/proc/meminfo``), or None elsewhere."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f)
        return sum(int(fields[k].split()[0]) for k in ("Dirty", "Writeback")) * 1024 / 1e6
    except (OSError, KeyError, ValueError):
        return None


def settle(limit_mb: float = 64.0, timeout_s: float = 120.0) -> float | None:
    """Flushes the page cache's dirty pages before a measured run and waits (up to ``timeout_s``) until
    under ``limit_mb`` remain, so no contender pays for the writeback of the previous one's output (the
    kernel throttles writers once dirty pages pass vm.dirty_background_ratio; on this 2-core machine a
    1 GB raw copy took 2.3 s right after another run's output and 0.4-0.9 s after a sync). Returns the
    dirty MB left."""
    os.sync()
    deadline = time.monotonic() + timeout_s
    left = dirty_mb()
    while left is not None and left > limit_mb and time.monotonic() < deadline:
        time.sleep(0.2)
        left = dirty_mb()
    return left


def show_path(arg: str) -> str:
    """``arg`` relative to the repository root when it is a path inside it (commands as one types them there)."""
    if os.path.isabs(arg) and (arg == ROOT or arg.startswith(ROOT + os.sep)):
        return os.path.relpath(arg, ROOT)
    return arg


def datagen_stamp_ok(path: str, want: dict) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f) == want
    except (OSError, ValueError):
        return False


def tail(path: str | None, lines: int = 15) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 64 * 1024))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiplies every default size (e.g. 0.02 for a quick check; default 1.0)",
    )
    ap.add_argument(
        "--only",
        default=",".join(DEFAULT_SECTIONS),
        help=f"sections to run, comma-separated, of {','.join(SECTIONS)} (default: all but remote, sizes, zarr, nifti and parquet)",
    )
    ap.add_argument(
        "--sizes",
        default=sizes.DEFAULT_SIZES,
        help=f"sizes section: input sizes in raw array bytes, times --scale (default {sizes.DEFAULT_SIZES})",
    )
    ap.add_argument(
        "--seed_limit_s",
        type=float,
        default=300.0,
        help="sizes section: skip the seed loop where its previous rate predicts more seconds than this (default 300)",
    )
    ap.add_argument(
        "--workdir", default=None, help=f"where inputs and outputs go (default {report.relpath(DEFAULT_WORKDIR)})"
    )
    ap.add_argument(
        "--results_dir",
        default=None,
        help="where results.json/md/png and logs/ go (default bench/results, or WORKDIR/results "
        "when --workdir is given)",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the generated data between runs and reuse it (regenerated only if missing)",
    )
    ap.add_argument("--keep_outputs", action="store_true", help="keep every contender's output")
    ap.add_argument(
        "--rss_8gb",
        action="store_true",
        help="also generate one 8 GB HDF5 file (x --scale) and convert it with --writer planned, "
        "for the peak RSS target (<= 1 GB per process)",
    )
    ap.add_argument(
        "--peers",
        action="store_true",
        help="run the peers section (TFDS and Ray Data against convert and the hand loop), building "
        "their environments bench/.venv-peers-{tfds,ray} first when missing; alone it runs only "
        "that section",
    )
    ap.add_argument(
        "--peer_rounds",
        type=int,
        default=3,
        help="peers section: rounds of alternated runs; the median of each contender is reported (default 3)",
    )
    ap.add_argument(
        "--read",
        action="store_true",
        help="run the read section (every reader over the same shards, values checked), building the "
        "reader-only environment bench/.venv-peers-reader (PyTorch, tfrecord, Grain; no TensorFlow) "
        "first when missing; alone it runs only that section",
    )
    ap.add_argument(
        "--read_rounds",
        type=int,
        default=3,
        help="read section: rounds of alternated runs; the median of each reader is reported (default 3)",
    )
    ap.add_argument(
        "--read_inputs",
        default=",".join(readsection.INPUTS),
        help=f"read section: inputs, of {','.join(readsection.INPUTS)} (default all)",
    )
    ap.add_argument(
        "--read_contenders",
        default="",
        help="read section: readers to run, comma-separated keys of bench.read_contenders (default all)",
    )
    ap.add_argument(
        "--read_random",
        type=int,
        default=readsection.RANDOM_READS,
        help=f"read section: random reads of the RandomAccess readers (default {readsection.RANDOM_READS:,})",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per contender; the fastest is reported (default 1)")
    ap.add_argument(
        "--steady",
        choices=("auto", "on", "off"),
        default="auto",
        help="also run every contender on 1/50 of the rows to net out start-up (auto: when --scale >= 0.1)",
    )
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds before one run is killed (default 3600)")
    ap.add_argument(
        "--convert_flags", default="", help="extra flags for pipelines.convert, e.g. '--target_range_mb 16'"
    )
    ap.add_argument("--augment_flags", default="", help="extra flags for pipelines.augment")
    args = ap.parse_args(argv)
    if args.scale <= 0:
        ap.error("--scale must be > 0")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if args.peer_rounds < 1:
        ap.error("--peer_rounds must be >= 1")
    if args.read_rounds < 1:
        ap.error("--read_rounds must be >= 1")
    return args


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return Bench(parse_args(argv)).run()


if __name__ == "__main__":
    raise SystemExit(main())
