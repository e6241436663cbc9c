"""python -m pipelines.verify and python -m pipelines.inspect: clean outputs pass, and a bad-input matrix on the
TFRecord side (each case: exit code and the important words: file, record index, byte offset, feature).
Also the security checks: YAML is loaded safely, metadata paths never leave the output directory."""

from __future__ import annotations

import gzip
import json
import shutil

import google_crc32c
import h5py
import numpy as np
import pytest

from tests.conftest import convert, fixture_file, run_command
from tfrecord_etl.transforms import codec, reader
from tfrecord_etl.transforms.errors import ConfigError, IncompleteOutputError, RecordError, SchemaError
from tfrecord_etl.transforms.output import metadata, tfrecord

ROWS = 240
PENGUIN = "tfx/components/testdata/penguin/data/Split-train/data_tfrecord-00000-of-00001.gz"
SEQUENCE = "tfx/components/testdata/tfrecord_sequence/Split-train/data_tfrecord_train.gz"


def verify(*args, capsys):
    from tfrecord_etl.pipelines import verify as verify_module

    return run_command(verify_module.main, [str(a) for a in args], capsys)


def inspect(*args, capsys):
    from tfrecord_etl.pipelines import inspect as inspect_module

    return run_command(inspect_module.main, [str(a) for a in args], capsys)


def make_source(path):
    rng = np.random.default_rng(5)
    table = np.zeros(ROWS, np.dtype([("id", "<i8"), ("pos", ">f4", (2,))]))
    table["id"] = np.arange(ROWS) * 3
    table["pos"] = rng.standard_normal((ROWS, 2))
    weights = rng.standard_normal(ROWS).astype(">f8")
    weights[:3] = [np.nan, -0.0, np.inf]
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 255, (ROWS, 4, 4), dtype=np.uint8), chunks=(16, 4, 4))
        f["meta/weights"] = weights
        f["meta/labels"] = (np.arange(ROWS) % 7 - 3).astype(">i2")
        f["flags"] = np.arange(ROWS) % 3 == 0
        f["table"] = table
        f.create_dataset(
            "names", data=np.array([b"n%d" % i for i in range(ROWS)], dtype=object), dtype=h5py.string_dtype()
        )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The source and three outputs: planned (no provenance), beam + provenance + gzip, beam without provenance."""
    tmp = tmp_path_factory.mktemp("verify")
    src = tmp / "in.h5"
    make_source(src)
    flags = {
        "planned": [
            "--num_shards",
            "3",
            "--target_range_mb",
            "0.002",
            "--feature_encodings",
            "meta/labels=list,table/pos=list,flags=list",
        ],
        "beam": ["--writer", "beam", "--provenance", "--compression", "gzip", "--num_shards", "2"],
        "beam_noprov": ["--writer", "beam", "--num_shards", "2"],
    }
    outs = {}
    for name, extra in flags.items():
        code, _, _ = convert(src, tmp / name, *extra)
        assert code == 0, name
        outs[name] = tmp / name
    return src, outs


def copy_output(outputs, tmp_path, name="planned"):
    out = tmp_path / name
    shutil.copytree(outputs[1][name], out)
    return out


def shard(out, i=1):
    return out / metadata.load(str(out), counts=False)["shards"][i]["file"]  # counts edited by some cases


def frames(path, compression="none"):
    """``[(index, offset, record)]`` of a shard."""
    with open(path, "rb") as raw:
        return list(tfrecord.iter_records(tfrecord.open_decompressed(raw, compression), str(path)))


def write_records(path, records, compression="none"):
    data = tfrecord.frame_records(records)
    path.write_bytes(gzip.compress(data, mtime=0) if compression == "gzip" else data)


def set_meta(out, **changes):
    meta = json.loads((out / "metadata.json").read_text())
    for key, fn in changes.items():
        meta[key] = fn(meta[key])
    (out / "metadata.json").write_text(json.dumps(meta))


def change_value(record: bytes, feature: str) -> bytes:
    """The record with one byte of ``feature``'s tensor value changed: same length, so a valid Example."""
    spans = codec.split_features(record)
    _, (raw,) = codec.decode_feature(record, spans[feature])
    at = record.find(raw, spans[feature][0]) + len(raw) - 1
    return record[:at] + bytes([record[at] ^ 0x40]) + record[at + 1 :]


