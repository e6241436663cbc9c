"""augment writes the reader files of its own shards when the input had them: TFDS's dataset_info.json and
features.json (a --splits or --tfds_name output stays tfds.builder_from_directory-loadable, with the new features
and the same split counts and shard lengths), and tfrecord2idx index files (--index) that match the new shards,
read by the `tfrecord` package's multi-worker path and reader.RandomAccess. Never the input's, copied stale."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import convert, run_command
from tests.test_augment import run_augment, tf  # noqa: F401 - the shared TF fixture
from tests.test_index import in_tfrecord_package, tfrecord2idx
from tests.test_splits_tfds import check_tfds_values, in_order, make_npz
from tfrecord_etl.pipelines import verify as verify_module
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import metadata

ROWS = 120
FN = ["--fn", "tests.augment_fns:label_times_two", "--fn_inputs", "label", "--constants", "year=2026,src=tfx"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Two TFDS directories written with --index: a --splits output (named after its directory) and a --tfds_name
    directory of two splits written by two runs."""
    tmp = tmp_path_factory.mktemp("augreaders")
    data = make_npz(tmp / "in.npz", rows=ROWS)
    test = make_npz(tmp / "test.npz", rows=30, start=10_000, seed=1)
    assert (
        convert(
            tmp / "in.npz",
            tmp / "splits",
            "--splits",
            "train=3,test=1",
            "--split_key",
            "uid",
            "--num_shards",
            "2",
            "--provenance",
            "--index",
        )[0]
        == 0
    )
    assert (
        convert(
            tmp / "in.npz",
            tmp / "toy",
            "--tfds_name",
            "toy",
            "--split",
            "train",
            "--num_shards",
            "2",
            "--provenance",
            "--index",
        )[0]
        == 0
    )
    assert (
        convert(tmp / "test.npz", tmp / "toy", "--tfds_name", "toy", "--split", "test", "--provenance", "--index")[0]
        == 0
    )
    return tmp, {"splits": {"train": data, "test": data}, "toy": {"train": data, "test": test}}


@pytest.fixture(scope="module")
def rewritten(inputs):
    """Each input augmented in rewrite mode: --fn (label2 = 2 * label) and constants (year, src)."""
    tmp, _ = inputs
    for name in ("splits", "toy"):
        assert run_augment(tmp / name, tmp / f"{name}-aug", *FN)[0] == 0
    return tmp


def split_rows(out, split):
    return [int(e["_source/row"]) for e in reader.iter_numpy(str(out), split=split)]


@pytest.mark.parametrize("name, dataset", [("splits", "splits"), ("toy", "toy")])
def test_rewrite_keeps_a_tfds_directory_loadable_with_the_new_features(inputs, rewritten, name, dataset):
    import tensorflow_datasets as tfds

    tmp, sources = inputs
    before, after = tfds.builder_from_directory(str(tmp / name)), tfds.builder_from_directory(str(tmp / f"{name}-aug"))
    assert after.info.name == before.info.name == dataset
    assert set(after.info.features) == set(before.info.features) | {"label2", "year", "src"}
    assert {n: s.shard_lengths for n, s in after.info.splits.items()} == {
        n: s.shard_lengths for n, s in before.info.splits.items()
    }
    meta = metadata.load(str(tmp / f"{name}-aug"))
    assert {n: s.num_examples for n, s in after.info.splits.items()} == {
        n: v["num_records"] for n, v in meta["splits"].items()
    }
    assert {n: s.num_bytes for n, s in after.info.splits.items()} == {
        n: sum(sh["bytes"] for sh in meta["shards"] if sh["split"] == n) for n in meta["splits"]
    }
    assert meta["tfds"] == {"name": dataset, "version": "1.0.0", "files": ["features.json", "dataset_info.json"]}
    for split in ("train", "test"):
        rows = split_rows(tmp / name, split)
        got = check_tfds_values(
            after.as_dataset(split=split, shuffle_files=False, read_config=in_order()), sources[name][split], rows
        )  # the old features, exactly
        for e, r in zip(got, rows):
            assert e["label2"] == 2 * sources[name][split]["label"][r] and e["label2"].dtype == np.int64
            assert e["year"] == 2026 and e["src"] == b"tfx"
    # TFDS's slicing reads the shard lengths
    assert len(list(after.as_dataset(split="train[:10]"))) == 10


