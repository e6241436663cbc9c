"""``--resume``: a failed or killed convert continued into the same output. The shards the failed run committed are
kept untouched (their inode and modification time unchanged), only the missing ones are written, and the result is
byte-identical to an uninterrupted run (shards, index files, schema.pbtxt, metadata.json apart from its timestamp).
Refusals (inputs, options, output format changed) are one line, exit 2, nothing written; a tampered kept shard is
rewritten. Failures are injected in-process (a shard that raises) and by SIGKILL through the failpoints
(``TFRECORD_ETL_FAILPOINT``) in subprocesses under the multi-processing DirectRunner."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT, convert, run_command
from tests.test_s3 import s3  # noqa: F401 - the moto server fixture
from tfrecord_etl.transforms.beam import write as beam_write
from tfrecord_etl.transforms.errors import OutputError
from tfrecord_etl.transforms.output import metadata

SHARDS = 6
FLAGS = ("--num_shards", str(SHARDS), "--index", "--provenance")


def make_input(path, rows=3000, start=0):
    with h5py.File(path, "w") as f:
        f["x"] = (np.arange(rows * 48, dtype="<f4").reshape(rows, 48) + start).astype("<f4")
        f["y"] = np.arange(start, start + rows, dtype="<i8")


def contents(out) -> dict[str, bytes]:
    """Every file of the output but the run marker, ``metadata.json`` without its timestamp."""
    files = {}
    for p in sorted(out.iterdir()):
        if p.name == ".tf-etl-run.json":
            continue
        data = p.read_bytes()
        if p.name == "metadata.json":
            meta = json.loads(data)
            meta.pop("created")
            data = json.dumps(meta, sort_keys=True).encode()
        files[p.name] = data
    return files


def shard_stamps(out) -> dict[str, tuple[int, int]]:
    """``{shard or index file: (inode, st_mtime_ns)}``: a file kept untouched keeps both."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.iterdir() if p.name.startswith("data-")}


@pytest.fixture
def setup(tmp_path, capsys):
    """The input, and the files of an uninterrupted run into the same output path (then removed)."""
    src, out = tmp_path / "in.h5", tmp_path / "out"
    make_input(src)
    code, _, err = convert(src, out, *FLAGS, capsys=capsys)
    assert code == 0, err
    reference = contents(out)
    shutil.rmtree(out)
    return src, out, reference


def fail_at_shard(monkeypatch, index: int):
    """The planned writer raises at shard plan ``index`` (the in-memory runner writes them in order)."""
    write = beam_write.WriteShardFn._write

    def failing(self, shard):
        if shard.index == index:
            raise OutputError(f"injected failure at shard {index}")
        return write(self, shard)

    monkeypatch.setattr(beam_write.WriteShardFn, "_write", failing)


def failed_run(src, out, capsys, monkeypatch, index=3):
    fail_at_shard(monkeypatch, index)
    code, _, err = convert(src, out, *FLAGS, capsys=capsys)
    monkeypatch.undo()
    assert code == 2, err
    return err


