"""The encoding registry and the encodings added through it (zlib, packbits): exact round trips through the
NumPy decoder, the batch decoder and tf.data, byte compatibility with TFDS's Encoding.ZLIB, refusals, and the
whole path (convert, augment, verify, reader) on a real mask."""

from __future__ import annotations

import math
import pathlib
import zlib

import h5py
import numpy as np
import pytest

from tests.conftest import convert, fixture_file, run_command
from tests.test_codec import NUMERIC, TEXT, TIME, assert_exact, sample
from tfrecord_etl.transforms import codec, compression, reader
from tfrecord_etl.transforms.codec import ENCODINGS, FeatureSpec
from tfrecord_etl.transforms.errors import RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def encode(array, encoding, name="f"):
    spec = FeatureSpec(name, codec.normalize_dtype(array.dtype), array.shape[1:], encoding)
    return spec, codec.encode_batch({name: array}, [spec], len(array))


def tf_rows(tf, records, spec):
    """Every record decoded inside tf.data by the reader's parse spec + decode_tf."""
    parse = reader.parse_spec(tf, [spec])
    ds = tf.data.Dataset.from_tensor_slices(records).map(
        lambda r: reader.decode_tf(tf, tf.io.parse_single_example(r, parse), [spec])
    )
    return [ex[spec.name].numpy() for ex in ds]


def test_registry_is_the_one_list_of_encodings_and_config_takes_its_names():
    from tfrecord_etl.pipelines.augment import AugmentConfig
    from tfrecord_etl.transforms.config import ConvertConfig

    assert list(ENCODINGS) == ["tensor", "list", "zlib", "packbits", "varlen"]
    for name in ENCODINGS:
        assert (
            ConvertConfig(input="a.h5", output_dir="o", encoding=name, feature_encodings={"x": name}).encoding == name
        )
        assert AugmentConfig(input="a", output_dir="o", feature_encodings={"x": name}).feature_encodings == {"x": name}
    with pytest.raises(Exception, match="tensor.*list.*zlib.*packbits"):
        ConvertConfig(input="a.h5", output_dir="o", encoding="gzip")
    with pytest.raises(SchemaError, match="Unknown encoding 'gzip'"):
        codec.check_spec(FeatureSpec("x", "<f4", (), "gzip"))


def test_no_module_outside_the_registry_branches_on_an_encoding_name():
    hits = []
    for path in (ROOT / "transforms").rglob("*.py"):
        if "encodings" in path.parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "encoding ==" in line or "encoding !=" in line:
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert hits == []


# -- zlib ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("dt", NUMERIC + TEXT + TIME)
def test_zlib_round_trip_is_exact_for_every_dtype_and_byte_order(dt, order):
    dtype = np.dtype(dt).newbyteorder(order) if np.dtype(dt).itemsize > 1 else np.dtype(dt)
    src = sample(dtype)
    spec, records = encode(src, "zlib")
    assert_exact(src, [codec.decode_example(r, [spec])["f"] for r in records])
    batch = codec.decode_batch(records, [spec])["f"]
    assert_exact(src, list(batch))


@pytest.mark.parametrize("dt", ["?", "u1", "i2", ">u4", "i8", "f2", ">f4", "f8", "c8", "c16", "S5", "U3", "M8[D]"])
def test_zlib_decodes_inside_tf_data(tf, dt):
    src = sample(np.dtype(dt))
    spec, records = encode(src, "zlib")
    got = tf_rows(tf, records, spec)
    want = [codec.decode_example(r, [spec])["f"] for r in records]
    for g, w in zip(got, want):
        if w.dtype.kind in "SU":
            w = np.char.encode(w, "utf-8") if w.dtype.kind == "U" else w
            assert g.tolist() == w.tolist()
        elif w.dtype.kind in "Mm":
            assert g.tolist() == w.view("<i8").tolist()
        else:
            assert g.dtype == w.dtype and g.tobytes() == w.tobytes()


@pytest.mark.parametrize("dt", ["bool", "uint8", "int64", "float32", "float64"])
def test_zlib_value_is_byte_identical_to_tfds_encoding_zlib_with_the_zlib_backend(dt, monkeypatch):
    from tensorflow_datasets.core.features.tensor_feature import Encoding, Tensor

    monkeypatch.setenv(compression.ENV, "zlib")
    src = sample(np.dtype(dt), (5, 6, 7))
    _spec, records = encode(src, "zlib")
    feature = Tensor(shape=(6, 7), dtype=np.dtype(dt), encoding=Encoding.ZLIB)
    for row, record in zip(src, records):
        spans = codec.split_features(record)
        kind, values = codec.decode_feature(record, spans["f"])
        assert kind == "bytes" and values == [feature.encode_example(row)]