def test_rewrite_writes_new_index_files_that_the_tfrecord_package_and_random_access_read(inputs, rewritten):
    """Index files of the new shards (as the package's own tfrecord2idx writes them, never the input's); the
    package's TFRecordDataset / MultiTFRecordDataset loaders, as each of 2 DataLoader workers runs them, read every
    record once with the exact old and new values; reader.RandomAccess too; verify checks them."""
    tmp, sources = inputs
    out, data = tmp / "splits-aug", sources["splits"]["train"]
    meta, old = metadata.load(str(out)), metadata.load(str(tmp / "splits"))
    assert [s["index"] for s in meta["shards"]] == [s["index"] for s in old["shards"]]
    for shard, was in zip(meta["shards"], old["shards"]):
        text = (out / shard["index"]).read_text()
        assert text == tfrecord2idx(out / shard["file"]) != (tmp / "splits" / was["index"]).read_text()
    description = reader.torch_description(str(out), features=["_source/row", "label", "label2", "year"])
    assert description == {"_source/row": "int", "label": "int", "label2": "int", "year": "int"}
    rows = in_tfrecord_package(
        WORKERS, out, json.dumps(description), json.dumps([[s["file"], s["index"]] for s in meta["shards"]])
    )
    assert sorted(r[0] for r in rows["single"]) == list(range(ROWS))  # each record once over the 2 workers
    for row, label, label2, year in rows["single"]:
        assert label == data["label"][row] and label2 == 2 * label and year == 2026
    for split in ("train", "test"):
        assert sorted(rows["multi"][split]) == sorted(split_rows(tmp / "splits", split))
    ra = reader.RandomAccess(str(out))
    in_order_rows = list(reader.iter_numpy(str(out)))
    assert len(ra) == ROWS
    for i in (0, 1, 44, 45, ROWS - 1):
        got, want = ra[i], in_order_rows[i]
        assert got.keys() == want.keys() >= {"label2", "year", "src", "image"}
        r = int(got["_source/row"])
        np.testing.assert_array_equal(got["image"], data["image"][r])
        assert int(got["label2"]) == 2 * data["label"][r] and got["src"] == b"tfx"
    assert run_command(verify_module.main, [out])[0] == 0


# the package's torch datasets call these loaders in each DataLoader worker with shard=(worker id, workers)
# (tfrecord/torch/dataset.py); PyTorch is not in the test extras, so the loaders are called as the workers would
WORKERS = """
import json, sys
from tfrecord.reader import multi_tfrecord_loader, tfrecord_loader
out, description, shards = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
single = [[int(e[k][0]) for k in ("_source/row", "label", "label2", "year")]
          for data, index in shards for w in range(2)
          for e in tfrecord_loader(out + "/" + data, out + "/" + index, description, shard=(w, 2))]
multi = {}
for split in ("train", "test"):
    ids = {d.rpartition(".tfrecord-")[2]: 1.0 for d, _ in shards if d.startswith(f"data-{split}.")}
    multi[split] = [int(e["_source/row"][0]) for w in range(2) for e in multi_tfrecord_loader(
        out + f"/data-{split}.tfrecord-{{}}", out + f"/data-{split}.idx-{{}}", ids, description, infinite=False,
        shard=(w, 2))]
print(json.dumps({"single": single, "multi": multi}))
"""


def test_torch_dataloader_workers_read_the_new_index_files(inputs, rewritten):
    """The package's TFRecordDataset in a DataLoader of 2 workers, per augmented shard with its new index file."""
    pytest.importorskip("torch", reason="PyTorch is not in the test extras (tests/test_torch_io.py)")
    tmp, _ = inputs
    out = tmp / "splits-aug"
    meta = metadata.load(str(out))
    rows = in_tfrecord_package(
        TORCH,
        out,
        json.dumps(reader.torch_description(str(out), features=["_source/row"])),
        json.dumps([[s["file"], s["index"]] for s in meta["shards"]]),
    )
    assert sorted(rows) == list(range(ROWS))  # each record once over the 2 workers


TORCH = """
import json, sys, torch
from tfrecord.torch.dataset import TFRecordDataset
out, description, shards = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
rows = []
for data, index in shards:
    loader = torch.utils.data.DataLoader(TFRecordDataset(out + "/" + data, out + "/" + index, description),
                                         batch_size=8, num_workers=2)
    rows += [int(r) for batch in loader for r in batch["_source/row"].reshape(-1)]
print(json.dumps(rows))
"""


def test_sidecar_is_tfds_loadable_with_the_new_features_aligned_with_the_input(inputs, tmp_path, capsys, tf):
    """A sidecar of a TFDS directory: TFDS loads it (the new features, the input's splits and shard lengths), and
    zipped with the input's dataset (TFDS's default reading) each record meets its input record; its index files
    match its shards."""
    import tensorflow_datasets as tfds

    tmp, _ = inputs
    side = tmp_path / "side"
    code, stdout, err = run_augment(tmp / "toy", side, "--mode", "sidecar", *FN, capsys=capsys)
    assert code == 0, err
    assert f"tfds: tfds.builder_from_directory('{side}') loads toy (the new features only" in stdout
    assert "index files: 3 (tfrecord2idx of the new shards, one beside each)" in stdout
    base, builder = tfds.builder_from_directory(str(tmp / "toy")), tfds.builder_from_directory(str(side))
    assert set(builder.info.features) == {"label2", "year", "src"}
    assert {n: s.shard_lengths for n, s in builder.info.splits.items()} == {
        n: s.shard_lengths for n, s in base.info.splits.items()
    }
    for split in ("train", "test"):
        pairs = list(
            tfds.as_numpy(tf.data.Dataset.zip((base.as_dataset(split=split), builder.as_dataset(split=split))))
        )
        assert len(pairs) == base.info.splits[split].num_examples
        for old, new in pairs:
            assert new["label2"] == 2 * old["label"] and new["year"] == 2026 and new["src"] == b"tfx"
    meta = metadata.load(str(side))
    for shard in meta["shards"]:
        assert (side / shard["index"]).read_text() == tfrecord2idx(side / shard["file"])
    assert run_command(verify_module.main, [side])[0] == 0


