"""Hostile TFRecord inputs and names: hostile groups 11 (manifest paths), 12 (augment records, --fn keys,
code points), 14 (feature count and record size limits), 16 (surrogates, big --fn values, escapes).

Every input is generated here and small: a "huge" record is a length header that lies.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import tracemalloc

import h5py
import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, run_command
from tfrecord_etl.pipelines import augment as augment_main, inspect as inspect_main, verify as verify_main
from tfrecord_etl.pipelines.augment import AugmentConfig
from tfrecord_etl.transforms import augment, codec, reader, verify as verify_lib
from tfrecord_etl.transforms.errors import ConfigError, RecordError, SchemaError, SourceError, printable
from tfrecord_etl.transforms.output import metadata, tfrecord
from tfrecord_etl.transforms.storage import fileio

HUGE = 3 * 2**29  # 1.5 GiB: the length a lying header declares


# ----------------------------------------------------------------------------------------------
# Generated inputs
# ----------------------------------------------------------------------------------------------


def int_feature(value: int) -> bytes:
    """A serialized ``Feature{int64_list: [value]}``."""
    return codec.length_delimited_field(3, codec.length_delimited_field(1, codec.encode_varint(value)))


def float_feature(value: float) -> bytes:
    return codec.length_delimited_field(2, codec.length_delimited_field(1, struct.pack("<f", value)))


def example_of(pairs) -> bytes:
    """A serialized Example of ``(name, serialized Feature)`` pairs, written by hand (any name)."""
    entries = b"".join(
        codec.length_delimited_field(
            1,
            codec.length_delimited_field(1, name.encode("utf-8", "surrogatepass"))
            + codec.length_delimited_field(2, feature),
        )
        for name, feature in pairs
    )
    return codec.length_delimited_field(1, entries)


def write_records(path, records, compression="none"):
    with open(path, "wb") as raw:
        writer = tfrecord.ShardWriter(raw, compression)
        writer.write_batch(list(records))
        writer.close()
    return path


def id_records(n: int) -> list[bytes]:
    return [example_of([("id", int_feature(i))]) for i in range(n)]


def lying_header(path, compressed: bool):
    """A valid length header (and CRC) declaring a 1.5 GiB record, then 8 MiB of zeros (gzip: ~8 KB)."""
    length = struct.pack("<Q", HUGE)
    head = length + struct.pack("<I", tfrecord.masked_crc(length))
    if compressed:
        with gzip.open(path, "wb") as f:
            f.write(head)
            for _ in range(8):
                f.write(bytes(1 << 20))
    else:
        with open(path, "wb") as f:
            f.write(head + bytes(4096))
    return path


def augment_cfg(input_, output_dir, **kw) -> AugmentConfig:
    return AugmentConfig(input=str(input_), output_dir=str(output_dir), **kw)


def one_error_line(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# --fn functions of these tests (``--fn tests.test_hostile_records:NAME``)


def int_and_str_keys(features):
    return {1: np.int64(1), "1": np.int64(2)}


def int_key(features):
    return {7: np.int64(1)}


def surrogate_str(features):
    return {"label": "ok\ud800"}


def code_point_above_max(features):
    return {"label": np.frombuffer(np.array([65, 0x110000], "<u4").tobytes(), "<U1")}


def two_mib(features):
    return {"blob": np.zeros(2 << 20, np.uint8)}


def one_mib(features):
    return {"blob": np.zeros(1 << 20, np.uint8)}


def big_at_20(features):
    n = (2 << 20) if int(np.asarray(features["id"]).reshape(-1)[0]) == 20 else 4
    return {"blob": np.zeros(n, np.uint8)}


# ----------------------------------------------------------------------------------------------
# 11: manifest.json paths are never followed
# ----------------------------------------------------------------------------------------------


def sidecar_dir(tmp_path, inputs: list[str]):
    """A hand-made sidecar collection: one sidecar shard (3 records, feature ``c``) per manifest ``input``."""
    side = tmp_path / "side"
    side.mkdir()
    specs = [codec.FeatureSpec("c", "<i8", (), "tensor")]
    shards, entries = [], []
    for i, original in enumerate(inputs):
        name = f"data-{i:05d}-of-{len(inputs):05d}.tfrecord"
        write_records(side / name, codec.encode_batch({"c": np.arange(3)}, specs, 3))
        size = (side / name).stat().st_size
        shards.append({"file": name, "records": 3, "bytes": size})
        entries.append(
            {"input": original, "compression": "none", "records": 3, "bytes": 10, "crc32c": "00000000", "sidecar": name}
        )
    meta = metadata.build(specs, shards, "none", [{"path": p, "records": 3} for p in inputs], "augment", {})
    metadata.write(str(side), meta, specs)
    manifest = {
        "format": reader.SIDECAR_FORMAT,
        "input": "x",
        "inferred": True,
        "features": [codec.FeatureSpec("id", "<i8", (1,), "list").to_json()],
        "shards": entries,
        "num_records": 3 * len(inputs),
    }
    (side / "manifest.json").write_text(json.dumps(manifest))
    return side


@pytest.mark.timeout(60)
def test_verify_does_not_follow_manifest_paths_to_a_fifo(tmp_path, capsys):
    """Hostile group 11: manifest.json naming a FIFO (absolute) and a '../' path: verify never opens them."""
    fifo = tmp_path / "fifo.tfrecord"
    os.mkfifo(fifo)
    side = sidecar_dir(tmp_path, [str(fifo), "../../secret.tfrecord"])
    code, out, err = run_command(verify_main.main, [side, "--json"], capsys)
    report = json.loads(out)
    assert code == 0, (out, err)
    assert report["manifest"] == {
        "shards": 2,
        "originals_checked": 0,
        "originals_unreachable": 0,
        "originals_not_named": 2,
    }
    assert any("2 original shards were not checked" in w and "--original" in w for w in report["warnings"])


def test_verify_never_opens_a_secret_named_by_the_manifest(tmp_path, monkeypatch):
    """Hostile group 11: an absolute path to a secret file in manifest.json is never opened, even with --original."""
    secret = tmp_path / "secret" / "data.tfrecord"
    secret.parent.mkdir()
    write_records(secret, id_records(3))
    side = sidecar_dir(tmp_path, [str(secret)])
    opened = []
    real_open = fileio.open_read
    monkeypatch.setattr(fileio, "open_read", lambda path: opened.append(path) or real_open(path))
    report = verify_lib.verify(str(side))
    assert report.manifest["originals_checked"] == 0 and report.ok
    mine = tmp_path / "mine"
    mine.mkdir()
    write_records(mine / "other.tfrecord", id_records(3))
    report = verify_lib.verify(str(side), originals=[str(mine)])  # the named collection lacks that name
    assert report.manifest == {
        "shards": 1,
        "originals_checked": 0,
        "originals_unreachable": 1,
        "originals_not_named": 0,
    }
    assert any("not among the --original files" in w for w in report.warnings)
    assert str(secret) not in opened and not any("secret" in str(p) for p in opened), opened


@pytest.mark.timeout(60)
def test_verify_original_that_is_a_fifo_is_not_opened(tmp_path, capsys):
    """Hostile group 11: --original names a directory whose shard of the manifest's name is a FIFO: refused, no hang."""
    originals = tmp_path / "orig"
    originals.mkdir()
    os.mkfifo(originals / "data.tfrecord")
    side = sidecar_dir(tmp_path, ["/anywhere/data.tfrecord"])
    code, out, err = run_command(verify_main.main, [side, "--original", originals], capsys)
    assert code == 1 and "[manifest]" in out and "Not a regular file (a FIFO)" in out, (out, err)