@pytest.mark.parametrize("backend", compression.available())
@pytest.mark.parametrize("dt", ["bool", "uint8", "int64", "float64"])
def test_zlib_values_of_every_backend_decode_exactly_with_tfds_and_each_other(dt, backend, monkeypatch):
    from tensorflow_datasets.core.features.tensor_feature import Encoding, Tensor

    monkeypatch.setenv(compression.ENV, backend)
    src = sample(np.dtype(dt), (5, 6, 7))
    spec, records = encode(src, "zlib")
    again = encode(src, "zlib")[1]
    assert again == records  # same backend, same level: the same bytes
    feature = Tensor(shape=(6, 7), dtype=np.dtype(dt), encoding=Encoding.ZLIB)
    for row, record in zip(src, records):
        value = codec.decode_feature(record, codec.split_features(record)["f"])[1][0]
        assert value[:1] == b"x" and zlib.decompress(value) == row.astype(np.dtype(dt).newbyteorder("<")).tobytes()
        got = np.asarray(feature.decode_example(value))
        assert got.dtype == np.dtype(dt) and got.tobytes() == row.tobytes()
    for other in compression.available():  # each backend reads what the others wrote
        monkeypatch.setenv(compression.ENV, other)
        assert_exact(src, [codec.decode_example(r, [spec])["f"] for r in records])


def test_zlib_of_a_sparse_array_is_smaller_and_a_varying_shape_round_trips():
    rng = np.random.default_rng(1)
    sparse = np.zeros((20, 64, 64), np.float32)
    sparse[rng.random(sparse.shape) < 0.01] = 1.0
    _, z = encode(sparse, "zlib")
    _, t = encode(sparse, "tensor")
    assert sum(map(len, z)) * 10 < sum(map(len, t))
    rows = [rng.integers(0, 3, (n, 3)).astype("<i4") for n in (0, 1, 5, 2)]
    spec = FeatureSpec("v", "<i4", (None, 3), "zlib")
    records = codec.encode_batch({"v": rows}, [spec], len(rows))
    for row, record in zip(rows, records):
        got = codec.decode_example(record, [spec])["v"]
        assert got.shape == row.shape and np.array_equal(got, row)


def _with_value(spec, value: bytes) -> bytes:
    """A record of ``spec`` holding one bytes value ``value`` (as another writer could produce)."""
    return codec.encode_batch({spec.name: [value]}, [FeatureSpec(spec.name, "bytes", (), "list")], 1)[0]


@pytest.mark.parametrize(
    "value,message",
    [
        (zlib.compress(b"\0" * (10**6)), r"decompresses to 16\+ bytes, expected 16"),  # a bomb stops at 16 bytes
        (zlib.compress(b"\1" * 15), "decompresses to 15 bytes, expected 16"),
        (zlib.compress(b"\1" * 16)[:-3], "a truncated stream|not a zlib stream"),
        (b"not zlib at all", "not a zlib stream"),
        (zlib.compress(b"\1" * 16) + b"tail", "decompresses to 16"),
    ],
)
def test_zlib_values_that_do_not_decompress_to_the_row_are_record_errors(value, message):
    spec = FeatureSpec("f", "<f4", (4,), "zlib")
    with pytest.raises(RecordError, match=message):
        codec.decode_example(_with_value(spec, value), [spec])
    with pytest.raises(RecordError):
        codec.decode_batch([_with_value(spec, value)], [spec])


def test_zlib_refuses_what_it_cannot_carry():
    with pytest.raises(SchemaError, match="only the list encoding"):
        codec.check_spec(FeatureSpec("s", "bytes", (), "zlib"))
    with pytest.raises(SchemaError, match="varies between examples"):
        codec.check_spec(FeatureSpec("s", None, None, "zlib"))


