"""Hostile edits of an output's own files: hostile groups 22 (schema.pbtxt and metadata.json that disagree), 23 (a
span directory that is not the one collection.json lists) and 24 (an input shard that differs from its metadata at
rest, reported as changed while read).

Every output is made by convert here and edited as a user (or a bad copy, restore or script) would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, run_command
from tfrecord_etl.pipelines import augment as augment_main, common, verify as verify_main
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.collections import collection, schemacheck
from tfrecord_etl.transforms.errors import IncompleteOutputError, SchemaError
from tfrecord_etl.transforms.output import metadata, schemafile

X = np.arange(300, dtype=np.float64).reshape(100, 3) / 7  # float64: a tensor feature, tagged <f8 in schema.pbtxt
Y = np.arange(100, dtype=np.int32)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("meta")
    np.savez(tmp / "in.npz", x=X, y=Y)
    assert convert(tmp / "in.npz", tmp / "out", "--num_shards", "2", "--index")[0] == 0
    return tmp / "out"


@pytest.fixture
def out(made, tmp_path):
    """A fresh copy of the output, to edit."""
    shutil.copytree(made, tmp_path / "out")
    return tmp_path / "out"


def run_verify(target, capsys, *flags):
    return run_command(verify_main.main, [target, *flags], capsys)


def run_augment(input_, output_dir, capsys, *flags):
    return run_command(
        augment_main.main,
        ["--input", input_, "--output_dir", output_dir, "--constants", "tag=1", *flags, *BEAM_FLAGS],
        capsys,
    )


def edit_metadata_dtype(out):
    meta = json.loads((out / "metadata.json").read_text())
    (x,) = [f for f in meta["features"] if f["name"] == "x"]
    x["dtype"] = "<i8"
    (out / "metadata.json").write_text(json.dumps(meta, indent=1))


def every_reader(out):
    """Each reader entry point, opening ``out``."""
    common.preload_tensorflow()
    return {
        "iter_numpy": lambda: next(reader.iter_numpy(str(out))),
        "RandomAccess": lambda: reader.RandomAccess(str(out))[0],
        "get": lambda: reader.get(str(out), 3),
        "to_tf_dataset": lambda: reader.to_tf_dataset(str(out)),
        "tf_feature_spec": lambda: reader.tf_feature_spec(str(out)),
    }


# -- group 22: schema.pbtxt and metadata.json disagree ------------------------------------------------------------


def test_a_dtype_edited_in_metadata_json_is_refused_by_verify_every_reader_and_augment(out, tmp_path, capsys):
    """Hostile group 22: metadata.json's dtype of 'x' changed from <f8 to <i8 (schema.pbtxt still tags <f8). Before:
    verify without --source said OK, the readers decoded int64 garbage, augment ran on it."""
    edit_metadata_dtype(out)
    code, text, _ = run_verify(out, capsys)
    assert code == 1 and text.startswith("FAILED")
    assert (
        f"[schema] {out}/schema.pbtxt, feature 'x': its tfrecord_etl.dtype tag is <f8 in schema.pbtxt, <i8 in "
        "metadata.json; one of the two files was edited or replaced after the output was written: convert it "
        "again"
    ) in text
    for read in every_reader(out).values():
        with pytest.raises(
            SchemaError,
            match=r"schema.pbtxt and metadata.json disagree: feature 'x': its "
            r"tfrecord_etl.dtype tag is <f8 in schema.pbtxt, <i8 in metadata.json",
        ):
            read()
    code, _, err = run_augment(out, tmp_path / "aug", capsys)
    assert code == 2 and "error: SchemaError: schema.pbtxt and metadata.json disagree: feature 'x'" in err
    assert not (tmp_path / "aug" / "metadata.json").exists()


@pytest.mark.parametrize(
    "edit, found",
    [
        (lambda t: "garbage {{{\n", "not a TensorFlow Metadata Schema in text format"),
        (
            lambda t: t.replace("tfrecord_etl.dtype:<f8", "tfrecord_etl.dtype:<f4"),
            "its tfrecord_etl.dtype tag is <f4 in schema.pbtxt, <f8 in metadata.json",
        ),
        (
            lambda t: t.replace('name: "y"', 'name: "z"'),
            "feature 'y': the feature is absent in schema.pbtxt, a feature of type INT in metadata.json",
        ),
        (
            lambda t: t.replace("type: INT", "type: FLOAT"),
            "feature 'y': the type is FLOAT in schema.pbtxt, INT in metadata.json",
        ),
    ],
    ids=["garbage", "dtype-tag", "name", "type"],
)
def test_an_edited_schema_pbtxt_fails_verify_and_the_readers(out, capsys, edit, found):
    """Hostile group 22: schema.pbtxt replaced by garbage, or a dtype tag, a feature name or a type edited. Before:
    verify said OK (and TFXIO would read another schema than our readers)."""
    schema = out / "schema.pbtxt"
    schema.write_text(edit(schema.read_text()))
    code, text, _ = run_verify(out, capsys)
    assert code == 1 and "[schema]" in text and found.split(": ", 1)[-1] in text
    with pytest.raises(SchemaError, match="schema.pbtxt and metadata.json disagree") as e:
        next(reader.iter_numpy(str(out)))
    assert found in str(e.value) and e.value.context["file"] == str(schema)


def test_a_missing_schema_pbtxt_is_refused(out, capsys):
    """Hostile group 22: schema.pbtxt deleted: the output is damaged (the readers read on before)."""
    (out / "schema.pbtxt").unlink()
    with pytest.raises(SchemaError, match="schema.pbtxt is missing beside metadata.json"):
        reader.RandomAccess(str(out))
    code, text, _ = run_verify(out, capsys)
    assert code == 1 and "[schema]" in text and "schema.pbtxt is missing" in text


# list features: a dtype edited inside its schema type (FLOAT, BYTES, INT)
F = np.arange(60, dtype=np.float32).reshape(20, 3) * 1e5  # 1e5..: inf as float16
S = np.array([b"abcd%d" % (i % 10) for i in range(20)], "S5")
N = np.arange(20, dtype=np.int64) * 1000  # wraps as uint8


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("listed")
    np.savez(tmp / "in.npz", f=F, s=S, i=N)
    flags = ("--num_shards", "2", "--index", "--feature_encodings", "f=list,s=list,i=list")
    assert convert(tmp / "in.npz", tmp / "out", *flags)[0] == 0
    return tmp / "out"


def edit_meta(out, edit):
    meta = json.loads((out / "metadata.json").read_text())
    edit(meta)
    (out / "metadata.json").write_text(json.dumps(meta, indent=1))


def set_dtype(meta, name, dtype):
    (feature,) = [f for f in meta["features"] if f["name"] == name]
    feature["dtype"] = dtype


@pytest.mark.parametrize(
    "name, was, edited",
    [("f", "<f4", "<f2"), ("s", "|S5", "|S2"), ("i", "<i8", "|u1")],
    ids=["f4-f2", "S5-S2", "i8-u1"],
)
def test_a_dtype_edited_inside_its_schema_type_is_refused_by_verify_and_every_reader(
    listed, tmp_path, capsys, name, was, edited
):
    """A list feature's dtype edited in metadata.json to another of the same schema type (FLOAT, BYTES, INT).
    Before: schema.pbtxt said only the type, so the cross-check passed, verify said OK and the readers read inf,
    truncated strings or wrapped integers (each reader its own way)."""
    out = tmp_path / "out"
    shutil.copytree(listed, out)
    assert f"tfrecord_etl.dtype:{was}" in (out / "schema.pbtxt").read_text()
    edit_meta(out, lambda meta: set_dtype(meta, name, edited))
    found = f"feature '{name}': its tfrecord_etl.dtype tag is {was} in schema.pbtxt, {edited} in metadata.json"
    for what, read in every_reader(out).items():
        with pytest.raises(SchemaError, match="schema.pbtxt and metadata.json disagree: " + found) as e:
            read()
        assert e.value.context["file"] == str(out / "schema.pbtxt") and "\n" not in str(e.value), what
    code, text, _ = run_verify(out, capsys)
    assert code == 1 and f"[schema] {out}/schema.pbtxt, {found}; one of the two files was edited" in text


def strip_new_fields(out):
    """``out`` as an earlier version wrote it: schema.pbtxt without the list features' annotations, metadata.json
    without rows_read and rows_dead_lettered."""
    meta = metadata.load(str(out))
    (out / "schema.pbtxt").write_text(schemafile.schema_text(meta["features"], native_tags=False))
    edit_meta(out, lambda m: [m.pop("rows_read"), m.pop("rows_dead_lettered")])


def test_an_output_written_before_the_list_tags_and_row_counts_reads_and_verifies_as_before(listed, tmp_path, capsys):
    """Compatibility: an output without the new fields (no annotation on its list features, no rows_read) is read
    by every reader and verified as before; its list features' other fields are still compared."""
    out = tmp_path / "out"
    shutil.copytree(listed, out)
    strip_new_fields(out)
    assert "annotation" not in (out / "schema.pbtxt").read_text()
    got = list(reader.iter_numpy(str(out)))
    np.testing.assert_array_equal(np.stack([e["f"] for e in got]), F)
    assert [e["s"].item() for e in got] == list(S) and [e["i"].item() for e in got] == list(N)
    assert reader.RandomAccess(str(out))[19]["i"] == N[19]
    common.preload_tensorflow()
    batch = next(iter(reader.to_tf_dataset(str(out), batch_size=20)))
    np.testing.assert_array_equal(batch["f"].numpy(), F)
    code, text, _ = run_verify(out, capsys)
    assert code == 0 and text.startswith("OK"), text
    schema = out / "schema.pbtxt"
    schema.write_text(schema.read_text().replace("type: FLOAT", "type: INT"))  # still compared: the type
    with pytest.raises(SchemaError, match="feature 'f': the type is INT in schema.pbtxt, FLOAT in metadata.json"):
        next(reader.iter_numpy(str(out)))