def test_a_failed_run_keeps_its_shards_and_resume_writes_only_the_missing(setup, capsys, monkeypatch):
    src, out, reference = setup
    err = failed_run(src, out, capsys, monkeypatch)
    last = err.strip().splitlines()[-1]
    assert last == (
        f"[tfrecord-etl] 3 shards this run committed are kept in {out} (not listed by metadata.json): the same "
        "command with --resume writes only the missing ones"
    )
    assert not (out / "metadata.json").exists() and not [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    kept = shard_stamps(out)
    assert len(kept) == 6  # 3 shards and their index files
    assert sorted(p.name for p in out.glob(".tf-etl-done-*")) == [f".tf-etl-done-0000{i}.json" for i in range(3)]

    code, stdout, err = convert(src, out, *FLAGS, "--resume", capsys=capsys)
    assert code == 0, err
    assert f"resume: keeping 3 of the 6 shards the earlier run committed in {out}; writing the 3 missing" in err
    after = shard_stamps(out)
    assert {n: after[n] for n in kept} == kept  # untouched: not rewritten
    assert len(set(after) - set(kept)) == 6  # only the missing: 3 shards and their index files
    assert "shards_written                   3" in stdout and "rows_read                    1,500" in stdout
    assert contents(out) == reference  # byte-identical, receipts gone

    code, stdout, _ = convert(src, out, *FLAGS, "--resume", capsys=capsys)
    assert code == 0 and f"resume: the earlier run committed {out}: nothing to resume" in stdout
    assert contents(out) == reference


def test_resume_is_a_yaml_key_too(setup, tmp_path, capsys, monkeypatch):
    from tfrecord_etl.pipelines import convert as convert_main

    src, out, reference = setup
    failed_run(src, out, capsys, monkeypatch)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"input: {src}\noutput_dir: {out}\nnum_shards: {SHARDS}\nindex: true\nprovenance: true\nresume: true\n"
        "pipeline_options:\n  runner: DirectRunner\n  direct_running_mode: in_memory\n"
    )
    code, _, err = run_command(convert_main.main, ["--config", cfg], capsys)
    assert code == 0, err
    assert f"resume: keeping 3 of the 6 shards the earlier run committed in {out}; writing the 3 missing" in err
    got, meta = contents(out), json.loads(reference["metadata.json"])
    meta["options"]["pipeline_options"] = {"runner": "DirectRunner", "direct_running_mode": "in_memory"}
    assert json.loads(got.pop("metadata.json")) == meta  # (the YAML's pipeline_options are recorded)
    assert got == {k: v for k, v in reference.items() if k != "metadata.json"}


def test_verify_names_a_failed_runs_kept_shards_beside_a_complete_output(tmp_path, capsys, monkeypatch):
    from tfrecord_etl.pipelines import verify as verify_main

    src, out = tmp_path / "in.h5", tmp_path / "out"
    make_input(src)
    assert convert(src, out, "--num_shards", "2", capsys=capsys)[0] == 0
    fail_at_shard(monkeypatch, 2)
    code, _, err = convert(src, out, "--num_shards", "6", "--overwrite", capsys=capsys)
    monkeypatch.undo()
    assert code == 2, err
    code, stdout, err = run_command(verify_main.main, [str(out)], capsys)
    assert code == 0, stdout + err
    warned = [line for line in stdout.splitlines() if "kept for --resume" in line]
    assert len(warned) == 4, stdout  # two shards and their receipts
    assert (
        "warning: data-00000-of-00006.tfrecord: a shard a failed run committed, kept for --resume (the same "
        "command with --resume writes only the missing shards; without it, the next run removes it)"
    ) in stdout
    assert "warning: .tf-etl-done-00001.json: the receipt of a shard a failed run committed" in stdout


def test_resume_with_nothing_of_an_earlier_run_runs_in_full(setup, capsys):
    src, out, reference = setup
    code, _, err = convert(src, out, *FLAGS, "--resume", capsys=capsys)
    assert code == 0, err
    assert f"resume: nothing of an earlier run in {out}: running in full" in err
    assert contents(out) == reference


def test_without_resume_a_failed_runs_shards_are_removed_by_name(setup, capsys, monkeypatch):
    src, out, reference = setup
    failed_run(src, out, capsys, monkeypatch)
    code, _, err = convert(src, out, *FLAGS, capsys=capsys)
    assert code == 0, err
    assert f"removing 9 files of an earlier run in {out}: .tf-etl-done-00000.json" in err
    assert contents(out) == reference


def test_a_tampered_kept_shard_is_rewritten(setup, capsys, monkeypatch):
    src, out, reference = setup
    failed_run(src, out, capsys, monkeypatch, index=4)
    truncated, edited = out / "data-00001-of-00006.tfrecord", out / "data-00002-of-00006.tfrecord"
    size = truncated.stat().st_size
    truncated.write_bytes(truncated.read_bytes()[:-10])
    data = bytearray(edited.read_bytes())
    data[100] ^= 0xFF
    edited.write_bytes(bytes(data))  # the same size
    code, _, err = convert(src, out, *FLAGS, "--resume", capsys=capsys)
    assert code == 0, err
    assert f"resume: keeping 2 of the 6 shards the earlier run committed in {out}; writing the 4 missing" in err
    assert (
        f"resume: rewriting data-00001-of-00006.tfrecord: data-00001-of-00006.tfrecord has {size - 10} bytes, "
        f"{size} when it was written"
    ) in err
    assert (
        "resume: rewriting data-00002-of-00006.tfrecord: data-00002-of-00006.tfrecord was modified after it was written"
    ) in err
    assert contents(out) == reference