# ----------------------------------------------------------------------------------------------
# Clean outputs pass, exactly
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,mode", [("planned", "sequential"), ("beam", "provenance")])
def test_clean_output_passes_with_exact_source_comparison(outputs, capsys, name, mode):
    src, outs = outputs
    code, out, err = verify(outs[name], "--source", src, capsys=capsys)
    assert code == 0, out + err
    assert out.startswith(f"OK: {outs[name]}: output, {ROWS} records")
    assert f"exact values against the source ({ROWS} of {ROWS} rows compared, {mode})" in out
    assert err == ""  # no progress bar when stderr is not a terminal
    code, out, _ = verify(outs[name], "--source", src, "--json", capsys=capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["num_problems"] == 0 and report["problems"] == []
    assert report["source"] == {
        "patterns": [str(src)],
        "mode": mode,
        "rows": ROWS,
        "compared": ROWS,
        "dead_lettered": 0,
    }
    assert report["num_records"] == report["expected_records"] == ROWS
    assert {f["name"] for f in report["features"]} >= {"images", "meta/weights", "names", "table/pos"}


def test_clean_output_passes_without_source_and_lists_files_when_verbose(outputs, capsys):
    code, out, _ = verify(outputs[1]["planned"], "--verbose", capsys=capsys)
    assert code == 0, out
    assert "data-00002-of-00003.tfrecord:" in out and "(metadata: " in out


# what Airflow's BeamRunPythonPipelineOperator appends (--flag=value only), and other Beam flags in every form
AIRFLOW_FLAGS = ["--runner=DirectRunner", "--labels=airflow-version=v3-3-2"]
BEAM_FLAGS_ALL_FORMS = [
    "--project",
    "p",
    "--temp_location=gs://b/tmp",
    "--direct_num_workers",
    "2",
    "--save_main_session",
    "--experiments=a",
    "--experiments",
    "b",
    "--flink_master=localhost:8081",
]


def test_beam_flags_are_accepted_and_ignored(outputs, capsys):
    src, outs = outputs
    _, plain, _ = verify(outs["planned"], "--source", src, "--json", capsys=capsys)
    for argv in (
        [*AIRFLOW_FLAGS, f"--target={outs['planned']}", f"--source={src}", "--json"],
        [*BEAM_FLAGS_ALL_FORMS, outs["planned"], "--source", src, "--json"],
        [outs["planned"], "--runner", "DirectRunner", "--source", src, "--json", *BEAM_FLAGS_ALL_FORMS],
    ):
        code, out, err = verify(*argv, capsys=capsys)
        assert code == 0 and err == "", err
        report, expected = json.loads(out), json.loads(plain)
        assert report["source"]["compared"] == ROWS
        assert {k: v for k, v in report.items() if k != "seconds"} == {
            k: v for k, v in expected.items() if k != "seconds"
        }


@pytest.mark.parametrize(
    "argv,message",
    [
        # a typo of verify's own flags is refused, also among Beam flags
        (["OUT", *AIRFLOW_FLAGS, "--jsno"], "unknown flag --jsno (did you mean --json?)"),
        (["--sorce=x.h5", *AIRFLOW_FLAGS, "OUT"], "unknown flag --sorce (did you mean --source?)"),
        (["--targt=OUT"], "unknown flag --targt (did you mean --target?)"),
        # a flag neither verify's nor Beam's, and a misspelled Beam flag, are not ignored
        (["OUT", *AIRFLOW_FLAGS, "--zzzqqq=1"], "unknown flag --zzzqqq"),
        (["OUT", "--runer=DirectRunner"], "unknown flag --runer"),
        # TARGET: required, once
        (AIRFLOW_FLAGS, "TARGET is missing Hint: give TARGET once, as the argument or as --target"),
        (["OUT", "--target=elsewhere"], "two TARGETs: "),
    ],
)
def test_unknown_flags_are_refused_next_to_beam_flags(outputs, capsys, argv, message):
    target = str(outputs[1]["planned"])
    code, out, err = verify(*[a.replace("OUT", target) for a in argv], capsys=capsys)
    assert code == 2 and out == "", out
    assert err.startswith(f"error: ConfigError: {message}") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("name", ["planned", "beam"])
def test_one_changed_value_with_valid_crc_is_caught_only_by_the_source_comparison(outputs, tmp_path, capsys, name):
    src = outputs[0]
    out = copy_output(outputs, tmp_path, name)
    compression = metadata.load(str(out))["compression"]
    path = shard(out, 1)
    recs = frames(path, compression)
    index, offset, _ = recs[5]
    write_records(path, [change_value(r, "meta/weights") if i == 5 else r for i, _, r in recs], compression)
    set_meta(out, shards=lambda shards: [dict(s, bytes=(out / s["file"]).stat().st_size) for s in shards])
    code, stdout, _ = verify(out, capsys=capsys)  # the shard's CRC32C in metadata.json tells, without --source
    assert code == 1 and f"[checksum] {path}: File's CRC32C is " in stdout, stdout
    set_meta(
        out,
        shards=lambda shards: [
            dict(s, crc32c=google_crc32c.Checksum((out / s["file"]).read_bytes()).hexdigest().decode()) for s in shards
        ],
    )
    code, stdout, _ = verify(out, capsys=capsys)
    assert code == 0, stdout  # metadata.json rewritten too: framing, CRCs, checksums, counts and decoding all hold
    code, stdout, _ = verify(out, "--source", src, capsys=capsys)
    assert code == 1, stdout
    assert stdout.startswith("FAILED:")
    line = next(ln for ln in stdout.splitlines() if ln.strip().startswith("[source]"))
    for word in (
        path.name,
        f"record {index}",
        f"byte offset {offset}",
        "feature 'meta/weights'",
        "Value differs from the source",
        "in the output",
        "in the source",
    ):
        assert word in line, (word, line)
    code, stdout, _ = verify(out, "--source", src, "--json", capsys=capsys)
    report = json.loads(stdout)
    assert code == 1 and report["num_problems"] == 1
    (problem,) = report["problems"]
    assert problem["kind"] == "source" and problem["file"] == str(path) and problem["record"] == index
    assert problem["offset"] == offset and problem["feature"] == "meta/weights"


def test_source_comparison_of_an_unordered_output_without_provenance_is_refused(outputs, capsys):
    src, outs = outputs
    code, _, err = verify(outs["beam_noprov"], "--source", src, capsys=capsys)
    assert code == 2
    assert err.startswith("error: ConfigError:") and "--provenance" in err and "planned" in err
    code, out, _ = verify(outs["beam_noprov"], capsys=capsys)  # the rest is still verifiable
    assert code == 0, out


def test_source_with_other_features_is_reported_not_compared(outputs, tmp_path, capsys):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["images"] = np.zeros((ROWS, 4, 4), np.uint8)
    code, out, _ = verify(outputs[1]["planned"], "--source", other, capsys=capsys)
    assert code == 1 and "differ from the output's" in out and "other.h5" in out


@pytest.mark.parametrize(
    "flags, mode",
    [([], "sequential"), (["--provenance"], "sequential"), (["--writer", "beam", "--provenance"], "provenance")],
)
def test_dead_lettered_hdf5_rows_are_expected_absent_and_the_rest_compared(tmp_path, capsys, flags, mode):
    """Rows 300-399 cannot be read (a corrupt chunk) and are dead-lettered: metadata.json lists them, verify
    --source expects exactly them to be absent and compares the 900 others; a changed value in one of those still
    fails, and so does a list that names other rows than the missing ones."""
    from tests.test_reliability import corrupt_h5  # chunk 3 of /x (rows 300-399) cannot be decompressed

    src = tmp_path / "in.h5"
    corrupt_h5(src)
    out = tmp_path / "out"
    code, _, err = convert(
        src,
        out,
        "--dead_letter_dir",
        tmp_path / "dead",
        "--target_range_mb",
        "0.05",
        "--num_shards",
        "3",
        *flags,
        capsys=capsys,
    )
    assert code == 0, err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["rows_dead_lettered"] == 100 and meta["num_records"] == 900
    listed = sorted((d["file"], d["start"], d["stop"]) for d in meta["dead_letters"])
    assert {f for f, _, _ in listed} == {str(src)}
    assert sorted(r for _, a, b in listed for r in range(a, b)) == list(range(300, 400))
    code, stdout, _ = verify(out, "--source", src, capsys=capsys)
    assert code == 0, stdout
    assert f"exact values against the source (900 of 1000 rows compared, 100 dead-lettered, {mode})" in stdout

    changed = tmp_path / "changed"  # a value changed in a row with a record
    shutil.copytree(out, changed)
    path = changed / meta["shards"][1]["file"]
    records = [r for _, _, r in frames(path)]
    records[5] = change_value(records[5], "x")
    write_records(path, records)
    code, stdout, _ = verify(changed, "--source", src, capsys=capsys)
    assert code == 1 and "FAILED" in stdout and "feature 'x': Value differs from the source" in stdout, stdout

    wrong = tmp_path / "wrong"  # the list names rows that have records
    shutil.copytree(out, wrong)
    set_meta(
        wrong,
        dead_letters=lambda _: [{"file": str(src), "start": 200, "stop": 300, "rows": 100, "error": "SourceError"}],
    )
    code, stdout, _ = verify(wrong, "--source", src, "--max_problems", "200", capsys=capsys)
    assert code == 1 and "FAILED" in stdout, stdout
    if mode == "provenance":
        assert "Row 200 of" in stdout and "lists it as dead-lettered" in stdout
        assert "100 source rows have no record in the output (first: row 300" in stdout


def test_an_output_that_does_not_list_its_dead_letters_is_compared_by_provenance_or_refused(tmp_path, capsys):
    """metadata.json written before it listed the dead-lettered rows (only their count): compared by provenance
    as before (the count of rows without a record must match), refused without provenance."""
    from tests.test_reliability import corrupt_h5

    corrupt_h5(tmp_path / "in.h5")
    for name, flags in (("prov", ["--provenance"]), ("plain", [])):
        code, _, err = convert(
            tmp_path / "in.h5",
            tmp_path / name,
            "--dead_letter_dir",
            tmp_path / "dead",
            "--target_range_mb",
            "0.05",
            *flags,
            capsys=capsys,
        )
        assert code == 0, err
        meta = json.loads((tmp_path / name / "metadata.json").read_text())
        del meta["dead_letters"]
        (tmp_path / name / "metadata.json").write_text(json.dumps(meta))
    code, stdout, _ = verify(tmp_path / "prov", "--source", tmp_path / "in.h5", capsys=capsys)
    assert code == 0, stdout
    assert "(900 of 1000 rows compared, provenance)" in stdout and "100 source rows were dead-lettered" in stdout
    code, _, err = verify(tmp_path / "plain", "--source", tmp_path / "in.h5", capsys=capsys)
    assert code == 2 and "100 rows were dead-lettered and metadata.json does not list them" in err


def test_dead_letters_of_shards_cut_inside_the_range_grid_are_accounted_for(tmp_path, capsys):
    """Shard boundaries (chunk-aligned: rows 300 and 700) fall between the 40-row range grid, so the planned
    writer's ranges differ from a plain split of the file; verify must read the source with the writer's
    ranges, or the rows it dead-lettered (300-419) and the rows verify cannot read would not match (when
    metadata.json does not list them)."""
    from tests.test_reliability import corrupt_h5  # chunk 3 of /x (rows 300-399) cannot be decompressed

    corrupt_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    code, _, err = convert(
        tmp_path / "in.h5",
        out,
        "--dead_letter_dir",
        tmp_path / "dead",
        "--target_range_mb",
        str(40 * 2056 / 2**20),
        "--num_shards",
        "3",
        "--provenance",
        capsys=capsys,
    )
    assert code == 0, err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["rows_dead_lettered"] == 120 and meta["num_records"] == 880
    letters = [json.loads(line) for p in sorted((tmp_path / "dead").glob("*.jsonl")) for line in p.open()]
    assert [(d["start"], d["stop"]) for d in letters] == [(300, 340), (340, 380), (380, 420)]
    assert [(d["start"], d["stop"]) for d in meta["dead_letters"]] == [(300, 340), (340, 380), (380, 420)]
    code, stdout, _ = verify(out, "--source", tmp_path / "in.h5", capsys=capsys)
    assert code == 0, stdout
    assert "880 of 1000 rows compared, 120 dead-lettered, sequential" in stdout
    set_meta(out, dead_letters=lambda _: None)
    code, stdout, _ = verify(out, "--source", tmp_path / "in.h5", capsys=capsys)
    assert code == 0, stdout
    assert "120 source rows were dead-lettered" in stdout


# ----------------------------------------------------------------------------------------------
# The bad-input matrix, TFRecord side
# ----------------------------------------------------------------------------------------------


def truncated_mid_record(out):
    path = shard(out)
    index, offset, record = frames(path)[7]
    path.write_bytes(path.read_bytes()[: offset + 12 + len(record) // 2])
    return out, ["[framing]", path.name, f"record {index}", f"byte offset {offset}", "Truncated record"]


def flipped_data_byte(out):
    path = shard(out)
    index, offset, record = frames(path)[3]
    data = bytearray(path.read_bytes())
    data[offset + 12 + len(record) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return out, ["[framing]", path.name, f"record {index}", f"byte offset {offset}", "Data CRC mismatch"]


def flipped_length_byte(out):
    path = shard(out)
    index, offset, _ = frames(path)[4]
    data = bytearray(path.read_bytes())
    data[offset + 1] ^= 0x10
    path.write_bytes(bytes(data))
    return out, ["[framing]", path.name, f"record {index}", f"byte offset {offset}", "Length CRC mismatch"]


def gzip_read_as_none(out):
    path = shard(out)
    path.write_bytes(gzip.compress(path.read_bytes()))
    return out, [
        "[framing]",
        path.name,
        "record 0",
        "byte offset 0",
        "Length CRC mismatch",
        "looks gzip-compressed",
        "compression none",
    ]


def none_read_as_gzip(out):
    set_meta(out, compression=lambda _: "gzip")
    return out, ["[framing]", shard(out, 0).name, "record 0", "Cannot decompress", "compression"]


def _replace_record(out, payload):
    path = shard(out)
    recs = frames(path)
    index, offset, _ = recs[2]
    write_records(path, [payload if i == 2 else r for i, _, r in recs])
    set_meta(out, shards=lambda shards: [dict(s, bytes=(out / s["file"]).stat().st_size) for s in shards])
    return path, index, offset


def random_payload(out):
    path, index, offset = _replace_record(out, b"\xff\xfe\xfd\xfc random")
    return out, ["[decode]", path.name, f"record {index}", f"byte offset {offset}", "not a tf.train.Example"]


def sequence_example_payload(out):
    sequence = frames(fixture_file(SEQUENCE), "gzip")[0][2]
    path, index, offset = _replace_record(out, sequence)
    return out, ["[not_example]", path.name, f"record {index}", f"byte offset {offset}", "SequenceExample"]


def missing_feature(out):
    path = shard(out)
    recs = frames(path)
    path, index, offset = _replace_record(out, codec.drop_features(recs[2][2], ["names"]))
    return out, ["[decode]", path.name, f"record {index}", f"byte offset {offset}", "feature 'names'", "missing"]


def shard_missing(out):
    path = shard(out)
    path.unlink()
    return out, ["[missing]", path.name, "missing"]


def count_differs_from_metadata(out):
    set_meta(
        out,
        shards=lambda shards: [dict(s, records=s["records"] + 1) if i == 1 else s for i, s in enumerate(shards)],
        num_records=lambda n: n + 1,
    )
    path = shard(out)
    return out, ["[count]", path.name, "metadata.json says"]


def record_dropped(out):
    path = shard(out)
    write_records(path, [r for _, _, r in frames(path)][:-1])
    return out, ["[count]", "[size]", path.name, "metadata.json says"]


def sequence_file(_):
    path = fixture_file(SEQUENCE)
    return path, ["[not_example]", path.name, "record 0", "byte offset 0", "SequenceExample", "10500 problems"]


def plain_file_truncated(out):
    path = out / "cut.tfrecord.gz"
    data = fixture_file(PENGUIN).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path, ["[framing]", path.name, "Compressed file ended before the end-of-stream marker"]


def plain_files_random_payload(out):
    path = out / "plain.tfrecord"
    write_records(
        path,
        [codec.encode_batch({"a": np.arange(2)}, [codec.FeatureSpec("a", "<i8", (), "list")], 2)[0], b"\x07\x07\x07"],
    )
    return path, ["[not_example]", path.name, "record 1", f"byte offset {frames(path)[1][1]}", "tf.train.Example"]


FAILS = {  # name: mutation of a copy of the planned output -> (target, words in stdout); exit code 1
    "truncated mid-record": truncated_mid_record,
    "flipped data byte (CRC mismatch)": flipped_data_byte,
    "flipped length byte (length CRC mismatch)": flipped_length_byte,
    "gzip shard read as none": gzip_read_as_none,
    "plain shard read as gzip": none_read_as_gzip,
    "random payload with valid framing": random_payload,
    "SequenceExample payload": sequence_example_payload,
    "feature missing from one record": missing_feature,
    "shard missing": shard_missing,
    "record count differs from metadata": count_differs_from_metadata,
    "record dropped from a shard": record_dropped,
    "plain TFX SequenceExample file": sequence_file,
    "plain gzip file cut in half": plain_file_truncated,
    "plain file with a random payload": plain_files_random_payload,
}


@pytest.mark.parametrize("case", sorted(FAILS))
def test_bad_tfrecord_data_fails_with_a_precise_report(outputs, tmp_path, capsys, case):
    target, words = FAILS[case](copy_output(outputs, tmp_path))
    code, out, err = verify(target, capsys=capsys)
    assert code == 1, out + err
    assert out.startswith("FAILED:"), out
    for word in words:
        assert word in out, (word, out)
    code, out, _ = verify(target, "--json", capsys=capsys)
    report = json.loads(out)
    assert code == 1 and not report["ok"] and report["num_problems"] >= 1
    assert all(set(p) == {"kind", "message", "file", "record", "offset", "feature"} for p in report["problems"])


def escaping_shard(out):
    set_meta(out, shards=lambda shards: [dict(shards[0], file="../x")] + shards[1:])
    return out


def no_metadata(out):
    (out / "metadata.json").unlink()
    return out


def _write(path, text, result):
    path.write_text(text)
    return result


REFUSED = {  # name: (mutation, error type, words); exit code 2
    "shard path escaping the directory": (escaping_shard, "SchemaError", ["not a plain file name", "'../x'"]),
    "output without metadata.json (incomplete)": (no_metadata, "IncompleteOutputError", ["incomplete"]),
    "pattern matching nothing": (lambda out: out / "nothing-*.tfrecord", "SourceError", ["No input file matches"]),
    "--source for plain files": (lambda out: shard(out), "ConfigError", ["--source needs an output directory"]),
    "metadata.json that is not JSON": (
        lambda out: _write(out / "metadata.json", "{oops", out),
        "SchemaError",
        ["Invalid metadata.json"],
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unverifiable_targets_are_refused_with_exit_code_2(outputs, tmp_path, capsys, case):
    mutate, error, words = REFUSED[case]
    out = copy_output(outputs, tmp_path)
    target = mutate(out)
    extra = ["--source", outputs[0]] if "--source" in case else []
    code, stdout, err = verify(target, *extra, capsys=capsys)
    assert code == 2, stdout + err
    assert err.startswith(f"error: {error}:") and len(err.strip().splitlines()) == 1, err
    for word in words + [out.name]:
        assert word in err, (word, err)
    code, stdout, err = verify(target, *extra, "--json", capsys=capsys)
    assert code == 2 and json.loads(stdout)["error"]["type"] == error


@pytest.mark.parametrize("mutate,error", [(no_metadata, IncompleteOutputError), (escaping_shard, SchemaError)])
def test_reader_refuses_what_verify_refuses(outputs, tmp_path, mutate, error):
    out = mutate(copy_output(outputs, tmp_path))
    with pytest.raises(error):
        next(reader.iter_numpy(str(out)))


def test_stale_temporaries_and_unlisted_files_are_warnings(outputs, tmp_path, capsys):
    out = copy_output(outputs, tmp_path)
    (out / ".tmp-data-00000-of-00003.tfrecord-abc").write_bytes(b"partial")
    (out / "data-00009-of-00010.tfrecord").write_bytes(b"")
    code, stdout, _ = verify(out, capsys=capsys)
    assert code == 0, stdout
    assert "warning: .tmp-data-00000-of-00003.tfrecord-abc: a temporary file" in stdout
    assert "warning: data-00009-of-00010.tfrecord: not listed in metadata.json" in stdout


# ----------------------------------------------------------------------------------------------
# Plain TFRecord files and sidecar collections
# ----------------------------------------------------------------------------------------------


def test_plain_tfx_file_passes_with_inferred_features(capsys):
    path = fixture_file(PENGUIN)
    for target in (path, str(path.parent / "*")):
        code, out, _ = verify(target, capsys=capsys)
        assert code == 0, out
        assert "TFRecord files, 234 records in 1 files, compression gzip" in out
        assert "species <i8 [1]" in out and "body_mass_g <f4 [1]" in out
    code, out, _ = verify(path, "--json", capsys=capsys)
    report = json.loads(out)
    assert report["kind"] == "files" and report["inferred"] and report["files"][0]["records"] == 234


def test_plain_files_with_a_feature_of_two_kinds_fail(tmp_path, capsys):
    a = codec.encode_batch({"x": np.arange(2)}, [codec.FeatureSpec("x", "<i8", (), "list")], 2)
    b = codec.encode_batch({"x": np.zeros(1, "<f4")}, [codec.FeatureSpec("x", "<f4", (), "list")], 1)
    write_records(tmp_path / "mixed.tfrecord", a + b)
    code, out, _ = verify(tmp_path / "mixed.tfrecord", capsys=capsys)
    assert code == 1 and "[kind]" in out and "record 2" in out and "feature 'x'" in out


def make_sidecar(outputs, tmp_path):
    """A hand-made sidecar collection over the planned output: the sidecar dir is a copy of it with a manifest."""
    original = copy_output(outputs, tmp_path, "planned")
    side = tmp_path / "side"
    shutil.copytree(original, side)
    meta = metadata.load(str(side))
    entries = []
    for s in meta["shards"]:
        data = (original / s["file"]).read_bytes()
        entries.append(
            {
                "input": str(original / s["file"]),
                "sidecar": s["file"],
                "records": s["records"],
                "bytes": len(data),
                "crc32c": google_crc32c.Checksum(data).hexdigest().decode(),
                "compression": "none",
            }
        )
    manifest = {"format": reader.SIDECAR_FORMAT, "features": [f.to_json() for f in meta["features"]], "shards": entries}
    (side / "manifest.json").write_text(json.dumps(manifest))
    return original, side


def test_sidecar_collection_checks_the_manifest_and_reachable_originals(outputs, tmp_path, capsys):
    original, side = make_sidecar(outputs, tmp_path)
    code, out, _ = verify(side, "--json", capsys=capsys)  # the manifest's paths are never followed
    report = json.loads(out)
    assert code == 0 and report["manifest"] == {
        "shards": 3,
        "originals_checked": 0,
        "originals_unreachable": 0,
        "originals_not_named": 3,
    }, out
    assert "3 original shards were not checked" in report["warnings"][0]
    code, out, _ = verify(side, "--json", "--original", str(original), capsys=capsys)
    report = json.loads(out)
    assert code == 0 and report["kind"] == "sidecar", out
    assert report["manifest"] == {
        "shards": 3,
        "originals_checked": 3,
        "originals_unreachable": 0,
        "originals_not_named": 0,
    }
    first = original / metadata.load(str(original))["shards"][0]["file"]
    first.write_bytes(first.read_bytes() + b"\x00")  # the original changed after the sidecar was written
    code, out, _ = verify(side, "--original", str(original), capsys=capsys)
    assert code == 1 and "[manifest]" in out and first.name in out and "changed after its sidecar" in out
    manifest = json.loads((side / "manifest.json").read_text())
    manifest["shards"][1]["records"] += 1
    (side / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = verify(side, "--original", str(original), capsys=capsys)
    assert "misaligned pair" in out and manifest["shards"][1]["sidecar"] in out
    manifest["shards"][1]["records"] -= 1
    (side / "manifest.json").write_text(json.dumps(manifest))
    first.write_bytes(first.read_bytes()[:-1])
    recs = frames(first)  # same size, another value, valid CRCs: only the checksum tells
    write_records(first, [change_value(r, "meta/weights") if i == 0 else r for i, _, r in recs])
    code, out, _ = verify(side, "--original", str(original), capsys=capsys)
    assert code == 1 and "[manifest]" in out and "CRC32C" in out and "changed after its sidecar" in out
    other = tmp_path / "other"
    other.mkdir()
    code, out, _ = verify(side, "--original", str(other / "*"), capsys=capsys)  # none of them named
    assert code == 1 and "--original" in out and "No" in out, out


# ----------------------------------------------------------------------------------------------
# inspect on files without metadata
# ----------------------------------------------------------------------------------------------


def test_inspect_infers_the_features_of_the_tfx_penguin_file(capsys):
    path = fixture_file(PENGUIN)
    for target in (path, path.parent, str(path.parent / "*.gz")):
        code, out, _ = inspect(target, "--json", capsys=capsys)
        assert code == 0
        s = json.loads(out)
        assert s["num_records"] == 234 and s["num_shards"] == 1 and s["compression"] == "gzip"
        assert s["features"] == [
            {"name": n, "dtype": "<f4", "shape": [1], "encoding": "list"}
            for n in ("flipper_length_mm", "culmen_depth_mm", "culmen_length_mm", "body_mass_g")
        ] + [{"name": "species", "dtype": "<i8", "shape": [1], "encoding": "list"}]
        assert s["inferred"] == {"from_records": 234, "metadata": False} and "species" in s["sample"]
    code, out, _ = inspect(path, capsys=capsys)
    assert code == 0 and "no metadata.json: features learned from all 234 records" in out
    assert "species                      <i8        [1]" in out


def test_inspect_refuses_sequence_examples_with_a_clear_record_error(capsys):
    path = fixture_file(SEQUENCE)
    code, _, err = inspect(path, capsys=capsys)
    assert code == 2
    for word in ("error: RecordError:", "Not a tf.train.Example", "SequenceExample", path.name, "record=0"):
        assert word in err, (word, err)


def test_inspect_tolerates_features_with_no_kind_and_varying_lengths(tmp_path, capsys):
    empty = codec.length_delimited_field(
        1, codec.length_delimited_field(1, codec.length_delimited_field(1, b"e") + codec.length_delimited_field(2, b""))
    )
    ints = codec.encode_batch(
        {"n": [np.arange(k) for k in (1, 2)]}, [codec.FeatureSpec("n", "<i8", (None,), "list")], 2
    )
    ints = [codec.drop_features(r, ["n/shape"]) for r in ints]
    write_records(tmp_path / "x.tfrecord", [empty + ints[0], empty + ints[1]])
    code, out, _ = inspect(tmp_path / "x.tfrecord", "--json", capsys=capsys)
    s = json.loads(out)
    assert code == 0 and s["compression"] == "none" and s["num_records"] == 2
    assert s["features"] == [
        {"name": "e", "dtype": "bytes", "shape": [None], "encoding": "varlen"},
        {"name": "n", "dtype": "<i8", "shape": [None], "encoding": "varlen"},
    ]


def test_inspect_reads_shards_without_metadata_and_refuses_an_incomplete_output(outputs, tmp_path, capsys):
    out = copy_output(outputs, tmp_path, "beam")
    shards = tmp_path / "shards"
    shards.mkdir()
    for p in out.glob("data-*"):
        shutil.copy(p, shards)
    code, stdout, _ = inspect(shards, "--json", "--tf_read", capsys=capsys)
    s = json.loads(stdout)
    assert code == 0 and s["num_records"] == s["tf_read_records"] == ROWS and s["compression"] == "gzip"
    assert {"name": "_source/row", "dtype": "<i8", "shape": [1], "encoding": "list"} in s["features"]
    (out / "metadata.json").unlink()  # shards and schema.pbtxt, no metadata: an incomplete output
    code, _, err = inspect(out, capsys=capsys)
    assert code == 2 and err.startswith("error: IncompleteOutputError:") and "incomplete" in err


def test_inspect_of_an_output_directory_is_unchanged(outputs, capsys):
    code, out, _ = inspect(outputs[1]["planned"], "--json", capsys=capsys)
    s = json.loads(out)
    assert code == 0 and s["num_records"] == ROWS and "inferred" not in s


# ----------------------------------------------------------------------------------------------
# Security
# ----------------------------------------------------------------------------------------------


def test_yaml_python_tags_are_refused_and_never_run(tmp_path, capsys):
    marker = tmp_path / "pwned"
    config = tmp_path / "evil.yaml"
    config.write_text(
        f'input: !!python/object/apply:os.system ["touch {marker}"]\n'
        "compression: !!python/object:builtins.object {}\n"
    )
    code, _, err = convert("x.h5", tmp_path / "out", "--config", config, capsys=capsys)
    assert code == 2 and err.startswith("error: ConfigError:") and "Invalid YAML" in err and "evil.yaml" in err
    assert not marker.exists()
    from tfrecord_etl.transforms.config import load_yaml

    with pytest.raises(ConfigError, match="python/object"):
        load_yaml(str(config))


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", "..\\x", "..", ".", "", "x\x00y", 7, None])
def test_metadata_shard_paths_never_leave_the_output_directory(tmp_path, name):
    meta = {
        "format": metadata.FORMAT,
        "compression": "none",
        "features": [],
        "num_records": 0,
        "shards": [{"file": name, "records": 0, "bytes": 0}],
    }
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="Invalid metadata.json"):
        metadata.load(str(tmp_path))
    with pytest.raises(SchemaError):
        next(reader.iter_numpy(str(tmp_path)))


def test_metadata_shard_paths_stay_inside_for_plain_names(tmp_path):
    meta = {
        "format": metadata.FORMAT,
        "compression": "none",
        "features": [],
        "num_records": 0,
        "shards": [{"file": n, "records": 0, "bytes": 0} for n in ("a.tfrecord", "...", "x..y", " ")],
    }
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    for path in metadata.shard_paths(str(tmp_path), metadata.load(str(tmp_path))):
        assert (tmp_path / path).resolve().parent == tmp_path.resolve()


def test_progress_bar_is_off_without_a_terminal_and_safe_on_one(capsys):
    from tfrecord_etl.pipelines.verify import TqdmProgress

    bar = TqdmProgress(enabled=True)
    bar.start("verifying", 10)
    bar.update(5)
    bar.close()
    off = TqdmProgress(enabled=False)
    off.start("verifying", 10)
    off.update(5)
    off.close()
    assert capsys.readouterr().err == ""  # delay=1 s: a fast run shows nothing even on a terminal


def test_infer_specs_names_the_file_and_record_of_a_sequence_example():
    from tfrecord_etl.transforms import verify as verify_lib

    good = frames(fixture_file(PENGUIN), "gzip")[0][2]
    with pytest.raises(RecordError, match="SequenceExample") as e:
        verify_lib.infer_specs([good, frames(fixture_file(SEQUENCE), "gzip")[0][2]], "seq.gz")
    assert e.value.context["file"] == "seq.gz" and e.value.context["record"] == 1
