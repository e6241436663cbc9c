"""The ``read`` section: every way of reading an output back, on the same shards, values checked.

    python -m bench.run --read [--read_rounds 3] [--scale 1.0]    (builds the reader-only environment when missing)
    python -m bench.run --only read                               (uses it when it is there)

Inputs (times ``--scale``; ``bench.datagen``): 1,000,000 small rows (``x`` float32[16] + ``id`` int64, 72 MB raw)
and 20,000 large rows (``image`` uint8[64,64,3] + ``emb`` float32[128] + ``id`` int64, 256 MB raw), converted as a
new user would, ``convert --index --compression none`` (the default encodings: ``image`` as raw bytes, the rest as
float and int64 lists), and the small rows again with ``--compression gzip``; TFDS reads a ``--tfds_name`` output of
the same rows. The contenders (``bench.read_contenders``), each one whole process under ``bench.measure``:

* in the project's ``.venv`` (TensorFlow): the hand-written tf.data pipeline (tensors, and
  ``.as_numpy_iterator()``), ``reader.to_tf_dataset`` batched and unbatched, TFDS ``as_dataset``;
* in the reader-only environment ``bench/.venv-peers-reader`` (no TensorFlow, no Beam: PyTorch, the ``tfrecord``
  package, Grain, NumPy and google-crc32c; the code of this checkout through ``PYTHONPATH``), built by ``--read``
  from :data:`READER_PINS`: the plain read of the shard files (the floor), ``reader.iter_numpy`` (and batched),
  ``RandomAccess`` (``[i]`` and ``__getitems__``), PyTorch ``DataLoader`` over ``RandomAccess`` and over the
  ``tfrecord`` package, Grain over ``RandomAccess``. Without that environment they run in the project's ``.venv``
  (which has no PyTorch: those two are skipped), and the table says so.

Each process times one full pass (random access: ``--random`` reads) after its imports and reports records/s; the
rows are alternated over ``--read_rounds`` rounds (the order rotated every round), the table gives the medians, and
every run's values are checked against the source arrays (``bench.read_check``); a run whose check fails fails its
contender. Results: a ``read`` part of ``results.md`` (:func:`markdown`) and ``read.png`` (:func:`draw`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import time

import numpy as np

from bench import datagen, peers
from bench.common import LAYOUTS, iter_h5_chunks, row_bytes
from bench.read_check import save_expected
from bench.read_contenders import CONTENDERS, RANDOM_READS

READ_ROWS = {"small": 1_000_000, "large": 20_000}
# input name -> (row layout, compression)
INPUTS = {"small": ("small", "none"), "large": ("large", "none"), "small_gz": ("small", "gzip")}
READER_ENV = "reader"
READER_PINS = ("torch==2.13.0", "tfrecord==1.14.6", "grain==0.2.18", "numpy==2.4.6", "google-crc32c==1.9.0")
BASE = "tf_hand"  # the ratios of the table are to this contender's median
_READ = re.compile(r"^read: (\d+) records, (\d+) bytes in ([0-9.]+) s", re.M)
_SKIP = re.compile(r"^read_skip: (.*)$", re.M)
_CHECK = re.compile(r"^read_check: (.*)$", re.M)


def parse_log(text: str) -> dict:
    """A contender's log -> ``{"records", "bytes", "seconds", "skip", "check"}`` (None where absent)."""
    m, skip, chk = _READ.search(text), _SKIP.search(text), _CHECK.findall(text)
    return {
        "records": int(m.group(1)) if m else None,
        "bytes": int(m.group(2)) if m else None,
        "seconds": float(m.group(3)) if m else None,
        "skip": skip.group(1) if skip else None,
        "check": chk[-1] if chk else None,
    }


def _prepare(bench, kind: str, rows: int, compression: str, tfds: bool) -> tuple[str, str, str | None]:
    """``(output dir, expected-arrays dir, TFDS output dir or None)`` of one input, converted (kept with --keep
    when the stamps match)."""
    name = f"read_{kind}"
    h5 = bench.h5(kind, name, rows)
    expected = os.path.join(bench.data_dir, name + "_expected")
    want = dict(datagen.stamp(kind, rows, datagen.SEEDS[kind]), variant="expected")
    if not _stamp_ok(expected, want, bench):
        shutil.rmtree(expected, ignore_errors=True)
        chunks = list(iter_h5_chunks(h5))
        save_expected({k.lstrip("/"): np.concatenate([c[k] for c in chunks]) for k in chunks[0]}, expected)
        _stamp(expected, want, bench)
    flags = ["--index", "--compression", "none"] if compression == "none" else ["--compression", compression]
    out = _convert(bench, h5, kind, rows, f"{name}_{compression}", flags)
    tfds_out = _convert(bench, h5, kind, rows, f"{name}_tfds", ["--tfds_name", f"bench_read_{kind}"]) if tfds else None
    return out, expected, tfds_out