@pytest.mark.parametrize(
    "flags, tfds_why, index_why",
    [
        (
            ["--constants", "year=1", "--output_compression", "gzip"],
            "no dataset_info.json: TFDS reads uncompressed shards only, these are gzip",
            "none: the output is gzip and index files give byte offsets into uncompressed shards",
        ),
        (
            ["--constants", "year=1,ok=true:bool", "--feature_encodings", "ok=packbits"],
            (
                "no dataset_info.json: feature 'ok' cannot be described to TFDS: the packbits encoding has no TFDS feature"
            ),
            None,
        ),
    ],
)
def test_reader_files_that_cannot_be_written_are_left_out_and_said(
    inputs, tmp_path, capsys, flags, tfds_why, index_why
):
    tmp, _ = inputs
    out = tmp_path / "aug"
    code, stdout, err = run_augment(tmp / "toy", out, *flags, capsys=capsys)
    assert code == 0, err
    assert f"tfds: {tfds_why}" in stdout
    assert not (out / "dataset_info.json").exists() and not (out / "features.json").exists()
    meta = metadata.load(str(out))
    assert "tfds" not in meta
    if index_why:
        assert f"index files: {index_why}" in stdout
        assert not list(out.glob("*.idx*")) and not any("index" in s for s in meta["shards"])
    else:
        assert sorted(p.name for p in out.glob("*.idx*")) == sorted(s["index"] for s in meta["shards"])


def test_a_pattern_selecting_part_of_a_split_gets_no_tfds_files(inputs, tmp_path, capsys):
    tmp, _ = inputs
    out = tmp_path / "aug"
    code, stdout, err = run_augment(
        tmp / "toy" / "toy-train.tfrecord-00001-of-00002", out, "--constants", "year=1", capsys=capsys
    )
    assert code == 0, err
    assert (
        "tfds: no dataset_info.json: the input holds 1 shard of split 'train' and "
        "'toy-train.tfrecord-00001-of-00002' is not shard 0 of 1 (augment the whole directory)"
    ) in stdout
    assert not (out / "dataset_info.json").exists()
    assert [p.name for p in out.glob("*.idx*")] == ["toy-train.idx-00001-of-00002"]


def test_overwrite_writes_the_other_generation_s_names_into_the_tfds_template(inputs, tmp_path, capsys):
    """Augmenting again over an augmented output writes the -g1 names; TFDS's file template and the index files
    follow them, and the replaced output's index files are removed."""
    import tensorflow_datasets as tfds

    tmp, sources = inputs
    out = tmp_path / "aug"
    assert run_augment(tmp / "toy", out, "--constants", "year=1")[0] == 0
    code, _, err = run_augment(tmp / "toy", out, "--constants", "year=2", "--overwrite", capsys=capsys)
    assert code == 0, err
    meta = metadata.load(str(out))
    assert all(s["file"].startswith("toy-g1-") and s["index"].startswith("toy-g1-") for s in meta["shards"])
    assert sorted(p.name for p in out.glob("*.idx*")) == sorted(s["index"] for s in meta["shards"])
    builder = tfds.builder_from_directory(str(out))
    got = check_tfds_values(
        builder.as_dataset(split="test", shuffle_files=False, read_config=in_order()),
        sources["toy"]["test"],
        split_rows(tmp / "toy", "test"),
    )
    assert [int(e["year"]) for e in got] == [2] * 30


def test_a_collection_s_spans_get_new_index_files_read_by_random_access(tmp_path, capsys):
    """A collection of --index spans, augmented span by span: each augmented span has its own index files, and
    reader.RandomAccess over the augmented collection (one global index across the spans) reads the exact rows."""
    from tests.test_collection_read import add_span, span_arrays

    arrays = {3: span_arrays(3, 20), 5: span_arrays(5, 13)}
    for span, data in arrays.items():
        add_span(tmp_path / "coll", tmp_path / "raw", span, data)
    code, _, err = run_augment(
        tmp_path / "coll",
        tmp_path / "aug",
        "--fn",
        "tests.augment_fns:label_times_two",
        "--fn_inputs",
        "label",
        capsys=capsys,
    )
    assert code == 0, err
    for span in arrays:
        out = tmp_path / "aug" / f"span-{span}"
        meta = metadata.load(str(out))
        assert len(meta["shards"]) == 2
        for shard in meta["shards"]:
            assert (out / shard["index"]).read_text() == tfrecord2idx(out / shard["file"])
    ra = reader.RandomAccess(str(tmp_path / "aug"))
    want = np.concatenate([arrays[3]["label"], arrays[5]["label"]])
    x = np.concatenate([arrays[3]["x"], arrays[5]["x"]])
    assert len(ra) == 33
    for i in range(33):
        assert int(ra[i]["label"]) == want[i] and int(ra[i]["label2"]) == 2 * want[i]
        np.testing.assert_array_equal(ra[i]["x"], x[i])