@pytest.mark.timeout(60)
def test_reader_sidecar_merge_refuses_a_fifo_original(tmp_path):
    """Hostile group 11: reader.open_sidecar with a FIFO among the named originals: SourceError, never opened."""
    originals = tmp_path / "orig"
    originals.mkdir()
    os.mkfifo(originals / "data.tfrecord")
    side = sidecar_dir(tmp_path, ["/anywhere/data.tfrecord"])
    with pytest.raises(SourceError, match=r"Not a regular file \(a FIFO\): not read"):
        reader.open_sidecar(str(originals), str(side))


@pytest.mark.timeout(60)
def test_verify_and_inspect_refuse_a_fifo_target(tmp_path, capsys):
    """Hostile group 11: a FIFO among the TFRecord files of verify/inspect is refused before it is opened."""
    write_records(tmp_path / "a.tfrecord", id_records(2))
    os.mkfifo(tmp_path / "b.tfrecord")
    for main in (verify_main.main, inspect_main.main):
        code, _, err = run_command(main, [tmp_path / "*.tfrecord"], capsys)
        assert code == 2, err
        one_error_line(err, "SourceError", "Not a regular file (a FIFO)", "b.tfrecord")


@pytest.mark.timeout(60)
def test_augment_refuses_a_fifo_shard(tmp_path):
    """Hostile group 11: a FIFO among augment's input shards is refused before it is opened (no hang)."""
    write_records(tmp_path / "a.tfrecord", id_records(2))
    os.mkfifo(tmp_path / "b.tfrecord")
    with pytest.raises(SourceError, match=r"Not a regular file \(a FIFO\): not read.*b.tfrecord"):
        augment.plan_augment(augment_cfg(tmp_path / "*.tfrecord", tmp_path / "out", constants={"c": "1"}))


