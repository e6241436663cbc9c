"""Hostile and careless input layouts: an output directory inside the tree the input pattern matches, file and
directory symlinks leading out of (or around) the pattern's base, the same file matched twice, and what a failed
run leaves in the temporary directory."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from tests.conftest import convert
from tfrecord_etl.pipelines import common


def image_tree(base, classes: dict[str, int]):
    """``base/CLASS/i.png`` for ``{CLASS: count}``: small PNGs, each distinct; returns ``base``."""
    from PIL import Image
    for name, count in classes.items():
        (base / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            value = (sum(name.encode()) + 37 * i) % 256
            Image.fromarray(np.full((3, 4, 3), value, np.uint8)).save(base / name / f"{i}.png")
    return base


# ------------------------------------------------------------------------------------------ runner logs

def test_a_failed_run_leaves_no_empty_runner_log(tmp_path, capsys, monkeypatch):
    """A failed run kept its runner log even when it held nothing (every failing run left an empty
    /tmp/tfrecord-etl-*.log); a log holding more than our echoed progress lines is kept and named."""
    logs = tmp_path / "tmp"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    tree = image_tree(tmp_path / "tree", {"cat": 2})
    (tree / "cat" / "notes.png").write_bytes(b"not an image")  # fails in the pipeline, not at planning
    code, _, err = convert(tree / "*" / "*", tmp_path / "out", "--format", "files", capsys=capsys)
    assert code == 2 and "not an image Pillow can identify" in err, err
    code, _, err = convert(tree / "cat" / "0.png", tmp_path / "out2", "--format", "files", "--file_labels", "none",
                           capsys=capsys)
    assert code == 0, err
    assert sorted(p.name for p in logs.iterdir()) == []
    for written, kept in ((b"[tfrecord-etl] shards 1/2\n", False), (b"Traceback (most recent call last):\n", True)):
        common.LAST_RUN_LOG = None
        with pytest.raises(RuntimeError):
            with common._worker_stderr_to_log():
                os.write(2, written)
                raise RuntimeError("a worker failed")
        left = list(logs.glob("tfrecord-etl-*.log"))
        assert (len(left), common.LAST_RUN_LOG is not None) == ((1, True) if kept else (0, False)), written
        if kept:
            assert left[0].read_bytes() == written and common.LAST_RUN_LOG == str(left[0])
            left[0].unlink()
    capsys.readouterr()
