"""The augment command: add fields to TFRecord collections written by convert, by plain TensorFlow and by
TFX, in rewrite and sidecar modes, on DirectRunner; read back with plain TensorFlow."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, fixture_file, run_command
from tfrecord_etl.pipelines import augment as augment_main, common
from tfrecord_etl.transforms import augment, codec, reader
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError

PENGUIN = "tfx/components/testdata/penguin/data/Split-train/data_tfrecord-00000-of-00001.gz"
ROWS = 300  # records of the generated collections: ids 0..299 in shard order


@pytest.fixture(scope="module")
def tf():
    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def run_augment(input_, output_dir, *flags, capsys=None):
    return run_command(augment_main.main, ["--input", input_, "--output_dir", output_dir, *flags, *BEAM_FLAGS], capsys)


def tf_records(tf, files, compression=""):
    """Every serialized record of ``files``, in order, read with tf.data."""
    return [r.numpy() for r in tf.data.TFRecordDataset([str(f) for f in files], compression_type=compression)]


def tf_parse(tf, records, spec):
    """Plain tf.io.parse_example over all records; numpy values (VarLen features densified)."""
    parsed = tf.io.parse_example(tf.constant(records), spec)
    return {k: (tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v).numpy() for k, v in parsed.items()}


def entry_names(record):
    return [codec.entry_name(record, span) for _, span in codec.split_feature_entries(record)]


def assert_old_bytes_kept(inputs, outputs, names, prefix=True):
    """Old features byte-identical record by record; with ``prefix`` the old record is the output's start."""
    assert len(inputs) == len(outputs)
    for old, new in zip(inputs, outputs):
        a, b = codec.split_features(old), codec.split_features(new)
        for name in names:
            assert old[slice(*a[name])] == new[slice(*b[name])], name
        if prefix:
            assert new.startswith(old)


def write_foreign(tf, directory, names, compression="", late_at=None):
    """Shards written by plain tf.io.TFRecordWriter: ``id`` int64, ``x`` float (3), ``name`` bytes and
    ``empty`` (a Feature with no kind set, as some TFX Examples carry); 150 records per shard."""
    directory.mkdir(parents=True, exist_ok=True)
    i = 0
    for name in names:
        with tf.io.TFRecordWriter(str(directory / name), options=compression or None) as w:
            for _ in range(ROWS // len(names)):
                f = {
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i / 2, -i])),
                    "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"n%d" % i])),
                    "empty": tf.train.Feature(),
                }
                if i == late_at:
                    f["late"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))
                w.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
                i += 1
    return sorted(directory.iterdir())