# ----------------------------------------------------------------------------------------------
# 12: augment checks every record; --fn keys; code points
# ----------------------------------------------------------------------------------------------


def test_augment_refuses_a_non_example_after_its_sample(tmp_path, capsys):
    """Hostile group 12: a non-Example record after augment's 1,000-record sample: one-line RecordError, no commit."""
    records = id_records(1010)
    records[1005] = b"\x12\x03abc"  # field 2: a SequenceExample's feature_lists, not an Example
    shard = write_records(tmp_path / "in.tfrecord", records)
    plan = augment.plan_augment(augment_cfg(shard, tmp_path / "unused", constants={"c": "1"}))  # sample is fine
    augmenter = augment.BatchAugmenter(plan)
    with pytest.raises(RecordError, match=r"not a tf.train.Example.*record=1005") as info:
        for first, batch in augment.batches(augment.iter_shard(plan.collection.shards[0]), 100):
            augmenter.augment(batch, str(shard), first)
    assert info.value.context["file"] == str(shard)
    for mode in ("rewrite", "sidecar"):
        out = tmp_path / mode
        code, _, err = run_command(
            augment_main.main,
            ["--input", shard, "--output_dir", out, "--mode", mode, "--constants", "c=1", *BEAM_FLAGS],
            capsys,
        )
        assert code == 2
        one_error_line(err, "RecordError", "not a tf.train.Example", "record=1005", "in.tfrecord")
        assert not (out / "metadata.json").exists()


@pytest.mark.parametrize(
    "fn, match",
    [
        ("int_and_str_keys", r"returned keys 1 and '1', which name the same feature; feature names must be str"),
        ("int_key", r"returned key 7 \(int\); feature names must be str"),
    ],
    ids=["1-and-'1'", "int-key"],
)
def test_augment_fn_keys_must_be_str(tmp_path, fn, match):
    """Hostile group 12: --fn returning keys 1 and "1" (one value would be dropped): SchemaError naming both."""
    shard = write_records(tmp_path / "in.tfrecord", id_records(4))
    with pytest.raises(SchemaError, match=match):
        augment.plan_augment(augment_cfg(shard, tmp_path / "out", fn=f"tests.test_hostile_records:{fn}"))


def npy_strings(path, codes_or_strings):
    if isinstance(codes_or_strings[0], int):
        arr = np.frombuffer(np.array(codes_or_strings, "<u4").tobytes(), "<U1")
    else:
        arr = np.array(codes_or_strings)
    np.save(path, arr)
    return path


