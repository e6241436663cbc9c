"""The usual shard patterns match only shards: our run marker, lock and temporaries have names no pattern of
``*.tfrecord*``, ``*tfrecord*``, ``data-*``, ``*-of-*``, ``*.gz``, ``*.deflate`` matches, in Beam's
``FileSystems.match`` and in ``tf.io.gfile.glob`` (both match names that start with a dot), on a complete output and
on one whose run is going on; Beam's ``ReadFromTFRecord`` and ``tf.data.TFRecordDataset`` read what they match. The
docs page Reading the output's plain-TensorFlow snippet reads a 2-shard output in row order."""

from __future__ import annotations

import fnmatch
import json
import os
import re

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT, convert
from tfrecord_etl.transforms.output import outdir, sink

PATTERNS = ["*.tfrecord*", "*tfrecord*", "data-*", "*-of-*", "*.gz", "*.deflate"]
ROWS = 600


def make_h5(path):
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(ROWS, dtype="<i8")
        f["x"] = np.arange(ROWS * 3, dtype="<f4").reshape(ROWS, 3)
    return path


def shard_names(out):
    return [s["file"] for s in json.loads((out / "metadata.json").read_text())["shards"]]


def matched(out, pattern):
    """Names matched by ``out/pattern`` with Beam's FileSystems.match and with tf.io.gfile.glob."""
    import tensorflow as tf
    from apache_beam.io.filesystems import FileSystems

    beam = {os.path.basename(m.path) for m in FileSystems.match([str(out / pattern)])[0].metadata_list}
    tf_names = {os.path.basename(p) for p in tf.io.gfile.glob(str(out / pattern))}
    return beam, tf_names


def read_ids_tf(paths, compression):
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(paths, compression_type=compression)
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    return [int(tf.io.parse_single_example(r, spec)["id"]) for r in ds]


def read_ids_beam(pattern):
    import apache_beam as beam
    import tensorflow as tf
    from apache_beam.io.tfrecordio import ReadFromTFRecord
    from apache_beam.testing.util import assert_that, equal_to

    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    with beam.Pipeline(runner="DirectRunner") as p:
        ids = p | ReadFromTFRecord(pattern) | beam.Map(lambda r: int(tf.io.parse_single_example(r, spec)["id"]))
        assert_that(ids, equal_to(list(range(ROWS))))


@pytest.fixture(scope="module", params=["zlib", "gzip"])
def output(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    make_h5(tmp / "in.h5")
    out = tmp / "out"
    code, _, err = convert(
        tmp / "in.h5", out, "--num_shards", "2", "--compression", request.param, "--encoding", "list"
    )
    assert code == 0, err
    return out, request.param


def check_patterns(out, shards):
    for pattern in PATTERNS:
        beam, tf_names = matched(out, pattern)
        expected = {s for s in shards if fnmatch.fnmatch(s, pattern)}
        assert beam == expected and tf_names == expected, (pattern, sorted(beam), sorted(tf_names))


def test_a_complete_output_matches_only_its_shards(output):
    out, compression = output
    names = sorted(os.listdir(out))
    assert outdir.MARKER_FILE in names and outdir.LOCK_FILE not in names
    shards = shard_names(out)
    check_patterns(out, shards)
    pattern = str(out / "*.tfrecord*")
    import tensorflow as tf

    assert read_ids_tf(sorted(tf.io.gfile.glob(pattern)), compression.upper()) == list(range(ROWS))
    read_ids_beam(pattern)


def test_an_output_during_a_run_matches_only_complete_shards(output, tmp_path):
    """A run that has taken the lock, written its marker and is writing a shard (a temporary) beside complete
    shards: the patterns match the complete shards only, which both readers read."""
    import shutil

    out, compression = output
    during = tmp_path / "during"
    during.mkdir()
    first, second = shard_names(out)
    lock = outdir.prepare(str(during), command="convert", options={}, files=shard_names(out), overwrite=False)
    try:
        shutil.copy(out / first, during / first)  # a shard the run has committed
        with pytest.raises(RuntimeError):
            with sink.committed_file(str(during / second)) as f:  # the second shard, half written
                f.write((out / second).read_bytes()[:100])
                names = os.listdir(during)
                assert outdir.LOCK_FILE in names and outdir.MARKER_FILE in names
                assert any(n.startswith(outdir.TEMP_PREFIX) for n in names)
                check_patterns(during, [first])
                import tensorflow as tf

                ids = read_ids_tf(sorted(tf.io.gfile.glob(str(during / "*.tfrecord*"))), compression.upper())
                assert ids == list(range(len(ids))) and 0 < len(ids) < ROWS
                raise RuntimeError("the run is killed")
    finally:
        lock.release()


def test_an_earlier_versions_marker_and_lock_are_still_ours(tmp_path, capsys):
    """Outputs written before the rename keep their marker (``.tfrecord-etl-run.json``): a re-run recognizes its
    files as ours and replaces them; a live lock under the old name still stops a second run."""
    make_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    code, _, err = convert(tmp_path / "in.h5", out, "--num_shards", "2", capsys=capsys)
    assert code == 0, err
    os.rename(out / outdir.MARKER_FILE, out / outdir.LEGACY_MARKER_FILE)
    legacy_temp = out / f".tmp-{shard_names(out)[0]}-{'a' * 32}"
    legacy_temp.write_bytes(b"killed attempt")
    code, _, err = convert(tmp_path / "in.h5", out, "--num_shards", "3", "--overwrite", capsys=capsys)
    assert code == 0, err
    names = set(os.listdir(out))
    assert outdir.LEGACY_MARKER_FILE not in names and legacy_temp.name not in names
    assert names == {outdir.MARKER_FILE, "metadata.json", "schema.pbtxt", *shard_names(out)}
    (out / outdir.LEGACY_LOCK_FILE).write_text(
        json.dumps(
            {
                "host": os.uname().nodename,
                "pid": os.getpid(),
                "start": outdir.process_start(os.getpid()),
                "run_id": "x",
                "since": "now",
            }
        )
    )
    code, _, err = convert(tmp_path / "in.h5", out, "--num_shards", "3", capsys=capsys)
    assert code != 0 and "Another run" in err and outdir.LEGACY_LOCK_FILE in err


def test_the_docs_plain_tensorflow_snippet_reads_rows_in_order(tmp_path, monkeypatch):
    """docs/reading.md's 'With plain TensorFlow' block, run as written on a 2-shard gzip output in ``out/``."""
    page = (ROOT / "docs" / "reading.md").read_text()
    block = re.search(r"With plain TensorFlow:\n\n(?:<!-- test -->\n)?```python\n(.*?)```", page, re.S).group(1)
    make_h5(tmp_path / "in.h5")
    code, _, err = convert(
        tmp_path / "in.h5", tmp_path / "out", "--num_shards", "2", "--compression", "gzip", "--encoding", "list"
    )
    assert code == 0, err
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "docs/reading.md", "exec"), scope)  # noqa: S102 - the page's own code
    ids = np.concatenate([batch["id"].numpy() for batch in scope["ds"]])
    np.testing.assert_array_equal(ids, np.arange(ROWS))
