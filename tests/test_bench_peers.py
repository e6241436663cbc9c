"""The peers section of the benchmark (``bench.peers``, ``bench.peer_check``): its pure logic and its value check,
on tiny inputs. The peers themselves (TFDS, Ray Data) run only in ``python -m bench.run --peers``, in environments
of their own: never here."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from bench import peer_check, peers, run


def _row(section, key, wall, status="ok", **kw):
    label = {k: label for k, label, _ in peers.CONTENDERS}[key]
    return {"section": section, "key": key, "name": label, "status": status, "wall_s": wall, "walls_s": [wall], **kw}


def test_rotation_puts_every_contender_in_every_position():
    keys = ["a", "b", "c"]
    rounds = [peers.rotation(keys, r) for r in range(3)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert peers.rotation(keys, 4) == ["b", "c", "a"]
    assert peers.rotation([], 2) == []


def test_summarize_takes_the_median_and_fails_on_any_failed_run():
    assert peers.summarize(
        [{"wall_s": 3.0, "error": None}, {"wall_s": 1.0, "error": None}, {"wall_s": 2.5, "error": None}]
    ) == {"status": "ok", "wall_s": 2.5, "walls_s": [3.0, 1.0, 2.5], "error": None}
    out = peers.summarize([{"wall_s": 1.0, "error": None}, {"wall_s": 9.0, "error": "ids: values differ from row 3"}])
    assert out["status"] == "failed" and out["wall_s"] is None and out["error"] == "ids: values differ from row 3"
    assert peers.summarize([])["status"] == "failed"


def test_markdown_table_gives_medians_and_ratios_to_ours_with_defaults():
    rows = [
        _row("peers_small", "convert_defaults", 2.0, output_bytes=1000),
        _row("peers_small", "convert_local", 1.64),
        _row("peers_small", "seed", 19.0),
        _row("peers_small", "tfds", 36.0),
        _row("peers_small", "ray", 33.0, status="failed", error="exit code 1"),
        _row("peers_small", "raw", 0.06),
        {"section": "small", "key": "seed", "name": "seed loop", "status": "ok", "wall_s": 1.0},
    ]
    info = {"peers_small": {"rows": 2_000_000, "raw_bytes": 144_000_000, "layout": "small"}}
    md = peers.markdown(rows, info)
    assert (
        "| 2,000,000 small rows, 144 MB | **2.00 s** | 1.64 s (0.82x) | 19.00 s (9.50x slower) | "
        "36.00 s (18.00x slower) | failed | 0.06 s (0.03x) |"
    ) in md.splitlines()
    assert "| small | ours, defaults | 2.00 | 1,000 | ok |" in md.splitlines()
    assert "| small | Ray Data 2.60 write_tfrecords | 33.00 | - | failed: exit code 1 |" in md.splitlines()
    assert peers.markdown([rows[-1]], info) == ""  # no peers rows: no table


def test_peers_flag_selects_the_section_and_only_keeps_the_others():
    assert run.selected_sections(run.parse_args(["--peers"])) == ["peers"]
    assert run.selected_sections(run.parse_args(["--only", "small", "--peers"])) == ["small", "peers"]
    assert "peers" not in run.selected_sections(run.parse_args([]))
    with pytest.raises(SystemExit, match="unknown section"):
        run.selected_sections(run.parse_args(["--only", "peer"]))


def test_a_peer_environment_counts_only_with_the_current_pins(tmp_path):
    d = tmp_path / "bench" / ".venv-peers-ray"
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "python").write_text("")
    assert peers.env_python(str(tmp_path), "ray") is None  # no requirements file: not built by us
    (d / peers.SPEC_FILE).write_text("ray[data]==2.9.0\n")
    assert peers.env_python(str(tmp_path), "ray") is None  # other pins: rebuilt by --peers
    (d / peers.SPEC_FILE).write_text("\n".join(peers.ENVS["ray"]) + "\n")
    assert peers.env_python(str(tmp_path), "ray") == str(d / "bin" / "python")


def _write(path, columns, order):
    import tensorflow as tf

    from bench.common import make_row_example_fn

    to_example = make_row_example_fn()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as w:
        for i in order:
            w.write(to_example(columns, i))


def test_peer_check_accepts_any_record_order_and_names_the_first_wrong_value(tmp_path):
    rng = np.random.default_rng(3)
    cols = {
        "image": rng.integers(0, 256, (20, 4, 4, 3), dtype=np.uint8),
        "emb": rng.standard_normal((20, 5)).astype(np.float32),
        "id": np.arange(20, dtype=np.int64),
    }
    h5 = str(tmp_path / "in.h5")
    with h5py.File(h5, "w") as f:
        for k, v in cols.items():
            f[k] = v
    order = list(rng.permutation(20))
    _write(str(tmp_path / "ok" / "a.tfrecords"), cols, order[:7])  # Ray-like names, two files, shuffled rows
    _write(str(tmp_path / "ok" / "b.tar"), cols, order[7:])
    assert peer_check.check(h5, str(tmp_path / "ok")) is None
    bad = {**cols, "emb": cols["emb"].copy()}
    bad["emb"][11, 2] = np.nextafter(bad["emb"][11, 2], np.float32(9))  # one ulp
    _write(str(tmp_path / "bad" / "d.tfrecord"), bad, range(20))
    assert peer_check.check(h5, str(tmp_path / "bad")) == "emb: values differ from row 11"
    _write(str(tmp_path / "short" / "d.tfrecord"), cols, range(19))
    assert peer_check.check(h5, str(tmp_path / "short")) == "19 records, expected 20"
    _write(str(tmp_path / "dup" / "d.tfrecord"), cols, [0] + list(range(1, 19)) + [0])
    assert peer_check.check(h5, str(tmp_path / "dup")) == "the ids are not each row number once"
    assert peer_check.check(h5, str(tmp_path / "none")) == "no TFRecord files in the output"
