"""augment with a collection --input: each selected span IN/span-N augmented into AUG/span-N and committed in
AUG/collection.json; --spans new does only the spans not augmented yet (or whose input span changed); a failing
span stops the run with the earlier spans committed. Read back with our readers and plain TensorFlow."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, run_command
from tests.test_collection_read import add_span, span_arrays
from tfrecord_etl.pipelines import augment as augment_main, common, verify as verify_main
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.output import metadata

ROWS = {3: 40, 4: 25, 7: 31}
FN = ["--fn", "tests.augment_fns:label_times_two", "--fn_inputs", "label"]


def run_augment(input_, output_dir, *flags, capsys=None):
    return run_command(augment_main.main, ["--input", input_, "--output_dir", output_dir, *flags, *BEAM_FLAGS], capsys)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("in")
    for span, rows in ROWS.items():
        add_span(tmp / "coll", tmp / "raw", span, span_arrays(span, rows))
    return tmp


def copy_source(source, tmp_path):
    shutil.copytree(source, tmp_path / "in")
    return tmp_path / "in" / "coll", tmp_path / "in" / "raw"


def want(spans):
    label = np.concatenate([span_arrays(s, ROWS.get(s, 9))["label"] for s in spans])
    x = np.concatenate([span_arrays(s, ROWS.get(s, 9))["x"] for s in spans])
    return {"label": label, "x": x, "label2": label * 2}


def shard_mtimes(directory):
    return {p.name: p.stat().st_mtime_ns for p in directory.glob("data-*")}


def test_augment_every_span_rewrite_read_back_exactly(source, tmp_path, capsys):
    coll, _ = copy_source(source, tmp_path)
    aug = tmp_path / "aug"
    code, out, err = run_augment(coll, aug, *FN, capsys=capsys)
    assert code == 0, err
    assert "augmenting 3 spans of" in out and out.count("records committed to") == 3
    committed = collection.load(str(aug))
    assert [(s["span"], s["num_records"]) for s in committed["spans"]] == [(3, 40), (4, 25), (7, 31)]
    for s in committed["spans"]:
        (row,) = s["inputs"]
        source_meta = coll / f"span-{s['span']}" / "metadata.json"
        assert row == {
            "path": str(source_meta),
            "size": source_meta.stat().st_size,
            "mtime_ns": None,
            "version": metadata.digest(source_meta.read_bytes()),
        }
    examples = list(reader.iter_numpy(str(aug)))
    expected = want([3, 4, 7])
    for key in ("label", "x", "label2"):
        np.testing.assert_array_equal(np.stack([e[key] for e in examples]), expected[key], err_msg=key)
    common.preload_tensorflow()
    import tensorflow as tf

    files = [p for d in collection.span_dirs(str(aug)) for p in metadata.shard_paths(d, metadata.load(d))]
    parsed = tf.io.parse_example(
        tf.constant([r.numpy() for r in tf.data.TFRecordDataset(files)]), reader.tf_feature_spec(str(aug))
    )
    np.testing.assert_array_equal(parsed["label2"].numpy(), expected["label2"])
    np.testing.assert_array_equal(parsed["x"].numpy(), expected["x"])
    code, out, _ = run_command(verify_main.main, [aug], capsys)
    assert code == 0 and out.splitlines()[-1].startswith(f"OK: {aug}: collection, 3 spans, 96 records")


def test_spans_new_augments_only_the_new_and_the_changed_spans(source, tmp_path, capsys):
    coll, raw = copy_source(source, tmp_path)
    aug = tmp_path / "aug"
    assert run_augment(coll, aug, *FN, "--spans", "3-4", capsys=capsys)[0] == 0
    before = {s: shard_mtimes(aug / f"span-{s}") for s in (3, 4)}
    add_span(coll, raw, 9, span_arrays(9, 9))  # a new span converted: 7 and 9 are new
    code, out, err = run_augment(coll, aug, *FN, "--spans", "new", capsys=capsys)
    assert code == 0, err
    assert "augmenting 2 spans of" in out and out.rstrip().endswith(
        f"span 9: 9 records committed to {aug / 'collection.json'}"
    )
    assert {s: shard_mtimes(aug / f"span-{s}") for s in (3, 4)} == before
    assert [s["span"] for s in collection.load(str(aug))["spans"]] == [3, 4, 7, 9]
    np.testing.assert_array_equal(
        np.stack([e["label2"] for e in reader.iter_numpy(str(aug), spans="latest:2")]), want([7, 9])["label2"]
    )
    listed = (aug / "collection.json").read_bytes()
    code, out, _ = run_augment(coll, aug, *FN, "--spans", "new", capsys=capsys)
    assert code == 0 and out.startswith("nothing new: every span of")
    assert (aug / "collection.json").read_bytes() == listed
    # span 4 re-converted from other rows: its metadata digest changes, so it is "new" again
    add_span(coll, raw, 4, span_arrays(44, 6), "--overwrite")
    code, out, _ = run_augment(coll, aug, *FN, "--spans", "new", capsys=capsys)
    assert code == 0 and "augmenting 1 span of" in out and "span 4: 6 records committed" in out
    np.testing.assert_array_equal(
        np.stack([e["label2"] for e in reader.iter_numpy(str(aug), spans=4)]), span_arrays(44, 6)["label"] * 2
    )
    assert shard_mtimes(aug / "span-3") == before[3]


def test_a_failing_span_stops_the_run_earlier_spans_stay_committed(source, tmp_path, capsys):
    coll, _ = copy_source(source, tmp_path)
    aug = tmp_path / "aug"
    code, _out, err = run_augment(
        coll, aug, "--fn", "tests.augment_fns:fail_on_span_4", "--fn_inputs", "label", capsys=capsys
    )
    assert code != 0 and "boom at label 4000" in err and "span=4" in err
    assert [s["span"] for s in collection.load(str(aug))["spans"]] == [3]
    assert not (aug / "span-7").exists()
    assert sum(1 for _ in reader.iter_numpy(str(aug))) == 40


def test_sidecar_mode_per_span_merges_with_its_input_span(source, tmp_path, capsys):
    coll, _ = copy_source(source, tmp_path)
    aug = tmp_path / "aug"
    code, _, err = run_augment(coll, aug, *FN, "--mode", "sidecar", "--spans", "latest:2", capsys=capsys)
    assert code == 0, err
    assert [s["span"] for s in collection.load(str(aug))["spans"]] == [4, 7]
    for span in (4, 7):
        merged = list(reader.iter_numpy_merged(str(coll / f"span-{span}"), str(aug / f"span-{span}")))
        np.testing.assert_array_equal(np.stack([e["label2"] for e in merged]), want([span])["label2"])
        np.testing.assert_array_equal(np.stack([e["x"] for e in merged]), want([span])["x"])
    side = list(reader.iter_numpy(str(aug)))  # the sidecar spans alone: only the new feature
    assert sorted(side[0]) == ["label2"] and len(side) == 56


def test_collection_options_refused_with_clear_errors(source, tmp_path, capsys):
    coll, _ = copy_source(source, tmp_path)
    code, _, err = run_augment(coll / "span-3", tmp_path / "a", *FN, "--spans", "3", capsys=capsys)
    assert code == 2 and "--spans needs a collection --input" in err
    code, _, err = run_augment(coll, tmp_path / "b", *FN, "--spans", "5", capsys=capsys)
    assert code == 2 and "Span 5 is not in the collection" in err
    np.savez(tmp_path / "labels.npz", y=np.arange(96))
    code, _, err = run_augment(coll, tmp_path / "c", "--join_input", tmp_path / "labels.npz", capsys=capsys)
    assert code == 2 and "--join_by position cannot augment a collection" in err
    assert run_augment(coll / "span-3", tmp_path / "plain", *FN, capsys=capsys)[0] == 0
    code, _, err = run_augment(coll, tmp_path / "plain", *FN, capsys=capsys)
    assert code == 2 and "is an output directory, not a collection" in err
    assert not any((tmp_path / p).exists() for p in ("a", "b", "c"))
