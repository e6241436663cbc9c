"""Hostile groups 1-8 (and the output-directory items of 16): a run deletes or replaces only files of
ours, refuses everything else, takes paths literally, and holds an exclusive lock (transforms/output/outdir.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import uuid

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.conftest import BEAM_FLAGS, ROOT, convert, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.output import outdir

ROWS = 40


def make_h5(path, rows=ROWS, offset=0):
    data = np.arange(offset, offset + rows * 4, dtype="<i4").reshape(rows, 4)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data)
    return data


def snapshot(directory) -> dict[str, bytes]:
    """Every file under ``directory`` (recursively) with its bytes."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def read_x(out):
    return np.stack([e["x"] for e in reader.iter_numpy(str(out))])


def augment(input_pattern, output_dir, *flags, capsys=None):
    from tfrecord_etl.pipelines import augment as augment_main

    argv = ["--input", input_pattern, "--output_dir", output_dir, "--constants", "k=1", *flags] + BEAM_FLAGS
    return run_command(augment_main.main, argv, capsys)


def test_rerun_of_the_same_command_keeps_the_users_files(tmp_path, capsys):
    """Hostile group 1: a re-run into a complete output holding the user's notes.txt keeps notes.txt."""
    data = make_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    assert convert(tmp_path / "in.h5", out, capsys=capsys)[0] == 0
    (out / "notes.txt").write_text("mine")
    code, _, err = convert(tmp_path / "in.h5", out, capsys=capsys)
    assert code == 2 and "holds files tfrecord-etl did not write (notes.txt)" in err and "--overwrite" in err
    assert (out / "notes.txt").read_text() == "mine"
    code, _, err = convert(tmp_path / "in.h5", out, "--overwrite", capsys=capsys)
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine"
    assert "keeping 1 file tfrecord-etl did not write" in err and "removing" in err  # printed by default
    np.testing.assert_array_equal(read_x(out), data)


def test_another_tools_shards_named_like_ours_are_never_deleted(tmp_path, capsys):
    """Hostile group 2: shards of another tool named like ours (Beam's template) and its schema.pbtxt,
    with no metadata.json, are not ours: refused without --overwrite, and never replaced with it."""
    make_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord", "schema.pbtxt"):
        (out / name).write_bytes(b"another tool's " + name.encode())
    before = snapshot(out)
    code, _, err = convert(tmp_path / "in.h5", out, "--num_shards", "2", capsys=capsys)
    assert code == 2 and "did not write" in err
    code, _, err = convert(tmp_path / "in.h5", out, "--num_shards", "2", "--overwrite", capsys=capsys)
    assert code == 2 and "with the names this run writes" in err and "never replaced" in err
    after = snapshot(out)
    assert {k: after[k] for k in before} == before


