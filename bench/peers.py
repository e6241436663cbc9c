"""The ``peers`` section: TFDS and Ray Data against our convert and the hand-written loop, on the same HDF5 rows.

    python -m bench.run --peers [--peer_rounds 3] [--scale 1.0]      (builds the peer environments when missing)
    python -m bench.run --only peers                                 (uses them when they are there)

Inputs (times ``--scale``): 2,000,000 small rows (``x`` float32[16] + ``id`` int64, 144 MB raw) and 40,000 large
rows (``image`` uint8[64,64,3] + ``emb`` float32[128] + ``id`` int64, 512 MB raw), from ``bench.datagen``.
Contenders, each a whole separate process under ``bench.measure``:

* ``python -m pipelines.convert`` with its defaults (no Beam flags: the local runner it chooses) and with
  ``--config configs/local.yaml``, both ``--compression none`` and the benchmark's Example forms;
* the hand-written loop (``bench.seed_loop``) and the raw copy of the array bytes (``bench.raw_copy``);
* TFDS 4.9.10 (``bench.peer_tfds``: a ``GeneratorBasedBuilder`` over the rows, shuffling off) and Ray Data 2.60
  (``bench.peer_ray``: ``map_batches`` over h5py row ranges and ``write_tfrecords``, ``ray.init(num_cpus=N)`` with
  N the machine's CPUs, included), each run by the Python of its own virtual environment,
  ``bench/.venv-peers-tfds`` and ``bench/.venv-peers-ray`` (ignored by git), built by ``--peers`` from the pins in
  :data:`ENVS` (rebuilt when the pins change); the test suite never builds or runs them.

The contenders are alternated: ``--peer_rounds`` rounds, each running every contender once, the order rotated by
one each round, so a burst of load from elsewhere falls on different contenders; the table gives each one's
median wall time. Every output (every round) is checked value for value against the HDF5 input by
``bench.peer_check`` (plain TensorFlow, records ordered by ``id``), the raw copy by its byte count; a run that
fails its check fails the contender. Results: a ``peers`` part of ``results.md`` (:func:`markdown`) and the chart
``peers.png`` (:func:`draw`) in the results directory.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys

from bench.common import LAYOUTS, convert_encoding_flags, dir_bytes, row_bytes

PEER_ROWS = {"small": 2_000_000, "large": 40_000}
ENVS = {  # environment -> pip requirements (h5py/numpy as the project's, TensorFlow as the project's)
    "tfds": ("tensorflow-datasets==4.9.10", "tensorflow==2.21.0", "h5py==3.14.0", "numpy==2.4.6"),
    "ray": ("ray[data]==2.60.0", "tensorflow==2.21.0", "crc32c==2.9.post0", "h5py==3.14.0", "numpy==2.4.6"),
}
# (key, label, role); the order of the first round
CONTENDERS = (
    ("convert_defaults", "ours, defaults", "other"),
    ("convert_local", "ours, configs/local.yaml", "other"),
    ("seed", "hand-written TF loop", "seed"),
    ("tfds", "TFDS 4.9.10 generator", "other"),
    ("ray", "Ray Data 2.60 write_tfrecords", "other"),
    ("raw", "raw copy", "raw"),
)
BASE = "convert_defaults"  # the ratios of the table are to this contender's median
SPEC_FILE = ".peer-requirements"


def env_dir(root: str, name: str) -> str:
    return os.path.join(root, "bench", f".venv-peers-{name}")


def env_python(root: str, name: str, pins: tuple | None = None) -> str | None:
    """The Python of the peer environment ``name`` when it is built with the current pins (``pins``, default
    ``ENVS[name]``), else None."""
    pins = ENVS[name] if pins is None else pins
    d = env_dir(root, name)
    py = os.path.join(d, "bin", "python")
    try:
        with open(os.path.join(d, SPEC_FILE), encoding="utf-8") as f:
            ok = f.read().split() == list(pins)
    except OSError:
        ok = False
    return py if ok and os.path.exists(py) else None


def build_env(root: str, name: str, say=print, pins: tuple | None = None) -> str:
    """Creates (or updates) the virtual environment of peer ``name`` with ``pins`` (default the pins of
    :data:`ENVS`); returns its Python. Raises ``SystemExit`` with pip's last lines when the install fails."""
    pins = ENVS[name] if pins is None else pins
    py = env_python(root, name, pins)
    if py is not None:
        return py
    d = env_dir(root, name)
    if not os.path.exists(os.path.join(d, "bin", "python")):
        say(f"  [peers] creating {os.path.relpath(d, root)}")
        subprocess.run([sys.executable, "-m", "venv", d], check=True)
    say(f"  [peers] installing {' '.join(pins)} into {os.path.relpath(d, root)} (a few minutes the first time)")
    done = subprocess.run(
        [os.path.join(d, "bin", "python"), "-m", "pip", "install", "-q", *pins], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"cannot build the {name} peer environment {d}:\n{done.stderr[-3000:]}")
    with open(os.path.join(d, SPEC_FILE), "w", encoding="utf-8") as f:
        f.write("\n".join(pins) + "\n")
    return os.path.join(d, "bin", "python")


