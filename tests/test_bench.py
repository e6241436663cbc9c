"""Smoke test of the benchmark (``python -m bench.run``), at a tiny scale: it runs end to end and reports
one row per contender. No timing is asserted; the benchmark itself is not part of the test suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SMALL_CONTENDERS = {
    "raw",
    "seed",
    "plain_beam_2w",
    "convert_planned_2w",
    "convert_beam_2w",
    "convert_planned_1w",
    "convert_beam_1w",
}


@pytest.mark.timeout(600)
def test_bench_runs_small_at_tiny_scale(tmp_path):
    workdir = tmp_path / "work"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", HOME=str(tmp_path / "home"))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--scale", "0.0005", "--only", "small", "--workdir", str(workdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=570,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = workdir / "results"
    result = json.loads((results / "results.json").read_text())
    rows = result["results"]
    assert {r["key"] for r in rows} == SMALL_CONTENDERS
    assert len(rows) == len(SMALL_CONTENDERS)
    assert all(r["section"] == "small" and r["rows"] == 1000 for r in rows)
    by_key = {r["key"]: r for r in rows}
    for key in ("seed", "raw"):
        assert by_key[key]["status"] == "ok", by_key[key]
        assert by_key[key]["examples_per_s"] > 0
        assert by_key[key]["peak_rss_mb"] > 0
    assert by_key["seed"]["x_seed"] == pytest.approx(1.0)
    assert by_key["raw"]["x_raw"] == pytest.approx(1.0)
    md = (results / "results.md").read_text()
    table = [
        line
        for line in md.splitlines()
        if line.startswith("| ") and not line.startswith("| contender") and not line.startswith("| target")
    ]
    contender_lines = [line for line in table if line.split("|")[2].strip() in ("ok", "failed")]
    assert len(contender_lines) == len(SMALL_CONTENDERS)
    assert sorted(line.split("|")[1].strip() for line in contender_lines) == sorted(r["name"] for r in rows)
    # Without --keep, the generated data and outputs are removed; the logs stay with the results.
    assert not (workdir / "data").exists() and not (workdir / "out").exists()
    assert len(list((results / "logs").glob("small__*.log"))) == len(SMALL_CONTENDERS)


def test_work_seconds_are_read_from_each_kind_of_contender_log(tmp_path):
    from bench.run import work_seconds

    logs = {
        "convert": "wrote 10 examples\nBeam metrics:\n  rows_read  10\nwork span: 1.250 s (first shard started "
        "to last shard written, 8 records/s)\n",
        "raw": "raw_copy: 1,000 bytes in 0.125 s (8 MB/s)\n",
        "seed": "seed_loop: 5 examples in 2.500 s (2 examples/s)\n",
        "plain": "plain_beam: 5 examples in 9.000 s\n",
    }
    got = {}
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
        got[name] = work_seconds(str(tmp_path / name))
    assert got == {"convert": 1.25, "raw": 0.125, "seed": 2.5, "plain": None}
    assert work_seconds(str(tmp_path / "missing")) is None


@pytest.mark.timeout(600)
def test_bench_raw_and_files_sections_at_tiny_scale(tmp_path):
    """The raw and files sections run end to end, every contender ok on the same row count."""
    workdir = tmp_path / "work"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", HOME=str(tmp_path / "home"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--scale",
            "0.002",
            "--only",
            "raw,files",
            "--steady",
            "off",
            "--workdir",
            str(workdir),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=570,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((workdir / "results" / "results.json").read_text())["results"]
    want = {"raw", "seed", "convert_planned_2w", "convert_planned_inproc"}
    for section, n in (("raw", 80), ("files", 20)):
        got = {r["key"]: r for r in rows if r["section"] == section}
        assert set(got) == want
        assert all(r["status"] == "ok" and r["rows"] == n for r in got.values()), got


def test_sizes_summary_and_targets_from_rows():
    """The sizes section's arithmetic: auto against the best fixed mode, steady state as the slope
    between the two largest sizes, and a target is not met when auto ran the same mode as in-process."""
    from bench import sizes

    assert sizes.parse_size("10MB") == 10**7 and sizes.parse_size("8GB") == 8 * 10**9
    info = {
        f"sizes_{k}_{s}": {"layout": k, "size": s, "rows": r, "raw_bytes": r * 72}
        for k in ("small", "large")
        for s, r in (("1GB", 1000), ("8GB", 8000))
    }
    rows = []
    for section, walls in (
        (
            "sizes_small_1GB",
            {
                "raw": 1.0,
                "seed": 100.0,
                "convert_in_memory": 5.0,
                "convert_multi_threading": 5.5,
                "convert_multi_processing": 6.0,
                "convert_auto": 5.2,
            },
        ),
        (
            "sizes_small_8GB",
            {
                "raw": 8.0,
                "convert_in_memory": 40.0,
                "convert_multi_threading": 35.0,
                "convert_multi_processing": 30.0,
                "convert_auto": 31.0,
            },
        ),
        ("sizes_large_1GB", {"raw": 1.0, "seed": 9.0, "convert_in_memory": 3.0, "convert_auto": 3.1}),
        ("sizes_large_8GB", {"raw": 10.0, "seed": 60.0, "convert_in_memory": 10.0, "convert_auto": 8.0}),
    ):
        for key, wall in walls.items():
            rows.append(
                {
                    "section": section,
                    "key": key,
                    "status": "ok",
                    "wall_s": wall,
                    "chosen": (
                        "multi_processing, 2 workers (auto: ...)"
                        if section == "sizes_small_8GB"
                        else "in_memory (auto: ...)"
                    )
                    if key == "convert_auto"
                    else None,
                }
            )
    rows.append({"section": "sizes_small_8GB", "key": "seed", "status": "skipped", "predicted_wall_s": 800.0})
    summ = sizes.summary(rows, info)
    small = summ["small"]
    assert [round(t["auto_vs_best"], 3) for t in small["table"]] == [1.04, round(31 / 30, 3)]
    assert small["steady_rows_per_s"]["convert_auto"] == pytest.approx(7000 / 25.8)
    assert "seed" not in small["steady_rows_per_s"]  # one measured size only
    targets = {t["target"]: t for t in sizes.targets(rows, summ)}
    assert targets["auto faster than in-process on the largest small-row input (8GB)"]["status"] == "met"
    large = targets["auto faster than in-process on the largest large-row input (8GB)"]
    assert large["status"] == "missed" and "noise" in large["text"]  # auto ran in-process there
    # in-process with parallel bundles (threads) is not the in_memory contender's one bundle: a real difference
    threads = [
        dict(r, chosen="in_memory, 2 parallel bundles (threads) (auto: ...)")
        if r["section"] == "sizes_large_8GB" and r["key"] == "convert_auto"
        else r
        for r in rows
    ]
    large = {t["target"]: t for t in sizes.targets(threads, sizes.summary(threads, info))}[
        "auto faster than in-process on the largest large-row input (8GB)"
    ]
    assert large["status"] == "met" and large["text"] == "0.80x in-process wall"
    md = sizes.markdown(summ, sizes.targets(rows, summ))
    assert "~800 (predicted, skipped)" in md and "| 8GB | 8,000 |" in md