@pytest.mark.parametrize("encoding", ["list", "tensor"])
def test_convert_code_point_above_unicode_is_refused(tmp_path, capsys, encoding):
    """Hostile group 12: a '<U' array holding U+110000: one-line error at encode naming feature and row, no output."""
    src = npy_strings(tmp_path / "u.npy", [65, 66, 0x110000, 67])
    code, _, err = convert(src, tmp_path / "out", "--encoding", encoding, capsys=capsys)
    assert code == 2
    one_error_line(
        err,
        "RecordError",
        "Feature 'array' holds code point U+110000 (above U+10FFFF)",
        "batch_row=2",
        "u.npy",
        "rows='0-3'",
    )
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_augment_fn_code_point_above_unicode_is_refused(tmp_path):
    """Hostile group 12: --fn returning a '<U' value with U+110000 (NumPy cannot even make a str of it): RecordError."""
    shard = write_records(tmp_path / "in.tfrecord", id_records(4))
    with pytest.raises(RecordError, match=r"Feature 'label' holds code point U\+110000.*record=0, feature='label'"):
        augment.plan_augment(
            augment_cfg(shard, tmp_path / "out", fn="tests.test_hostile_records:code_point_above_max", encoding="list")
        )


# ----------------------------------------------------------------------------------------------
# 16: lone surrogates
# ----------------------------------------------------------------------------------------------


def test_convert_lone_surrogate_list_encoding(tmp_path, capsys):
    """Hostile group 16: a lone surrogate ('\\ud800') with --encoding list: one line, not a traceback."""
    src = npy_strings(tmp_path / "s.npy", ["ab", "c\ud800", "de"])
    code, _, err = convert(src, tmp_path / "out", "--encoding", "list", capsys=capsys)
    assert code == 2 and "Traceback" not in err
    one_error_line(err, "RecordError", "U+D800 (a lone surrogate)", "batch_row=1", "s.npy")


def test_augment_fn_lone_surrogate(tmp_path):
    """Hostile group 16: --fn returning the str 'ok\\ud800': RecordError naming the feature and record."""
    shard = write_records(tmp_path / "in.tfrecord", id_records(4))
    with pytest.raises(RecordError, match=r"Feature 'label' holds code point U\+D800 \(a lone surrogate\).*record=0"):
        augment.plan_augment(augment_cfg(shard, tmp_path / "out", fn="tests.test_hostile_records:surrogate_str"))


def test_augment_constant_lone_surrogate(tmp_path, capsys):
    """Hostile group 16: --constants value with a lone surrogate (non-UTF-8 argv bytes): one-line ConfigError."""
    shard = write_records(tmp_path / "in.tfrecord", id_records(4))
    with pytest.raises(ConfigError, match=r"--constants tag: 'a\\udcff' holds code point U\+DCFF"):
        augment.plan_augment(augment_cfg(shard, tmp_path / "out", constants={"tag": "a\udcff"}))
    with pytest.raises(ConfigError, match=r"U\+DCFF"):
        augment.plan_augment(augment_cfg(shard, tmp_path / "out", constants={"tag": "a\udcff:str"}))


# ----------------------------------------------------------------------------------------------
# 14: feature count and record size limits
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wide_file(tmp_path_factory):
    """One record of 20,001 distinct int64 features (~260 KB), after one normal record."""
    path = tmp_path_factory.mktemp("wide") / "wide.tfrecord"
    wide = example_of([(f"f{i}", int_feature(i)) for i in range(20_001)])
    return write_records(path, [example_of([("f0", int_feature(0))]), wide])


def test_max_features_verify(wide_file, capsys):
    """Hostile group 14: verify on a record of 20,001 features: a problem naming file and record (--max_features)."""
    code, out, _ = run_command(verify_main.main, [wide_file], capsys)
    assert code == 1 and "[not_example]" in out and "record 1" in out, out
    assert "More than 10000 features (the feature limit, --max_features 10000)" in out
    code, out, _ = run_command(verify_main.main, [wide_file, "--max_features", "30000"], capsys)
    assert code == 0, out


