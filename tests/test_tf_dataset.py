"""reader.to_tf_dataset's pipeline (transforms.reading.tfdata): batched parsing exact for every encoding and dtype, batched
and unbatched, equal to the per-example decoder and to iter_numpy; shard order, shuffled shards reproducible with a
seed, workers' shards disjoint and complete; shards tampered with at rest refused before any record is read."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.conftest import convert
from tests.test_codec import NUMERIC, TEXT, TIME, sample
from tfrecord_etl.transforms import codec, reader
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata, tfrecord
from tfrecord_etl.transforms.reading import shardcheck, tfdata

ROWS = 400  # 4 shards of 100 rows


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


# -- the batch decoder, per encoding ---------------------------------------------------------------------------


def _features(encoding: str, shape: tuple) -> tuple[list[FeatureSpec], dict[str, np.ndarray]]:
    """Every dtype ``encoding`` carries exactly, as one feature each of rows of ``shape`` (9 rows)."""
    specs, arrays = [], {}
    for dt in NUMERIC + TEXT + TIME:
        array = sample(np.dtype(dt), (9, *shape))
        if encoding == "packbits":
            if dt not in ("?", "u1"):
                continue
            array = (array != 0).astype(dt) if dt == "?" else (array % 2).astype(dt)
        spec = FeatureSpec(
            f"f_{np.dtype(dt).str[1:].replace('[', '').replace(']', '')}",
            codec.normalize_dtype(array.dtype),
            shape,
            encoding,
        )
        try:
            codec.check_spec(spec)
        except SchemaError:  # e.g. complex or float64 as a list: refused, not carried
            continue
        specs.append(spec)
        arrays[spec.name] = array
    return specs, arrays


def _numpy(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else value


@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
@pytest.mark.parametrize("encoding", ["tensor", "list", "zlib", "packbits"])
def test_batched_decoding_equals_the_per_example_decoder_for_every_dtype(tf, encoding, shape):
    specs, arrays = _features(encoding, shape)
    records = codec.encode_batch(arrays, specs, 9)
    parse = reader.parse_spec(tf, specs)
    one = [
        {k: _numpy(v) for k, v in ex.items()}
        for ex in tf.data.Dataset.from_tensor_slices(records).map(
            lambda r: reader.decode_tf(tf, tf.io.parse_single_example(r, parse), specs)
        )
    ]
    batches = list(
        tf.data.Dataset.from_tensor_slices(records)
        .batch(4)
        .map(lambda b: tfdata.decode_batch(tf, tf.io.parse_example(b, parse), specs))
    )
    assert [len(b[specs[0].name]) for b in batches] == [4, 4, 1]
    for spec in specs:
        got = np.concatenate([_numpy(b[spec.name]) for b in batches])
        want = np.stack([ex[spec.name] for ex in one])  # 0-d tf.string values come back as NumPy bytes: 'S'
        assert got.shape == want.shape == (9, *shape), spec
        if got.dtype == object:  # tf.string
            assert got.tolist() == want.astype(object).tolist(), spec
            continue
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), spec
        numpy_rows = [codec.decode_example(r, [spec])[spec.name] for r in records]  # the NumPy decoder agrees
        assert got.tobytes() == np.stack(numpy_rows).astype(got.dtype).tobytes(), spec


def test_a_value_of_the_wrong_size_fails_the_batch(tf):
    spec = FeatureSpec("s", "|S4", (2,), "tensor")
    good = codec.encode_batch({"s": np.array([[b"ab", b"cd"]] * 2, "S4")}, [spec], 2)
    bad = codec.encode_batch(
        {"s": np.array([[b"ab", b"cd", b"ef"]], "S4")}, [FeatureSpec("s", "|S4", (3,), "tensor")], 1
    )
    parse = reader.parse_spec(tf, [spec])
    for records in (good + bad, bad + good):
        with pytest.raises(tf.errors.InvalidArgumentError):
            list(
                tf.data.Dataset.from_tensor_slices(records)
                .batch(3)
                .map(lambda b: tfdata.decode_batch(tf, tf.io.parse_example(b, parse), [spec]))
            )


# -- outputs on disk -------------------------------------------------------------------------------------------


def _write_input(path):
    rng = np.random.default_rng(1)
    np.savez(
        path,
        id=np.arange(ROWS, dtype="<i8"),
        image=rng.integers(0, 256, (ROWS, 5, 4, 3), dtype=np.uint8),
        x=rng.standard_normal((ROWS, 7)).astype(">f8"),
        mask=rng.integers(0, 2, (ROWS, 3, 9)).astype(bool),
        name=np.array([f"row-{i}".encode() for i in range(ROWS)], dtype="S8"),
        word=np.array([["é", "日本", ""][i % 3] for i in range(ROWS)], dtype="U2"),
    )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """``{compression: output dir}`` of the same rows (4 shards), with zlib, packbits, tensor and list features."""
    root = tmp_path_factory.mktemp("tfdata")
    _write_input(root / "in.npz")
    out = {}
    for compression in ("none", "gzip"):
        out[compression] = root / compression
        code = convert(
            root / "in.npz",
            out[compression],
            "--num_shards",
            "4",
            "--compression",
            compression,
            "--feature_encodings",
            "image=zlib,mask=packbits,x=tensor",
        )[0]
        assert code == 0
    return out


def _rows(ds) -> list[dict]:
    return [dict(ex.items()) for ex in ds.as_numpy_iterator()]


def _unbatch(batches: list[dict]) -> list[dict]:
    return [{k: v[i] for k, v in b.items()} for b in batches for i in range(len(next(iter(b.values()))))]


def _same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k in w:
            wk = np.asarray(w[k])
            if wk.dtype.kind in "SU":  # tf.string: bytes (str as UTF-8)
                wk = np.vectorize(lambda s: s.encode() if isinstance(s, str) else s, otypes=[object])(wk)
                assert np.asarray(g[k]).tolist() == wk.tolist(), k
            else:
                assert np.asarray(g[k]).dtype == wk.dtype and np.array_equal(g[k], wk), k


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_batched_and_unbatched_read_what_iter_numpy_reads(outputs, compression):
    out = str(outputs[compression])
    want = list(reader.iter_numpy(out))
    assert [int(e["id"]) for e in want] == list(range(ROWS))
    _same(_rows(reader.to_tf_dataset(out)), want)
    batches = _rows(reader.to_tf_dataset(out, batch_size=64))
    assert [len(b["id"]) for b in batches] == [64] * 6 + [16]  # batches run across shard ends, as before
    _same(_unbatch(batches), want)
    picked = _unbatch(_rows(reader.to_tf_dataset(out, batch_size=7, features=["word", "mask"])))
    _same(picked, [{k: e[k] for k in ("word", "mask")} for e in want])


def test_without_deterministic_order_every_record_is_read_once(outputs):
    ids = [int(e["id"]) for e in reader.to_tf_dataset(str(outputs["none"]), deterministic=False).as_numpy_iterator()]
    assert sorted(ids) == list(range(ROWS))


def _shard_runs(ids: list[int]) -> list[int]:
    """The shard (100 rows each) of each run of consecutive ids, checking each shard is read whole, in order."""
    runs = [ids[i : i + 100] for i in range(0, len(ids), 100)]
    for run in runs:
        assert run == list(range(run[0], run[0] + 100)) and run[0] % 100 == 0
    return [run[0] // 100 for run in runs]


def test_shuffled_shards_are_reproducible_with_a_seed_and_change_each_epoch(outputs):
    out = str(outputs["none"])

    def epochs(seed, n=3):
        ds = reader.to_tf_dataset(out, batch_size=50, shuffle_files=True, seed=seed)
        return [_shard_runs([int(i) for b in ds.as_numpy_iterator() for i in b["id"]]) for _ in range(n)]

    first = epochs(7)
    assert first == epochs(7)  # the same orders in another run with the same seed
    assert all(sorted(order) == [0, 1, 2, 3] for order in first)
    assert len({tuple(order) for order in first + epochs(8)}) > 1  # shuffled: not one order every time
    assert _shard_runs([int(e["id"]) for e in reader.to_tf_dataset(out).as_numpy_iterator()]) == [0, 1, 2, 3]


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_workers_read_disjoint_sets_of_shards_that_are_the_whole_output(outputs, tf, workers):
    out = str(outputs["gzip"])
    seen = []
    for index in range(workers):
        context = tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=index)
        ids = [int(e["id"]) for e in reader.to_tf_dataset(out, input_context=context).as_numpy_iterator()]
        assert ids == [
            int(e["id"]) for e in reader.to_tf_dataset(out, num_workers=workers, worker_index=index).as_numpy_iterator()
        ]
        assert _shard_runs(ids) == list(range(index, 4, workers))
        seen += ids
    assert sorted(seen) == list(range(ROWS))


def test_worker_options_that_do_not_fit_are_refused(outputs, tf):
    out = str(outputs["none"])
    with pytest.raises(ConfigError, match="5 workers.*the output has 4"):
        reader.to_tf_dataset(out, num_workers=5, worker_index=0)
    with pytest.raises(ConfigError, match="0 <= worker_index < num_workers"):
        reader.to_tf_dataset(out, num_workers=2, worker_index=2)
    with pytest.raises(ConfigError, match="need both"):
        reader.to_tf_dataset(out, num_workers=2)
    with pytest.raises(ConfigError, match="either input_context or"):
        reader.to_tf_dataset(out, input_context=tf.distribute.InputContext(2, 0), num_workers=2, worker_index=0)


# -- shards tampered with at rest ---------------------------------------------------------------------------------


def _frames(path) -> list[bytes]:
    data = open(path, "rb").read()
    offsets, lengths = tfrecord.scan_frames(open(path, "rb"), len(data), str(path))
    return [data[int(o) : int(o) + int(n)] for o, n in zip(offsets, lengths)]


@pytest.fixture
def copy(outputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(outputs["none"], out)
    shard = out / json.loads((out / "metadata.json").read_text())["shards"][1]["file"]
    return out, shard


def _equal_pair(frames) -> tuple[int, int]:
    """The first two records of the same size (zlib images vary a little)."""
    first = {}
    for j, frame in enumerate(frames):
        if len(frame) in first:
            return first[len(frame)], j
        first[len(frame)] = j
    raise AssertionError("no two records of one size")


def _swap_two_records(shard):
    frames = _frames(shard)
    i, j = _equal_pair(frames)  # same size: the shard's size does not change
    frames[i], frames[j] = frames[j], frames[i]
    shard.write_bytes(b"".join(frames))


def _first_twice_last_dropped(shard):
    frames = _frames(shard)
    shard.write_bytes(b"".join([frames[0], *frames[:-1]]))


def _cut_at_a_record_boundary(shard):
    shard.write_bytes(b"".join(_frames(shard)[:-1]))


@pytest.mark.parametrize("tamper", [_swap_two_records, _first_twice_last_dropped, _cut_at_a_record_boundary])
def test_a_tampered_shard_is_refused_naming_it(copy, tamper):
    out, shard = copy
    tamper(shard)
    what = "CRC32C" if tamper is _swap_two_records else "bytes"
    for batch_size in (None, 32):
        with pytest.raises(RecordError, match=what) as e:
            reader.to_tf_dataset(str(out), batch_size=batch_size)
        assert str(shard) in str(e.value)
    if tamper is _swap_two_records:  # the documented opt-out: size only
        ids = [int(e["id"]) for e in reader.to_tf_dataset(str(out), check_checksums=False).as_numpy_iterator()]
        i, j = _equal_pair(_frames(shard))
        assert sorted(ids) == list(range(ROWS)) and (ids[100 + i], ids[100 + j]) == (100 + j, 100 + i)
    else:
        with pytest.raises(RecordError, match="bytes"):
            reader.to_tf_dataset(str(out), check_checksums=False)


def test_a_shard_cut_after_the_checks_fails_while_reading(copy, tf):
    out, shard = copy
    ds = reader.to_tf_dataset(str(out), batch_size=32)
    _cut_at_a_record_boundary(shard)  # after the checks: the record count asserted per shard catches it
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain 100 elements"):
        list(ds)


def test_a_shard_is_checksummed_once_per_file_version(copy, monkeypatch):
    out, shard = copy
    reads = []
    crc = shardcheck.file_crc32c
    monkeypatch.setattr(shardcheck, "file_crc32c", lambda path: reads.append(path) or crc(path))
    reader.to_tf_dataset(str(out))
    reader.to_tf_dataset(str(out), batch_size=8)
    assert sorted(reads) == sorted(str(p) for p in out.glob("*.tfrecord*"))  # each once
    os.utime(shard)  # a new version (modification time): read again
    reader.to_tf_dataset(str(out))
    assert reads[-1] == str(shard) and len(reads) == 5


# -- large records: read ahead by a thread of their own, still in shard order ----------------------------------


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """``{compression: output dir}`` of 300 records of about 5 kB (3 shards): read ahead (tfdata.read_ahead)."""
    root = tmp_path_factory.mktemp("tfdata_large")
    rng = np.random.default_rng(3)
    np.savez(root / "in.npz", id=np.arange(300, dtype="<i8"), image=rng.integers(0, 256, (300, 40, 40, 3), np.uint8))
    out = {}
    for compression in ("none", "gzip"):
        out[compression] = root / compression
        assert convert(root / "in.npz", out[compression], "--num_shards", "3", "--compression", compression)[0] == 0
    return out


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_large_records_read_ahead_in_shard_order_as_plain_tensorflow_reads_them(large, tf, compression):
    from tfrecord_etl.transforms.reading import collection_reader

    out = str(large[compression])
    shards = tfdata.shards_of(collection_reader.parts(out, None, None, None, False)[1])
    assert tfdata.read_ahead(shards) >= 16  # ~4.8 kB records: read ahead
    meta = metadata.load(out)
    plain = tf.data.TFRecordDataset(
        [f"{out}/{s['file']}" for s in meta["shards"]], compression_type={"gzip": "GZIP"}.get(compression, "")
    )
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "image": tf.io.FixedLenFeature([], tf.string)}
    want = [tf.io.parse_single_example(r, spec) for r in plain]
    assert [int(w["id"]) for w in want] == list(range(300))
    batches = _rows(reader.to_tf_dataset(out, batch_size=64))
    assert [len(b["id"]) for b in batches] == [64] * 4 + [44]
    got = _unbatch(batches)
    assert [int(g["id"]) for g in got] == list(range(300))
    for g, w in zip(got, want):
        assert g["image"].dtype == np.uint8 and g["image"].tobytes() == w["image"].numpy()
    unbatched = _rows(reader.to_tf_dataset(out))
    assert [int(e["id"]) for e in unbatched] == list(range(300))
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(unbatched, got))


def test_small_records_are_not_read_ahead(outputs):
    from tfrecord_etl.transforms.reading import collection_reader

    shards = tfdata.shards_of(collection_reader.parts(str(outputs["none"]), None, None, None, False)[1])
    assert tfdata.read_ahead(shards) == 0


def test_large_records_cut_after_the_checks_fail_while_reading_ahead(large, tf, tmp_path):
    shutil.copytree(large["none"], tmp_path / "out")
    out = tmp_path / "out"
    shard = out / metadata.load(str(out))["shards"][1]["file"]
    ds = reader.to_tf_dataset(str(out), batch_size=32)
    _cut_at_a_record_boundary(shard)
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain 100 elements"):
        list(ds)


def test_reading_a_local_output_imports_no_apache_beam(outputs):
    """Beam's FileSystems (with its GCP modules) cost the first ``to_tf_dataset`` of a process about 2 s: a local
    output is read with ``os.path`` alone, as Beam's LocalFileSystem would, also when Beam is installed."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import sys\nfrom tfrecord_etl.transforms import reader\n"
        f"n = sum(int(b['id'].shape[0]) for b in reader.to_tf_dataset({str(outputs['gzip'])!r}, batch_size=7))\n"
        f"n += sum(len(b['id']) for b in reader.iter_numpy({str(outputs['none'])!r}, batch_size=7))\n"
        "print(n, 'apache_beam' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [str(2 * ROWS), "False"]