# -- packbits --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (1,), (7,), (8,), (9,), (3, 13), (2, 3, 17), (4, 0)])
@pytest.mark.parametrize("dt", ["?", "u1"])
def test_packbits_round_trip_is_exact_and_one_bit_per_element(tf, shape, dt):
    rng = np.random.default_rng(2)
    src = rng.integers(0, 2, (6, *shape)).astype(dt)
    spec, records = encode(src, "packbits")
    rows = [codec.decode_example(r, [spec])["f"] for r in records]
    assert_exact(src, rows)
    assert_exact(src, list(codec.decode_batch(records, [spec])["f"]))
    got = tf_rows(tf, records, spec)
    for g, s in zip(got, src):
        assert g.dtype == s.dtype and g.shape == s.shape and np.array_equal(g, s)
    full = shape or (1,)
    packed = math.prod(full[:-1]) * ((full[-1] + 7) // 8)
    kind, values = codec.decode_feature(records[0], codec.split_features(records[0])["f"])
    assert kind == "bytes" and values == [np.packbits(src[0].reshape(full), axis=-1).tobytes()]
    assert len(values[0]) == packed


def test_packbits_varying_shapes_round_trip_in_numpy_and_tf(tf):
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, 2, (n, m)).astype(bool) for n, m in ((1, 1), (3, 9), (2, 16), (0, 5))]
    spec = FeatureSpec("m", "|b1", (None, None), "packbits")
    records = codec.encode_batch({"m": rows}, [spec], len(rows))
    for row, record in zip(rows, records):
        got = codec.decode_example(record, [spec])["m"]
        assert got.shape == row.shape and np.array_equal(got, row)
    for row, got in zip(rows, tf_rows(tf, records, spec)):
        assert got.shape == row.shape and np.array_equal(got, row)


def test_packbits_refuses_other_values_and_dtypes():
    src = np.zeros((5, 4), np.uint8)
    src[3, 2] = 2
    with pytest.raises(RecordError, match="other than 0 and 1") as e:
        encode(src, "packbits")
    assert e.value.context["batch_row"] == 3
    for dtype in ("<f4", "<i2", "bytes", "|S3"):
        with pytest.raises(SchemaError, match="packbits"):
            codec.check_spec(FeatureSpec("x", dtype, (3,), "packbits"))
    with pytest.raises(SchemaError, match="known rank"):
        codec.check_spec(FeatureSpec("x", "|b1", None, "packbits"))


def test_packbits_value_of_the_wrong_size_is_a_record_error():
    spec = FeatureSpec("f", "|b1", (3, 9), "packbits")
    with pytest.raises(RecordError, match="holds 5 bytes, expected 6"):
        codec.decode_example(_with_value(spec, b"\0" * 5), [spec])
    with pytest.raises(RecordError, match="wrong size"):
        codec.decode_batch([_with_value(spec, b"\0" * 5)], [spec])


# -- the whole path ----------------------------------------------------------------------------------------