def test_max_features_inspect(wide_file, capsys):
    """Hostile group 14: inspect on a record of 20,001 features: one-line RecordError naming file and record."""
    code, _, err = run_command(inspect_main.main, [wide_file], capsys)
    assert code == 2
    one_error_line(err, "RecordError", "More than 10000 features", "record=1", "wide.tfrecord")


def test_max_features_augment(wide_file, tmp_path):
    """Hostile group 14: augment's feature inference on a record of 20,001 features: RecordError with file, record."""
    with pytest.raises(RecordError, match=r"More than 10000 features.*wide.tfrecord', record=1"):
        augment.plan_augment(augment_cfg(wide_file, tmp_path / "out", constants={"c": "1"}))
    with pytest.raises(RecordError, match=r"More than 50 features"):
        augment.plan_augment(augment_cfg(wide_file, tmp_path / "out", constants={"c": "1"}, max_features=50))


def test_max_features_distinct_names_across_records(tmp_path, capsys):
    """Hostile group 14: many records of distinct names (each small): the distinct-name count is bounded too."""
    path = write_records(
        tmp_path / "many.tfrecord", [example_of([(f"r{r}n{i}", int_feature(i)) for i in range(40)]) for r in range(5)]
    )
    code, out, _ = run_command(verify_main.main, [path, "--max_features", "100"], capsys)
    assert code == 1 and "[features]" in out and "More than 100 distinct feature names" in out, out
    with pytest.raises(RecordError, match=r"More than 100 features.*record=2"):
        codec.infer_feature_specs([tfr for _, _, tfr in reader.iter_records(str(path))], 100)
    code, _, err = run_command(inspect_main.main, [path, "--max_features", "100"], capsys)
    assert code == 2
    one_error_line(err, "More than 100 features", "many.tfrecord")


@pytest.mark.parametrize("compressed", [True, False], ids=["gzip", "none"])
@pytest.mark.parametrize("reader_name", ["verify", "inspect", "augment", "reader"])
def test_lying_length_header_is_refused_before_reading(tmp_path, capsys, compressed, reader_name):
    """Hostile group 14: a length header declaring a 1.5 GiB record (gzip body of zeros): refused before reading."""
    path = lying_header(tmp_path / ("huge.tfrecord" + (".gz" if compressed else "")), compressed)
    assert path.stat().st_size < 64 << 10
    needle = (
        f"Record of {HUGE} bytes (1536.0 MB) is over the record size limit of {1024 << 20} bytes (--max_record_mb 1024)"
    )
    if reader_name in ("verify", "inspect"):
        main = verify_main.main if reader_name == "verify" else inspect_main.main
        code, out, err = run_command(main, [path], capsys)
        if reader_name == "verify":
            assert code == 1 and "[framing]" in out and needle in out and "record 0, byte offset 0" in out, out
        else:
            assert code == 2
            one_error_line(err, "RecordError", needle, "record=0", "offset=0")
    elif reader_name == "augment":
        with pytest.raises(RecordError, match=r"over the record size limit.*record=0"):
            augment.plan_augment(augment_cfg(path, tmp_path / "out", constants={"c": "1"}))
    else:
        tracemalloc.start()
        try:
            with pytest.raises(RecordError, match=r"over the record size limit") as info:
                list(reader.iter_records(str(path)))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 32 << 20, peak  # the 1.5 GiB was never allocated (nor 8 MiB decompressed at once)
        assert info.value.context == {"file": str(path), "record": 0, "offset": 0}


def test_max_record_mb_flag_raises_the_limit(tmp_path, capsys):
    """Hostile group 14: --max_record_mb lowers/raises the limit: a 2 KB record under --max_record_mb 0.001 is refused."""
    path = write_records(
        tmp_path / "a.tfrecord",
        [example_of([("b", codec.length_delimited_field(1, codec.length_delimited_field(1, bytes(2048))))])],
    )
    code, out, _ = run_command(verify_main.main, [path, "--max_record_mb", "0.001"], capsys)
    assert code == 1 and "over the record size limit of 1048 bytes" in out, out
    code, out, _ = run_command(verify_main.main, [path], capsys)
    assert code == 0, out
    code, _, err = run_command(verify_main.main, [path, "--max_record_mb", "5000"], capsys)
    assert code == 2
    one_error_line(err, "ConfigError", "--max_record_mb must be in (0, 2047]")