def test_a_collection_span_written_before_the_list_tags_has_the_same_schema_as_a_new_one(tmp_path, capsys):
    """Compatibility: in a collection whose span 1 was written before list features carried their annotation
    (its schema.pbtxt and collection.json fingerprint without them), span 2 written now is not a schema change:
    no --allow_schema_change needed, and the spans read together."""
    for span in (1, 2):
        (tmp_path / "raw" / f"span-{span}").mkdir(parents=True)
        np.savez(tmp_path / "raw" / f"span-{span}" / "a.npz", y=Y[:10] + span)
    pattern = str(tmp_path / "raw" / "span-{SPAN}" / "*.npz")
    coll = tmp_path / "coll"
    assert convert(pattern, coll, "--span", "1")[0] == 0
    strip_new_fields(coll / "span-1")
    committed = json.loads((coll / "collection.json").read_text())
    (entry,) = committed["spans"]
    entry.pop("schema_untagged")
    entry["schema"] = collection.schema_fingerprint((coll / "span-1" / "schema.pbtxt").read_text())
    entry["metadata"] = metadata.digest((coll / "span-1" / "metadata.json").read_bytes())
    (coll / "collection.json").write_bytes(collection.dumps(committed))
    assert convert(pattern, coll, "--span", "2")[0] == 0
    assert not collection.load(str(coll))["schema_changes"]
    assert [int(e["y"]) for e in reader.iter_numpy(str(coll))] == list(Y[:10] + 1) + list(Y[:10] + 2)
    code, text, _ = run_verify(coll, capsys)
    assert code == 0, text