def test_augment_never_replaces_a_split_named_like_its_output(tmp_path, capsys):
    """Hostile group 3: augment --input 'Split-train/*.gz' --output_dir Split-eval must not replace the
    eval split, whose shard names equal the train split's."""
    import tensorflow as tf

    for split in ("Split-train", "Split-eval"):
        (tmp_path / split).mkdir()
        with tf.io.TFRecordWriter(str(tmp_path / split / "data_tfrecord-00000-of-00001.gz"), options="GZIP") as w:
            for i in range(5):
                ex = tf.train.Example(
                    features=tf.train.Features(
                        feature={"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                    )
                )
                w.write(ex.SerializeToString())
    before = snapshot(tmp_path / "Split-eval")
    for flags in ([], ["--overwrite"]):
        code, _, err = augment(str(tmp_path / "Split-train" / "*.gz"), tmp_path / "Split-eval", *flags, capsys=capsys)
        assert code == 2 and "did not write" in err, err
    assert snapshot(tmp_path / "Split-eval") == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_output_dir_symlink_to_the_input_is_refused(tmp_path, capsys, overwrite):
    """Hostile group 4: --output_dir a symlink to the input collection (augment) or to the input's
    directory (convert) is found with realpath and refused; the inputs are untouched."""
    src = tmp_path / "src"
    src.mkdir()
    make_h5(src / "in.h5")
    assert convert(src / "in.h5", tmp_path / "coll", capsys=capsys)[0] == 0
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "coll")
    before = snapshot(tmp_path / "coll")
    flags = ["--overwrite"] if overwrite else []
    code, _, err = augment(str(tmp_path / "coll"), link, *flags, capsys=capsys)
    assert code == 2 and "is inside --output_dir" in err, err
    assert snapshot(tmp_path / "coll") == before
    link2 = tmp_path / "link2"
    link2.symlink_to(src)
    code, _, err = convert(link2 / "in.h5", tmp_path / "src", *flags, capsys=capsys)
    assert code == 2 and "is inside --output_dir" in err
    assert (src / "in.h5").exists()


def test_convert_overwrite_never_deletes_an_input_inside_the_output(tmp_path, capsys):
    """Hostile group 5: convert --overwrite with the input file inside --output_dir is refused before
    anything is deleted (augment already refused this)."""
    out = tmp_path / "out"
    out.mkdir()
    data = make_h5(out / "in.h5")
    code, _, err = convert(out / "in.h5", out, "--overwrite", capsys=capsys)
    assert code == 2 and "An input file is inside --output_dir" in err
    with h5py.File(out / "in.h5") as f:
        np.testing.assert_array_equal(f["x"][:], data)


def test_dead_letter_dir_inside_the_output_is_refused(tmp_path, capsys):
    """Hostile group 5: dead letters are never written where a re-run could delete them."""
    make_h5(tmp_path / "in.h5")
    code, _, err = convert(
        tmp_path / "in.h5", tmp_path / "out", "--dead_letter_dir", tmp_path / "out" / "dl", capsys=capsys
    )
    assert code == 2 and "--dead_letter_dir is inside --output_dir" in err


def test_a_held_lock_refuses_a_second_run(tmp_path, capsys):
    """Hostile group 6: while one run holds the output directory's lock, another is refused at once."""
    make_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    lock = outdir.prepare(str(out), command="convert", options={}, files=[], overwrite=False)
    try:
        code, _, err = convert(tmp_path / "in.h5", out, "--overwrite", capsys=capsys)
        assert code == 2 and "Another run (host" in err and f"pid {os.getpid()}" in err
    finally:
        lock.release()
    assert not (out / outdir.LOCK_FILE).exists()
    assert convert(tmp_path / "in.h5", out, capsys=capsys)[0] == 0  # the marker of that run was ours


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path, capsys):
    """Hostile group 6: a lock left by a launcher that was killed (its pid is gone) is taken over."""
    data = make_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / outdir.LOCK_FILE).write_text(
        json.dumps({"host": os.uname().nodename, "pid": dead.pid, "start": "1", "run_id": "x", "since": "then"})
    )
    code, _, err = convert(tmp_path / "in.h5", out, capsys=capsys)
    assert code == 0, err
    assert "taking over the stale lock" in err
    np.testing.assert_array_equal(read_x(out), data)
    assert not (out / outdir.LOCK_FILE).exists()


@pytest.mark.timeout(300)
def test_two_concurrent_runs_into_one_directory(tmp_path):
    """Hostile group 6: two convert processes started together into one --output_dir: one is refused
    with the lock's error, the other's output holds exactly its own input's rows."""
    a, b = make_h5(tmp_path / "a.h5", rows=400), make_h5(tmp_path / "b.h5", rows=400, offset=10**6)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelines.convert",
                "--input",
                str(tmp_path / f"{n}.h5"),
                "--output_dir",
                str(out),
                *BEAM_FLAGS,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in "ab"
    ]
    results = [p.communicate(timeout=240) + (p.returncode,) for p in procs]
    codes = [r[2] for r in results]
    if codes == [0, 0]:  # one finished before the other started: then the second refused or replaced ours
        pytest.fail("both runs succeeded: " + " | ".join(r[1] for r in results))
    assert sorted(codes) == [0, 2], results
    loser = results[codes.index(2)][1]
    assert "Another run" in loser or "holds a complete output of another run" in loser, loser
    winner = a if codes[0] == 0 else b
    np.testing.assert_array_equal(read_x(out), winner)


def test_output_dir_with_glob_characters_is_literal(tmp_path, capsys):
    """Hostile group 7: --output_dir 'o[ab]' is a directory name, not a pattern: the sibling directories
    oa/ and ob/ are never listed, sized or deleted, with or without --overwrite."""
    data = make_h5(tmp_path / "in.h5")
    for sib in ("oa", "ob"):
        (tmp_path / sib).mkdir()
        (tmp_path / sib / "data-00000-of-00001.tfrecord").write_bytes(b"sibling " + sib.encode())
        (tmp_path / sib / "metadata.json").write_text("{}")
    before = snapshot(tmp_path / "oa"), snapshot(tmp_path / "ob")
    out = tmp_path / "o[ab]"
    assert convert(tmp_path / "in.h5", out, "--num_shards", "1", capsys=capsys)[0] == 0
    code, _, err = convert(tmp_path / "in.h5", out, "--num_shards", "1", "--overwrite", capsys=capsys)
    assert code == 0, err
    assert (snapshot(tmp_path / "oa"), snapshot(tmp_path / "ob")) == before
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["shards"][0]["bytes"] == (out / meta["shards"][0]["file"]).stat().st_size
    np.testing.assert_array_equal(read_x(out), data)
    code, _, err = convert(tmp_path / "in.h5", tmp_path / "p[ab]", "--writer", "beam", capsys=capsys)
    assert code == 2 and "--writer beam cannot write into a directory whose name holds" in err
    # with no sibling matching the pattern, every run ended in IndexError (the shard size was looked up by match)
    code, _, err = convert(tmp_path / "in.h5", tmp_path / "q[xy]", capsys=capsys)
    assert code == 0, err
    np.testing.assert_array_equal(read_x(tmp_path / "q[xy]"), data)


