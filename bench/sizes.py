"""The ``sizes`` section: laptop-sized to 8 GB jobs, every DirectRunner mode and ``auto``, against the
hand-written loop and the raw copy, in one run; plus the documented laptop setup (``configs/local.yaml``) on a
10-row file and on a 491 MB image file.

Inputs: the small (72-byte) and large (12,808-byte) row layouts of ``bench.common`` at 10 MB, 100 MB, 1 GB and 8 GB
of raw array bytes (``--sizes``, times ``--scale``). Each (layout, size) is a section of its own, so the usual
ratios to the seed loop and the raw copy apply; the steady state of a contender is the slope between the two
largest sizes it ran, ``(rows_b - rows_a) / (wall_b - wall_a)``, so start-up cancels without a separate tiny run.
The seed loop is skipped where its rate at the previous size predicts more than ``--seed_limit_s`` seconds (8 GB
of small rows: about 25 minutes); the report says so and extrapolates.
"""

from __future__ import annotations

import os
import re

from bench.common import LAYOUTS, convert_encoding_flags, row_bytes

DEFAULT_SIZES = "10MB,100MB,1GB,8GB"
MODES = (  # (key, label, flags)
    ("in_memory", "convert in_memory", ["--direct_running_mode=in_memory"]),
    (
        "multi_threading",
        "convert multi_threading (2)",
        ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
    ),
    (
        "multi_processing",
        "convert multi_processing (2)",
        ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    ),
    ("auto", "convert auto (up to 2)", ["--direct_num_workers=2"]),  # no mode flag: auto
)
FIXED = tuple(k for k, _, _ in MODES if k != "auto")
LAPTOP_IMAGE_ROWS = 40_000  # uint8 [64, 64, 3]: 491 MB, the laptop-sized image file
UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(text: str) -> int:
    """``'10MB'`` -> 10**7 bytes (decimal units, as the rest of the benchmark)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(KB|MB|GB)\s*", text.upper())
    if not m:
        raise SystemExit(f"--sizes: cannot read {text!r} (use e.g. 10MB,1GB)")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def run_sizes(bench, sizes: str, seed_limit_s: float) -> list[str]:
    """Measures every (layout, size) section and the laptop cases; returns the section names in order."""
    py = bench.py
    order = [_laptop(bench)]  # first: a laptop's Python installation is in the page cache, which 8 GB runs evict
    for kind in ("small", "large"):
        layout, rb = LAYOUTS[kind], row_bytes(LAYOUTS[kind])
        seed_rate = None  # rows/s of the seed loop at the previous size (whole process)
        for size in [s.strip() for s in sizes.split(",") if s.strip()]:
            rows = max(1, int(parse_size(size) * bench.args.scale) // rb)
            section = f"sizes_{kind}_{size}"
            bench.say(f"[{section}] {rows:,} rows x {rb:,} bytes = {rows * rb / 1e6:,.1f} MB raw")
            path = bench.h5(kind, section, rows)
            bench.section_info[section] = {
                "rows": rows,
                "row_bytes": rb,
                "raw_bytes": rows * rb,
                "input": path,
                "layout": kind,
                "size": size,
            }
            bench.contender(
                section,
                "raw",
                "raw copy",
                "raw",
                rows,
                rb,
                lambda i, o: [py, "-m", "bench.raw_copy", "--input", i, "--output", os.path.join(o, "raw.bin")],
                None,
                check="bytes",
            )
            predicted = rows / seed_rate if seed_rate else 0.0
            if predicted > seed_limit_s:
                bench.say(f"  seed loop skipped: about {predicted:,.0f} s predicted (--seed_limit_s {seed_limit_s:g})")
                bench.rows.append(
                    {
                        "section": section,
                        "key": "seed",
                        "name": "seed loop",
                        "role": "seed",
                        "rows": rows,
                        "raw_bytes": rows * rb,
                        "status": "skipped",
                        "predicted_wall_s": predicted,
                        "command": "",
                    }
                )
            else:
                row = bench.contender(
                    section,
                    "seed",
                    "seed loop",
                    "seed",
                    rows,
                    rb,
                    lambda i, o: [
                        py,
                        "-m",
                        "bench.seed_loop",
                        "--input",
                        i,
                        "--output",
                        os.path.join(o, "data.tfrecord"),
                    ],
                    None,
                )
                if row["status"] == "ok":
                    seed_rate = rows / max(row["wall_s"], 1e-9)
            for key, label, flags in MODES:
                row = bench.contender(
                    section,
                    f"convert_{key}",
                    label,
                    "other",
                    rows,
                    rb,
                    _convert(py, layout, flags),
                    None,
                    expect_writer="planned",
                    check="metadata",
                )
                if key == "auto" and row["status"] == "ok":
                    row["chosen"] = chosen_mode(row.get("log"))
            # gzip: TensorFlow's GZIP writer in the hand loop against convert --compression gzip (auto)
            if predicted <= seed_limit_s:
                bench.contender(
                    section,
                    "seed_gzip",
                    "seed loop, TF GZIP writer",
                    "other",
                    rows,
                    rb,
                    lambda i, o: [
                        py,
                        "-m",
                        "bench.seed_loop",
                        "--input",
                        i,
                        "--compression",
                        "gzip",
                        "--output",
                        os.path.join(o, "data.tfrecord.gz"),
                    ],
                    None,
                    check="gzip_frames",
                )
            bench.contender(
                section,
                "convert_auto_gzip",
                "convert --compression gzip auto (up to 2)",
                "other",
                rows,
                rb,
                _convert(py, layout, ["--direct_num_workers=2", "--compression", "gzip"]),
                None,
                expect_writer="planned",
                check="metadata",
            )
            order.append(section)
    return order


def _convert(py, layout, flags):
    def make(inp, out):
        return [
            py,
            "-m",
            "pipelines.convert",
            "--input",
            inp,
            "--output_dir",
            out,
            "--overwrite",
            *convert_encoding_flags(layout),
            "--runner=DirectRunner",
            *flags,
        ]

    return make


def _laptop(bench) -> str:
    """The documented laptop setup (``--config configs/local.yaml``, uncompressed) on 10 rows and on a 491 MB file
    of uint8 [64, 64, 3] images, against the seed loop on the same file."""
    import h5py
    import numpy as np

    section, py = "sizes_laptop", bench.py
    tiny = os.path.join(bench.data_dir, "laptop_10rows.h5")
    images = os.path.join(bench.data_dir, f"laptop_images_{LAPTOP_IMAGE_ROWS}.h5")
    if not os.path.exists(tiny):
        with h5py.File(tiny + ".tmp", "w") as f:
            f["x"], f["y"] = np.arange(10.0), np.arange(10)
        os.replace(tiny + ".tmp", tiny)
    rows = max(1, int(LAPTOP_IMAGE_ROWS * bench.args.scale))
    if not os.path.exists(images) or h5py.File(images, "r")["image"].shape[0] != rows:
        rng = np.random.default_rng(16)
        with h5py.File(images + ".tmp", "w") as f:
            d = f.create_dataset("image", (rows, 64, 64, 3), "u1")
            for s in range(0, rows, 4000):
                d[s : s + 4000] = rng.integers(0, 256, (min(4000, rows - s), 64, 64, 3), dtype=np.uint8)
        os.replace(images + ".tmp", images)
    rb = 64 * 64 * 3
    bench.section_info[section] = {"rows": rows, "row_bytes": rb, "raw_bytes": rows * rb, "input": images}
    local = ["--config", "configs/local.yaml", "--compression", "none"]
    bench.contender(
        section,
        "seed",
        "seed loop (491 MB of images)",
        "seed",
        rows,
        rb,
        lambda i, o: [py, "-m", "bench.seed_loop", "--input", i, "--output", os.path.join(o, "d.tfrecord")],
    )
    row = bench.contender(
        section,
        "laptop_images",
        "convert --config configs/local.yaml (491 MB of images)",
        "other",
        rows,
        rb,
        lambda i, o: [py, "-m", "pipelines.convert", "--input", i, "--output_dir", o, "--overwrite", *local],
        None,
        check="metadata",
    )
    row["chosen"] = chosen_mode(row.get("log"))
    bench.section_info[section]["tiny_input"] = tiny
    row = bench.contender(
        section,
        "laptop_tiny",
        "convert --config configs/local.yaml (10 rows)",
        "other",
        10,
        16,
        lambda i, o: [py, "-m", "pipelines.convert", "--input", tiny, "--output_dir", o, "--overwrite", *local],
        None,
        check="none",
    )
    row["chosen"] = chosen_mode(row.get("log"))
    return section


def chosen_mode(log: str | None) -> str | None:
    """The ``local runner:`` line of a convert's summary (what auto chose, and why)."""
    if not log or not os.path.exists(log):
        return None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip().startswith("local runner:"):
                return line.split(":", 1)[1].strip()
    return None