def test_a_big_endian_source_reads_back_little_endian_with_its_exact_values(tmp_path, capsys):
    """Byte order: a '>f8' .npy (and '>i8' beside it) is recorded and read back as '<f8' by every reader, with the
    same values, and verify --source finds them equal; nothing promises the source's byte order back."""
    big = (np.arange(40, dtype=np.float64).reshape(20, 2) / 3).astype(">f8")
    np.save(tmp_path / "big.npy", big)
    assert convert(tmp_path / "big.npy", tmp_path / "out", "--index")[0] == 0
    out = str(tmp_path / "out")
    ((name, dtype),) = [
        (f["name"], f["dtype"]) for f in json.loads((tmp_path / "out" / "metadata.json").read_text())["features"]
    ]
    assert dtype == "<f8"
    rows = np.stack([e[name] for e in reader.iter_numpy(out)])
    assert rows.dtype.str == "<f8" and np.array_equal(rows, big)
    assert reader.RandomAccess(out)[7][name].dtype.str == "<f8" and np.array_equal(
        reader.RandomAccess(out)[7][name], big[7]
    )
    common.preload_tensorflow()
    batch = next(iter(reader.to_tf_dataset(out, batch_size=20)))[name].numpy()
    assert batch.dtype.str == "<f8" and np.array_equal(batch, big)
    capsys.readouterr()
    code, text, _ = run_verify(tmp_path / "out", capsys, "--source", tmp_path / "big.npy")
    assert code == 0 and text.startswith("OK") and "(20 of 20 rows compared" in text, text