def test_empty_output_dir_is_refused(tmp_path, capsys, monkeypatch):
    """Hostile group 7: --output_dir "" never means the current directory."""
    make_h5(tmp_path / "in.h5")
    monkeypatch.chdir(tmp_path)
    code, _, err = convert(tmp_path / "in.h5", "", capsys=capsys)
    assert code == 2 and "output_dir" in err
    assert sorted(os.listdir(tmp_path)) == ["in.h5"]
    with pytest.raises(ConfigError, match="--output_dir is empty"):
        outdir.prepare("", command="convert", options={}, files=[], overwrite=True)


def test_temporaries_of_killed_attempts_are_removed_by_name(tmp_path, capsys):
    """Hostile group 8: at commit, only temporaries of this run's own file names are removed (and printed);
    a '.tmp-' file of another name is not ours and is kept (it makes a re-run refuse without --overwrite)."""
    out = tmp_path / "out"
    out.mkdir()
    key = hashlib.sha1(b"data-00000-of-00001.tfrecord").hexdigest()[:8]
    ours = out / f".tmp-{uuid.uuid4().hex}-{key}"
    legacy = out / f".tmp-data-00000-of-00001.tfrecord-{uuid.uuid4().hex}"  # an earlier version's temporary
    other = out / f".tmp-notes.txt-{uuid.uuid4().hex}"
    other_new = out / f".tmp-{uuid.uuid4().hex}-{hashlib.sha1(b'notes.txt').hexdigest()[:8]}"
    for path in (ours, legacy):
        path.write_bytes(b"killed attempt")
    for path in (other, other_new):
        path.write_bytes(b"not ours")
    outdir.remove_temporaries(str(out), ["data-00000-of-00001.tfrecord"])
    assert not ours.exists() and not legacy.exists()
    assert other.read_bytes() == b"not ours" and other_new.read_bytes() == b"not ours"
    assert "removing 2 temporary files of killed" in capsys.readouterr().err


def test_a_crashed_beam_writer_runs_temp_dir_is_removed_by_the_rerun(tmp_path, capsys):
    """Hostile group 8: the beam-temp-* directory of a crashed --writer beam run (recorded by its marker)
    is removed by the re-run; a beam-temp dir of another prefix (not recorded) is kept."""
    data = make_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    outdir.prepare(
        str(out),
        command="convert",
        options={},
        files=["data-00000-of-00002.tfrecord"],
        overwrite=False,
        beam_temp_prefixes=["data"],
    ).release()  # the run, then a crash
    crashed = out / f"beam-temp-data-{uuid.uuid1().hex}"
    crashed.mkdir()
    (crashed / "part").write_bytes(b"x" * 1000)
    code, _, err = convert(tmp_path / "in.h5", out, "--writer", "beam", capsys=capsys)
    assert code == 0, err
    assert not crashed.exists() and "removing" in err
    assert not [n for n in os.listdir(out) if n.startswith("beam-temp-")]
    np.testing.assert_array_equal(np.sort(read_x(out), axis=0), data)


@pytest.mark.parametrize("kind", ["file", "dangling symlink"])
def test_output_dir_that_cannot_be_a_directory(tmp_path, capsys, kind):
    """Hostile group 16: an --output_dir that is a file or a dangling symlink is one line, before any work."""
    make_h5(tmp_path / "in.h5")
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("a file")
        expected = "exists and is not a directory"
    else:
        out.symlink_to(tmp_path / "nowhere")
        expected = "symbolic link to nothing"
    code, _, err = convert(tmp_path / "in.h5", out, capsys=capsys)
    assert code == 2 and expected in err and "Traceback" not in err
    assert not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------- property test of the protocol