# ------------------------------------------------------------------------------------------ report


def summary(rows: list[dict], section_info: dict) -> dict:
    """Per layout: the wall time of every contender at every size, auto against the best fixed mode, and the
    steady-state rates (slope between the two largest sizes measured)."""
    out = {}
    for kind in ("small", "large"):
        sections = [s for s, i in section_info.items() if i.get("layout") == kind]
        table = []
        for s in sections:
            info = section_info[s]
            walls = {r["key"]: r.get("wall_s") for r in rows if r["section"] == s and r["status"] == "ok"}
            skipped = next((r for r in rows if r["section"] == s and r["status"] == "skipped"), None)
            fixed = {k: walls.get(f"convert_{k}") for k in FIXED if walls.get(f"convert_{k}")}
            best = min(fixed.items(), key=lambda kv: kv[1]) if fixed else (None, None)
            auto = walls.get("convert_auto")
            chosen = next((r.get("chosen") for r in rows if r["section"] == s and r["key"] == "convert_auto"), None)
            table.append(
                {
                    "size": info["size"],
                    "rows": info["rows"],
                    "raw_bytes": info["raw_bytes"],
                    "walls": walls,
                    "seed_predicted_s": skipped and skipped.get("predicted_wall_s"),
                    "best_fixed": best[0],
                    "best_fixed_s": best[1],
                    "auto_s": auto,
                    "auto_chosen": chosen,
                    "auto_vs_best": auto / best[1] if auto and best[1] else None,
                    "auto_vs_in_memory": auto / fixed["in_memory"] if auto and fixed.get("in_memory") else None,
                    "gzip_vs_none": walls["convert_auto_gzip"] / auto
                    if auto and walls.get("convert_auto_gzip")
                    else None,
                    "gzip_x_seed_gzip": walls["seed_gzip"] / walls["convert_auto_gzip"]
                    if walls.get("seed_gzip") and walls.get("convert_auto_gzip")
                    else None,
                }
            )
        steady = {}
        for key in ["raw", "seed"] + [f"convert_{k}" for k, _, _ in MODES]:
            points = [(t["rows"], t["walls"][key]) for t in table if t["walls"].get(key)]
            if len(points) >= 2 and points[-1][1] > points[-2][1]:
                (ra, wa), (rb_, wb) = points[-2], points[-1]
                steady[key] = (rb_ - ra) / (wb - wa)
        out[kind] = {"table": table, "steady_rows_per_s": steady}
    return out