def _stamp_ok(path: str, want: dict, bench) -> bool:
    if not (bench.args.keep or path in bench.generated):
        return False
    try:
        with open(path + ".json", encoding="utf-8") as f:
            return json.load(f) == want and os.path.isdir(path)
    except (OSError, ValueError):
        return False


def _stamp(path: str, want: dict, bench) -> None:
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(want, f)
    bench.generated.add(path)


def _convert(bench, h5: str, kind: str, rows: int, name: str, flags: list[str]) -> str:
    out = os.path.join(bench.data_dir, name)
    want = dict(datagen.stamp(kind, rows, datagen.SEEDS[kind]), flags=flags)
    if _stamp_ok(out, want, bench):
        bench.say(f"  kept {name}/")
        return out
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    code, log = bench.run_plain(
        [bench.py, "-m", "pipelines.convert", "--input", h5, "--output_dir", out, *flags], f"prepare__{name}"
    )
    if code != 0:
        raise SystemExit(f"cannot prepare {name}: see {log}")
    _stamp(out, want, bench)
    bench.say(f"  prepared {name}/ ({rows:,} records, convert {' '.join(flags)}) in {time.perf_counter() - t:.1f} s")
    return out


def selected(spec: str | None) -> list[str]:
    """The contender keys of ``--read_contenders`` (all by default). Raises SystemExit naming an unknown one."""
    keys = [k.strip() for k in (spec or "").split(",") if k.strip()] or list(CONTENDERS)
    bad = [k for k in keys if k not in CONTENDERS]
    if bad:
        raise SystemExit(f"--read_contenders: unknown {bad}; choose from {','.join(CONTENDERS)}")
    return keys


def _command(py: str, key: str, out: str, expected: str, random: int) -> list[str]:
    return [
        py,
        "-m",
        "bench.read_contenders",
        key,
        "--output_dir",
        out,
        "--expected",
        expected,
        "--random",
        str(random),
    ]


