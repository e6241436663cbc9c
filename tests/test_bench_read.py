"""The read section of the benchmark (``bench.readsection``, ``bench.read_contenders``, ``bench.read_check``): the
value check on right and wrong values, a contender failing on a wrong value, the table's arithmetic, and a
tiny-scale run with the readers of the project's .venv. No timing is asserted. The PyTorch readers run only in
``python -m bench.run --read``, in the reader-only environment it builds: never here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench import read_check, read_contenders, readsection, run
from tests.conftest import ROOT, convert


def _source(n=40):
    rng = np.random.default_rng(5)
    return {
        "id": np.arange(n, dtype=np.int64),
        "x": rng.standard_normal((n, 4)).astype(np.float32),
        "image": rng.integers(0, 256, (n, 3, 2), dtype=np.uint8),
    }


def test_check_passes_on_the_source_rows_in_each_mode():
    src = _source()
    assert read_check.check(src, src) is None
    perm = np.random.default_rng(1).permutation(40)
    shuffled = {k: v[perm] for k, v in src.items()}
    assert read_check.check(shuffled, src, ordered=False) is None
    picks = np.array([7, 3, 39, 3])  # random access may read a row twice
    assert read_check.check({k: v[picks] for k, v in src.items()}, src, indices=picks) is None


def test_check_names_the_first_wrong_value_missing_row_and_wrong_order():
    src = _source()
    bad = {k: v.copy() for k, v in src.items()}
    bad["x"][11, 2] = np.nextafter(bad["x"][11, 2], np.float32(9))  # one ulp
    assert read_check.check(bad, src) == "x: values differ from row 11"
    neg = {k: v.copy() for k, v in src.items()}
    neg["x"][0, 0] = 0.0
    neg_src = {k: v.copy() for k, v in src.items()}
    neg_src["x"][0, 0] = -0.0  # equal as floats, different bits
    assert read_check.check(neg, neg_src) == "x: values differ from row 0"
    assert read_check.check({k: v[:39] for k, v in src.items()}, src) == "39 records, expected 40"
    dup = {k: np.concatenate([v[:1], v[:39]]) for k, v in src.items()}
    assert read_check.check(dup, src, ordered=False) == "the ids are not each row number once"
    swapped = {k: v[[1, 0, *range(2, 40)]] for k, v in src.items()}
    assert read_check.check(swapped, src) == "record 0 is row 1: rows out of order"
    assert read_check.check(swapped, src, ordered=False) is None
    picks = np.array([5, 6])
    assert (
        read_check.check({k: v[[5, 7]] for k, v in src.items()}, src, indices=picks)
        == "record 1 read for index 6 is row 7"
    )
    cast = dict(src, image=src["image"].astype(np.int64))
    assert read_check.check(cast, src) == "image: dtype int64, expected uint8"
    assert read_check.check({k: v for k, v in src.items() if k != "x"}, src) == "features ['x'] not read"


def test_collected_turns_batches_and_examples_into_arrays():
    src = _source(6)
    col = read_check.Collected()
    col.batch({k: v[:4] for k, v in src.items()})
    col.batch({k: list(v[4:]) for k, v in src.items()})  # anything np.asarray takes (tensors, lists)
    assert read_check.check(col.arrays(), src) is None
    col = read_check.Collected()
    for i in range(6):
        col.row({k: v[i] for k, v in src.items()})
    assert read_check.check(col.arrays(), src) is None


@pytest.fixture(scope="module")
def small_output(tmp_path_factory):
    d = tmp_path_factory.mktemp("read")
    src = _source(300)
    np.savez(d / "in.npz", **src)
    code, _, _ = convert(str(d / "in.npz"), str(d / "out"), "--index", "--compression", "none", "--num_shards", "2")
    assert code == 0
    read_check.save_expected(src, str(d / "expected"))
    return d


@pytest.mark.parametrize("key", ["numpy_iter", "ra_random", "floor"])
def test_a_contender_passes_on_the_source_and_fails_on_a_wrong_value(small_output, key, capsys):
    d = small_output
    argv = [key, "--output_dir", str(d / "out"), "--expected", str(d / "expected"), "--random", "100"]
    assert read_contenders.main(argv) == 0
    out = capsys.readouterr().out
    assert "read_check: ok" in out
    got = readsection.parse_log(out)
    assert got["records"] == (100 if key == "ra_random" else 300)
    assert got["seconds"] > 0 and got["check"].startswith("ok")
    wrong = d / f"wrong-{key}"
    src = _source(300)
    src["x"][read_contenders.random_indices(300, 100, 0)[3], 1] += 1  # a row every contender reads
    read_check.save_expected(src, str(wrong))
    if key == "floor":  # the floor checks the shard bytes: change one byte of a shard instead
        shard = d / "out" / json.loads((d / "out" / "metadata.json").read_text())["shards"][1]["file"]
        data = bytearray(shard.read_bytes())
        data[100] ^= 1
        broken = d / "out-broken"
        os.makedirs(broken, exist_ok=True)
        for name in os.listdir(d / "out"):
            (broken / name).write_bytes((d / "out" / name).read_bytes())
        (broken / shard.name).write_bytes(bytes(data))
        argv = [key, "--output_dir", str(broken), "--expected", str(d / "expected")]
    else:
        argv = [key, "--output_dir", str(d / "out"), "--expected", str(wrong), "--random", "100"]
    assert read_contenders.main(argv) == 1
    err = capsys.readouterr().err
    assert (": CRC32C " in err) if key == "floor" else ("read_check: x: values differ from row" in err), err


def test_outcome_of_a_run_from_its_log(tmp_path):
    log = tmp_path / "r.log"

    def outcome(text, code):
        log.write_text(text)
        return readsection._outcome({"log": str(log), "returncode": code, "wall_s": 3.0})

    ok = outcome("read: 300 records, 9000 bytes in 0.250000 s (1,200 records/s)\nread_check: ok (300 records)\n", 0)
    assert ok["error"] is None and ok["records"] == 300 and ok["seconds"] == 0.25
    bad = outcome("read: 300 records, 9000 bytes in 0.25 s\n", 1)
    assert bad["error"] == "exit code 1"
    bad = outcome("read: 300 records, 9000 bytes in 0.25 s\nread_check: x: values differ from row 7\n", 1)
    assert bad["error"] == "x: values differ from row 7"
    skip = outcome("read_skip: reader.iter_numpy has no batch_size in this checkout\n", 3)
    assert skip["error"] is None and skip["skip"].startswith("reader.iter_numpy")


def test_table_cells_give_rates_and_ratios_to_the_hand_written_pipeline():
    base = {"key": "tf_hand", "status": "ok", "records_per_s": 147_000.0}
    assert readsection.cell(base, base) == "**147.0k rec/s**"
    assert (
        readsection.cell({"key": "tf_reader", "status": "ok", "records_per_s": 38_600.0}, base)
        == "38.6k rec/s (**3.8x slower**)"
    )
    assert (
        readsection.cell({"key": "numpy_batched", "status": "ok", "records_per_s": 1_500_000.0}, base)
        == "1.50M rec/s (10.20x)"
    )
    assert (
        readsection.cell({"key": "floor", "status": "ok", "bytes_per_s": 3.2e9, "read_s": 0.034}, base)
        == "3.20 GB/s (0.034 s)"
    )
    assert readsection.cell({"key": "grain", "status": "skipped"}, base) == "skipped"
    assert readsection.cell(None, base) == "-"


def test_read_flag_selects_the_section_and_contenders_are_checked():
    assert run.selected_sections(run.parse_args(["--read"])) == ["read"]
    assert run.selected_sections(run.parse_args(["--peers", "--read"])) == ["peers", "read"]
    assert "read" not in run.selected_sections(run.parse_args([]))
    assert readsection.selected("") == list(read_contenders.CONTENDERS)
    with pytest.raises(SystemExit, match="unknown"):
        readsection.selected("floor,tf_fast")


@pytest.mark.timeout(600)
def test_read_section_runs_at_tiny_scale(tmp_path):
    """One round, small rows, the readers of the project's .venv: every one ok, the table and chart written."""
    workdir = tmp_path / "work"
    keys = ["floor", "tf_hand_numpy", "tf_reader", "numpy_iter", "ra_random"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", HOME=str(tmp_path / "home"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--only",
            "read",
            "--scale",
            "0.0005",
            "--read_rounds",
            "1",
            "--read_inputs",
            "small",
            "--read_contenders",
            ",".join(keys),
            "--read_random",
            "100",
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
    assert [r["key"] for r in rows] == keys
    assert all(r["section"] == "read_small" and r["status"] == "ok" for r in rows), rows
    by_key = {r["key"]: r for r in rows}
    assert by_key["ra_random"]["records_read"] == 100 and by_key["numpy_iter"]["records_read"] == 500
    assert by_key["floor"]["bytes_read"] == by_key["numpy_iter"]["bytes_read"] > 0
    md = (workdir / "results" / "results.md").read_text()
    assert "### read: every reader over the same shards" in md
    assert "| the same, `.as_numpy_iterator()` |" in md
    try:
        import matplotlib  # noqa: F401 - the bench extra

        assert (workdir / "results" / "read.png").stat().st_size > 0
    except ImportError:
        assert "no read chart: matplotlib is not installed" in proc.stdout


def test_chart_is_drawn_from_a_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [
        {
            "section": "read_small",
            "key": k,
            "name": k,
            "status": "ok",
            "records_per_s": v,
            "bytes_per_s": 1e9,
            "read_s": 1.0,
        }
        for k, v in (("floor", 1e6), ("tf_hand", 1.5e5), ("tf_reader", 4e4), ("numpy_iter", 1.5e4))
    ]
    info = {"read_small": {"rows": 1000, "layout": "small", "stored_bytes": 108_000_000}}
    (tmp_path / "results.json").write_text(json.dumps({"results": rows, "section_info": info}))
    assert readsection.main(["--results", str(tmp_path / "results.json"), "--chart", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