def _refused(src, out, capsys, *flags) -> str:
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    code, _, err = convert(src, out, *flags, "--resume", capsys=capsys)
    assert code == 2, err
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == before  # nothing written
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    return line


def test_resume_refuses_changed_inputs(setup, capsys, monkeypatch):
    src, out, _ = setup
    failed_run(src, out, capsys, monkeypatch)
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    assert _refused(src, out, capsys, *FLAGS) == (
        f"error: ConfigError: Cannot resume: the inputs changed ({src} was modified since the earlier run); "
        f"resuming would mix two different outputs [file='{out}'] Hint: run the same command as the earlier run, "
        "or run without --resume to replace its shards"
    )
    make_input(src, rows=3001)
    assert f"Cannot resume: the inputs changed ({src}: " in _refused(src, out, capsys, *FLAGS)


def test_resume_refuses_inputs_added_or_removed(tmp_path, capsys, monkeypatch):
    (tmp_path / "in").mkdir()
    make_input(tmp_path / "in" / "a.h5")
    make_input(tmp_path / "in" / "b.h5", start=5000)
    pattern, out = tmp_path / "in" / "*.h5", tmp_path / "out"
    failed_run(pattern, out, capsys, monkeypatch)
    make_input(tmp_path / "in" / "c.h5", start=9000)
    line = _refused(pattern, out, capsys, *FLAGS)
    assert f"Cannot resume: the inputs changed ({tmp_path / 'in' / 'c.h5'} is new)" in line
    (tmp_path / "in" / "c.h5").unlink()
    (tmp_path / "in" / "b.h5").unlink()
    line = _refused(pattern, out, capsys, *FLAGS)
    assert f"Cannot resume: the inputs changed ({tmp_path / 'in' / 'b.h5'} was an input of the earlier run" in line


def test_resume_refuses_an_option_that_changes_the_bytes(setup, capsys, monkeypatch):
    src, out, _ = setup
    failed_run(src, out, capsys, monkeypatch)
    line = _refused(src, out, capsys, "--num_shards", "6", "--provenance", "--compression", "gzip")
    assert "Cannot resume: --compression differs ('gzip', the earlier run's 'none')" in line
    line = _refused(src, out, capsys, *FLAGS[:-1])
    assert "Cannot resume: --provenance differs (False, the earlier run's True)" in line
    code, _, err = convert(src, out, *FLAGS, "--resume", "--overwrite", "--progress", capsys=capsys)
    assert code == 0, err  # options that change no byte


def test_resume_refuses_another_output_format_version(setup, capsys, monkeypatch):
    src, out, _ = setup
    failed_run(src, out, capsys, monkeypatch)
    monkeypatch.setattr(metadata, "VERSION", "9.9.9")
    line = _refused(src, out, capsys, *FLAGS)
    assert "Cannot resume: the output format differs (tool '9.9.9', the earlier run's '0.1.0')" in line


# ---------------------------------------------------------------- killed runs (subprocesses, SIGKILL)


def _command(src, out, *extra):
    return [
        sys.executable,
        "-m",
        "pipelines.convert",
        "--input",
        str(src),
        "--output_dir",
        str(out),
        *FLAGS,
        *extra,
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ]


def _run(cmd, home, **env):
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT), **env)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    stdout, err = proc.communicate(timeout=300)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # workers a killed launcher left
    except ProcessLookupError:
        pass
    return proc.returncode, stdout.decode() + err.decode()


