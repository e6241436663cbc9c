"""The benchmark's outputs: ratios, the issue's targets, ``results.json``, ``results.md`` and ``results.png``.

A result row (one contender of one section) is a dict with, among others: ``section``, ``name``,
``role`` (``seed``, ``raw`` or ``other``), ``status`` (``ok`` or ``failed``), ``rows``, ``raw_bytes``,
``wall_s``, ``examples_per_s``, ``mb_per_s`` (raw array MB, 10**6 bytes, per second), the steady-state
figures ``steady_examples_per_s``/``steady_mb_per_s`` (when measured: the same command also run on an
input of 1/50 the rows, and ``(rows - tiny rows) / (wall - tiny wall)``, so interpreter start-up,
imports and pipeline set-up cancel out), ``peak_rss_mb`` (largest single process), ``tree_rss_mb``
(sum over the process tree), ``work_s``/``work_examples_per_s`` (the contender's own time for its work, see
``bench.run.work_seconds``) and the ratios ``x_seed``/``x_raw`` (and ``steady_x_seed``/``steady_x_raw``, ``work_x_seed``).
"""

from __future__ import annotations

import json
import math
import os

SECTION_TITLES = {
    "small": "Small rows (x float32[16] + id int64; 72 bytes a row)",
    "large": "Large rows (image uint8[64,64,3] + emb float32[128] + id int64; 12,808 bytes a row)",
    "augment_small": "Augmentation: small records + one int64 field",
    "augment_images": "Augmentation: image collection (the large rows converted) + one int64 field",
    "scaling": "Scaling: 2 workers vs 1 on many small rows (x float32[16] + id int64; 72 bytes a row)",
    "raw": "Raw binary file (--format raw): uint8 [64, 64, 3] rows, 12,288 bytes a row",
    "files": "Image files (--format files): 64x64 RGB PNGs in 4 class folders",
    "rss8gb": "Peak RSS: one 8 GB HDF5 file, convert --writer planned",
}
GB = 1e9


def add_ratios(rows: list[dict]) -> None:
    """Sets ``x_seed``/``x_raw`` (and their steady-state twins) of every row, within its section."""
    by_section: dict[str, list[dict]] = {}
    for r in rows:
        by_section.setdefault(r["section"], []).append(r)
    for section_rows in by_section.values():
        seed = next((r for r in section_rows if r["role"] == "seed" and r["status"] == "ok"), None)
        raw = next((r for r in section_rows if r["role"] == "raw" and r["status"] == "ok"), None)
        for r in section_rows:
            ok = r["status"] == "ok"
            r["x_seed"] = _ratio(r.get("examples_per_s"), seed and seed.get("examples_per_s")) if ok else None
            r["x_raw"] = _ratio(r.get("mb_per_s"), raw and raw.get("mb_per_s")) if ok else None
            r["steady_x_seed"] = (
                _ratio(r.get("steady_examples_per_s"), seed and seed.get("steady_examples_per_s")) if ok else None
            )
            r["steady_x_raw"] = _ratio(r.get("steady_mb_per_s"), raw and raw.get("steady_mb_per_s")) if ok else None
            r["work_x_seed"] = (
                _ratio(r.get("work_examples_per_s"), seed and seed.get("work_examples_per_s")) if ok else None
            )


def _ratio(a, b):
    if a is None or not b:
        return None
    return a / b


def _find(rows, section, key):
    return next((r for r in rows if r["section"] == section and r["key"] == key), None)


def _rate(r, field):
    """``(value, basis)``: the steady-state figure when measured, else the whole-process one."""
    if r is None or r["status"] != "ok":
        return None, None
    steady = r.get(f"steady_{field}")
    if steady is not None:
        return steady, "steady state"
    return r.get(field), "whole process"