def targets(rows: list[dict], summ: dict) -> list[dict]:
    """The targets for laptop-sized to 8 GB jobs (start-up, auto against the fixed modes, steady state against the
    seed loop and the raw copy), each met / missed / not measured."""

    def row(section, key):
        return next((r for r in rows if r["section"] == section and r["key"] == key and r["status"] == "ok"), None)

    out = []
    tiny = row("sizes_laptop", "laptop_tiny")
    out.append(_target("laptop setup, 10 rows: <= 2.5 s wall", tiny and tiny["wall_s"], lambda v: v <= 2.5, "{:.2f} s"))
    seed, images = row("sizes_laptop", "seed"), row("sizes_laptop", "laptop_images")
    ratio = seed["wall_s"] / images["wall_s"] if seed and images else None
    out.append(
        _target(
            "laptop setup, 491 MB of images: >= 2x the seed loop (whole process)", ratio, lambda v: v >= 2.0, "{:.2f}x"
        )
    )
    worst = [(kind, t["size"], t["auto_vs_best"]) for kind, s in summ.items() for t in s["table"] if t["auto_vs_best"]]
    if worst:
        kind, size, v = max(worst, key=lambda x: x[2])
        out.append(
            _target(
                f"auto within 10% of the best fixed mode at every size (worst: {kind} {size})",
                v,
                lambda x: x <= 1.10,
                "{:.2f}x the best",
            )
        )
    for kind, s in summ.items():
        big = s["table"][-1] if s["table"] else None
        if big and big["auto_vs_in_memory"]:
            chosen = big["auto_chosen"] or ""  # in_memory with one bundle is the in_memory contender itself
            inproc = chosen.startswith("in_memory") and "parallel bundles" not in chosen
            t = _target(
                f"auto faster than in-process on the largest {kind}-row input ({big['size']})",
                big["auto_vs_in_memory"],
                lambda x, inproc=inproc: x < 1.0 and not inproc,
                "{:.2f}x in-process wall",
            )
            if inproc:
                t["text"] += " (auto ran as in_memory with one bundle too: the difference is run-to-run noise)"
            out.append(t)
    for kind, s in summ.items():  # gzip: its cost over uncompressed, and against TF's GZIP writer in the loop
        big = next((t for t in reversed(s["table"]) if t["gzip_x_seed_gzip"]), None)
        if big:
            out.append(
                _target(
                    f"gzip convert within 1.3x of uncompressed ({kind} rows, {big['size']}, whole process)",
                    big["gzip_vs_none"],
                    lambda x: x <= 1.3,
                    "{:.2f}x",
                )
            )
            out.append(
                _target(
                    f"gzip convert >= 2.5x the TF GZIP loop ({kind} rows, {big['size']}, whole process)",
                    big["gzip_x_seed_gzip"],
                    lambda x: x >= 2.5,
                    "{:.2f}x",
                )
            )
    small, large = (
        summ.get("small", {}).get("steady_rows_per_s", {}),
        summ.get("large", {}).get("steady_rows_per_s", {}),
    )
    best_small = max((small.get(f"convert_{k}") or 0) for k, _, _ in MODES)
    out.append(
        _target(
            "small rows steady >= 30x the seed loop",
            best_small / small["seed"] if small.get("seed") and best_small else None,
            lambda x: x >= 30,
            "{:.1f}x",
        )
    )
    best_large = max((large.get(f"convert_{k}") or 0) for k, _, _ in MODES)
    out.append(
        _target(
            "large rows steady >= 90% of the raw copy",
            best_large / large["raw"] if large.get("raw") and best_large else None,
            lambda x: x >= 0.9,
            "{:.0%}",
        )
    )
    return out