@pytest.mark.parametrize(
    "failpoint",
    [
        "shard-recorded:once:launcher",  # the launcher killed after a worker's first receipt
        "shard-opened:once",  # a worker killed while it writes a shard: the run fails, keeping what it committed
        "before-commit:launcher",  # the launcher killed with every shard written, before metadata.json
        "committed:launcher",  # after metadata.json, before the receipts are removed
    ],
)
def test_killed_then_resumed_ends_byte_identical(setup, tmp_path, failpoint):
    src, out, reference = setup
    once = tmp_path / "once"
    code, err = _run(
        _command(src, out), tmp_path, TFRECORD_ETL_FAILPOINT=failpoint, TFRECORD_ETL_FAILPOINT_ONCE=str(once)
    )
    assert code != 0, err[-2000:]
    first_err = err
    kept = shard_stamps(out)
    code, err = _run(_command(src, out, "--resume"), tmp_path)
    assert code == 0, err[-3000:]
    after = shard_stamps(out)
    nothing = f"resume: the earlier run committed {out}: nothing to resume"
    # before-commit: the launcher dies, but the commit (the pipeline's last step) may run on a worker before the
    # process group is killed: then the output is the earlier run's, complete, and a resume has nothing to do
    if failpoint.startswith("committed") or (failpoint.startswith("before-commit") and nothing in err):
        assert nothing in err, err[-3000:]
    else:
        line = next((line for line in err.splitlines() if "resume: keeping" in line), None)
        assert line is not None, (first_err[-3000:], err[-3000:])
        n = int(line.split("keeping ")[1].split(" ")[0])
        assert n >= (SHARDS if failpoint.startswith("before-commit") else 1), line
        unchanged = {k for k in kept if after.get(k) == kept[k]}
        assert len(unchanged) >= 2 * n  # the kept shards and their index files, untouched
        assert len(set(after) - unchanged) == 2 * (SHARDS - n)  # the missing ones written
    assert contents(out) == reference
    assert not [p.name for p in out.iterdir() if p.name.startswith((".tmp-", ".tf-etl.lock", ".tf-etl-done"))]


# ---------------------------------------------------------------- s3:// (a moto server) and gs:// (the emulator)


class Store:
    """One object store of the tests: its output URL and a client's list, read, write and delete of keys."""

    def __init__(self, root, flags, names, read, put, delete):
        self.root, self.flags, self.names, self.read, self.put, self.delete = root, flags, names, read, put, delete


@pytest.fixture(scope="module")
def gcs_bucket():
    from tests import gcs_emulator

    with gcs_emulator.server("etl-resume") as port, gcs_emulator.emulator_host(f"http://127.0.0.1:{port}"):
        from google.cloud import storage

        yield storage.Client.create_anonymous_client().bucket("etl-resume")


@pytest.fixture(params=["s3", "gs"])
def store(request):
    if request.param == "s3":
        from tests.test_s3 import BUCKET, keys

        client, flags = request.getfixturevalue("s3")
        return Store(
            f"s3://{BUCKET}",
            flags,
            lambda prefix: keys(client, prefix),
            lambda key: client.get_object(Bucket=BUCKET, Key=key)["Body"].read(),
            lambda key, data: client.put_object(Bucket=BUCKET, Key=key, Body=data),
            lambda key: client.delete_object(Bucket=BUCKET, Key=key),
        )
    pytest.importorskip("gcp_storage_emulator", reason="pip install -e .[test]")
    bucket = request.getfixturevalue("gcs_bucket")
    return Store(
        "gs://etl-resume",
        [],
        lambda prefix: sorted(b.name for b in bucket.client.list_blobs(bucket, prefix=prefix)),
        lambda key: bucket.blob(key).download_as_bytes(),
        lambda key, data: bucket.blob(key).upload_from_string(data),
        lambda key: bucket.blob(key).delete(),
    )