def _compare(a_row, b_row, field):
    """``(a / b, basis)`` on one basis for both rows: steady state when both have it, else the work time
    both report (see ``bench.run.work_seconds``), else the whole process."""
    if a_row is None or b_row is None or a_row["status"] != "ok" or b_row["status"] != "ok":
        return None, None
    for prefix, basis in (("steady_", "steady state"), ("work_", "work time")):
        sa, sb = a_row.get(f"{prefix}{field}"), b_row.get(f"{prefix}{field}")
        if sa is not None and sb is not None:
            return _ratio(sa, sb), basis
    return _ratio(a_row.get(field), b_row.get(field)), "whole process"


def evaluate_targets(rows: list[dict], extras: dict) -> list[dict]:
    """The throughput targets (convert against the seed loop and the raw copy, 2 workers against 1, augment against
    its seed loop, peak RSS on 8 GB, the sidecar's size bound), each ``met``, ``missed`` or ``not measured``, for
    each convert writer."""
    out = []

    def add(target, writer, value, required, basis, fmt, higher_is_better=True):
        if value is None:
            status = "not measured"
        elif higher_is_better:
            status = "met" if value >= required else "missed"
        else:
            status = "met" if value <= required else "missed"
        out.append(
            {
                "target": target,
                "writer": writer,
                "measured": value,
                "required": required,
                "basis": basis,
                "status": status,
                "text": (fmt.format(value) if value is not None else "n/a"),
            }
        )

    for w in ("planned", "beam"):
        v, basis = _compare(_find(rows, "small", f"convert_{w}_2w"), _find(rows, "small", "seed"), "examples_per_s")
        add("small rows: convert (2 workers) >= 20x the seed loop", w, v, 20.0, basis, "{:.1f}x")
        v, basis = _compare(_find(rows, "large", f"convert_{w}_2w"), _find(rows, "large", "raw"), "mb_per_s")
        add("large rows: convert (2 workers) >= 80% of the raw copy", w, v, 0.8, basis, "{:.0%}")
        # on the scaling section (20M rows) when it ran for this writer, else on the 2M-row small section
        section = "scaling" if _find(rows, "scaling", f"convert_{w}_2w") is not None else "small"
        v, basis = _compare(
            _find(rows, section, f"convert_{w}_2w"), _find(rows, section, f"convert_{w}_1w"), "examples_per_s"
        )
        add("small rows: 2 workers >= 1.7x 1 worker", w, v, 1.7, basis and f"{basis}, {section} section", "{:.2f}x")
    v, basis = _compare(_find(rows, "augment_small", "rewrite"), _find(rows, "augment_small", "seed"), "examples_per_s")
    add("augmentation: rewrite (2 workers) >= 20x the seed loop", "augment", v, 20.0, basis, "{:.1f}x")
    r = _find(rows, "rss8gb", "convert_planned_2w")
    v = r["peak_rss_mb"] * 1e6 / GB if r is not None and r["status"] == "ok" else None
    add(
        "8 GB HDF5 file: peak RSS of every process <= 1 GB",
        "planned",
        v,
        1.0,
        "kernel high-water mark",
        "{:.2f} GB",
        higher_is_better=False,
    )
    add(
        "image collection: sidecar bytes < 5% of rewrite's",
        "augment",
        extras.get("sidecar_ratio"),
        0.05,
        "output bytes",
        "{:.2%}",
        higher_is_better=False,
    )
    return out


def _fmt(value, spec="{:,.0f}"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value)


