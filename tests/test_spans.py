"""Spans of a collection from input patterns with TFX's placeholders: the placeholders and their span numbers (as
TFX's ``example_gen/utils.py``), the choice of span and version, converting spans into ``OUT/span-N/`` listed by
``collection.json``, idempotent re-runs, schema changes, the refusals, and a kill between a span's commit and the
collection's."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, ROOT, convert
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.collections import collection, spans
from tfrecord_etl.transforms.errors import ConfigError, SchemaError
from tfrecord_etl.transforms.output import runlock

DATES = ["2025-11-23", "2025-11-24", "2025-11-25"]


def make_h5(path, start, rows=40, dtype="<i8"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(start, start + rows, dtype=dtype)
        f["x"] = np.arange(start, start + rows, dtype="<f4")[:, None] * np.ones(3, "<f4")
    return str(path)


def tf_ids(span_dir):
    """The ``id`` of every example of one span, read with plain TensorFlow over metadata.json's shards."""
    import tensorflow as tf

    meta = json.loads(open(os.path.join(span_dir, "metadata.json")).read())
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([3], tf.float32)}
    out = []
    for batch in tf.data.TFRecordDataset([os.path.join(span_dir, s["file"]) for s in meta["shards"]]).batch(16):
        parsed = tf.io.parse_example(batch, spec)
        np.testing.assert_array_equal(parsed["x"].numpy(), parsed["id"].numpy()[:, None].astype("f4") * np.ones(3))
        out += [int(i) for i in parsed["id"].numpy()]
    return out


def our_ids(span_dir):
    return [int(e["id"]) for e in reader.iter_numpy(span_dir)]


