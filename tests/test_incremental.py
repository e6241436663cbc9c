"""``convert --incremental``: the files of a growing directory that no committed span holds become the next span
(the collection's ledger: path, size and mtime_ns locally, ETag on s3://); a run with nothing new writes nothing; a
changed file stops the run, naming it and its span, unless ``--reconvert_changed``; deleted files are reported."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

from tests.conftest import convert
from tests.test_spans import make_h5, our_ids, tf_ids
from tfrecord_etl.transforms.collections import collection


def everything(root):
    """``{relative path: (bytes or None for a directory, mtime_ns)}`` of every file and directory under ``root``."""
    out = {".": (None, os.stat(root).st_mtime_ns)}
    for d, dirs, names in os.walk(root):
        for n in dirs:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = (None, os.stat(p).st_mtime_ns)
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = (open(p, "rb").read(), os.stat(p).st_mtime_ns)
    return out


@pytest.fixture
def growing(tmp_path):
    """raw/ with f0.h5 .. f2.h5 (ids 100*i ... 100*i + 19), and the collection directory out/."""
    for i in range(3):
        make_h5(tmp_path / "raw" / f"f{i}.h5", 100 * i, rows=20)
    return str(tmp_path / "raw" / "*.h5"), str(tmp_path / "out"), tmp_path


def ids_of(*files):
    return [i for f in files for i in range(100 * f, 100 * f + 20)]


def test_incremental_converts_exactly_the_new_files_as_the_next_span(growing, capsys):
    pattern, out, tmp = growing
    code, stdout, err = convert(pattern, out, "--incremental", capsys=capsys)
    assert code == 0, err
    assert f"span: 0 in {out}/span-0" in stdout and f"collection: {out}: 1 spans (0-0), 60 records" in stdout
    make_h5(tmp / "raw" / "f3.h5", 300, rows=20)
    make_h5(tmp / "raw" / "f4.h5", 400, rows=20)
    code, stdout, err = convert(pattern, out, "--incremental", capsys=capsys)
    assert code == 0, err
    assert f"collection: {out}: 2 spans (0-1), 100 records" in stdout
    coll = collection.load(out)
    assert [[r["path"] for r in s["inputs"]] for s in coll["spans"]] == [
        [str(tmp / "raw" / f"f{i}.h5") for i in range(3)],
        [str(tmp / "raw" / f"f{i}.h5") for i in (3, 4)],
    ]
    for s in coll["spans"]:
        for r in s["inputs"]:
            st = os.stat(r["path"])
            assert (r["size"], r["mtime_ns"], r["version"]) == (st.st_size, st.st_mtime_ns, None)
    assert [s["num_records"] for s in coll["spans"]] == [60, 40]
    assert our_ids(f"{out}/span-0") == tf_ids(f"{out}/span-0") == ids_of(0, 1, 2)
    assert our_ids(f"{out}/span-1") == tf_ids(f"{out}/span-1") == ids_of(3, 4)
    assert coll["input_pattern"] == pattern


def test_nothing_new_says_so_and_writes_nothing(growing, capsys):
    pattern, out, _tmp = growing
    assert convert(pattern, out, "--incremental")[0] == 0
    capsys.readouterr()
    before = everything(out)
    code, stdout, err = convert(pattern, out, "--incremental", capsys=capsys)
    assert code == 0, err
    assert stdout.strip() == f"nothing new: 3 files matched, all in committed spans (1 spans in {out}); nothing written"
    assert everything(out) == before  # no lock, no directory, no file touched: bytes and mtimes
    code, stdout, err = convert(pattern, out, "--incremental", "--dry_run", capsys=capsys)
    assert code == 0 and stdout.startswith("nothing new: 3 files matched") and everything(out) == before


def test_a_changed_file_is_named_with_its_span_and_reconvert_changed_converts_that_span_again(growing, capsys):
    pattern, out, tmp = growing
    assert convert(pattern, out, "--incremental")[0] == 0
    make_h5(tmp / "raw" / "f3.h5", 300, rows=20)
    assert convert(pattern, out, "--incremental")[0] == 0
    changed = tmp / "raw" / "f1.h5"
    with h5py.File(changed, "r+") as f:  # same size, other values
        f["id"][:] = np.arange(5000, 5020)
        f["x"][:] = np.arange(5000, 5020, dtype="<f4")[:, None] * np.ones(3, "<f4")
    st = os.stat(changed)
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    make_h5(tmp / "raw" / "f5.h5", 500, rows=20)
    before = everything(out)
    code, _, err = convert(pattern, out, "--incremental", capsys=capsys)
    assert code == 2
    assert "InputChangedError: 1 input file(s) changed since their span was converted" in err
    assert f"{changed} in span 0" in err and "--reconvert_changed" in err
    assert everything(out) == before
    code, stdout, err = convert(pattern, out, "--incremental", "--reconvert_changed", "--dry_run", capsys=capsys)
    assert code == 0 and f"span 0 -> {out}/span-0 (re-converted: files changed)" in stdout
    assert "incremental: 0 new, 1 changed" in stdout and everything(out) == before
    code, stdout, err = convert(pattern, out, "--incremental", "--reconvert_changed", capsys=capsys)
    assert code == 0, err
    assert "re-converting span 0 only; 1 new file(s) wait, for the next run" in err
    coll = collection.load(out)
    assert [s["span"] for s in coll["spans"]] == [0, 1]
    row = [r for r in coll["spans"][0]["inputs"] if r["path"] == str(changed)][0]
    assert (row["size"], row["mtime_ns"]) == (os.stat(changed).st_size, os.stat(changed).st_mtime_ns)
    expected = ids_of(0) + list(range(5000, 5020)) + ids_of(2)
    assert our_ids(f"{out}/span-0") == tf_ids(f"{out}/span-0") == expected
    code, stdout, err = convert(pattern, out, "--incremental", capsys=capsys)  # now the new file
    assert code == 0, err
    assert f"collection: {out}: 3 spans (0-2)" in stdout
    assert our_ids(f"{out}/span-2") == ids_of(5)


def test_deleted_inputs_are_reported_and_their_spans_kept(growing, capsys):
    pattern, out, tmp = growing
    assert convert(pattern, out, "--incremental")[0] == 0
    os.unlink(tmp / "raw" / "f1.h5")
    capsys.readouterr()
    before = everything(out)
    code, stdout, err = convert(pattern, out, "--incremental", capsys=capsys)
    assert code == 0, err
    assert "1 file(s) held by committed spans no longer match the pattern" in err and str(tmp / "raw/f1.h5") in err
    assert stdout.startswith("nothing new: 2 files matched") and everything(out) == before
    assert our_ids(f"{out}/span-0") == ids_of(0, 1, 2)


def test_incremental_takes_no_placeholders_and_reconvert_changed_needs_it(growing, capsys):
    pattern, out, tmp = growing
    code, _, err = convert(str(tmp / "raw" / "{SPAN}" / "*.h5"), out, "--incremental", capsys=capsys)
    assert code == 2 and "--incremental takes a pattern without placeholders" in err
    code, _, err = convert(pattern, out, "--reconvert_changed", capsys=capsys)
    assert code == 2 and "--reconvert_changed goes with --incremental" in err
    assert not os.path.exists(out)


def test_incremental_on_s3_records_etags_and_finds_a_changed_object_by_its_etag(s3, tmp_path, capsys):
    from tests.conftest import run_command
    from tests.test_s3 import BUCKET, keys
    from tfrecord_etl.pipelines import convert as convert_module
    from tfrecord_etl.transforms import reader

    client, flags = s3

    def convert_s3(argv):
        return run_command(convert_module.main, argv, capsys)

    def put(name, start):
        client.put_object(
            Bucket=BUCKET, Key=f"inc/raw/{name}", Body=open(make_h5(tmp_path / name, start, 20), "rb").read()
        )

    for i in range(2):
        put(f"f{i}.h5", 100 * i)
    pattern, out = f"s3://{BUCKET}/inc/raw/*.h5", f"s3://{BUCKET}/inc/out"
    run = [
        "--input",
        pattern,
        "--output_dir",
        out,
        "--incremental",
        "--runner=DirectRunner",
        "--direct_running_mode=in_memory",
        *flags,
    ]
    assert convert_s3(run)[0] == 0
    put("f2.h5", 200)
    assert convert_s3(run)[0] == 0
    coll = json.loads(client.get_object(Bucket=BUCKET, Key="inc/out/collection.json")["Body"].read())
    assert [[r["path"].rsplit("/", 1)[1] for r in s["inputs"]] for s in coll["spans"]] == [
        ["f0.h5", "f1.h5"],
        ["f2.h5"],
    ]
    for s in coll["spans"]:
        for r in s["inputs"]:
            head = client.head_object(Bucket=BUCKET, Key=r["path"][len(f"s3://{BUCKET}/") :])
            assert (r["size"], r["version"], r["mtime_ns"]) == (head["ContentLength"], head["ETag"], None)
    assert [int(e["id"]) for e in reader.iter_numpy(f"{out}/span-1")] == ids_of(2)
    written = keys(client, "inc/out/")
    assert convert_s3(run)[0] == 0  # nothing new: nothing written
    assert keys(client, "inc/out/") == written
    put("f1.h5", 900)  # same size, other bytes: another ETag
    code, _, err = convert_s3(run)
    assert code == 2 and keys(client, "inc/out/") == written
    assert "InputChangedError" in err and f"s3://{BUCKET}/inc/raw/f1.h5 in span 0" in err
    assert convert_s3(run + ["--reconvert_changed"])[0] == 0
    assert [int(e["id"]) for e in reader.iter_numpy(f"{out}/span-0")] == ids_of(0, 9)
    coll = json.loads(client.get_object(Bucket=BUCKET, Key="inc/out/collection.json")["Body"].read())
    assert coll["spans"][0]["inputs"][1]["version"] == client.head_object(Bucket=BUCKET, Key="inc/raw/f1.h5")["ETag"]


from tests.test_s3 import s3  # noqa: E402,F401 - the moto server fixture