def markdown(result: dict) -> str:
    """The results as markdown: one table per section, the targets, the commands."""
    rows, meta = result["results"], result["meta"]
    lines = [
        f"Benchmark run {meta['created']} (scale {meta['scale']}, {meta['cpus']} CPUs, "
        f"apache-beam {meta['versions'].get('apache-beam')}, tensorflow {meta['versions'].get('tensorflow')}, "
        f"tfx-bsl {meta['versions'].get('tfx-bsl')}); `{meta['command']}`",
        "",
        "examples/s and MB/s (raw array bytes, 1 MB = 10^6 bytes) are over the whole process's wall time; "
        "*steady* figures net out start-up (the same command on 1/50 of the rows); *work* is the contender's own "
        "time for its work (the pipelines' first shard start to last shard end, from Beam metrics; the "
        "single-process loops' time after imports); x seed / x raw are "
        "ratios to the seed loop / raw copy of the same section and run; peak RSS is the largest of any "
        "single process, tree RSS the largest sum over the process tree (MB).",
        "",
    ]
    header = (
        "| contender | status | rows | wall s | examples/s | MB/s | x seed | x raw | steady examples/s | "
        "steady x seed | steady x raw | work s | work examples/s | work x seed | peak RSS MB | tree RSS MB | "
        "procs |"
    )
    for section in result["sections"]:
        section_rows = [r for r in rows if r["section"] == section]
        if not section_rows:
            continue
        info = result["section_info"].get(section, {})
        lines += [
            f"### {SECTION_TITLES.get(section, section)}",
            "",
            f"{info.get('rows', 0):,} rows, {info.get('raw_bytes', 0) / 1e6:,.1f} MB of raw array bytes.",
            "",
            header,
            "|" + "---|" * 17,
        ]
        for r in section_rows:
            ok = r["status"] == "ok"
            lines.append(
                "| "
                + " | ".join(
                    [
                        r["name"],
                        r["status"],
                        f"{r['rows']:,}",
                        _fmt(r.get("wall_s"), "{:.2f}"),
                        _fmt(r.get("examples_per_s") if ok else None),
                        _fmt(r.get("mb_per_s") if ok else None, "{:,.1f}"),
                        _fmt(r.get("x_seed"), "{:.2f}"),
                        _fmt(r.get("x_raw"), "{:.2f}"),
                        _fmt(r.get("steady_examples_per_s") if ok else None),
                        _fmt(r.get("steady_x_seed"), "{:.2f}"),
                        _fmt(r.get("steady_x_raw"), "{:.2f}"),
                        _fmt(r.get("work_s") if ok else None, "{:.2f}"),
                        _fmt(r.get("work_examples_per_s") if ok else None),
                        _fmt(r.get("work_x_seed"), "{:.2f}"),
                        _fmt(r.get("peak_rss_mb"), "{:,.0f}"),
                        _fmt(r.get("tree_rss_mb"), "{:,.0f}"),
                        _fmt(r.get("procs_seen"), "{}"),
                    ]
                )
                + " |"
            )
        if section == "augment_images" and result["extras"].get("sidecar_ratio") is not None:
            e = result["extras"]
            lines += [
                "",
                f"Sidecar output {e['sidecar_bytes']:,} bytes vs rewrite {e['rewrite_bytes']:,} bytes: "
                f"{e['sidecar_ratio']:.2%} (must be < 5%).",
            ]
        lines.append("")
    lines += ["### Targets", "", "| target | writer | measured | basis | status |", "|---|---|---|---|---|"]
    for t in result["targets"]:
        lines.append(f"| {t['target']} | {t['writer']} | {t['text']} | {t['basis'] or '-'} | {t['status']} |")
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", "### Failed contenders", ""]
        for r in failed:
            lines.append(f"- {r['section']} / {r['name']}: {r.get('error', '')} (log: `{r.get('log')}`)")
    lines += ["", "### Commands", ""]
    for r in rows:
        lines.append(f"- {r['section']} / {r['name']}: `{r['command']}`")
    return "\n".join(lines) + "\n"


