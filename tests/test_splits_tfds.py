"""--splits (TFX hash buckets), --split, and --tfds_name outputs that tfds.builder_from_directory loads as they are
(TFX's split layout and TFDS's file template)."""

from __future__ import annotations

import bisect
import hashlib
import json

import numpy as np
import pytest

from tests.conftest import convert, run_command
from tests.test_augment import tf  # noqa: F401 - the shared TF fixture
from tfrecord_etl.pipelines import verify as verify_module
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.output import metadata

ROWS = 600


def make_npz(path, rows=ROWS, start=0, seed=0):
    rng = np.random.default_rng(seed)
    data = {
        "image": rng.integers(0, 256, (rows, 6, 6, 3), dtype=np.uint8),  # tensor under auto
        "label": np.arange(start, start + rows, dtype=">i8") * 7 % 11,  # the split key: repeated values
        "uid": np.array([f"id-{i:05d}".encode() for i in range(start, start + rows)], dtype="S8"),
        "emb": rng.standard_normal((rows, 4)).astype("<f4"),
        "weight": rng.standard_normal(rows).astype(">f8"),  # tensor (float64)
        "flag": (np.arange(start, start + rows) % 3 == 0),
        "caption": np.array([f"caption {i}" for i in range(start, start + rows)]),  # <U..: TFDS Text
    }
    np.savez(path, **data)
    return data


def tfx_split(feature_bytes: bytes, buckets: list[int]) -> int:
    """TFX ExampleGen's _PartitionFn (tfx/components/example_gen/base_example_gen_executor.py), verbatim."""
    bucket = int(hashlib.sha256(feature_bytes).hexdigest(), 16) % buckets[-1]
    return bisect.bisect(buckets, bucket)


@pytest.fixture(scope="module")
def split_output(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("splits")
    data = make_npz(tmp / "in.npz")
    code, _, _ = convert(
        tmp / "in.npz",
        tmp / "out",
        "--splits",
        "train=8,validation=1,test=1",
        "--split_key",
        "uid",
        "--num_shards",
        "3",
        "--provenance",
        "--index",
    )
    assert code == 0
    return data, tmp


def test_each_row_lands_in_the_split_tfx_would_give_it(split_output, tf):
    data, tmp = split_output
    out = str(tmp / "out")
    meta = metadata.load(out)
    assert list(meta["splits"]) == ["train", "validation", "test"]
    names = ["train", "validation", "test"]
    seen = []
    for k, name in enumerate(names):
        got = list(reader.iter_numpy(out, split=name))
        assert len(got) == meta["splits"][name]["num_records"] and meta["splits"][name]["num_shards"] == 3
        for ex in got:
            row = int(ex["_source/row"])
            key = tf.train.Feature(bytes_list=tf.train.BytesList(value=[data["uid"][row]]))
            assert tfx_split(key.SerializeToString(deterministic=True), [8, 9, 10]) == k
            np.testing.assert_array_equal(ex["image"], data["image"][row])
            assert ex["weight"] == data["weight"][row] and ex["caption"] == data["caption"][row]
            seen.append(row)
    assert sorted(seen) == list(range(ROWS))  # every row once
    counts = [meta["splits"][n]["num_records"] for n in names]
    assert 0.7 * ROWS < counts[0] < 0.9 * ROWS and all(c > 0 for c in counts)
    assert sum(1 for _ in reader.to_tf_dataset(out, split="validation")) == counts[1]
    assert len(reader.RandomAccess(out, split="test")) == counts[2]
    with pytest.raises(SchemaError, match=r"No split 'dev' in this output; its splits are \['train', 'validation'"):
        list(reader.iter_numpy(out, split="dev"))


def test_integer_split_key_and_row_index_key_do_not_depend_on_the_shards(split_output, tf):
    _data, tmp = split_output
    membership = {}
    for shards in ("1", "4"):
        out = tmp / f"rows{shards}"
        assert convert(tmp / "in.npz", out, "--splits", "a=1,b=1", "--num_shards", shards, "--provenance")[0] == 0
        membership[shards] = {
            n: sorted(int(e["_source/row"]) for e in reader.iter_numpy(str(out), split=n)) for n in ("a", "b")
        }
    assert membership["1"] == membership["4"] and 200 < len(membership["1"]["a"]) < 400
    out = tmp / "bylabel"
    assert convert(tmp / "in.npz", out, "--splits", "a=3,b=2", "--split_key", "label", "--provenance")[0] == 0
    for k, name in enumerate(("a", "b")):
        for ex in reader.iter_numpy(str(out), split=name):
            key = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(ex["label"])]))
            assert tfx_split(key.SerializeToString(deterministic=True), [3, 5]) == k