def test_a_shard_listed_twice_is_refused_by_verify_and_every_reader(made, out, capsys):
    """metadata.json listing one shard file twice (in place of another one). Before: the readers read its records
    twice and the other shard's never, and verify said OK."""
    edit_meta(out, lambda meta: meta["shards"].__setitem__(1, dict(meta["shards"][0])))
    line = (
        "Invalid metadata.json: the file 'data-00000-of-00002.tfrecord' is listed twice (shards 0 and 1): every "
        "record of it would be read twice, and the shard it replaced never"
    )
    for what, read in every_reader(out).items():
        with pytest.raises(SchemaError, match=line.replace("(", r"\(").replace(")", r"\)")) as e:
            read()
        assert e.value.context["file"] == str(out / "metadata.json") and "\n" not in str(e.value), what
    code, _, err = run_verify(out, capsys)
    assert code == 2 and [x for x in err.splitlines() if x.startswith("error:")] == [
        f"error: SchemaError: {line} [file='{out}/metadata.json'] Hint: metadata.json was edited or damaged after "
        f"the output was written: {metadata.REDO}"
    ]


@pytest.mark.parametrize(
    "edit, wrong",
    [
        (
            lambda m: m.update(rows_read=101),
            "rows_read is 101 but the records written (100) and the rows dead-lettered (0) add up to 100",
        ),
        (
            lambda m: m.update(rows_dead_lettered=7),
            "rows_read is 100 but the records written (100) and the rows dead-lettered (7) add up to 107",
        ),
        (lambda m: m.update(num_records=90), "num_records is 90 but its shards hold 100 records"),
        (lambda m: m["shards"][0].update(records=40), "num_records is 100 but its shards hold 90 records"),
    ],
    ids=["rows_read", "rows_dead_lettered", "num_records", "shard-records"],
)
def test_counts_that_do_not_add_up_are_refused_by_verify_and_every_reader(out, capsys, edit, wrong):
    """metadata.json's counts edited so that records written + rows dead-lettered != rows read (or num_records
    != the records its shards list). Before: nothing compared rows_read and rows_dead_lettered with the records,
    and the readers read on."""
    edit_meta(out, edit)
    for what, read in every_reader(out).items():
        with pytest.raises(SchemaError, match="Invalid metadata.json: its counts do not add up: ") as e:
            read()
        assert wrong in str(e.value) and e.value.context["file"] == str(out / "metadata.json"), what
    code, text, _ = run_verify(out, capsys)
    assert code == 1 and f"[count] {out}/metadata.json: metadata.json's counts do not add up: {wrong}" in text


def test_a_replacing_run_killed_between_its_schema_and_its_commit_leaves_the_old_output_readable(
    made, out, tmp_path, capsys
):
    """The crash-safety promise holds with the check: a run replacing the output with other features writes its
    schema.pbtxt just before its metadata.json; killed between the two, the directory holds the new schema.pbtxt
    beside the old metadata.json and the run's marker. The readers read the old output (exactly), verify passes
    with a warning, and the same command run again commits the new output. (float32 x: a FLOAT list feature, not
    a tagged bytes one.)"""
    from tests.test_spans import run_process

    np.savez(tmp_path / "new.npz", x=X.astype(np.float32)[:40], y=Y[:40])
    flags = ("--num_shards", "2", "--index", "--overwrite")
    killed = run_process(str(tmp_path / "new.npz"), str(out), *flags, failpoint="schema-written")
    assert killed.returncode == -9, killed.stderr[-3000:]
    before = (made / "schema.pbtxt").read_text()
    assert "tfrecord_etl.dtype:<f8" in before and "tfrecord_etl.dtype:<f4" in (out / "schema.pbtxt").read_text()
    assert json.loads((out / "metadata.json").read_text())["features"][0]["dtype"] == "<f8"
    np.testing.assert_array_equal(np.stack([e["x"] for e in reader.iter_numpy(str(out))]), X)
    assert reader.RandomAccess(str(out))[99]["y"] == 99
    code, text, _ = run_verify(out, capsys)
    assert code == 0 and "warning: schema.pbtxt disagrees with metadata.json (feature 'x': " in text
    assert convert(tmp_path / "new.npz", out, *flags)[0] == 0
    np.testing.assert_array_equal(np.stack([e["x"] for e in reader.iter_numpy(str(out))]), X.astype(np.float32)[:40])
    assert run_verify(out, capsys)[0] == 0