def _target(text, value, ok, fmt):
    if value is None:
        return {"target": text, "status": "not measured", "text": "-"}
    return {"target": text, "status": "met" if ok(value) else "missed", "text": fmt.format(value)}


def markdown(summ: dict, tgts: list[dict]) -> str:
    lines = [
        "### Sizes: every DirectRunner mode and auto",
        "",
        "Whole-process wall seconds (convert: `--writer planned`, the benchmark's encodings); auto / best = auto's "
        "wall over the fastest fixed mode's at that size.",
        "",
    ]
    for kind, s in summ.items():
        lines += [
            f"{kind} rows ({row_bytes(LAYOUTS[kind]):,} bytes a row):",
            "",
            "| size | rows | raw copy | seed loop | in_memory | multi_threading | multi_processing | auto | auto chose "
            "| auto / best | seed loop, TF GZIP | auto, gzip | gzip / none | gzip x TF GZIP loop |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for t in s["table"]:
            w = t["walls"]
            seed = (
                f"{w['seed']:.2f}"
                if w.get("seed")
                else (f"~{t['seed_predicted_s']:,.0f} (predicted, skipped)" if t["seed_predicted_s"] else "-")
            )
            lines.append(
                "| "
                + " | ".join(
                    [
                        t["size"],
                        f"{t['rows']:,}",
                        _s(w.get("raw")),
                        seed,
                        *[_s(w.get(f"convert_{k}")) for k in FIXED],
                        _s(w.get("convert_auto")),
                        (t["auto_chosen"] or "-").split(" (")[0],
                        f"{t['auto_vs_best']:.2f}" if t["auto_vs_best"] else "-",
                        _s(w.get("seed_gzip")),
                        _s(w.get("convert_auto_gzip")),
                        _s(t["gzip_vs_none"]),
                        _s(t["gzip_x_seed_gzip"]),
                    ]
                )
                + " |"
            )
        steady = s["steady_rows_per_s"]
        if steady:
            lines += [
                "",
                "steady state (rows/s between the two largest sizes): "
                + ", ".join(f"{k.replace('convert_', '')} {v:,.0f}" for k, v in steady.items()),
            ]
        lines.append("")
    lines += ["| target | measured | status |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['text']} | {t['status']} |" for t in tgts]
    return "\n".join(lines) + "\n"


def _s(v):
    return f"{v:.2f}" if v else "-"


def draw(path: str, summ: dict) -> str | None:
    """Wall time against input size, log-log, one panel per layout. Returns None when drawn, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e .[bench])"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), squeeze=False)
    for ax, (kind, s) in zip(axes[0], summ.items()):
        for key, label in [("raw", "raw copy"), ("seed", "seed loop")] + [(f"convert_{k}", lbl) for k, lbl, _ in MODES]:
            pts = [(t["raw_bytes"] / 1e6, t["walls"][key]) for t in s["table"] if t["walls"].get(key)]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, linewidth=2.5 if key == "convert_auto" else 1.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input, MB of raw array bytes")
        ax.set_ylabel("whole-process wall, s")
        ax.set_title(f"{kind} rows ({row_bytes(LAYOUTS[kind]):,} B)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