def test_verify_checks_split_outputs_against_the_source(split_output, capsys):
    _, tmp = split_output
    code, out, _ = run_command(verify_module.main, [tmp / "out", "--source", tmp / "in.npz"], capsys)
    assert code == 0 and "600 of 600 rows compared, provenance" in out and "not listed" not in out


def test_a_splits_output_is_tfds_loadable_by_default(split_output, capsys):
    """Without --tfds_name, a --splits output gets dataset_info.json and features.json named after its directory
    (the shards keep their data- prefix, which the file template names)."""
    import tensorflow_datasets as tfds

    data, tmp = split_output
    out = tmp / "My-Splits.v2"
    code, stdout, err = convert(
        tmp / "in.npz",
        out,
        "--splits",
        "train=8,validation=1,test=1",
        "--split_key",
        "uid",
        "--num_shards",
        "2",
        "--provenance",
        capsys=capsys,
    )
    assert code == 0, err
    assert f"tfds: tfds.builder_from_directory('{out}') loads my_splits_v2 (dataset_info.json, features.json)" in stdout
    meta = metadata.load(str(out))
    assert meta["tfds"]["name"] == "my_splits_v2" and sorted(meta["tfds"]["files"]) == [
        "dataset_info.json",
        "features.json",
    ]
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.name == "my_splits_v2"
    assert {n: s.num_examples for n, s in builder.info.splits.items()} == {
        n: info["num_records"] for n, info in meta["splits"].items()
    }
    for split in ("train", "validation", "test"):
        rows = [int(e["_source/row"]) for e in reader.iter_numpy(str(out), split=split)]
        check_tfds_values(builder.as_dataset(split=split, shuffle_files=False, read_config=in_order()), data, rows)
    code, stdout, _ = run_command(verify_module.main, [out], capsys)
    assert code == 0 and "not listed" not in stdout
    # replaced by a re-run: the other generation's names (data-g1-...) are in TFDS's file template
    code, _, err = convert(
        tmp / "in.npz",
        out,
        "--splits",
        "train=1,test=1",
        "--num_shards",
        "2",
        "--provenance",
        "--overwrite",
        capsys=capsys,
    )
    assert code == 0, err
    meta = metadata.load(str(out))
    assert meta["shards"][0]["file"].startswith("data-g1-")
    builder = tfds.builder_from_directory(str(out))
    for split in ("train", "test"):
        rows = [int(e["_source/row"]) for e in reader.iter_numpy(str(out), split=split)]
        check_tfds_values(builder.as_dataset(split=split, shuffle_files=False, read_config=in_order()), data, rows)


@pytest.mark.parametrize(
    "flags, why",
    [
        (["--compression", "gzip"], "no dataset_info.json: TFDS reads uncompressed shards only, these are gzip"),
        (["--feature_encodings", "flag=packbits"], "no dataset_info.json: feature 'flag' cannot be described to TFDS"),
    ],
)
def test_a_splits_output_tfds_cannot_read_says_why(tmp_path, capsys, flags, why):
    make_npz(tmp_path / "in.npz", rows=30)
    code, stdout, err = convert(tmp_path / "in.npz", tmp_path / "out", "--splits", "a=1,b=1", *flags, capsys=capsys)
    assert code == 0, err
    assert why in stdout
    assert not (tmp_path / "out" / "dataset_info.json").exists() and "tfds" not in metadata.load(str(tmp_path / "out"))