def run_read(bench, build: bool, rounds: int) -> list[str]:
    """Measures the read section; returns its section names (``read_small``, ``read_large``, ``read_small_gz``)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = bench.args
    light = (
        peers.build_env(root, READER_ENV, bench.say, READER_PINS)
        if build
        else peers.env_python(root, READER_ENV, READER_PINS)
    )
    if light is None:
        bench.say(
            "  [read] no reader-only environment with the current pins (pass --read to build it): the "
            "TensorFlow-free readers run in the project's .venv, PyTorch's are skipped"
        )
    keys = selected(getattr(args, "read_contenders", None))
    inputs = [s.strip() for s in (getattr(args, "read_inputs", None) or ",".join(INPUTS)).split(",") if s.strip()]
    bad = [s for s in inputs if s not in INPUTS]
    if bad:
        raise SystemExit(f"--read_inputs: unknown {bad}; choose from {','.join(INPUTS)}")
    random = max(1, int(getattr(args, "read_random", RANDOM_READS)))
    order = []
    for name in inputs:
        kind, compression = INPUTS[name]
        rows = max(1, round(READ_ROWS[kind] * args.scale))
        rb = row_bytes(LAYOUTS[kind])
        section = f"read_{name}"
        mine = [
            k
            for k in keys
            if compression in CONTENDERS[k].inputs or (compression == "none" and "tfds" in CONTENDERS[k].inputs)
        ]
        bench.say(
            f"[{section}] {rows:,} rows x {rb:,} bytes = {rows * rb / 1e6:,.1f} MB raw, {compression} shards, "
            f"{rounds} rounds"
        )
        out, expected, tfds_out = _prepare(bench, kind, rows, compression, "tfds" in mine)
        with open(os.path.join(out, "metadata.json"), encoding="utf-8") as f:
            stored = sum(s["bytes"] for s in json.load(f)["shards"])
        bench.section_info[section] = {
            "rows": rows,
            "row_bytes": rb,
            "raw_bytes": rows * rb,
            "input": out,
            "layout": kind,
            "compression": compression,
            "stored_bytes": stored,
            "reader_env": "bench/.venv-peers-reader" if light else ".venv",
        }
        cmds = {}
        for key in mine:
            c = CONTENDERS[key]
            py = bench.py if c.env == "tf" or light is None else light
            cmds[key] = _command(py, key, tfds_out if "tfds" in c.inputs else out, expected, random)
        runs: dict[str, list[dict]] = {k: [] for k in cmds}
        skipped: dict[str, str] = {}
        for rnd in range(rounds):
            for key in peers.rotation([k for k in cmds if k not in skipped], rnd):
                m = bench.measured(cmds[key], f"{section}__{key}__r{rnd + 1}")
                m.update(_outcome(m))
                if m.get("skip"):
                    skipped[key] = m["skip"]
                    bench.say(f"  {key}: skipped ({m['skip']})")
                    continue
                bench.say(
                    f"  round {rnd + 1} {key}: "
                    + (
                        f"{m['records']:,} records in {m['seconds']:.2f} s ({m['records'] / max(m['seconds'], 1e-9):,.0f}"
                        f" records/s; process {m['wall_s']:.1f} s)"
                        if m["error"] is None
                        else f"failed ({m['error']})"
                    )
                )
                runs[key].append(m)
        for key in mine:  # a reader that does not read this input has no row (a "-" in the table)
            bench.rows.append(
                _row(
                    bench,
                    section,
                    key,
                    rows,
                    rb,
                    stored,
                    cmds.get(key),
                    runs.get(key) or [],
                    skipped.get(key),
                    light is None and CONTENDERS[key].env == "light",
                )
            )
        order.append(section)
    return order


def _outcome(m: dict) -> dict:
    """The result of one run from its measurement and log: ``error`` None when it read and its check passed."""
    text = ""
    if m.get("log") and os.path.exists(m["log"]):
        with open(m["log"], encoding="utf-8", errors="replace") as f:
            text = f.read()
    got = parse_log(text)
    if got["skip"] and m.get("returncode") == 3:
        return {**got, "error": None}
    if m.get("error"):
        return {**got, "error": m["error"]}
    if m.get("timed_out"):
        return {**got, "error": "timed out"}
    if m.get("returncode") != 0 or got["seconds"] is None:
        why = got["check"] if got["check"] and got["check"] != "ok" else f"exit code {m.get('returncode')}"
        return {**got, "error": why}
    if not (got["check"] or "").startswith("ok"):
        return {**got, "error": f"no value check ({got['check']})"}
    return {**got, "error": None}


def _row(bench, section, key, rows, rb, stored, cmd, runs, skip, fallback) -> dict:
    c = CONTENDERS[key]
    row = {
        "section": section,
        "key": key,
        "name": c.label,
        "role": "raw" if key == "floor" else "seed" if key == BASE else "other",
        "rows": rows,
        "raw_bytes": rows * rb,
        "command": " ".join(cmd or []),
        "env": "tf" if c.env == "tf" else (".venv" if fallback else "reader"),
    }
    if cmd is None or skip is not None or not runs:
        return {**row, "status": "skipped", "error": skip or "not run on this input"}
    summ = peers.summarize(runs)
    median_run = next((r for r in runs if r.get("wall_s") == summ["wall_s"]), runs[-1])
    row.update(bench._row_fields(median_run))
    row.update(summ)
    if row["status"] != "ok":
        return row
    seconds = [r["seconds"] for r in runs]
    row.update(
        {
            "read_s": statistics.median(seconds),
            "reads_s": seconds,
            "records_read": runs[0]["records"],
            "bytes_read": runs[0]["bytes"],
        }
    )
    row["records_per_s"] = row["records_read"] / max(row["read_s"], 1e-9)
    row["bytes_per_s"] = row["bytes_read"] / max(row["read_s"], 1e-9)
    # the generic table: whole process (examples_per_s) and the timed pass (work_*)
    row["examples_per_s"] = row["records_read"] / max(row["wall_s"], 1e-9)
    row["mb_per_s"] = rows * rb / 1e6 / max(row["wall_s"], 1e-9)
    row["work_s"], row["work_examples_per_s"] = row["read_s"], row["records_per_s"]
    row["work_mb_per_s"] = row["records_read"] * rb / 1e6 / max(row["read_s"], 1e-9)
    return row


def _rate(r: dict | None) -> str:
    v = r["records_per_s"]
    return f"{v / 1e6:.2f}M rec/s" if v >= 1e6 else f"{v / 1e3:.1f}k rec/s" if v >= 1e3 else f"{v:.0f} rec/s"


def cell(r: dict | None, base: dict | None) -> str:
    """A table cell: records/s of the timed pass (median) and its ratio to the hand-written pipeline's; the floor
    in bytes/s."""
    if r is None:
        return "-"
    if r.get("status") != "ok":
        return "skipped" if r.get("status") == "skipped" else "failed"
    if r["key"] == "floor":
        return f"{r['bytes_per_s'] / 1e9:.2f} GB/s ({r['read_s']:.3f} s)"
    text = _rate(r)
    if base is None or base is r or base.get("status") != "ok":
        return f"**{text}**" if base is r else text
    x = r["records_per_s"] / base["records_per_s"]
    return f"{text} ({x:.2f}x)" if x >= 0.995 else f"{text} (**{1 / x:.1f}x slower**)"


def _title(info: dict, section: str) -> str:
    kind = info.get("layout", "?")
    what = "f4[16] + i8" if kind == "small" else "u1 64x64x3 + f4[128] + i8"
    comp = "" if info.get("compression", "none") == "none" else f", {info['compression']}"
    return f"{info.get('rows', 0):,} {kind} rows ({what}{comp}, {info.get('stored_bytes', 0) / 1e6:,.0f} MB)"


def markdown(rows: list[dict], section_info: dict) -> str:
    """The read table (one line per contender, one column per input) and every run, as Markdown."""
    mine = [r for r in rows if r["section"].startswith("read_")]
    if not mine:
        return ""
    sections = list(dict.fromkeys(r["section"] for r in mine))
    keys = list(dict.fromkeys(r["key"] for r in mine))
    env = {s: section_info.get(s, {}).get("reader_env", "?") for s in sections}
    lines = [
        "### read: every reader over the same shards",
        "",
        "Records/s of one full pass after imports (random access: 20,000 random records; medians of the "
        "alternated rounds), every run's values checked against the source arrays; ratios to the hand-written "
        "tf.data pipeline. The floor: a plain read of the shard files. TensorFlow-free readers ran in "
        + ", ".join(sorted(set(env.values())))
        + ".",
        "",
        "| reader | " + " | ".join(_title(section_info.get(s, {}), s) for s in sections) + " |",
        "|---|" + "---|" * len(sections),
    ]
    for key in keys:
        label = next(r["name"] for r in mine if r["key"] == key)
        cells = []
        for s in sections:
            by_key = {r["key"]: r for r in mine if r["section"] == s}
            cells.append(cell(by_key.get(key), by_key.get(BASE)))
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| input | reader | passes (s) | process (s) | peak RSS (MB) | status |", "|---|---|---|---|---|---|"]
    for s in sections:
        for r in (r for r in mine if r["section"] == s):
            passes = ", ".join(f"{x:.3f}" for x in r.get("reads_s") or [])
            wall = f"{r['wall_s']:.1f}" if r.get("wall_s") else "-"
            rss = f"{r['peak_rss_mb']:,.0f}" if r.get("peak_rss_mb") else "-"
            why = r["status"] if r["status"] == "ok" else f"{r['status']}: {str(r.get('error'))[:120]}"
            lines.append(f"| {s[5:]} | {r['key']} | {passes} | {wall} | {rss} | {why} |")
    return "\n".join(lines) + "\n"


def draw(path: str, rows: list[dict], section_info: dict) -> str | None:
    """Bar chart of each reader's records/s as a multiple of the hand-written tf.data pipeline's, one group per
    input (log scale); None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (the bench extra)"
    sections = list(dict.fromkeys(r["section"] for r in rows if r["section"].startswith("read_")))
    keys = [
        k
        for k in CONTENDERS
        if k != "floor" and any(r["key"] == k and r["section"] in sections and r["status"] == "ok" for r in rows)
    ]
    if not sections or not keys:
        return "no read results"
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.32 * len(keys) * len(sections)))
    height = 0.8 / len(keys)
    cmap = plt.get_cmap("tab20")
    for si, s in enumerate(sections):
        by_key = {r["key"]: r for r in rows if r["section"] == s}
        base = by_key.get(BASE)
        if base is None or base["status"] != "ok":
            continue
        for ci, key in enumerate(keys):
            r = by_key.get(key)
            if r is None or r["status"] != "ok":
                continue
            x = r["records_per_s"] / base["records_per_s"]
            y = si + (ci - (len(keys) - 1) / 2) * height
            ax.barh(y, x, height * 0.9, color=cmap(ci % 20), label=key if si == 0 else None)
            ax.text(x, y, f" {x:.2f}x ({_rate(r)})", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_yticks(range(len(sections)))
    ax.set_yticklabels([_title(section_info.get(s, {}), s).replace(" (", "\n(") for s in sections], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("records/s / hand-written tf.data pipeline's (median of one full pass; higher is faster; log)")
    ax.set_title("Reading the same shards back (values checked)")
    ax.legend(loc="lower right", fontsize=7)
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, hi * 4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv=None) -> int:
    """Redraws the chart (and prints the table) of a run's ``results.json``: ``python -m bench.readsection
    --results bench/results/results.json --chart bench/charts/read.png`` (with matplotlib, the bench extra)."""
    ap = argparse.ArgumentParser(prog="python -m bench.readsection", description=main.__doc__)
    ap.add_argument("--results", required=True, help="results.json of a run with the read section")
    ap.add_argument("--chart", default=None, help="where to write the chart (PNG)")
    args = ap.parse_args(argv)
    with open(args.results, encoding="utf-8") as f:
        result = json.load(f)
    print(markdown(result["results"], result["section_info"]))
    if args.chart:
        why = draw(args.chart, result["results"], result["section_info"])
        if why is not None:
            print(f"no chart: {why}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