def tree(root):
    """``{relative path: (bytes, mtime_ns)}`` of every file under ``root``."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = (open(p, "rb").read(), os.stat(p).st_mtime_ns)
    return out


def shard_bytes(span_dir):
    meta = json.loads(open(os.path.join(span_dir, "metadata.json")).read())
    return [open(os.path.join(span_dir, s["file"]), "rb").read() for s in meta["shards"]]


@pytest.fixture
def dated(tmp_path):
    """Three days of raw files: day i holds a.h5 (40 rows) and b.h5 (25 rows) with ids starting at 1000 * i."""
    for i, day in enumerate(DATES):
        make_h5(tmp_path / "raw" / day / "a.h5", 1000 * i)
        make_h5(tmp_path / "raw" / day / "b.h5", 1000 * i + 500, rows=25)
    return tmp_path


def expected_ids(i):
    return list(range(1000 * i, 1000 * i + 40)) + list(range(1000 * i + 500, 1000 * i + 525))


# ---------------------------------------------------------------- placeholders


def test_dates_become_span_numbers_as_tfx_does():
    for y, m, d in [(1970, 1, 1), (2000, 1, 1), (2025, 11, 24), (2024, 2, 29), (2038, 1, 19)]:
        independent = calendar.timegm((y, m, d, 0, 0, 0)) // 86400  # TFX: days since 1970-01-01
        assert spans.date_to_span(y, m, d) == independent
        assert str(spans.span_to_date(independent)) == f"{y:04d}-{m:02d}-{d:02d}"
    assert spans.date_to_span(2025, 11, 24) == 20416
    assert spans.parse_span_flag("2025-11-24") == (20416, True)
    assert spans.parse_span_flag("latest") == (None, False) and spans.parse_span_flag("7") == (7, False)
    with pytest.raises(ConfigError, match="not a calendar date"):
        spans.parse_span_flag("2025-02-30")


def test_placeholders_become_globs_and_read_the_span_back():
    p = spans.parse("raw/{YYYY}-{MM}-{DD}/*.h5")
    assert (p.kind, p.glob) == ("date", "raw/????-??-??/*.h5")
    assert p.span_of("raw/2025-11-24/a.h5") == (20416, None, "2025-11-24")
    assert p.span_of("raw/2025-11-24/sub/a.h5") is None  # '*' does not cross '/', as Beam's glob
    p = spans.parse("raw/span-{SPAN:3}/v{VERSION}/*.npz")
    assert p.glob == "raw/span-???/v*/*.npz"
    assert p.span_of("raw/span-007/v12/a.npz") == (7, 12, "007")
    assert p.span_of("raw/span-07/v12/a.npz") is None and p.span_of("raw/span-0x7/v1/a.npz") is None
    p = spans.parse("s3://bucket/raw/{SPAN}/part-*.h5")
    assert p.glob == "s3://bucket/raw/*/part-*.h5" and p.span_of("s3://bucket/raw/123/part-0.h5")[:2] == (123, None)
    assert spans.has_placeholders("a/{SPAN}/*") and not spans.has_placeholders("a/{x}/*.h5")


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("raw/{SPAN}/{YYYY}-{MM}-{DD}/*.h5", "both {SPAN} and date placeholders"),
        ("raw/{YYYY}-{MM}/*.h5", "each of {YYYY}, {MM} and {DD}"),
        ("raw/v{VERSION}/*.h5", "{VERSION} needs a span placeholder"),
        ("raw/{SPAN}/{DAY}/*.h5", "Unknown placeholder {DAY}"),
        ("raw/{SPAN}/{SPAN}/*.h5", "Only one {SPAN}"),
        ("raw/{SPAN:0}/*.h5", "not a positive integer"),
        ("raw/{SPAN:x}/*.h5", "not a positive integer"),
    ],
)
def test_bad_patterns_are_refused(pattern, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        spans.parse(pattern)


def test_resolve_picks_the_latest_span_and_version_or_the_one_asked(tmp_path):
    for span, version in [(3, 1), (12, 1), (12, 2), (9, 4)]:
        make_h5(tmp_path / f"span-{span}" / f"v{version}" / "a.h5", span)
    make_h5(tmp_path / "span-old" / "v1" / "a.h5", 0)  # not a number where {SPAN} stands: not a span
    pattern = str(tmp_path / "span-{SPAN}" / "v{VERSION}" / "*.h5")
    got = spans.resolve(pattern)
    assert (got.span, got.version, got.spans) == (12, 2, (3, 9, 12))
    assert got.files == ((str(tmp_path / "span-12/v2/a.h5"), os.path.getsize(tmp_path / "span-12/v2/a.h5")),)
    assert got.pattern == str(tmp_path / "span-12" / "v2" / "*.h5")
    assert (spans.resolve(pattern, "12", 1).version, spans.resolve(pattern, 3).span) == (1, 3)
    with pytest.raises(ConfigError, match=r"No input file of span 4 .*spans found: 3, 9, 12"):
        spans.resolve(pattern, "4")
    with pytest.raises(ConfigError, match=r"span 12 version 3 .*versions of span 12: 1, 2"):
        spans.resolve(pattern, "12", 3)
    with pytest.raises(ConfigError, match=r"is a date, but the input pattern has \{SPAN\}"):
        spans.resolve(pattern, "2025-11-24")
    with pytest.raises(ConfigError, match=r"--version 1: the input pattern has no \{VERSION\}"):
        spans.resolve(str(tmp_path / "span-{SPAN}" / "v1" / "*.h5"), None, 1)


# ---------------------------------------------------------------- converting spans


def test_three_date_spans_convert_into_a_collection_listed_in_order(dated, capsys):
    pattern, out = str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), str(dated / "out")
    for day in (DATES[2], DATES[0], DATES[1]):  # out of order: the collection lists them by span
        code, stdout, err = convert(pattern, out, "--span", day, capsys=capsys)
        assert code == 0, err
    assert f"span: {spans.date_to_span(2025, 11, 24)} (2025-11-24) in {out}/span-20416" in stdout
    assert f"collection: {out}: 3 spans (20415-20417), {3 * 65:,} records" in stdout
    coll = collection.load(out)
    assert [(s["span"], s["date"], s["dir"], s["num_records"]) for s in coll["spans"]] == [
        (20415 + i, d, f"span-{20415 + i}", 65) for i, d in enumerate(DATES)
    ]
    assert coll["input_pattern"] == pattern and coll["schema_changes"] == []
    for i, s in enumerate(coll["spans"]):
        files = [str(dated / "raw" / DATES[i] / n) for n in ("a.h5", "b.h5")]
        assert s["inputs"] == [
            {"path": f, "size": os.path.getsize(f), "mtime_ns": os.stat(f).st_mtime_ns, "version": None} for f in files
        ]
        span_dir = os.path.join(out, s["dir"])
        assert tf_ids(span_dir) == our_ids(span_dir) == expected_ids(i)
        meta = json.loads(open(os.path.join(span_dir, "metadata.json")).read())
        assert meta["options"]["input"] == str(dated / "raw" / DATES[i] / "*.h5")
    assert len({s["schema"] for s in coll["spans"]}) == 1
    assert collection.span_dirs(out, "latest:2") == [f"{out}/span-20416", f"{out}/span-20417"]


def test_the_latest_span_is_the_default_and_a_rerun_is_byte_identical_leaving_other_spans_untouched(dated, capsys):
    pattern, out = str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), dated / "out"
    assert convert(pattern, str(out), "--span", DATES[0], "--num_shards", "2")[0] == 0
    assert convert(pattern, str(out), "--num_shards", "2")[0] == 0  # latest: 2025-11-25
    assert [s["span"] for s in collection.load(str(out))["spans"]] == [20415, 20417]
    before_other, before = tree(out / "span-20415"), shard_bytes(str(out / "span-20417"))
    entry = collection.load(str(out))["spans"][1]
    code, _, err = convert(pattern, str(out), "--span", "20417", "--num_shards", "2", capsys=capsys)
    assert code == 0, err
    assert shard_bytes(str(out / "span-20417")) == before  # byte-identical shards (the other generation's names)
    assert tree(out / "span-20415") == before_other  # bytes and mtimes
    after = collection.load(str(out))["spans"]
    assert [s["span"] for s in after] == [20415, 20417]
    assert after[1]["inputs"] == entry["inputs"] and after[1]["schema"] == entry["schema"]
    assert after[1]["run_id"] != entry["run_id"]
    assert our_ids(str(out / "span-20417")) == expected_ids(2)


def test_a_schema_change_is_refused_unless_allowed_and_then_recorded(dated, capsys):
    make_h5(dated / "raw" / "2025-11-26" / "a.h5", 3000, dtype="<i4")  # another dtype and one more feature
    with h5py.File(dated / "raw" / "2025-11-26" / "a.h5", "a") as f:
        f["extra"] = np.zeros(40, "<f4")
    pattern, out = str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), str(dated / "out")
    assert convert(pattern, out, "--span", DATES[2])[0] == 0
    code, _, err = convert(pattern, out, "--span", "2025-11-26", capsys=capsys)
    assert code == 2 and "SchemaError: Span 20418 has another schema than span 20417" in err
    assert "--allow_schema_change" in err
    assert not os.path.exists(os.path.join(out, "span-20418"))  # refused before anything was written
    assert [s["span"] for s in collection.load(out)["spans"]] == [20417]
    code, _, err = convert(pattern, out, "--span", "2025-11-26", "--allow_schema_change", capsys=capsys)
    assert code == 0, err
    coll = collection.load(out)
    assert [s["span"] for s in coll["spans"]] == [20417, 20418]
    assert coll["schema_changes"] == [
        {
            "span": 20418,
            "version": None,
            "schema": coll["spans"][1]["schema"],
            "previous": coll["spans"][0]["schema"],
            "previous_span": 20417,
        }
    ]
    with pytest.raises(SchemaError, match="different schemas"):
        collection.check_same_schema(coll["spans"])


def test_versions_are_written_to_their_own_directories(tmp_path, capsys):
    make_h5(tmp_path / "raw" / "span-7" / "v1" / "a.h5", 0)
    make_h5(tmp_path / "raw" / "span-7" / "v2" / "a.h5", 100)
    pattern, out = str(tmp_path / "raw" / "span-{SPAN}" / "v{VERSION}" / "*.h5"), str(tmp_path / "out")
    assert convert(pattern, out, "--version", "1")[0] == 0
    code, stdout, err = convert(pattern, out, capsys=capsys)
    assert code == 0, err
    assert f"span: 7 version 2 in {out}/span-7/version-2" in stdout
    coll = collection.load(out)
    assert [(s["span"], s["version"], s["dir"]) for s in coll["spans"]] == [
        (7, 1, "span-7/version-1"),
        (7, 2, "span-7/version-2"),
    ]
    assert collection.span_dirs(out) == [f"{out}/span-7/version-2"]  # the latest version of each span
    assert our_ids(f"{out}/span-7/version-1") == list(range(40)) and tf_ids(f"{out}/span-7/version-2") == list(
        range(100, 140)
    )


def test_collection_and_plain_output_directories_are_not_mixed(dated, capsys):
    pattern, out = str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), str(dated / "out")
    assert convert(pattern, out)[0] == 0
    code, _, err = convert(str(dated / "raw" / DATES[0] / "*.h5"), out, "--overwrite", capsys=capsys)
    assert code == 2 and "--output_dir is a collection (it holds collection.json)" in err
    plain = str(dated / "plain")
    assert convert(str(dated / "raw" / DATES[0] / "*.h5"), plain)[0] == 0
    code, _, err = convert(pattern, plain, capsys=capsys)
    assert code == 2 and "is the output directory of one conversion (it holds metadata.json)" in err
    code, _, err = convert(str(dated / "raw" / DATES[0] / "*.h5"), str(dated / "x"), "--span", "3", capsys=capsys)
    assert code == 2 and "--span and --version need an --input with {SPAN}" in err
    wide = str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*")  # its glob raw/????-??-??/* reaches the output dir
    code, _, err = convert(wide, str(dated / "raw" / "2030-01-01"), capsys=capsys)
    assert code == 2 and "--input matches the files this run writes" in err and "collection.json" in err
    assert not os.path.exists(dated / "raw" / "2030-01-01")


def test_dry_run_names_the_span_its_directory_and_files_and_writes_nothing(dated, capsys):
    pattern, out = str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), str(dated / "out")
    code, stdout, err = convert(pattern, out, "--dry_run", "--span", DATES[1], capsys=capsys)
    assert code == 0, err
    assert f"span 20416 (2025-11-24) -> {out}/span-20416" in stdout
    assert f"files of the span: 2: {dated}/raw/2025-11-24/a.h5, {dated}/raw/2025-11-24/b.h5" in stdout
    assert f"collection: {out} (0 committed spans)" in stdout
    assert not os.path.exists(out)


def run_process(pattern, out, *flags, failpoint=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(runlock.FAILPOINT_ENV, None)
    if failpoint:
        env[runlock.FAILPOINT_ENV] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "pipelines.convert", "--input", pattern, "--output_dir", out, *flags, *BEAM_FLAGS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_kill_between_the_span_commit_and_the_collection_commit_leaves_the_span_invisible(dated):
    pattern, out = str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), str(dated / "out")
    assert run_process(pattern, out, "--span", DATES[0]).returncode == 0
    killed = run_process(pattern, out, "--span", DATES[1], failpoint="before-collection-commit")
    assert killed.returncode == -9, killed.stderr
    assert os.path.exists(os.path.join(out, "span-20416", "metadata.json"))  # the span's output is complete ...
    assert [s["span"] for s in collection.load(out)["spans"]] == [20415]  # ... and not listed
    assert collection.span_dirs(out) == [f"{out}/span-20415"]
    again = run_process(pattern, out, "--span", DATES[1])  # takes the dead run's lock over, completes the span
    assert again.returncode == 0, again.stderr
    assert [s["span"] for s in collection.load(out)["spans"]] == [20415, 20416]
    assert our_ids(f"{out}/span-20416") == tf_ids(f"{out}/span-20416") == expected_ids(1)


def test_an_output_written_before_the_collection_flags_existed_is_rerun_without_overwrite(dated, capsys):
    """The flags that choose a span are not part of the options a re-run is compared with."""
    inp, out = str(dated / "raw" / DATES[0] / "*.h5"), dated / "plain"
    assert convert(inp, str(out))[0] == 0
    for name in ("metadata.json", ".tf-etl-run.json"):  # as an earlier version wrote them
        data = json.loads((out / name).read_text())
        for key in ("span", "version", "incremental", "reconvert_changed", "allow_schema_change"):
            del data["options"][key]
        (out / name).write_text(json.dumps(data))
    code, _, err = convert(inp, str(out), capsys=capsys)
    assert code == 0, err
    assert our_ids(str(out)) == expected_ids(0)


def test_the_ptransform_refuses_placeholders_naming_the_command(dated):
    from tfrecord_etl.transforms.convert import ConvertToTFRecord

    with pytest.raises(ConfigError, match="write a collection of spans, which the convert command does"):
        ConvertToTFRecord(str(dated / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), str(dated / "out"))
    assert not os.path.exists(dated / "out")