def test_split_flag_errors(tmp_path, capsys):
    make_npz(tmp_path / "in.npz", rows=20)
    for flags, message in [
        (["--splits", "train=8"], "--splits needs at least two splits"),
        (["--splits", "train=8,te-st=2"], "split name 'te-st' must be 1-64 letters"),
        (["--splits", "train=0,test=2"], "Input should be greater than or equal to 1|must be a positive integer"),
        (["--splits", "a=1,b=1", "--split_key", "emb"], "--split_key emb: the key must be one integer or string"),
        (["--splits", "a=1,b=1", "--split_key", "nope"], "--split_key nope: no such feature"),
        (["--split_key", "label"], "--split_key decides between --splits"),
        (["--splits", "a=1,b=1", "--split", "a"], "cannot be combined"),
        (["--splits", "a=1,b=1", "--writer", "beam"], "need --writer planned"),
        (
            ["--tfds_name", "toy", "--compression", "gzip"],
            "TFDS reads TFRecord shards uncompressed (TFDS 4.9's "
            "TfRecordFileAdapter opens them with tf.data.TFRecordDataset without a compression type: gzip shards fail "
            "with DataLossError)",
        ),
        (["--tfds_name", "toy", "--feature_encodings", "flag=packbits"], "feature 'flag' cannot be described to TFDS"),
        (["--tfds_name", "Bad-Name"], "tfds_name"),
    ]:
        code, _, err = convert(tmp_path / "in.npz", tmp_path / "out", *flags, capsys=capsys)
        assert code != 0, flags
        assert any(m in err for m in message.split("|")), (flags, err)
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_a_split_named_twice_is_refused(tmp_path, capsys):
    """--splits train=8,test=1,train=1 used to keep the last weight of train (about 50/50 instead of 90/10)."""
    make_npz(tmp_path / "in.npz", rows=20)
    with pytest.raises(SystemExit) as info:  # argparse: usage and one error line, status 2
        convert(tmp_path / "in.npz", tmp_path / "out", "--splits", "train=8,test=1,train=1")
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --splits: 'train' is named twice" in err, err
    with pytest.raises(SystemExit):
        convert(tmp_path / "in.npz", tmp_path / "out", "--feature_encodings", "emb=list,emb=tensor")
    assert "'emb' is named twice" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    code, _, err = convert(
        tmp_path / "in.npz", tmp_path / "out", "--splits", "train=8,test=1,valid=1", "--num_shards", "1", capsys=capsys
    )  # distinct names still work
    assert code == 0, err


# -- TFDS ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tfds")
    train = make_npz(tmp / "train.npz")
    test = make_npz(tmp / "test.npz", rows=50, start=10_000, seed=1)
    out = tmp / "toy"
    assert (
        convert(tmp / "train.npz", out, "--tfds_name", "toy", "--split", "train", "--num_shards", "3", "--provenance")[
            0
        ]
        == 0
    )
    assert convert(tmp / "test.npz", out, "--tfds_name", "toy", "--split", "test", "--provenance")[0] == 0
    return {"train": train, "test": test}, tmp, out


def in_order():
    """TFDS interleaves 16 shards at a time; one at a time reads the records in file order."""
    import tensorflow_datasets as tfds

    return tfds.ReadConfig(interleave_cycle_length=1)


def check_tfds_values(ds, source, rows):
    import tensorflow_datasets as tfds

    got = list(tfds.as_numpy(ds))
    assert [int(e["_source"]["row"]) for e in got] == list(rows)
    for e in got:
        r = int(e["_source"]["row"])
        np.testing.assert_array_equal(e["image"], source["image"][r])
        assert e["image"].dtype == np.uint8 and e["image"].shape == (6, 6, 3)
        assert e["label"] == source["label"][r] and e["label"].dtype == np.int64
        assert e["uid"] == source["uid"][r]
        np.testing.assert_array_equal(e["emb"], source["emb"][r])
        assert e["weight"] == source["weight"][r] and e["weight"].dtype == np.float64
        assert bool(e["flag"]) == bool(source["flag"][r])
        assert e["caption"].decode() == source["caption"][r]
    return got