def rotation(items: list, round_index: int) -> list:
    """``items`` rotated left by ``round_index`` (the order of one round)."""
    if not items:
        return []
    k = round_index % len(items)
    return items[k:] + items[:k]


def summarize(runs: list[dict]) -> dict:
    """One contender's runs (``{"wall_s", "error"}`` each) -> ``{"status", "wall_s" (median), "walls_s",
    "error"}``: failed when any run failed (its error kept), else the median of the wall times."""
    walls = [r.get("wall_s") for r in runs]
    bad = next((r for r in runs if r.get("error") is not None), None)
    if bad is not None or not runs:
        return {
            "status": "failed",
            "wall_s": None,
            "walls_s": walls,
            "error": bad["error"] if bad is not None else "not run",
        }
    return {"status": "ok", "wall_s": statistics.median(walls), "walls_s": walls, "error": None}


def cell(row: dict | None, base: dict | None) -> str:
    """A table cell: the median wall time, and for a contender other than the base its time as a multiple of the
    base's (``2.50x slower``, ``0.82x``)."""
    if row is None:
        return "-"
    if row.get("status") != "ok":
        return row.get("status") or "failed"
    text = f"{row['wall_s']:.2f} s"
    if base is None or base is row or base.get("status") != "ok" or not base.get("wall_s"):
        return f"**{text}**" if base is row else text
    x = row["wall_s"] / base["wall_s"]
    return f"{text} ({x:.2f}x{' slower' if x >= 1.005 else ''})"


def markdown(rows: list[dict], section_info: dict) -> str:
    """The peers table (one line per input, one column per contender) and the output sizes, as Markdown."""
    mine = [r for r in rows if r["section"].startswith("peers_")]
    if not mine:
        return ""
    sections = list(dict.fromkeys(r["section"] for r in mine))
    head = "| input | " + " | ".join(label for _, label, _ in CONTENDERS) + " |"
    lines = [
        "### peers: TFDS and Ray Data on the same rows",
        "",
        "Median wall time of whole processes (contenders alternated, the order rotated every round), "
        f"uncompressed output, every output's values checked; ratios to `{next(label for k, label, _ in CONTENDERS if k == BASE)}`.",
        "",
        head,
        "|" + "---|" * (len(CONTENDERS) + 1),
    ]
    for s in sections:
        by_key = {r["key"]: r for r in mine if r["section"] == s}
        info = section_info.get(s, {})
        base = by_key.get(BASE)
        name = f"{info.get('rows', 0):,} {info.get('layout', s[6:])} rows, {info.get('raw_bytes', 0) / 1e6:,.0f} MB"
        lines.append(f"| {name} | " + " | ".join(cell(by_key.get(k), base) for k, _, _ in CONTENDERS) + " |")
    lines += ["", "| input | contender | runs (s) | output bytes | status |", "|---|---|---|---|---|"]
    for s in sections:
        for r in (r for r in mine if r["section"] == s):
            walls = ", ".join(f"{w:.2f}" for w in r.get("walls_s") or [] if w is not None)
            out = f"{r['output_bytes']:,}" if r.get("output_bytes") else "-"
            why = r["status"] if r["status"] == "ok" else f"{r['status']}: {str(r.get('error'))[:120]}"
            lines.append(f"| {s[6:]} | {r['name']} | {walls} | {out} | {why} |")
    return "\n".join(lines) + "\n"