# ----------------------------------------------------------------------------------------------
# 16: --fn returning big values; names with escapes
# ----------------------------------------------------------------------------------------------


def test_augment_fn_record_over_max_record_mb(tmp_path):
    """Hostile group 16: --fn returning 2 MB per record under --max_record_mb 1: RecordError (file, record, size, flag)."""
    shard = write_records(tmp_path / "in.tfrecord", id_records(4))
    with pytest.raises(
        RecordError,
        match=r"returned 2097152 bytes \(2\.0 MB\) for one record, over the record size "
        r"limit of 1048576 bytes \(--max_record_mb 1\).*in.tfrecord.*record=0.*"
        r"size=2097152",
    ):
        augment.plan_augment(
            augment_cfg(shard, tmp_path / "out", fn="tests.test_hostile_records:two_mib", max_record_mb=1)
        )


def test_augment_fn_big_values_shrink_the_batch(tmp_path):
    """Hostile group 16: --fn returning 1 MB per record: batches of 256 records (256 MB of new values), not 4096."""
    shard = write_records(tmp_path / "in.tfrecord", id_records(8))
    plan = augment.plan_augment(augment_cfg(shard, tmp_path / "out", fn="tests.test_hostile_records:one_mib"))
    assert plan.batch_size == augment.BATCH_MB == 256
    small = augment.plan_augment(
        augment_cfg(shard, tmp_path / "out", fn="tests.test_hostile_records:big_at_20", fn_inputs=["id"])
    )
    assert small.batch_size == 4096


def test_augment_fn_one_late_big_record(tmp_path):
    """Hostile group 16: a late record's --fn value over the limit is refused as it comes back, naming that record."""
    shard = write_records(tmp_path / "in.tfrecord", id_records(30))
    plan = augment.plan_augment(
        augment_cfg(
            shard, tmp_path / "out", fn="tests.test_hostile_records:big_at_20", fn_inputs=["id"], max_record_mb=1
        )
    )
    augmenter = augment.BatchAugmenter(plan)
    records = [r for _, r in augment.iter_shard(plan.collection.shards[0])]
    with pytest.raises(RecordError, match=r"for one record, over the record size limit.*record=20"):
        augmenter.augment(records, str(shard), 0)


EVIL = "evil\x1b[2J\nname\u202e"


@pytest.fixture(scope="module")
def evil_output(tmp_path_factory):
    """A convert output of an HDF5 file whose dataset name holds an ANSI escape, a newline and a bidi override."""
    tmp = tmp_path_factory.mktemp("evil")
    with h5py.File(tmp / "e.h5", "w") as f:
        f[EVIL] = np.arange(6, dtype=np.int32).reshape(3, 2)
    return tmp


def test_convert_summary_escapes_names(evil_output, capsys):
    """Hostile group 16: convert's summary prints a dataset name with escapes/newlines escaped, on one line."""
    code, out, err = convert(evil_output / "e.h5", evil_output / "out", capsys=capsys)
    assert code == 0, err
    assert "\x1b" not in out and "\u202e" not in out and "\n" + "name" not in out
    assert r"evil\x1b[2J\nname\u202e <i4 [2] list" in out


def test_inspect_escapes_names(evil_output, capsys):
    """Hostile group 16: inspect's text output escapes feature names (JSON output is escaped by json)."""
    if not (evil_output / "out" / "metadata.json").exists():
        convert(evil_output / "e.h5", evil_output / "out", capsys=capsys)
    code, out, _ = run_command(inspect_main.main, [evil_output / "out"], capsys)
    assert code == 0 and "\x1b" not in out and "\u202e" not in out
    assert r"evil\x1b[2J\nname\u202e" in out
    code, out, _ = run_command(inspect_main.main, [evil_output / "out", "--json"], capsys)
    assert json.loads(out)["features"][0]["name"] == EVIL and "\x1b" not in out