def test_the_text_parser_agrees_with_the_writer_for_every_encoding_and_dtype():
    """What the readers compare (the reader-only parser of schema.pbtxt against metadata.json's features) holds for
    every schema the writer makes, and the field names it accepts are tensorflow_metadata's."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    from tfrecord_etl.transforms.codec.encodings import ENCODINGS

    assert {f.name for f in schema_pb2.Schema.DESCRIPTOR.fields} == schemacheck.SCHEMA_FIELDS
    assert {f.name for f in schema_pb2.Feature.DESCRIPTOR.fields} == schemacheck.FEATURE_FIELDS
    specs = []
    for encoding in ENCODINGS:
        for dtype in ("<f8", "<f4", "<i8", "|u1", "|b1", "bytes", "<U5", None):
            for shape in ((), (3,), (2, 2), (None,), (None, 3), None):
                spec = FeatureSpec(f"f{len(specs)}\x1bé\"'\\", dtype, shape, encoding)
                try:
                    schemafile.schema_text([spec])
                except Exception:  # noqa: BLE001 - a combination the encoding does not carry
                    continue
                specs.append(spec)
    assert len(specs) > 60
    text = schemafile.schema_text(specs)
    assert schemacheck.disagreements(text, specs) == []
    other = [dataclasses.replace(specs[0], dtype="<i8")] + specs[1:]
    assert [d.feature for d in schemacheck.disagreements(text, other)] == [specs[0].name]
    assert schemacheck.expected_text(specs) is None  # a control character: the parser decides
    printable = [dataclasses.replace(spec, name=f"f{i}é中\"'\\") for i, spec in enumerate(specs)]
    assert schemacheck.expected_text(printable) == schemafile.schema_text(printable)  # the fast path is the writer's


# -- group 23: a span directory that is not the one collection.json lists ---------------------------------------


def make_collection(tmp_path):
    for span in (1, 2):
        (tmp_path / "raw" / f"span-{span}").mkdir(parents=True)
        np.savez(tmp_path / "raw" / f"span-{span}" / "a.npz", x=X[:10] + span)
    pattern = str(tmp_path / "raw" / "span-{SPAN}" / "*.npz")
    for span in (1, 2):
        assert convert(pattern, tmp_path / "coll", "--span", str(span), "--num_shards", "2")[0] == 0
    return tmp_path / "coll"


def test_a_span_replaced_by_a_copy_of_another_is_refused_by_every_reader(tmp_path, capsys):
    """Hostile group 23: span-2/ replaced by a copy of span-1/. Before: verify failed, but iter_numpy, RandomAccess
    and to_tf_dataset read span 1's records twice without a word."""
    coll = make_collection(tmp_path)
    shutil.rmtree(coll / "span-2")
    shutil.copytree(coll / "span-1", coll / "span-2")
    for name, read in every_reader(coll).items():
        with pytest.raises(
            IncompleteOutputError,
            match=r"^Span 2's metadata.json is not the one collection.json "
            r"lists: .*Hint: run the convert of span 2 again",
        ) as e:
            read()
        assert e.value.context["file"] == str(coll / "span-2" / "metadata.json"), name
        assert "\n" not in str(e.value)
    assert len(list(reader.iter_numpy(str(coll), spans=1))) == 10  # the span that is the one listed reads
    trusted = np.stack([e["x"] for e in reader.iter_numpy(str(coll), trust_spans=True)])
    np.testing.assert_array_equal(trusted, np.concatenate([X[:10] + 1, X[:10] + 1]))  # the directory as it is
    assert len(reader.RandomAccess(str(coll), trust_spans=True)) == 20
    code, text, _ = run_verify(coll, capsys)
    assert code == 1 and "Span 2's metadata.json is not the one collection.json lists" in text
    code, _, err = run_augment(coll, tmp_path / "aug", capsys)
    assert code == 2 and "IncompleteOutputError: Span 2's metadata.json is not the one collection.json lists" in err