def draw(path: str, rows: list[dict], section_info: dict) -> str | None:
    """Bar chart of the median wall times relative to ours with defaults, one group per input; None when written,
    else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (the bench extra)"
    sections = list(dict.fromkeys(r["section"] for r in rows if r["section"].startswith("peers_")))
    if not sections:
        return "no peers results"
    fig, ax = plt.subplots(figsize=(9, 1.2 + 2.2 * len(sections)))
    height = 0.8 / len(CONTENDERS)
    colors = ("#1f77b4", "#6baed6", "#7f7f7f", "#ff7f0e", "#d62728", "#bbbbbb")
    for si, s in enumerate(sections):
        by_key = {r["key"]: r for r in rows if r["section"] == s}
        base = by_key.get(BASE)
        for ci, (key, label, _) in enumerate(CONTENDERS):
            r = by_key.get(key)
            if r is None or r["status"] != "ok" or base is None or base["status"] != "ok":
                continue
            x = r["wall_s"] / base["wall_s"]
            y = si + (ci - (len(CONTENDERS) - 1) / 2) * height
            ax.barh(y, x, height * 0.9, color=colors[ci], label=label if si == 0 else None)
            ax.text(x, y, f" {x:.2f}x ({r['wall_s']:.1f} s)", va="center", fontsize=8)
    ax.set_yticks(range(len(sections)))
    ax.set_yticklabels([f"{section_info.get(s, {}).get('rows', 0):,} {s[6:]} rows" for s in sections])
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("wall time / ours with defaults (median, whole process; lower is faster)")
    ax.set_title("TFRecord writers on the same HDF5 rows (values checked)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, max(ax.get_xlim()[1], 1.5) * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def commands(bench, kind: str, pythons: dict) -> dict:
    """``key -> make_cmd(input, out_dir) -> argv`` of the contenders that can run (a peer without its
    environment is left out)."""
    py, enc = bench.py, convert_encoding_flags(LAYOUTS[kind])
    ours = ["-m", "pipelines.convert", "--overwrite", "--compression", "none", *enc]
    cmds = {
        "convert_defaults": lambda i, o: [py, *ours, "--input", i, "--output_dir", o],
        "convert_local": lambda i, o: [py, *ours, "--config", "configs/local.yaml", "--input", i, "--output_dir", o],
        "seed": lambda i, o: [py, "-m", "bench.seed_loop", "--input", i, "--output", os.path.join(o, "data.tfrecord")],
        "raw": lambda i, o: [py, "-m", "bench.raw_copy", "--input", i, "--output", os.path.join(o, "raw.bin")],
    }
    if pythons.get("tfds"):
        cmds["tfds"] = lambda i, o: [pythons["tfds"], "-m", "bench.peer_tfds", "--input", i, "--output_dir", o]
    if pythons.get("ray"):
        cmds["ray"] = lambda i, o: [
            pythons["ray"],
            "-m",
            "bench.peer_ray",
            "--input",
            i,
            "--output_dir",
            o,
            "--num_cpus",
            str(os.cpu_count() or 1),
        ]
    return cmds


def _check(bench, key: str, m: dict, inp: str, out: str, rows: int, rb: int) -> str | None:
    if m.get("error"):
        return m["error"]
    if m.get("timed_out"):
        return "timed out"
    if m.get("returncode") != 0:
        return f"exit code {m.get('returncode')}"
    if key == "raw":
        n = dir_bytes(out)
        return None if n == rows * rb else f"wrote {n} bytes, expected {rows * rb}"
    done = subprocess.run(
        [bench.py, "-m", "bench.peer_check", "--input", inp, "--output_dir", out],
        capture_output=True,
        text=True,
        env=bench.env,
    )
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["peer_check failed"])[-1]
    return None


def run_peers(bench, build: bool, rounds: int) -> list[str]:
    """Measures the peers section (both inputs); returns its section names. ``build``: create the peer
    environments when missing (``--peers``); without it a peer whose environment is missing is reported as
    skipped."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pythons = {}
    for name in ENVS:
        pythons[name] = build_env(root, name, bench.say) if build else env_python(root, name)
        if pythons[name] is None:
            bench.say(f"  [peers] no {name} environment with the current pins: pass --peers to build it")
    order = []
    for kind in ("small", "large"):
        rows = max(1, round(PEER_ROWS[kind] * bench.args.scale))
        rb = row_bytes(LAYOUTS[kind])
        section = f"peers_{kind}"
        bench.say(f"[{section}] {rows:,} rows x {rb:,} bytes = {rows * rb / 1e6:,.1f} MB raw, {rounds} rounds")
        inp = bench.h5(kind, section, rows)
        bench.section_info[section] = {
            "rows": rows,
            "row_bytes": rb,
            "raw_bytes": rows * rb,
            "input": inp,
            "layout": kind,
        }
        cmds = commands(bench, kind, pythons)
        keys = [k for k, _, _ in CONTENDERS if k in cmds]
        runs: dict[str, list[dict]] = {k: [] for k in keys}
        out_bytes: dict[str, int] = {}
        for rnd in range(rounds):
            for key in rotation(keys, rnd):
                out = os.path.join(bench.out_dir, section, key)
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out, exist_ok=True)
                m = bench.measured(cmds[key](inp, out), f"{section}__{key}__r{rnd + 1}")
                m["error"] = _check(bench, key, m, inp, out, rows, rb)
                if m["error"] is None and key not in out_bytes:
                    out_bytes[key] = dir_bytes(out)
                bench.say(
                    f"  round {rnd + 1} {key}: "
                    + (f"{m['wall_s']:.2f} s" if m["error"] is None else f"failed ({m['error']})")
                )
                runs[key].append(m)
                shutil.rmtree(out, ignore_errors=True)
        for key, label, role in CONTENDERS:
            if key not in runs:
                bench.rows.append(
                    {
                        "section": section,
                        "key": key,
                        "name": label,
                        "role": role,
                        "rows": rows,
                        "raw_bytes": rows * rb,
                        "status": "skipped",
                        "command": "",
                        "error": "no environment (pass --peers)",
                    }
                )
                continue
            summ = summarize(runs[key])
            median_run = next((r for r in runs[key] if r.get("wall_s") == summ["wall_s"]), runs[key][-1])
            row = {
                "section": section,
                "key": key,
                "name": label,
                "role": role,
                "rows": rows,
                "raw_bytes": rows * rb,
                "command": " ".join(cmds[key](inp, "OUT")),
            }
            row.update(bench._row_fields(median_run))
            row.update(summ)
            if key in out_bytes:
                row["output_bytes"] = out_bytes[key]
            if row["status"] == "ok":
                row["examples_per_s"] = rows / max(row["wall_s"], 1e-9)
                row["mb_per_s"] = rows * rb / 1e6 / max(row["wall_s"], 1e-9)
            bench.rows.append(row)
        order.append(section)
    return order
