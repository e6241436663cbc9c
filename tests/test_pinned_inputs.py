"""Inputs pinned while they are read: augment checks its input collection (metadata.json's bytes, each shard's size
and CRC32C) per shard and at commit; convert checks its local inputs' size and modification time against the plan.
A change fails the run with "... changed while it was read: run again", and nothing is committed. The changes are
made by hooks at a chosen moment (after planning, after the first shard), never by timing."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, run_command
from tfrecord_etl.pipelines import augment as augment_main, convert as convert_main
from tfrecord_etl.transforms import augment, reader
from tfrecord_etl.transforms.augment import beam as augment_beam, commit as augment_commit
from tfrecord_etl.transforms.errors import IncompleteOutputError, InputChangedError
from tfrecord_etl.transforms.storage import fileio

ROWS = 3000


def make_rows(path, start=0, rows=ROWS):
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(start, start + rows, dtype="<i8")
        f["x"] = np.stack([np.arange(rows), -np.arange(rows)], axis=1).astype("<f4") + start


def run_augment(input_, output_dir, *flags, capsys=None):
    return run_command(augment_main.main, ["--input", input_, "--output_dir", output_dir, *flags, *BEAM_FLAGS], capsys)


@pytest.fixture
def collection(tmp_path):
    """A convert output of ids 0..2999 in 3 shards, and a function that replaces it as ``convert --overwrite`` of
    ids 100000.. does (the same shard names)."""
    make_rows(tmp_path / "old.h5")
    make_rows(tmp_path / "new.h5", start=100_000)
    coll = tmp_path / "coll"
    assert convert(tmp_path / "old.h5", coll, "--num_shards", "3")[0] == 0

    def replace():
        assert convert(tmp_path / "new.h5", coll, "--num_shards", "3", "--overwrite")[0] == 0

    return coll, replace


@pytest.mark.parametrize("moment", ["after planning", "after the first shard"])
def test_augment_fails_when_its_input_collection_is_replaced_while_read(
    collection, tmp_path, capsys, monkeypatch, moment
):
    coll, replace = collection
    replaced = []
    if moment == "after planning":
        plan_augment = augment.plan_augment

        def hooked_plan(cfg):
            plan = plan_augment(cfg)
            replace()
            replaced.append(True)
            return plan

        monkeypatch.setattr(augment, "plan_augment", hooked_plan)
    else:
        iter_shard = augment_beam.iter_shard

        def hooked_iter(shard, *args, **kwargs):
            yield from iter_shard(shard, *args, **kwargs)
            if not replaced:  # the first shard was read whole (and checked): now the collection is replaced
                replace()
                replaced.append(True)

        monkeypatch.setattr(augment_beam, "iter_shard", hooked_iter)
    out = tmp_path / "aug"
    code, _, err = run_augment(coll, out, "--constants", "tag=1", capsys=capsys)
    assert replaced and code == 2
    # the replaced generation's shards are deleted: gone, which the line says (and that a worker may not reach them)
    assert "InputChangedError: Input shard not found on the worker that reads it, though the run planned it (" in err
    assert "or the file was deleted or moved since" in err and f"file='{coll}/data-0000" in err
    with pytest.raises(IncompleteOutputError, match="No metadata.json"):  # not committed: no mix of old and new
        reader.iter_numpy(str(out)).__next__()


def test_augment_fails_at_commit_when_the_input_metadata_changed(collection, tmp_path, capsys, monkeypatch):
    coll, _ = collection
    process = augment_commit.FinalizeAugmentFn.process

    def hooked(self, results):  # every shard was read; then the input's metadata.json is rewritten
        meta = json.loads((coll / "metadata.json").read_text())
        meta["created"] = "2000-01-01T00:00:00Z"
        (coll / "metadata.json").write_text(json.dumps(meta))
        yield from process(self, results)

    monkeypatch.setattr(augment_commit.FinalizeAugmentFn, "process", hooked)
    out = tmp_path / "aug"
    code, _, err = run_augment(coll, out, "--constants", "tag=1", capsys=capsys)
    assert code == 2
    assert (
        "InputChangedError: The input collection changed while it was read (its metadata.json is not the one "
        f"planned): run again [file='{coll}/metadata.json']"
    ) in err
    assert not (out / "metadata.json").exists()


def test_augment_refuses_a_shard_of_another_size_before_reading_it(collection, tmp_path, capsys, monkeypatch):
    coll, _ = collection
    read = []
    open_read = fileio.open_read
    monkeypatch.setattr(fileio, "open_read", lambda path: read.append(path) or open_read(path))
    shard = coll / "data-00001-of-00003.tfrecord"
    plan_augment = augment.plan_augment

    def hooked_plan(cfg):
        plan = plan_augment(cfg)
        with open(shard, "ab") as f:  # a writer appending to it
            f.write(b"\0" * 10)
        return plan

    monkeypatch.setattr(augment, "plan_augment", hooked_plan)
    code, _, err = run_augment(coll, tmp_path / "aug", "--constants", "tag=1", capsys=capsys)
    size = os.path.getsize(shard)
    assert (
        code == 2
        and (
            f"Input shard changed while it was read ({size} bytes, {size - 10} when the run was "
            f"planned): run again [file='{shard}']"
        )
        in err
    )
    assert str(coll / "data-00000-of-00003.tfrecord") in read and str(shard) not in read  # refused before opening


def test_augment_of_plain_local_shards_checks_their_size_and_time(tmp_path, capsys, monkeypatch):
    """A collection without metadata.json: each local shard is pinned by size and modification time."""
    make_rows(tmp_path / "old.h5", rows=300)
    assert convert(tmp_path / "old.h5", tmp_path / "coll", "--num_shards", "2")[0] == 0
    plain = tmp_path / "plain"
    plain.mkdir()
    for p in sorted((tmp_path / "coll").glob("data-*")):
        os.link(p, plain / p.name)
    shard = plain / "data-00001-of-00002.tfrecord"
    plan_augment = augment.plan_augment

    def hooked_plan(cfg):
        plan = plan_augment(cfg)
        data = shard.read_bytes()
        st = os.stat(shard)
        shard.write_bytes(data)  # rewritten in place, the same bytes: only its modification time tells
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later write on a coarse clock
        return plan

    monkeypatch.setattr(augment, "plan_augment", hooked_plan)
    code, _, err = run_augment(f"{plain}/*.tfrecord", tmp_path / "aug", "--constants", "tag=1", capsys=capsys)
    assert (
        code == 2
        and (
            "Input shard changed while it was read (rewritten: its modification time is not the one "
            f"planned): run again [file='{shard}']"
        )
        in err
    )
    assert not (tmp_path / "aug" / "metadata.json").exists()


@pytest.mark.parametrize("change", ["same size", "more rows"])
@pytest.mark.parametrize("dead_letters", [False, True])
def test_convert_fails_when_an_input_is_rewritten_after_planning(tmp_path, capsys, monkeypatch, change, dead_letters):
    make_rows(tmp_path / "a.h5", rows=500)
    make_rows(tmp_path / "b.h5", start=500, rows=500)
    target = tmp_path / "b.h5"
    prepare = convert_main.prepare_output_dir

    def hooked(cfg, plan):  # planned (every input indexed); the run has not read a row yet
        before = os.stat(target)
        make_rows(target, start=9000, rows=500 if change == "same size" else 800)
        after = os.stat(target)
        if change == "same size":
            assert after.st_size == before.st_size
            os.utime(target, ns=(after.st_atime_ns, before.st_mtime_ns + 10**9))  # a later write on a coarse clock
        return prepare(cfg, plan)

    monkeypatch.setattr(convert_main, "prepare_output_dir", hooked)
    out = tmp_path / "out"
    flags = ["--dead_letter_dir", tmp_path / "dead"] if dead_letters else []
    code, _, err = convert(f"{tmp_path}/*.h5", out, "--num_shards", "2", *flags, capsys=capsys)
    assert code == 2, err
    detail = (
        "rewritten: its modification time is not the one planned"
        if change == "same size"
        else f"{os.path.getsize(target)} bytes, "
    )
    assert f"InputChangedError: Input file changed while it was read ({detail}" in err and "): run again" in err
    assert f"[file='{target}']" in err
    assert not (out / "metadata.json").exists()  # a changed input is never a dead letter: nothing committed
    assert not list((tmp_path / "dead").glob("*.jsonl"))


def test_check_pin_names_what_changed(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10)
    pinned = fileio.pin(str(path))
    fileio.check_pin(str(path), pinned)  # unchanged: nothing raised
    path.write_bytes(b"x" * 12)
    with pytest.raises(
        InputChangedError,
        match=r"Input file changed while it was read \(12 bytes, 10 when the run "
        r"was planned\): run again",
    ):
        fileio.check_pin(str(path), pinned)
    path.unlink()  # a worker that does not reach the launcher's files sees the same: both causes are named
    with pytest.raises(InputChangedError) as e:
        fileio.check_pin(str(path), pinned)
    assert str(e.value) == (
        "Input file not found on the worker that reads it, though the run planned it (10 bytes): the worker does "
        "not reach the launcher's files (another machine, container or mount), or the file was deleted or moved "
        f"since [file='{path}'] Hint: every worker must reach the same path: use s3:// or gs://, or a mount every "
        "worker shares at that path; if the file was deleted or moved, restore it, then run the command again"
    )


def test_a_change_seen_by_a_worker_process_is_one_line(tmp_path, capsys, monkeypatch):
    """In a worker process (multi_processing), the error comes back as a traceback's text: still one line."""
    make_rows(tmp_path / "in.h5", rows=500)
    prepare = convert_main.prepare_output_dir

    def hooked(cfg, plan):
        make_rows(tmp_path / "in.h5", rows=800)
        return prepare(cfg, plan)

    monkeypatch.setattr(convert_main, "prepare_output_dir", hooked)
    code, _, err = convert(
        tmp_path / "in.h5",
        tmp_path / "out",
        "--num_shards",
        "2",
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
        capsys=capsys,
        beam=False,
    )
    assert code == 2 and "Traceback" not in err
    line = next(ln for ln in err.splitlines() if ln.startswith("error: "))
    assert line.startswith("error: InputChangedError: Input file changed while it was read (") and "run again" in line
    assert not (tmp_path / "out" / "metadata.json").exists()