def test_a_crash_between_the_two_commits_is_refused_until_the_span_is_converted_again(tmp_path):
    """Hostile group 23: the explicit recovery. A re-run of span 2 (its input changed) killed between its span
    commit and its collection commit leaves span-2/ complete and unlisted: the readers refuse it (they read it as if
    listed before) until the same command runs again, which lists it."""
    from tests.test_spans import run_process

    coll = make_collection(tmp_path)
    np.savez(tmp_path / "raw" / "span-2" / "a.npz", x=X[:12] + 20)
    pattern = str(tmp_path / "raw" / "span-{SPAN}" / "*.npz")
    killed = run_process(pattern, str(coll), "--span", "2", "--num_shards", "2", failpoint="before-collection-commit")
    assert killed.returncode == -9, killed.stderr[-3000:]
    with pytest.raises(IncompleteOutputError, match="Span 2's metadata.json is not the one collection.json lists"):
        list(reader.iter_numpy(str(coll)))
    assert len(list(reader.iter_numpy(str(coll), trust_spans=True))) == 22
    assert convert(pattern, coll, "--span", "2", "--num_shards", "2")[0] == 0  # the same command again
    got = np.stack([e["x"] for e in reader.iter_numpy(str(coll))])
    np.testing.assert_array_equal(got, np.concatenate([X[:10] + 1, X[:12] + 20]))
    assert [s["num_records"] for s in collection.load(str(coll))["spans"]] == [10, 12]


# -- group 24: an input shard that differs from its metadata at rest ----------------------------------------------


def test_augment_on_a_shard_swapped_at_rest_says_what_is_wrong_every_time(out, tmp_path, capsys):
    """Hostile group 24: two shards of the same size swapped at rest. Before: "Input shard changed while it was
    read ... run again", and running again failed the same way."""
    a, b = out / "data-00000-of-00002.tfrecord", out / "data-00001-of-00002.tfrecord"
    assert a.stat().st_size == b.stat().st_size
    a.rename(tmp_path / "t")
    b.rename(a)
    (tmp_path / "t").rename(b)
    for attempt in range(2):
        code, _, err = run_augment(out, tmp_path / "aug", capsys)
        assert code == 2, attempt
        line = [x for x in err.splitlines() if x.startswith("error:")][0]
        assert (
            line.startswith("error: RecordError: Input shard differs from its metadata.json (")
            and "did not change during this run: it was corrupted or replaced after it was written" in line
        )
        assert f"tfrecord-etl verify {out}" in line and "changed while it was read" not in line
        assert not (tmp_path / "aug" / "metadata.json").exists()


def test_augment_on_a_truncated_shard_is_refused_at_planning(out, tmp_path, capsys):
    """Hostile group 24: a shard truncated at rest (another size than metadata.json's). Before: "changed while it
    was read (2000 bytes, 3616 when the run was planned): run again"."""
    shard = out / "data-00001-of-00002.tfrecord"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:2000])
    code, _, err = run_augment(out, tmp_path / "aug", capsys)
    assert code == 2
    assert (
        f"error: RecordError: Input shard holds 2000 bytes, its metadata.json says {size}: it was truncated, "
        f"corrupted or replaced after it was written [file='{shard}']"
    ) in err


def test_a_shard_rewritten_during_the_run_is_still_changed_while_read(out, tmp_path, capsys, monkeypatch):
    """Hostile group 24: the real concurrent case stays apart: a shard rewritten (same size, new bytes and
    modification time) while augment reads it is an InputChangedError that says to run again."""
    from tfrecord_etl.transforms.augment import beam as augment_beam

    iter_shard = augment_beam.iter_shard
    a, b = out / "data-00000-of-00002.tfrecord", out / "data-00001-of-00002.tfrecord"

    def hooked(shard, *args, **kwargs):
        for i, item in enumerate(iter_shard(shard, *args, **kwargs)):
            if i == 0 and shard.path == str(a):  # a writer replaces the shard under the reader
                data = b.read_bytes()
                with open(a, "r+b") as f:
                    f.write(data)
                os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 10**9))
            yield item

    monkeypatch.setattr(augment_beam, "iter_shard", hooked)
    code, _, err = run_augment(out, tmp_path / "aug", capsys)
    assert code == 2
    assert "error: InputChangedError: Input shard changed while it was read (rewritten" in err and "run again" in err
