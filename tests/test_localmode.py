"""``--direct_running_mode auto``: in-process unless worker processes pay off; an explicit mode wins."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import ROOT, run_command
from tfrecord_etl.transforms import localmode


@pytest.mark.parametrize("argv", [["--direct_running_mode", "auto"], ["--direct_running_mode=auto"], []])
def test_auto_is_stripped_and_is_the_default(argv):
    assert localmode.without_auto(["--runner=DirectRunner", *argv, "--direct_num_workers=2"]) == [
        "--runner=DirectRunner",
        "--direct_num_workers=2",
    ]


def test_the_rule():
    small = 72
    argv, mode = localmode.choose_local_mode(["--runner=DirectRunner"], 10, 10 * small, 10, cpus=2)
    assert mode.mode == "in_memory" and "--direct_running_mode=in_memory" in argv and "10 rows" in mode.reason
    assert mode.workers == 2 and "--direct_num_workers=2" in argv  # two bundles at once, in-process
    assert mode.describe().startswith("in_memory, 2 parallel bundles (threads) (auto: 10 rows")
    argv, mode = localmode.choose_local_mode([], 111_000_000, 111_000_000 * small, 40, cpus=2)
    assert (mode.mode, mode.workers) == ("multi_processing", 2) and "--direct_num_workers=2" in argv
    _, mode = localmode.choose_local_mode([], 30_000_000, 30_000_000 * 12_808, 400, cpus=2)
    assert mode.mode == "in_memory" and "bound by reading and writing" in mode.reason  # large rows: I/O-bound
    argv, mode = localmode.choose_local_mode([], 111_000_000, 111_000_000 * small, 40, cpus=1)
    assert mode.mode == "in_memory" and "one CPU" in mode.reason and not any("workers" in a for a in argv)
    argv, mode = localmode.choose_local_mode(["--direct_num_workers=3"], 111_000_000, 8 * 10**9, 40, cpus=8)
    assert mode.workers == 3 and argv.count("--direct_num_workers=3") == 1  # the count asked for is the cap
    _, mode = localmode.choose_local_mode(["--direct_num_workers=1"], 111_000_000, 8 * 10**9, 40, cpus=8)
    assert mode.mode == "in_memory"


def test_an_explicit_mode_wins_and_other_runners_are_left_alone():
    argv = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    out, mode = localmode.choose_local_mode(argv, 10, 720, 10, cpus=2)
    assert out == argv and mode.mode == "multi_processing" and mode.reason == "as asked"
    out, mode = localmode.choose_local_mode(["--runner=PortableRunner"], 10**9, 10**11, 100, cpus=2)
    assert mode is None and out == ["--runner=PortableRunner"]


def test_convert_says_which_mode_ran_and_why(tmp_path, capsys):
    import h5py

    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["x"] = np.arange(10.0)
    from tfrecord_etl.pipelines import convert

    for extra in ([], ["--config", str(ROOT / "configs" / "local.yaml"), "--compression", "none"]):
        code, out, err = run_command(
            convert.main, ["--input", tmp_path / "in.h5", "--output_dir", tmp_path / f"out{len(extra)}", *extra], capsys
        )
        assert code == 0, err
        import re

        assert re.search(
            r"local runner: in_memory(, \d+ parallel bundles \(threads\))? \(auto: 10 rows, below "
            r"the 25,000,000",
            out,
        ), out
    code, out, err = run_command(
        convert.main,
        [
            "--input",
            tmp_path / "in.h5",
            "--output_dir",
            tmp_path / "mt",
            "--direct_running_mode",
            "multi_threading",
            "--direct_num_workers",
            "2",
        ],
        capsys,
    )
    assert code == 0, err
    assert "local runner: multi_threading, 2 workers (as asked)" in out