def test_resume_on_an_object_store_keeps_the_committed_objects_and_rewrites_a_tampered_one(
    store, tmp_path, capsys, monkeypatch
):
    src, prefix = tmp_path / "in.h5", f"resume-{tmp_path.name}/out/"
    out = f"{store.root}/{prefix}".rstrip("/")
    make_input(src)

    def objects() -> dict[str, bytes]:
        found = {}
        for key in store.names(prefix):
            data = store.read(key)
            if key.endswith("/metadata.json"):
                meta = json.loads(data)
                meta.pop("created")
                data = json.dumps(meta, sort_keys=True).encode()
            if not key.endswith("/.tf-etl-run.json"):
                found[key[len(prefix) :]] = data
        return found

    assert convert(src, out, *FLAGS, *store.flags, capsys=capsys)[0] == 0
    reference = objects()
    assert len(reference) == 14  # 6 shards, their indexes, metadata.json, schema.pbtxt
    for key in store.names(prefix):
        store.delete(key)
    fail_at_shard(monkeypatch, 3)
    code, _, err = convert(src, out, *FLAGS, *store.flags, capsys=capsys)
    monkeypatch.undo()
    assert code == 2 and "3 shards this run committed are kept" in err.strip().splitlines()[-1], err
    shard = prefix + "data-00001-of-00006.tfrecord"
    store.put(shard, store.read(shard)[:-10])
    code, stdout, err = convert(src, out, *FLAGS, *store.flags, "--resume", capsys=capsys)
    assert code == 0, err
    assert f"resume: keeping 2 of the 6 shards the earlier run committed in {out}; writing the 4 missing" in err
    assert "resume: rewriting data-00001-of-00006.tfrecord: data-00001-of-00006.tfrecord has" in err
    assert "shards_written                   4" in stdout
    assert objects() == reference


def writing(out) -> bool:
    return out.exists() and any(p.name.startswith((".tmp-", "data-")) for p in out.iterdir())


def test_killed_at_random_moments_then_resumed_ends_byte_identical(tmp_path, capsys):
    """The launcher and its workers killed together (SIGKILL to the process group) at seeded random moments of the
    shards' writing, each time followed by ``--resume``: every outcome (some shards, all, committed) ends
    byte-identical, and a resume keeps every shard the killed run left a receipt of."""
    import random

    src, out = tmp_path / "in.h5", tmp_path / "out"
    make_input(src, rows=60_000)  # 11.5 MB: shards that take a moment to write
    assert convert(src, out, *FLAGS, capsys=capsys)[0] == 0
    reference = contents(out)
    rng = random.Random(11)
    outcomes = []
    for delay in sorted(rng.uniform(0.0, 0.3) for _ in range(3)):
        shutil.rmtree(out, ignore_errors=True)
        env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            _command(src, out),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while not writing(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the moment counts from the first shard's temporary
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        receipts = len(list(out.glob(".tf-etl-done-*"))) if out.exists() else 0
        code, err = _run(_command(src, out, "--resume"), tmp_path)
        assert code == 0, err[-3000:]
        kept = [line for line in err.splitlines() if "resume: keeping" in line]
        if kept:
            assert f"resume: keeping {receipts} of the 6 shards" in kept[0], (delay, kept)
        outcomes.append(receipts if kept else "full" if "running in full" in err else "committed")
        assert contents(out) == reference, delay
    print("outcomes", outcomes)  # shards kept, or 'full' / 'committed'; seen: [1, 'full', 2]


def test_a_span_whose_run_failed_resumes_and_is_listed(tmp_path, capsys, monkeypatch):
    from tests.test_spans import DATES, expected_ids, make_h5, our_ids
    from tfrecord_etl.transforms.collections import collection

    for i, day in enumerate(DATES):
        make_h5(tmp_path / "raw" / day / "a.h5", 1000 * i)
        make_h5(tmp_path / "raw" / day / "b.h5", 1000 * i + 500, rows=25)
    pattern, out = str(tmp_path / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"), tmp_path / "out"
    flags = ("--span", DATES[1], "--num_shards", "4")
    fail_at_shard(monkeypatch, 2)
    code, _, err = convert(pattern, out, *flags, capsys=capsys)
    monkeypatch.undo()
    assert code == 2 and "2 shards this run committed are kept" in err.strip().splitlines()[-1], err
    assert not (out / "collection.json").exists() or not collection.load(str(out))["spans"]
    code, _, err = convert(pattern, out, *flags, "--resume", capsys=capsys)
    assert code == 0, err
    assert "resume: keeping 2 of the 4 shards the earlier run committed" in err
    (span,) = collection.load(str(out))["spans"]
    assert our_ids(str(out / span["dir"])) == expected_ids(1)
    code, _, err = convert(pattern, out, *flags, "--resume", capsys=capsys)  # committed: listed again, in full
    assert code == 0, err
    assert [s["dir"] for s in collection.load(str(out))["spans"]] == [span["dir"]]