def real_mask_and_image():
    """A real photo (matplotlib's sample grace_hopper.jpg), tiled into 32x32 crops: the crops (uint8) and a
    segmentation-style mask of each (pixels brighter than the photo's median)."""
    from PIL import Image

    img = np.asarray(Image.open(fixture_file("matplotlib/mpl-data/sample_data/grace_hopper.jpg")).convert("L"))
    h, w = (img.shape[0] // 32) * 32, (img.shape[1] // 32) * 32
    crops = img[:h, :w].reshape(h // 32, 32, w // 32, 32).swapaxes(1, 2).reshape(-1, 32, 32)
    return crops, crops > np.median(img)


def test_convert_with_zlib_and_packbits_round_trips_through_every_reader_and_verify(tmp_path, tf, capsys):
    crops, mask = real_mask_and_image()
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["image"], f["mask"], f["label"] = crops, mask, np.arange(len(crops), dtype=">i8")
    out = tmp_path / "out"
    code, _, err = convert(
        tmp_path / "in.h5", out, "--feature_encodings", "image=zlib,mask=packbits", "--num_shards", "3", capsys=capsys
    )
    assert code == 0, err
    got = list(reader.iter_numpy(str(out)))
    assert len(got) == len(crops)
    for i, ex in enumerate(got):
        assert np.array_equal(ex["image"], crops[i]) and ex["mask"].dtype == bool
        assert np.array_equal(ex["mask"], mask[i]) and ex["label"] == i
    for i, ex in enumerate(reader.to_tf_dataset(str(out))):
        assert np.array_equal(ex["image"].numpy(), crops[i]) and np.array_equal(ex["mask"].numpy(), mask[i])
    # plain TensorFlow, from the metadata's recipe: decode_compressed + decode_raw; unpack the bits by hand
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    parse = {"image": tf.io.FixedLenFeature([], tf.string), "mask": tf.io.FixedLenFeature([], tf.string)}
    for i, r in enumerate(tf.data.TFRecordDataset(files)):
        ex = tf.io.parse_single_example(r, parse)
        image = tf.io.decode_raw(tf.io.decode_compressed(ex["image"], "ZLIB"), tf.uint8).numpy().reshape(32, 32)
        bits = np.unpackbits(tf.io.decode_raw(ex["mask"], tf.uint8).numpy().reshape(32, 4), axis=-1)
        assert np.array_equal(image, crops[i]) and np.array_equal(bits.astype(bool), mask[i])
    from tfrecord_etl.pipelines import verify as verify_module

    code, stdout, _ = run_command(verify_module.main, [str(out), "--source", str(tmp_path / "in.h5")], capsys)
    assert code == 0, stdout
    # a flipped bit in a mask (valid CRC) is caught by the source comparison
    meta = metadata.load(str(out))
    assert {f.name: f.encoding for f in meta["features"]} == {"image": "zlib", "mask": "packbits", "label": "list"}
    shard = sorted(out.glob("*.tfrecord"))[0]
    records = [rec for _, _, rec in reader.iter_records(str(shard))]
    spec = FeatureSpec("mask", "|b1", (32, 32), "packbits")
    flipped = mask[0].copy()
    flipped[5, 5] = not flipped[5, 5]
    new = codec.drop_features(records[0], {"mask"}) + codec.encode_batch({"mask": flipped[None]}, [spec], 1)[0]
    from tfrecord_etl.transforms.output import tfrecord

    shard.write_bytes(tfrecord.frame_records([new] + records[1:]))
    code, stdout, _ = run_command(verify_module.main, [str(out), "--source", str(tmp_path / "in.h5")], capsys)
    assert code == 1 and "mask" in stdout


def test_augment_writes_new_features_with_the_new_encodings(tmp_path, tf, capsys):
    from tests.conftest import BEAM_FLAGS
    from tfrecord_etl.pipelines import augment as augment_main

    ids = np.arange(40, dtype="<i8")
    np.save(tmp_path / "ids.npy", ids)
    src = tmp_path / "src"
    code, _, err = convert(tmp_path / "ids.npy", src, capsys=capsys)
    assert code == 0, err
    # the .npy feature is called "array"; augment_fns.mask_and_noise reads "id"
    code, _, err = run_command(
        augment_main.main,
        [
            "--input",
            str(src),
            "--output_dir",
            str(tmp_path / "side"),
            "--mode",
            "sidecar",
            "--fn",
            "tests.augment_fns:mask_and_noise_of_array",
            "--fn_inputs",
            "array",
            "--fn_batch",
            "--feature_encodings",
            "mask=packbits,noise=zlib",
            *BEAM_FLAGS,
        ],
        capsys,
    )
    assert code == 0, err
    merged = list(reader.iter_numpy_merged(str(src), str(tmp_path / "side")))
    from tests.augment_fns import mask_and_noise

    want = mask_and_noise({"id": ids})
    for i, ex in enumerate(merged):
        assert np.array_equal(ex["mask"], want["mask"][i]) and np.array_equal(ex["noise"], want["noise"][i])
    code, _, err = run_command(
        augment_main.main,
        [
            "--input",
            str(src),
            "--output_dir",
            str(tmp_path / "bad"),
            "--mode",
            "sidecar",
            "--fn",
            "tests.augment_fns:mask_and_noise_of_array",
            "--fn_inputs",
            "array",
            "--fn_batch",
            "--feature_encodings",
            "noise=packbits",
            *BEAM_FLAGS,
        ],
        capsys,
    )
    assert code != 0 and "packbits" in err and not (tmp_path / "bad").exists()
    code, _, err = run_command(
        augment_main.main,
        [
            "--input",
            str(src),
            "--output_dir",
            str(tmp_path / "bad2"),
            "--mode",
            "sidecar",
            "--fn",
            "tests.augment_fns:mask_and_noise_of_array",
            "--fn_inputs",
            "array",
            "--fn_batch",
            "--feature_encodings",
            "nope=zlib",
            *BEAM_FLAGS,
        ],
        capsys,
    )
    assert code != 0 and "nope" in err


def test_beam_writer_and_inspect_with_zlib_and_packbits(tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect as inspect_module

    crops, mask = real_mask_and_image()
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["image"], f["mask"] = crops, mask
    out = tmp_path / "out"
    code, _, err = convert(
        tmp_path / "in.h5",
        out,
        "--feature_encodings",
        "image=zlib,mask=packbits",
        "--writer",
        "beam",
        "--provenance",
        "--compression",
        "gzip",
        "--num_shards",
        "2",
        capsys=capsys,
    )
    assert code == 0, err
    got = sorted(reader.iter_numpy(str(out)), key=lambda e: int(e["_source/row"]))  # the beam writer: any order
    assert [int(e["_source/row"]) for e in got] == list(range(len(crops)))
    assert all(np.array_equal(e["image"], crops[i]) and np.array_equal(e["mask"], mask[i]) for i, e in enumerate(got))
    code, stdout, _ = run_command(inspect_module.main, [out, "--tf_read"], capsys)
    assert code == 0 and "packbits" in stdout and "zlib" in stdout