def test_inspect_prints_a_multi_row_value_on_one_line(tmp_path, capsys):
    """The first example's 2-D value is one readable line, not NumPy's newlines escaped as '\\n'."""
    np.save(tmp_path / "m.npy", np.arange(2 * 4 * 3, dtype=np.uint8).reshape(2, 4, 3))
    assert convert(tmp_path / "m.npy", tmp_path / "out", capsys=capsys)[0] == 0
    code, out, _ = run_command(inspect_main.main, [tmp_path / "out"], capsys)
    line = next(x for x in out.splitlines() if x.startswith("  array: "))
    assert code == 0 and line == "  array: uint8 [4, 3] [[ 0  1  2] [ 3  4  5] [ 6  7  8] [ 9 10 11]]", line


def test_verify_report_escapes_names(tmp_path, capsys):
    """Hostile group 16: verify's problem lines escape a feature name with an ANSI escape and a newline."""
    name = "k\x1b[31m\nx"
    path = write_records(
        tmp_path / "k.tfrecord", [example_of([(name, int_feature(1))]), example_of([(name, float_feature(1.0))])]
    )
    code, out, _ = run_command(verify_main.main, [path], capsys)
    assert code == 1 and "\x1b" not in out
    assert r"[kind] " in out and r"feature 'k\x1b[31m\nx'" in out, out


def test_error_messages_escape_names():
    """Hostile group 16: our errors print names escaped on one line (EtlError applies errors.printable)."""
    with pytest.raises(SchemaError) as info:
        codec.check_spec(codec.FeatureSpec("a\nb\x1b[0m", "<c8", (), "list"))
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)
    assert r"Feature 'a\nb\x1b[0m' is complex64" in str(info.value)
    assert printable("plain é ü") == "plain é ü" and printable("\ud800") == r"\ud800"


def test_check_example_frame_agrees_with_the_exact_walk():
    """check_example_frame's fast path accepts and counts exactly what split_feature_entries does (mutated records)."""
    import random

    rng = random.Random(10)
    specs = [
        codec.FeatureSpec("img", "<f4", (8,), "tensor"),
        codec.FeatureSpec("label", "<i8", (), "list"),
        codec.FeatureSpec("name", "bytes", (), "list"),
    ]
    names = np.empty(40, object)
    names[:] = [b"n" * i for i in range(40)]
    base = codec.encode_batch(
        {"img": np.zeros((40, 8), "<f4"), "label": np.arange(40) * 1000, "name": names}, specs, 40
    )
    for _ in range(3000):
        r = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 3)):
            r[rng.randrange(len(r))] = rng.randrange(256)
        if rng.random() < 0.3:
            r = r[: rng.randrange(len(r))]
        outcomes = []
        for check in (lambda b: len(codec.split_feature_entries(b, 2)), lambda b: codec.check_example_frame(b, 2)):
            try:
                outcomes.append(check(bytes(r)))
            except RecordError as e:
                outcomes.append(e.message)
        assert outcomes[0] == outcomes[1], bytes(r)


def test_max_features_augment_worker_records(tmp_path):
    """Hostile group 14: a record with too many features after augment's sample is refused by the worker (file, record)."""
    records = id_records(1003)
    records[1001] = example_of([(f"f{i}", int_feature(i)) for i in range(60)])
    shard = write_records(tmp_path / "in.tfrecord", records)
    plan = augment.plan_augment(augment_cfg(shard, tmp_path / "out", constants={"c": "1"}, max_features=50))
    augmenter = augment.BatchAugmenter(plan)
    with pytest.raises(
        RecordError,
        match=r"^More than 50 features \(the feature limit, --max_features 50\) "
        r"\[file='[^']*in.tfrecord', record=1001",
    ):
        for first, batch in augment.batches(augment.iter_shard(plan.collection.shards[0]), 500):
            augmenter.augment(batch, str(shard), first)