_LOOKALIKES = [
    "data-00000-of-00002.tfrecord",
    "data-00001-of-00002.tfrecord",
    "data-00000-of-00001.tfrecord.gz",
    "schema.pbtxt",
    "manifest.json",
    "notes.txt",
    "beam-temp-data-" + "a" * 32,
    ".tmp-data-00000-of-00002.tfrecord-" + "b" * 32,
    ".metadata.json.tmp",
    "x[1].txt",
    "*",
    ".tmp-" + "b" * 32 + "-" + hashlib.sha1(b"data-00000-of-00002.tfrecord").hexdigest()[:8],
    ".tmp-" + "c" * 32 + "-" + hashlib.sha1(b"notes.txt").hexdigest()[:8],
]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    foreign=st.sets(st.sampled_from(_LOOKALIKES) | st.text("abc.-_[]*?", min_size=1, max_size=8), max_size=6),
    ours=st.sets(
        st.sampled_from(
            [
                "data-00000-of-00002.tfrecord",
                "data-00001-of-00002.tfrecord",
                "schema.pbtxt",
                "data-00000-of-00001.tfrecord.gz",
            ]
        ),
        max_size=4,
    ),
    record=st.sampled_from(["none", "marker", "metadata"]),
    planned=st.sets(
        st.sampled_from(
            ["data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord", "data-00000-of-00001.tfrecord.gz"]
        ),
        max_size=3,
    ),
    overwrite=st.booleans(),
    same_options=st.booleans(),
)
def test_prepare_never_deletes_or_modifies_what_is_not_ours(foreign, ours, record, planned, overwrite, same_options):
    """The output-directory protocol: random pre-existing files (many named like ours), random records of what is
    ours, random flags: prepare() never deletes or changes a file that no marker/metadata of ours lists,
    never replaces one with a planned name, and on refusal deletes nothing at all."""
    foreign = {f for f in foreign if f not in (".", "..") and "/" not in f} - set(ours)
    foreign -= {outdir.MARKER_FILE, outdir.METADATA_FILE, outdir.LOCK_FILE}
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "out")
        os.mkdir(d)
        for name in foreign:
            path = os.path.join(d, name)
            if name.startswith("beam-temp-"):
                os.mkdir(path)
                path = os.path.join(path, "part")
            with open(path, "wb") as f:
                f.write(b"foreign " + name.encode())
        listed = set(ours) if record != "none" else set()
        if record == "metadata":  # our metadata.json makes its schema and its own temporary ours too
            listed |= {"schema.pbtxt", ".metadata.json.tmp"}
        listed |= {f for f in foreign if f.startswith(".tmp-") and f[5:-33] in listed}  # temporaries of ours,
        listed |= {
            f
            for f in foreign
            if f.startswith(".tmp-")
            and any(  # under both names
                f.endswith("-" + hashlib.sha1(n.encode()).hexdigest()[:8]) for n in listed
            )
        }
        for name in ours:
            with open(os.path.join(d, name), "wb") as f:
                f.write(b"ours")
        if record == "marker":
            with open(os.path.join(d, outdir.MARKER_FILE), "w") as f:
                json.dump(
                    {
                        "format": outdir.MARKER_FORMAT,
                        "files": sorted(ours),
                        "beam_temp_prefixes": [],
                        "options": {"a": 1},
                    },
                    f,
                )
        elif record == "metadata":
            with open(os.path.join(d, outdir.METADATA_FILE), "w") as f:
                json.dump(
                    {
                        "format": "tfrecord-etl/1",
                        "options": {"a": 1},
                        "shards": [{"file": n, "records": 1, "bytes": 4} for n in sorted(ours)],
                    },
                    f,
                )
        not_ours = {
            name: b
            for name, b in snapshot(d).items()
            if name.split(os.sep)[0] not in listed
            and name.split(os.sep)[0] not in (outdir.MARKER_FILE, outdir.METADATA_FILE)
        }
        before = snapshot(d)
        try:
            lock = outdir.prepare(
                d, command="convert", options={"a": 1} if same_options else {"a": 2}, files=planned, overwrite=overwrite
            )
        except ConfigError:
            assert snapshot(d) == before  # a refusal deletes nothing
            return
        lock.release()
        after = snapshot(d)
        for name, content in not_ours.items():
            assert after.get(name) == content, f"{name} was deleted or changed"
        top_foreign = {n.split(os.sep)[0] for n in not_ours}
        assert not (top_foreign & (set(lock.files) | {"schema.pbtxt", "metadata.json"})), "a written name clashed"
        # a complete output (metadata.json) is kept until the new one commits; the rest of ours is removed
        complete = (set(ours) | {"schema.pbtxt"}) if record == "metadata" else set()
        assert not ((listed - complete) & set(after)), "ours should have been removed"
        assert set(lock.replaced) <= complete and not (set(lock.files) & complete - {"schema.pbtxt"})
        if top_foreign:
            assert overwrite