def test_tfds_builder_from_directory_loads_every_split_exactly(tfds_dir):
    import tensorflow_datasets as tfds

    data, _, out = tfds_dir
    builder = tfds.builder_from_directory(str(out))
    assert {n: s.num_examples for n, s in builder.info.splits.items()} == {"train": ROWS, "test": 50}
    assert builder.info.splits["train"].num_shards == 3
    check_tfds_values(
        builder.as_dataset(split="train", shuffle_files=False, read_config=in_order()), data["train"], range(ROWS)
    )
    check_tfds_values(
        builder.as_dataset(split="test", shuffle_files=False, read_config=in_order()), data["test"], range(50)
    )
    check_tfds_values(
        builder.as_dataset(split="train[:10%]", shuffle_files=False, read_config=in_order()), data["train"], range(60)
    )
    check_tfds_values(
        builder.as_dataset(split="test[-10:]", shuffle_files=False, read_config=in_order()), data["test"], range(40, 50)
    )
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["tfds"]["files"] == ["features.json", "dataset_info.json"]
    assert [r["splits"] for r in meta["runs"]] == [["train"], ["test"]]
    assert meta["rows_read"] == ROWS + 50 and meta["num_records"] == ROWS + 50
    assert len(list(reader.iter_numpy(str(out), split="test"))) == 50


def test_tfds_split_add_rules(tfds_dir, capsys):
    import tensorflow_datasets as tfds

    data, tmp, out = tfds_dir
    # a split already there: refused without --overwrite, nothing touched
    before = sorted(p.name for p in out.iterdir())
    code, _, err = convert(
        tmp / "test.npz", out, "--tfds_name", "toy", "--split", "test", "--provenance", capsys=capsys
    )
    assert code != 0 and "Split 'test' is already in this TFDS directory" in err
    assert sorted(p.name for p in out.iterdir()) == before
    # other features: refused
    np.savez(tmp / "other.npz", label=np.arange(5))
    code, _, err = convert(tmp / "other.npz", out, "--tfds_name", "toy", "--split", "extra", capsys=capsys)
    assert code != 0 and "The features differ from those of the splits already in this TFDS directory" in err
    # --overwrite replaces that split and keeps the other
    code, _, err = convert(
        tmp / "test.npz", out, "--tfds_name", "toy", "--split", "test", "--provenance", "--overwrite", capsys=capsys
    )
    assert code == 0 and "keeping 3 files of the splits already there" in err.replace(f" in {out}", " there")
    builder = tfds.builder_from_directory(str(out))
    assert {n: s.num_examples for n, s in builder.info.splits.items()} == {"train": ROWS, "test": 50}
    check_tfds_values(
        builder.as_dataset(split="train[:5]", shuffle_files=False, read_config=in_order()), data["train"], range(5)
    )
    code, stdout, _ = run_command(verify_module.main, [out], capsys)
    assert code == 0 and "not listed" not in stdout


# -- --shuffle_seed ---------------------------------------------------------------------------------------------


def rows_of(out, split=None):
    return [int(e["_source/row"]) for e in reader.iter_numpy(str(out), split=split)]


def test_shuffle_seed_shuffles_within_each_split_reproducibly(split_output, capsys):
    data, tmp = split_output
    flags = ["--splits", "train=8,validation=1,test=1", "--split_key", "uid", "--num_shards", "3", "--provenance"]
    outs = {}
    for name, extra in (
        ("s7", ["--shuffle_seed", "7"]),
        ("s7again", ["--shuffle_seed", "7"]),
        ("s8", ["--shuffle_seed", "8"]),
        (
            "s7procs",
            [
                "--shuffle_seed",
                "7",
                "--runner=DirectRunner",
                "--direct_running_mode=multi_processing",
                "--direct_num_workers=2",
            ],
        ),
    ):
        argv = [tmp / "in.npz", tmp / name, *flags, *extra]
        code, _, err = convert(*argv, capsys=capsys, beam="--direct_running_mode=multi_processing" not in extra)
        assert code == 0, err
        outs[name] = tmp / name
    files = sorted(p.name for p in outs["s7"].glob("data-*"))
    assert len(files) == 9
    for f in files:  # byte-identical for a seed, in one process or two
        assert (outs["s7"] / f).read_bytes() == (outs["s7again"] / f).read_bytes() == (outs["s7procs"] / f).read_bytes()
    assert metadata.load(str(outs["s7"]))["writer"] == "shuffled"
    for split in ("train", "validation", "test"):
        plain = rows_of(tmp / "out", split)  # the unshuffled output of the same splits
        shuffled, other_seed = rows_of(outs["s7"], split), rows_of(outs["s8"], split)
        assert sorted(shuffled) == sorted(plain) == sorted(other_seed)  # same members, every row once
        assert shuffled != plain and shuffled != other_seed
    train = rows_of(outs["s7"], "train")
    firsts = [train[i] for i in range(0, len(train), 10)]  # records from all over the input, in every shard
    assert min(firsts) < ROWS / 5 and max(firsts) > 4 * ROWS / 5
    for ex in reader.iter_numpy(str(outs["s7"]), split="test"):
        np.testing.assert_array_equal(ex["image"], data["image"][int(ex["_source/row"])])
    code, out, _ = run_command(verify_module.main, [outs["s7"], "--source", tmp / "in.npz"], capsys)
    assert code == 0 and "600 of 600 rows compared" in out