def write_json(path: str, result: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")


def draw_png(path: str, result: dict) -> str | None:
    """A bar chart: examples/s (whole process and steady state) and peak RSS per contender, per section.
    Returns None when drawn, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e .[bench])"
    sections = [s for s in result["sections"] if any(r["section"] == s for r in result["results"])]
    if not sections:
        return "no results"
    heights = [max(1, sum(1 for r in result["results"] if r["section"] == s)) for s in sections]
    fig, axes = plt.subplots(
        len(sections),
        2,
        figsize=(14, 1.2 + 0.55 * sum(heights) + 0.9 * len(sections)),
        gridspec_kw={"height_ratios": heights, "width_ratios": [3, 1.4]},
        squeeze=False,
    )
    for (ax_rate, ax_rss), section in zip(axes, sections):
        srows = [r for r in result["results"] if r["section"] == section]
        names = [r["name"] for r in srows]
        y = list(range(len(srows)))
        whole = [r.get("examples_per_s") or 0 if r["status"] == "ok" else 0 for r in srows]
        steady = [r.get("steady_examples_per_s") or 0 if r["status"] == "ok" else 0 for r in srows]
        has_steady = any(steady)
        h = 0.4 if has_steady else 0.7
        ax_rate.barh(
            [v - (h / 2 if has_steady else 0) for v in y], whole, height=h, color="#4878a8", label="whole process"
        )
        if has_steady:
            ax_rate.barh([v + h / 2 for v in y], steady, height=h, color="#e0883c", label="steady state")
        floor = min([v for v in whole + steady if v > 0] or [1]) / 2
        for i, r in enumerate(srows):
            if r["status"] != "ok":
                ax_rate.text(floor, i, " failed", va="center", fontsize=7, color="red")
                continue
            label = f" {whole[i]:,.0f}"
            if r.get("x_seed") is not None and r["role"] != "seed":
                label += f" ({r['x_seed']:.1f}x seed)"
            ax_rate.text(whole[i], i - (h / 2 if has_steady else 0), label, va="center", fontsize=7)
            if has_steady and steady[i]:
                label = f" {steady[i]:,.0f}"
                if r.get("steady_x_seed") is not None and r["role"] != "seed":
                    label += f" ({r['steady_x_seed']:.1f}x seed)"
                ax_rate.text(steady[i], i + h / 2, label, va="center", fontsize=7)
        positive = [v for v in whole + steady if v > 0]
        if positive:
            ax_rate.set_xscale("log")
            ax_rate.set_xlim(min(positive) / 2, max(positive) * 8)
        ax_rate.set_yticks(y, names, fontsize=8)
        ax_rate.invert_yaxis()
        ax_rate.set_xlabel("examples/s (log scale)", fontsize=8)
        ax_rate.set_title(SECTION_TITLES.get(section, section), fontsize=9, loc="left")
        ax_rate.legend(fontsize=7, loc="lower right")
        rss = [r.get("peak_rss_mb") or 0 for r in srows]
        ax_rss.barh(y, rss, height=0.6, color="#6a9f58")
        for i, v in enumerate(rss):
            ax_rss.text(v, i, f" {v:,.0f}", va="center", fontsize=7)
        ax_rss.set_xlim(0, max(rss + [1000 if section == "rss8gb" else 1]) * 1.25)
        ax_rss.set_yticks(y, [""] * len(y))
        ax_rss.invert_yaxis()
        ax_rss.set_xlabel("peak RSS of any process (MB)", fontsize=8)
        if section == "rss8gb":
            ax_rss.axvline(1000, color="red", linestyle="--", linewidth=1)
    fig.suptitle(f"tfrecord-etl benchmark, scale {result['meta']['scale']}, {result['meta']['created']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def print_targets(targets: list[dict], stream) -> None:
    print("Targets:", file=stream)
    for t in targets:
        mark = {"met": "MET   ", "missed": "MISSED", "not measured": "n/a   "}[t["status"]]
        basis = f", {t['basis']}" if t["basis"] else ""
        print(f"  [{mark}] {t['target']} [{t['writer']}]: {t['text']}{basis}", file=stream)


def relpath(path: str) -> str:
    """``path`` relative to the current directory when inside it, else as it is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