def foreign_spec(tf):
    return {
        "id": tf.io.FixedLenFeature([1], tf.int64),
        "x": tf.io.FixedLenFeature([3], tf.float32),
        "name": tf.io.FixedLenFeature([1], tf.string),
        "empty": tf.io.VarLenFeature(tf.string),
    }


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A convert output: 2 shards of 150 records, tensor encoding; ``id`` = row, ``x`` (3,) float32."""
    tmp = tmp_path_factory.mktemp("conv")
    ids = np.arange(ROWS, dtype="<i8")
    np.savez(
        tmp / "in.npz",
        id=ids,
        x=np.stack([ids, ids / 2, -ids], axis=1).astype("<f4"),
        name=np.array([b"n%d" % i for i in ids], dtype="S4"),
    )
    code, _, _ = convert(tmp / "in.npz", tmp / "out", "--num_shards", "2")
    assert code == 0
    return tmp / "out"


@pytest.fixture(scope="module")
def foreign_gzip(tf, tmp_path_factory):
    d = tmp_path_factory.mktemp("foreign_gz")
    return write_foreign(tf, d / "in", ["part-00000-of-00002.tfrecord.gz", "part-00001-of-00002.tfrecord.gz"], "GZIP")


@pytest.fixture(scope="module")
def foreign_plain(tf, tmp_path_factory):
    d = tmp_path_factory.mktemp("foreign_plain")
    return write_foreign(tf, d / "in", ["part-00000", "part-00001"])  # no suffix: detected from the bytes


# ----------------------------------------------------------------------------------------------
# Rewrite mode
# ----------------------------------------------------------------------------------------------


def test_rewrite_convert_output_fn_per_example_position_join_constants(converted, tmp_path, tf, capsys):
    np.save(tmp_path / "labels.npy", (np.arange(ROWS) * 10).astype(">i4"))  # big-endian source
    out = tmp_path / "out"
    code, stdout, err = run_augment(
        converted,
        out,
        "--fn",
        "tests.augment_fns:add_one",
        "--fn_inputs",
        "id",
        "--join_input",
        tmp_path / "labels.npy",
        "--join_fields",
        "array=label",
        "--constants",
        "w=0.5:float32,src=conv",
        "--output_compression",
        "gzip",
        capsys=capsys,
    )
    assert code == 0, err
    assert "records in / out: 300 / 300" in stdout
    in_files = sorted(converted.glob("*.tfrecord"))
    out_files = sorted(out.glob("*.tfrecord.gz"))
    assert [f.name for f in out_files] == [f.name + ".gz" for f in in_files]  # same names, suffix swapped
    meta = json.loads((out / "metadata.json").read_text())
    assert [f["name"] for f in meta["features"]] == ["id", "x", "name", "id_plus_one", "label", "w", "src"]
    assert [s["records"] for s in meta["shards"]] == [150, 150] and meta["compression"] == "gzip"
    # plain TensorFlow: the old bytes are the start of each new record; the new values are right
    old, new = tf_records(tf, in_files), tf_records(tf, out_files, "GZIP")
    assert_old_bytes_kept(old, new, ["id", "x", "name"])
    parsed = tf_parse(tf, new, reader.tf_feature_spec(str(out)))
    ids = np.array([np.frombuffer(v, "<i8")[0] for v in parsed["id"]])
    np.testing.assert_array_equal(ids, np.arange(ROWS))
    np.testing.assert_array_equal([np.frombuffer(v, "<i8")[0] for v in parsed["id_plus_one"]], ids + 1)
    np.testing.assert_array_equal([np.frombuffer(v, "<i4")[0] for v in parsed["label"]], ids * 10)
    np.testing.assert_array_equal([np.frombuffer(v, "<f4")[0] for v in parsed["w"]], 0.5)
    assert set(parsed["src"].tolist()) == {b"conv"}
    # and our reader restores dtypes and shapes from the metadata
    first = next(reader.iter_numpy(str(out)))
    assert first["label"].dtype == np.dtype("<i4") and first["id_plus_one"].shape == ()


def test_rewrite_tf_written_uncompressed_position_join_with_counting(foreign_plain, tmp_path, tf):
    np.savez(
        tmp_path / "extra.npz",
        w=np.linspace(0, 1, ROWS, dtype="<f4"),
        v=np.arange(ROWS * 2, dtype="<i8").reshape(ROWS, 2),
    )
    out = tmp_path / "out"
    code, _, err = run_augment(
        str(foreign_plain[0].parent / "part-*"),
        out,
        "--join_input",
        tmp_path / "extra.npz",
        "--encoding",
        "list",
        "--constants",
        "one=1:int8",
        "--output_compression",
        "zlib",
    )
    assert code == 0, err
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.deflate", "part-00001.deflate"]
    old, new = tf_records(tf, foreign_plain), tf_records(tf, sorted(out.glob("part-*")), "ZLIB")
    assert_old_bytes_kept(old, new, ["id", "x", "name", "empty"])
    spec = {
        **foreign_spec(tf),
        "w": tf.io.FixedLenFeature([], tf.float32),
        "v": tf.io.FixedLenFeature([2], tf.int64),
        "one": tf.io.FixedLenFeature([], tf.int64),
    }
    parsed = tf_parse(tf, new, spec)
    np.testing.assert_array_equal(parsed["id"][:, 0], np.arange(ROWS))  # shard order = record order
    np.testing.assert_array_equal(parsed["w"], np.linspace(0, 1, ROWS, dtype="<f4"))
    np.testing.assert_array_equal(parsed["v"], np.arange(ROWS * 2).reshape(ROWS, 2))
    assert set(parsed["one"].tolist()) == {1}
    meta = json.loads((out / "metadata.json").read_text())
    feats = {f["name"]: f for f in meta["features"]}
    assert feats["id"] == {"name": "id", "dtype": "<i8", "shape": [1], "encoding": "list"}  # inferred
    assert feats["empty"]["shape"] == [None]  # a Feature with no kind set is tolerated
    assert meta["augment"]["input_features_inferred"] is True
    assert len(list(reader.iter_numpy(str(out)))) == ROWS


def test_replace_fields_removes_the_old_value(foreign_gzip, tmp_path, tf):
    out = tmp_path / "out"
    code, _, err = run_augment(
        str(foreign_gzip[0].parent / "*.gz"),
        out,
        "--fn",
        "tests.augment_fns:double_x",
        "--fn_inputs",
        "x",
        "--replace_fields",
        "x",
        "--encoding",
        "list",
    )
    assert code == 0, err
    old, new = tf_records(tf, foreign_gzip, "GZIP"), tf_records(tf, sorted(out.glob("*.gz")), "GZIP")
    assert_old_bytes_kept(old, new, ["id", "name", "empty"], prefix=False)
    for record in new:
        assert entry_names(record).count("x") == 1  # really removed, not shadowed
    parsed = tf_parse(tf, new, foreign_spec(tf))
    ids = parsed["id"][:, 0].astype(np.float32)
    np.testing.assert_array_equal(parsed["x"], 2 * np.stack([ids, ids / 2, -ids], axis=1))


def test_duplicate_name_is_refused_before_any_output(converted, tmp_path, capsys):
    code, _, err = run_augment(converted, tmp_path / "out", "--constants", "id=1", capsys=capsys)
    assert code == 2
    assert "SchemaError: New feature 'id' already exists in the input" in err and "--replace_fields id" in err
    assert not (tmp_path / "out").exists()


def test_duplicate_name_beyond_the_sample_is_refused_per_record(tf, tmp_path, capsys, monkeypatch):
    files = write_foreign(tf, tmp_path / "in", ["a.tfrecord", "b.tfrecord"], late_at=120)
    monkeypatch.setattr(augment.collection, "INFER_RECORDS", 10)  # 'late' is not in the sampled records
    out = tmp_path / "out"
    code, _, err = run_augment(str(tmp_path / "in" / "*.tfrecord"), out, "--constants", "late=1", capsys=capsys)
    assert code == 2
    assert "New feature 'late' already exists in the record" in err
    assert f"file='{files[0]}'" in err and "record=120" in err and "feature='late'" in err
    assert not (out / "metadata.json").exists() and not (out / "a.tfrecord").exists()
    assert not list(out.glob(".tmp-*"))


def test_interrupted_run_leaves_nothing_final(converted, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_augment(
        converted, out, "--fn", "tests.augment_fns:fail_late", "--fn_inputs", "id", "--batch_size", "50", capsys=capsys
    )
    assert code == 2
    assert "boom at id 250" in err and "record=100" in err  # id 250 is record 100 of the second shard
    failing = sorted(converted.glob("*.tfrecord"))[1].name
    assert not (out / "metadata.json").exists()
    assert not (out / failing).exists() and not list(out.glob(".tmp-*"))
    with pytest.raises(Exception, match="No metadata.json"):
        next(reader.iter_numpy(str(out)))
    # a re-run (fixed function) over the leftovers needs no cleanup
    code, _, err = run_augment(converted, out, "--fn", "tests.augment_fns:add_one", "--fn_inputs", "id", capsys=capsys)
    assert code == 0, err
    assert (out / "metadata.json").exists() and (out / failing).exists()


# ----------------------------------------------------------------------------------------------
# Sidecar mode and joins by key
# ----------------------------------------------------------------------------------------------


def test_sidecar_tf_written_gzip_fn_batch_and_bytes_key_join(foreign_gzip, tmp_path, tf):
    rng = np.random.default_rng(0)
    order = rng.permutation(ROWS)
    np.savez(
        tmp_path / "scores.npz",
        name=np.array([b"n%d" % i for i in order], dtype="S4"),
        score=(order * 0.25).astype("<f8"),
    )
    before = [reader.file_crc32c(str(f)) for f in foreign_gzip]
    out = tmp_path / "side"
    code, _, err = run_augment(
        str(foreign_gzip[0].parent / "*.gz"),
        out,
        "--mode",
        "sidecar",
        "--fn",
        "tests.augment_fns:norm_and_tag",
        "--fn_inputs",
        "id,x",
        "--fn_batch",
        "--join_input",
        tmp_path / "scores.npz",
        "--join_by",
        "key",
        "--key_feature",
        "name",
        "--join_key",
        "name",
        "--encoding",
        "list",
        "--allow_lossy",
        "score",
    )
    assert code == 0, err
    assert [reader.file_crc32c(str(f)) for f in foreign_gzip] == before  # inputs never modified
    side_files = sorted(out.glob("*.gz"))
    assert [f.name for f in side_files] == [f.name for f in foreign_gzip]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["input"], s["records"], (s["bytes"], s["crc32c"])) for s in manifest["shards"]] == [
        (str(f), 150, c) for f, c in zip(foreign_gzip, before)
    ]
    sidecar = tf_records(tf, side_files, "GZIP")
    assert {tuple(sorted(codec.split_features(r))) for r in sidecar} == {("score", "tag", "x_norm")}
    # plain tf.data: zip the two collections, join each pair of serialized records, parse
    ds = tf.data.Dataset.zip(
        (
            tf.data.TFRecordDataset([str(f) for f in foreign_gzip], compression_type="GZIP"),
            tf.data.TFRecordDataset([str(f) for f in side_files], compression_type="GZIP"),
        )
    )
    merged = [r.numpy() for r in ds.map(lambda a, b: tf.strings.join([a, b]))]
    spec = {
        **foreign_spec(tf),
        "x_norm": tf.io.FixedLenFeature([], tf.float32),
        "tag": tf.io.FixedLenFeature([], tf.string),
        "score": tf.io.FixedLenFeature([], tf.float32),
    }
    parsed = tf_parse(tf, merged, spec)
    ids = parsed["id"][:, 0]
    np.testing.assert_array_equal(ids, np.arange(ROWS))
    np.testing.assert_allclose(parsed["x_norm"], np.linalg.norm(parsed["x"], axis=1), rtol=1e-6)
    assert parsed["tag"].tolist() == [b"even" if i % 2 == 0 else b"odd" for i in ids]
    np.testing.assert_array_equal(parsed["score"], ids * 0.25)
    # our readers: the manifest is checked first, then the pairs are merged
    examples = list(reader.iter_numpy_merged(str(foreign_gzip[0].parent), str(out)))
    assert len(examples) == ROWS and examples[7]["score"].dtype == np.dtype("<f8") and examples[7]["score"] == 1.75
    assert examples[7]["name"].tolist() == [b"n7"] and examples[7]["empty"].size == 0
    batch = next(iter(reader.to_tf_dataset_merged(str(foreign_gzip[0].parent / "*.gz"), str(out), batch_size=ROWS)))
    np.testing.assert_array_equal(batch["score"].numpy(), ids * 0.25)
    assert batch["x"].shape == (ROWS, 3) and batch["tag"].shape == (ROWS,)


@pytest.fixture(scope="module")
def key_source(tmp_path_factory):
    """HDF5 join source: every third id (shuffled), int32 keys, label = 2 * id (int16)."""
    path = tmp_path_factory.mktemp("keys") / "keys.h5"
    ids = np.random.default_rng(1).permutation(np.arange(0, ROWS, 3)).astype("<i4")
    with h5py.File(path, "w") as f:
        f["id"] = ids
        f["label"] = (ids * 2).astype("<i2")
    return path


def test_key_join_missing_key_is_an_error(converted, key_source, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run_augment(
        converted,
        out,
        "--join_input",
        key_source,
        "--join_by",
        "key",
        "--key_feature",
        "id",
        "--join_key",
        "id",
        capsys=capsys,
    )
    assert code == 2
    assert "No row of the join source has key" in err and "--missing default" in err and "record=" in err
    assert not (out / "metadata.json").exists() and not list(out.glob("*.tfrecord"))


def test_key_join_missing_key_gets_the_default(converted, key_source, tmp_path, tf):
    out = tmp_path / "out"
    code, _, err = run_augment(
        converted,
        out,
        "--join_input",
        key_source,
        "--join_by",
        "key",
        "--key_feature",
        "id",
        "--join_key",
        "id",
        "--missing",
        "default",
        "--defaults",
        "label=-1",
    )
    assert code == 0, err
    new = tf_records(tf, sorted(out.glob("*.tfrecord")))
    assert_old_bytes_kept(tf_records(tf, sorted(converted.glob("*.tfrecord"))), new, ["id", "x", "name"])
    parsed = tf_parse(tf, new, reader.tf_feature_spec(str(out)))
    ids = np.array([np.frombuffer(v, "<i8")[0] for v in parsed["id"]])
    labels = np.array([np.frombuffer(v, "<i2")[0] for v in parsed["label"]])
    np.testing.assert_array_equal(labels, np.where(ids % 3 == 0, ids * 2, -1))


def test_position_join_row_count_mismatch(converted, foreign_plain, tmp_path, capsys):
    np.save(tmp_path / "short.npy", np.arange(ROWS - 1))
    # record counts known from the metadata: refused while planning, before any output
    code, _, err = run_augment(converted, tmp_path / "a", "--join_input", tmp_path / "short.npy", capsys=capsys)
    assert code == 2 and "The join source has 299 rows but the input has 300 records" in err
    assert not (tmp_path / "a").exists()
    # counts unknown (plain TFRecord files): refused after counting, before any shard is written
    code, _, err = run_augment(
        str(foreign_plain[0].parent / "part-*"), tmp_path / "b", "--join_input", tmp_path / "short.npy", capsys=capsys
    )
    assert code == 2 and "The join source has 299 rows but the input has 300 records" in err
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [".tf-etl-run.json"]  # only our marker


# ----------------------------------------------------------------------------------------------
# Real input: the TFX penguin shard (GZIP, 234 records, four float features and int64 species)
# ----------------------------------------------------------------------------------------------


def penguin_spec(tf):
    names = ["culmen_length_mm", "culmen_depth_mm", "flipper_length_mm", "body_mass_g"]
    return {
        **{n: tf.io.FixedLenFeature([1], tf.float32) for n in names},
        "species": tf.io.FixedLenFeature([1], tf.int64),
    }


@pytest.fixture(scope="module")
def penguin_sidecar(tmp_path_factory):
    out = tmp_path_factory.mktemp("penguin") / "side"
    code, _, err = run_augment(
        fixture_file(PENGUIN),
        out,
        "--mode",
        "sidecar",
        "--fn",
        "tests.augment_fns:mass_kg",
        "--fn_inputs",
        "body_mass_g,species",
        "--fn_batch",
        "--encoding",
        "list",
    )
    assert code == 0, err
    return out


def test_penguin_rewrite(tmp_path, tf, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_augment(
        fixture_file(PENGUIN),
        out,
        "--fn",
        "tests.augment_fns:mass_kg",
        "--fn_inputs",
        "body_mass_g,species",
        "--fn_batch",
        "--encoding",
        "list",
        "--constants",
        "source=tfx",
        capsys=capsys,
    )
    assert code == 0, err
    assert "records in / out: 234 / 234" in stdout
    old = tf_records(tf, [fixture_file(PENGUIN)], "GZIP")
    new = tf_records(tf, [out / "data_tfrecord-00000-of-00001.gz"], "GZIP")
    assert_old_bytes_kept(old, new, list(penguin_spec(tf)))
    spec = {
        **penguin_spec(tf),
        "mass_x2": tf.io.FixedLenFeature([], tf.float32),
        "is_adelie": tf.io.FixedLenFeature([], tf.int64),
        "source": tf.io.FixedLenFeature([], tf.string),
    }
    parsed = tf_parse(tf, new, spec)
    np.testing.assert_array_equal(parsed["mass_x2"], parsed["body_mass_g"][:, 0] * 2)
    np.testing.assert_array_equal(parsed["is_adelie"], parsed["species"][:, 0] == 0)
    assert 0 < parsed["is_adelie"].sum() < 234 and set(parsed["source"].tolist()) == {b"tfx"}


def test_penguin_sidecar(penguin_sidecar, tf):
    side = penguin_sidecar / "data_tfrecord-00000-of-00001.gz"
    ds = tf.data.Dataset.zip(
        (
            tf.data.TFRecordDataset(str(fixture_file(PENGUIN)), compression_type="GZIP"),
            tf.data.TFRecordDataset(str(side), compression_type="GZIP"),
        )
    )
    merged = [r.numpy() for r in ds.map(lambda a, b: tf.strings.join([a, b]))]
    spec = {
        **penguin_spec(tf),
        "mass_x2": tf.io.FixedLenFeature([], tf.float32),
        "is_adelie": tf.io.FixedLenFeature([], tf.int64),
    }
    parsed = tf_parse(tf, merged, spec)
    assert len(merged) == 234
    np.testing.assert_array_equal(parsed["is_adelie"], parsed["species"][:, 0] == 0)
    got = list(reader.iter_numpy_merged(str(fixture_file(PENGUIN)), str(penguin_sidecar)))
    assert len(got) == 234 and bool(got[0]["is_adelie"]) == (int(got[0]["species"][0]) == 0)
    batch = next(iter(reader.to_tf_dataset_merged(str(fixture_file(PENGUIN)), str(penguin_sidecar), batch_size=300)))
    np.testing.assert_array_equal(batch["mass_x2"].numpy(), parsed["mass_x2"])
    assert batch["is_adelie"].dtype == tf.bool


def test_sidecar_refuses_a_misaligned_pair(penguin_sidecar, tf, tmp_path):
    name = "data_tfrecord-00000-of-00001.gz"
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(fixture_file(PENGUIN), moved / name)
    assert len(reader.open_sidecar(str(moved), str(penguin_sidecar)).pairs) == 1  # a moved copy still pairs
    shorter = tmp_path / "shorter"
    shorter.mkdir()
    with tf.io.TFRecordWriter(str(shorter / name), options="GZIP") as w:
        for record in tf_records(tf, [fixture_file(PENGUIN)], "GZIP")[1:]:  # one record fewer
            w.write(record)
    with pytest.raises(RecordError, match="misaligned pair") as info:
        next(reader.iter_numpy_merged(str(shorter), str(penguin_sidecar)))
    assert info.value.context["shard"] == name
    with pytest.raises(RecordError, match="misaligned pair"):
        reader.to_tf_dataset_merged(str(shorter / name), str(penguin_sidecar))
    (moved / "other.gz").write_bytes((moved / name).read_bytes())
    with pytest.raises(SchemaError, match="without a sidecar shard"):
        reader.open_sidecar(str(moved), str(penguin_sidecar))


# ----------------------------------------------------------------------------------------------
# Pure functions and option checks (no pipeline run)
# ----------------------------------------------------------------------------------------------


def test_infer_feature_specs_and_lenient_decoding(tf):
    def example(**features):
        return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()

    def ints(*v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=v))

    def floats(*v):
        return tf.train.Feature(float_list=tf.train.FloatList(value=v))

    def strings(*v):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=v))

    records = [
        example(a=ints(1, 2), b=floats(1.5), c=strings(b"x"), e=tf.train.Feature()),
        example(a=ints(3), b=floats(2.5), c=strings(b"y"), e=tf.train.Feature()),
    ]
    specs = {s.name: s for s in codec.infer_feature_specs(records)}
    assert specs == {
        "a": FeatureSpec("a", "<i8", (None,), "varlen"),
        "b": FeatureSpec("b", "<f4", (1,), "list"),
        "c": FeatureSpec("c", "bytes", (1,), "list"),
        "e": FeatureSpec("e", "bytes", (None,), "varlen"),
    }
    got = codec.decode_example_lenient(records[0], list(specs.values()))
    assert got["a"].tolist() == [1, 2] and got["b"].tolist() == [1.5] and got["c"].tolist() == [b"x"]
    assert got["e"].size == 0
    mixed = records + [example(b=ints(1))]
    with pytest.raises(SchemaError, match="Feature 'b' holds float and int64 lists"):
        codec.infer_feature_specs(mixed)


def test_constants_and_output_names():
    assert augment.parse_constant("a", "7").dtype == np.int64
    assert augment.parse_constant("a", "1.5").dtype == np.float32
    assert augment.parse_constant("a", "http://h:80") == b"http://h:80"
    assert augment.parse_constant("a", "3:uint8").dtype == np.uint8
    assert augment.parse_constant("a", "true:bool") == np.array(True)
    with pytest.raises(ConfigError, match="out of range"):
        augment.parse_constant("a", "300:uint8")
    assert augment.output_name("d/x.tfrecord.gz", "gzip", "none") == "x.tfrecord"
    assert augment.output_name("d/part-0", "none", "zlib") == "part-0.deflate"
    assert augment.output_name("d/part-0.zlib", "zlib", "none") == "part-0"  # older outputs' suffix still known
    assert augment.output_name("d/a.gz", "gzip", "gzip") == "a.gz"


def test_batch_augmenter_clash_check_without_false_positives():
    coll = augment.InputCollection("in", (), (), True)
    plan = augment.AugmentPlan(
        collection=coll,
        output_dir="out",
        mode="rewrite",
        output_compression="none",
        new_specs=(FeatureSpec("label", "<i8", (), "list"),),
        constants=(("label", np.array(5, "<i8")),),
    )
    aug = augment.BatchAugmenter(plan)
    # a value that contains the key bytes of 'label' is not a 'label' feature
    decoy = codec.encode_batch(
        {"note": [codec.feature_key_pattern("label")]}, [FeatureSpec("note", "bytes", (), "list")], 1
    )[0]
    (out,) = aug.augment([decoy], "f.tfrecord", 0)
    assert out.startswith(decoy) and codec.parse_example(out)["label"][1].tolist() == [5]
    clash = codec.encode_batch({"label": np.array([1])}, [FeatureSpec("label", "<i8", (), "list")], 1)[0]
    with pytest.raises(SchemaError, match="'label' already exists in the record") as info:
        aug.augment([decoy, clash], "f.tfrecord", 40)
    assert info.value.context == {"file": "f.tfrecord", "record": 41, "feature": "label"}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--fn_inputs", "id"], "nothing to add"),
        (["--constants", "a=1", "--fn_inputs", "id"], "--fn_inputs and --fn_batch need --fn"),
        (["--constants", "a=1", "--mode", "sidecar", "--replace_fields", "a"], "--replace_fields needs --mode rewrite"),
        (["--join_input", "x.npy", "--join_by", "key"], "--join_by key needs --key_feature"),
        (["--fn", "no_such_module_xyz:f"], "Cannot import the module of --fn"),
        (["--fn", "tests.augment_fns:add_one", "--fn_inputs", "nope"], "--fn_inputs names ['nope']"),
        (["--constants", "a=1", "--replace_fields", "id"], "--replace_fields names ['id'], which are not new"),
        (["--constants", "a"], "expected NAME=VALUE"),
        (["--constants", "a=1,a=2"], "'a' is named twice"),
    ],
)
def test_option_errors_are_one_line(converted, tmp_path, capsys, flags, message):
    code, _, err = run_augment(converted, tmp_path / "out", *flags, capsys=capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_output_dir_holding_the_input_is_refused(converted, capsys):
    code, _, err = run_augment(converted, converted, "--constants", "a=1", "--overwrite", capsys=capsys)
    assert code == 2 and "An input file is inside --output_dir" in err
    assert (converted / "metadata.json").exists()


def test_help_lists_the_flags_with_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        common.run_main(augment_main.main, ["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--input",
        "--output_dir",
        "--mode",
        "--compression",
        "--output_compression",
        "--fn",
        "--fn_inputs",
        "--fn_batch",
        "--constants",
        "--join_input",
        "--join_by",
        "--key_feature",
        "--join_key",
        "--missing",
        "--defaults",
        "--replace_fields",
        "--encoding",
        "--overwrite",
        "--config",
    ):
        assert flag in text
    assert "(default: 'rewrite')" in text


def test_decode_batch_equals_decode_example_per_record():
    cases = [
        ("u1", np.arange(24, dtype="u1").reshape(3, 2, 4), "tensor"),
        ("f8", np.arange(3.0) * 1.5, "tensor"),
        ("s3", np.array([b"a", b"bc", b"def"], "S3"), "tensor"),
        ("u2", np.array(["x", "yz", "q"]), "tensor"),
        ("be", np.array([1, 2, 3], ">i8"), "tensor"),
        ("il", np.arange(6).reshape(3, 2) - 3, "list"),
        ("fl", np.arange(3, dtype="f4"), "list"),
        ("bool", np.array([True, False, True]), "list"),
        ("ul", np.arange(3, dtype=">u2") * 1000, "list"),
        ("day", np.array(["2020-01-01", "2021-05-05", "1999-12-31"], "M8[D]"), "list"),
    ]
    specs = [FeatureSpec(n, codec.normalize_dtype(a.dtype), a.shape[1:], e) for n, a, e in cases]
    specs.append(FeatureSpec("vb", "bytes", (), "list"))
    records = codec.encode_batch({**{n: a for n, a, _ in cases}, "vb": [b"p", b"", b"qq"]}, specs, 3)
    got = codec.decode_batch(records, specs)
    for spec in specs:
        want = np.stack([codec.decode_example(r, [spec])[spec.name] for r in records])
        assert got[spec.name].dtype == want.dtype and got[spec.name].tolist() == want.tolist(), spec.name
    # a bad record in a batch is named by the per-record fallback
    short = codec.encode_batch({"il": np.array([[1]])}, [FeatureSpec("il", "<i8", (1,), "list")], 1)[0]
    with pytest.raises(RecordError, match="holds 1 values, expected 2") as info:
        augment.decode_inputs([specs[5]], records + [short], "f.tfrecord", 10)
    assert info.value.context["record"] == 13 and info.value.context["file"] == "f.tfrecord"


def test_yaml_config_mappings_and_flag_precedence(tmp_path):
    from tfrecord_etl.transforms.config import parse_args

    cfg_file = tmp_path / "augment.yaml"
    cfg_file.write_text(
        "input: in/\noutput_dir: out/\nmode: sidecar\nconstants: {w: 0.5, flag: true}\n"
        "join_fields: [array=label]\nfn_inputs: [a, b]\npipeline_options: {runner: DirectRunner}\n"
    )
    cfg, beam_argv = parse_args(
        ["--config", str(cfg_file), "--mode", "rewrite", "--direct_num_workers=2"],
        augment_main.AugmentConfig,
        augment_main.AugmentOptions,
        "augment",
        "",
    )
    assert cfg.mode == "rewrite"  # the flag wins over the file
    assert cfg.constants == {"w": "0.5", "flag": "true"} and cfg.join_fields == {"array": "label"}
    assert cfg.fn_inputs == ["a", "b"] and beam_argv == ["--runner=DirectRunner", "--direct_num_workers=2"]


def test_a_directory_without_metadata_gets_a_pattern_that_matches(tmp_path, capsys):
    """Before: the hint suggested 'DIR/*.tfrecord*', which matches nothing in a TFX split directory (shards
    named data_tfrecord-00000-of-00001.gz)."""
    import shutil

    split = tmp_path / "Split-train"
    split.mkdir()
    shutil.copy(fixture_file(PENGUIN), split / "data_tfrecord-00000-of-00001.gz")
    code, _, err = run_augment(split, tmp_path / "out", "--constants", "k=1", capsys=capsys)
    assert code == 2 and f"e.g. '{split}/*.gz'" in err
    code, _, err = run_augment(f"{split}/*.gz", tmp_path / "out", "--constants", "k=1", capsys=capsys)
    assert code == 0, err  # the suggested pattern works