def test_shuffle_without_splits_and_in_tfds(tmp_path, capsys):
    import tensorflow_datasets as tfds

    make_npz(tmp_path / "in.npz", rows=200)
    assert (
        convert(
            tmp_path / "in.npz", tmp_path / "out", "--shuffle_seed", "1", "--num_shards", "2", "--provenance", "--index"
        )[0]
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "out").glob("data-*")) == [
        "data-00000-of-00002.idx",
        "data-00000-of-00002.tfrecord",
        "data-00001-of-00002.idx",
        "data-00001-of-00002.tfrecord",
    ]
    rows = rows_of(tmp_path / "out")
    assert sorted(rows) == list(range(200)) and rows != list(range(200))
    ra = reader.RandomAccess(str(tmp_path / "out"))
    assert [int(ra[i]["_source/row"]) for i in range(200)] == rows
    assert (
        convert(tmp_path / "in.npz", tmp_path / "toy", "--shuffle_seed", "1", "--tfds_name", "toy", "--provenance")[0]
        == 0
    )
    got = [
        int(e["_source"]["row"])
        for e in tfds.as_numpy(
            tfds.builder_from_directory(str(tmp_path / "toy")).as_dataset(
                split="train", shuffle_files=False, read_config=in_order()
            )
        )
    ]
    assert sorted(got) == list(range(200)) and got != list(range(200))
    code, _, err = convert(
        tmp_path / "in.npz", tmp_path / "b", "--shuffle_seed", "1", "--writer", "beam", capsys=capsys
    )
    assert code != 0 and "need --writer planned" in err


@pytest.mark.parametrize("encoding", ["list", "tensor", "zlib"])
def test_tfds_loads_a_feature_with_one_varying_dimension(tmp_path, encoding):
    """npz arrays mode: one example per member, shape [None, 2]: TFDS gets Tensor(shape=(None, 2)) and reshapes."""
    import tensorflow_datasets as tfds

    members = {
        "a": np.arange(6, dtype="<f4").reshape(3, 2),
        "b": np.arange(10, dtype="<f4").reshape(5, 2) * -1,
        "c": np.zeros((0, 2), "<f4"),
    }
    np.savez(tmp_path / "in.npz", **members)
    assert (
        convert(
            tmp_path / "in.npz",
            tmp_path / "out",
            "--npz_mode",
            "arrays",
            "--tfds_name",
            "ragged",
            "--encoding",
            encoding,
        )[0]
        == 0
    )
    builder = tfds.builder_from_directory(str(tmp_path / "out"))
    assert builder.info.features["array"].shape == (None, 2)
    got = {e["key"].decode(): e["array"] for e in tfds.as_numpy(builder.as_dataset(split="train"))}
    assert got.keys() == members.keys()
    for name, values in members.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], values)


def test_augment_keeps_the_splits(split_output):
    from tests.test_augment import run_augment

    _, tmp = split_output
    for mode in ("rewrite", "sidecar"):
        out = tmp / f"aug_{mode}"
        assert run_augment(tmp / "out", out, "--mode", mode, "--constants", "year=2026")[0] == 0
        meta, before = metadata.load(str(out)), metadata.load(str(tmp / "out"))
        assert meta["splits"] == before["splits"]
        assert [s["split"] for s in meta["shards"]] == [s["split"] for s in before["shards"]]
    test = list(reader.iter_numpy(str(tmp / "aug_rewrite"), split="test"))
    assert len(test) == before["splits"]["test"]["num_records"] and all(int(e["year"]) == 2026 for e in test)
