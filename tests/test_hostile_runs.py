"""Hostile groups 17-21: runs that fail at a bad moment or at scale. A full disk at a collection's commit (the
span's lock temporary was left behind and made every re-run refuse), the messages of re-runs and of a file linked
into two span folders, one row of 2 GB, and a pattern over very many tiny files. (Group 17, worker processes
killed at any moment, runs worker processes: ``tests/test_hostile_workers.py``.)"""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from tests.conftest import convert
from tests.test_hostile_config import tiny_tmpfs
from tests.test_spans import DATES, make_h5
from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.output import outdir, runlock


def tree_bytes(root):
    """``{relative path: bytes}`` of every file under ``root``."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = f.read()
    return out


def span_shards(span_dir):
    """The bytes of a span's shards in metadata.json's order (names aside: a replacing run writes the other
    generation's names)."""
    meta = json.loads(open(os.path.join(span_dir, "metadata.json")).read())
    return [open(os.path.join(span_dir, s["file"]), "rb").read() for s in meta["shards"]]


def fill(mount):
    """Fills the file system at ``mount`` (a tmpfs) with one file, until ENOSPC."""
    fd = os.open(mount / "filler", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as e:
        assert e.errno == errno.ENOSPC
        try:
            while True:
                os.write(fd, b"\0" * 512)
        except OSError:
            pass
    finally:
        os.close(fd)


def ours_only(span_dir):
    """What a failed run must not leave in a span directory: a lock, a lock's temporary, temporaries."""
    return [n for n in os.listdir(span_dir) if n.startswith((outdir.LOCK_FILE, outdir.TEMP_PREFIX))]


@pytest.fixture
def disk_full_at_collection_commit(monkeypatch):
    """Fills the tmpfs at ``state['mount']`` just before ``collection.json`` is committed (the moment a span's output
    is committed and its collection entry is not)."""
    state = {}
    commit = collection.commit

    def full_then_commit(*args, **kwargs):
        if "mount" in state:  # (armed by the test)
            fill(state["mount"])
        return commit(*args, **kwargs)

    monkeypatch.setattr(collection, "commit", full_then_commit)
    return state


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["span", "incremental"])
def test_a_full_disk_at_the_collection_commit_leaves_nothing_and_a_rerun_completes(
    tmp_path, capsys, monkeypatch, disk_full_at_collection_commit, kind
):
    """Hostile group 18: the disk fills up at the collection commit of a span run (placeholders, and
    --incremental): the run ends in one line, and it used to leave span-N/.tf-etl.lock.<pid> (0 bytes) after the
    lock could not be closed, which made the same command refuse ("files tfrecord-etl did not write") and
    --overwrite keep it for good. Now nothing of the run is left but the span's complete output (not listed), the
    collection is unchanged, and the same command completes it: byte-identical to a run on a roomy disk."""
    if kind == "span":
        for i, day in enumerate(DATES[:2]):
            make_h5(tmp_path / "raw" / day / "a.h5", 1000 * i)
        pattern, flags = (
            str(tmp_path / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5"),
            [["--span", DATES[0]], ["--span", DATES[1]]],
        )
        span_name = "span-20416"
    else:
        make_h5(tmp_path / "raw" / "a.h5", 0)
        pattern, flags = str(tmp_path / "raw" / "*.h5"), [["--incremental"], ["--incremental"]]
        span_name = "span-1"
    clean = tmp_path / "clean"
    with tiny_tmpfs(tmp_path / "mnt", "2m") as mnt:
        out = mnt / "coll"
        assert convert(pattern, str(out), *flags[0], capsys=capsys)[0] == 0
        assert convert(pattern, str(clean), *flags[0], capsys=capsys)[0] == 0
        if kind == "incremental":
            make_h5(tmp_path / "raw" / "b.h5", 1000)
        committed = (out / "collection.json").read_bytes()
        disk_full_at_collection_commit["mount"] = mnt
        code, _, err = convert(pattern, str(out), *flags[1], capsys=capsys)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(lines) == 1 and "No space left on device" in lines[0], err
        assert "Traceback" not in err
        os.unlink(mnt / "filler")
        monkeypatch.undo()
        assert not ours_only(out / span_name), os.listdir(out / span_name)
        assert (out / "collection.json").read_bytes() == committed
        code, _, err = convert(pattern, str(out), *flags[1], capsys=capsys)  # the same command, no cleanup
        assert code == 0, err
        assert convert(pattern, str(clean), *flags[1], capsys=capsys)[0] == 0
        assert span_shards(out / span_name) == span_shards(clean / span_name)
        assert [s["span"] for s in collection.load(str(out))["spans"]] == [
            s["span"] for s in collection.load(str(clean))["spans"]
        ]
        assert not ours_only(out / span_name)


def test_a_lock_that_cannot_be_closed_leaves_no_temporary_and_the_run_still_cleans_up(tmp_path, monkeypatch):
    """Hostile group 18: closing the lock of a failed run (its run id marked closed: a temporary renamed over it)
    on a full disk left the 0-byte temporary .tf-etl.lock.<pid>, and skipped removing what the run wrote. The same
    with ENOSPC raised by the write, where no tmpfs can be mounted."""
    real_open = open

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
            return False

    lock = runlock.Lock(str(tmp_path), "c" * 32).acquire()
    monkeypatch.setattr(
        runlock,
        "open",
        lambda path, mode="r", *a, **k: (
            Full(real_open(path, mode, *a, **k)) if "w" in mode else real_open(path, mode, *a, **k)
        ),
        raising=False,
    )
    removed = []
    lock.discard = lambda: removed.append(True)
    with pytest.raises(RuntimeError):
        with lock:
            raise RuntimeError("the run failed")
    assert removed == [True]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_lock_temporary_of_a_run_that_is_gone_is_ours_and_removed(tmp_path, capsys, overwrite):
    """Hostile group 18: a .tf-etl.lock.<pid> left by a killed run made the same command refuse ("files
    tfrecord-etl did not write"), and --overwrite kept it for good. It is the lock's own temporary: ours."""
    inp = tmp_path / "in.npy"
    np.save(inp, np.arange(40, dtype="<i8").reshape(20, 2))
    out = tmp_path / "out"
    assert convert(str(inp), str(out), capsys=capsys)[0] == 0
    before = span_shards(out)
    stale = out / f"{outdir.LOCK_FILE}.4194301"
    stale.write_bytes(b"")
    code, _, err = convert(str(inp), str(out), *(["--overwrite"] if overwrite else []), capsys=capsys)
    assert code == 0, err
    assert f"removing 1 lock temporary of an earlier run that is gone in {out}: {stale.name}" in err
    assert not stale.exists()
    assert span_shards(out) == before
    listed = {s["file"] for s in json.loads((out / "metadata.json").read_text())["shards"]}
    assert set(os.listdir(out)) == listed | {"metadata.json", "schema.pbtxt", outdir.MARKER_FILE}


def test_a_rerun_over_a_complete_output_does_not_call_it_incomplete(tmp_path, capsys):
    """Hostile group 21: a re-run of the same command over a complete output said it was "removing 1 file of an
    earlier run that did not complete: .tf-etl-run.json" (the run marker of the complete run). Now it says what it
    keeps, and what a crashed run left is still named as such."""
    inp = tmp_path / "in.npy"
    np.save(inp, np.arange(40, dtype="<i8").reshape(20, 2))
    out = tmp_path / "out"
    assert convert(str(inp), str(out), capsys=capsys)[0] == 0
    code, _, err = convert(str(inp), str(out), capsys=capsys)
    assert code == 0, err
    assert "did not complete" not in err and outdir.MARKER_FILE not in err, err
    assert f"keeping the complete output in {out} until this run commits" in err
    shard = json.loads((out / "metadata.json").read_text())["shards"][0]["file"]
    (out / f".tmp-{'0' * 32}-{outdir.name_key(shard)}").write_bytes(b"x")  # a killed attempt's temporary
    code, _, err = convert(str(inp), str(out), capsys=capsys)
    assert code == 0, err
    assert "removing 1 file of an earlier run that did not complete" in err, err


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_file_linked_into_two_span_folders_is_refused_naming_both(tmp_path, capsys, link):
    """Hostile group 21: a file hard- or sym-linked into two span folders was refused with "No input file matches
    the pattern"; the refusal names both paths and the rule (one file, one name)."""
    first = make_h5(tmp_path / "raw" / DATES[0] / "a.h5", 0)
    second = tmp_path / "raw" / DATES[1] / "a.h5"
    second.parent.mkdir(parents=True)
    os.link(first, second) if link == "hard" else os.symlink(first, second)
    pattern = str(tmp_path / "raw" / "{YYYY}-{MM}-{DD}" / "*.h5")
    code, _, err = convert(pattern, str(tmp_path / "coll"), "--span", DATES[1], capsys=capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    assert "No input file matches" not in lines[0]
    assert f"'{first}' and '{second}' are the same file" in lines[0]
    assert "one file, one name" in lines[0]
    assert not (tmp_path / "coll").exists()


def sparse_npy(path, row_bytes, rows=1):
    """A .npy of ``rows`` rows of ``row_bytes`` uint8 values each, stored sparse (a header, then a hole): the file
    has every byte its header declares, and takes no disk space."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (rows, row_bytes)})
        f.truncate(f.tell() + rows * row_bytes)
    return path


def test_one_row_of_2_gib_is_refused_at_planning_naming_the_limit_and_its_flag(tmp_path, capsys):
    """Hostile group 19: one row of 2 GiB (a sparse .npy of shape (1, 2**31)) was read whole and then refused by
    protobuf's 2 GB limit: 4.4 GB of memory and 72 s for an error. Now planning refuses it before anything is read
    or written, naming the row's size, the limit and --max_row_mb (also with --dry_run)."""
    big = sparse_npy(tmp_path / "big.npy", 2**31)
    for flags in ([], ["--dry_run"]):
        code, _, err = convert(str(big), str(tmp_path / "out"), *flags, capsys=capsys)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and lines == [
            f"error: SourceError: One row holds 2,147,483,648 bytes (2,048.0 MiB) of array values, over the limit of "
            f"1024 MiB per row (--max_row_mb) [file='{big}'] Hint: raise --max_row_mb (a row is held whole in "
            f"memory, about twice its size at peak; one Example holds at most 2048 MiB), or split the arrays into "
            f"smaller rows"
        ], err
        assert not (tmp_path / "out").exists()


def test_max_row_mb_bounds_every_feature_of_a_row_and_raising_it_converts_exactly(tmp_path, capsys):
    """Hostile group 19: the limit counts every fixed-size feature of a row (an .npz's members together); a row
    under a raised limit converts exactly."""
    from tfrecord_etl.transforms import reader

    inp = tmp_path / "rows.npz"
    a = np.arange(4 * 300_000, dtype="<f8").reshape(4, 300_000)  # 2.29 MiB per row
    b = np.arange(4 * 100_000, dtype="<i4").reshape(4, 100_000)  # 0.38 MiB per row
    np.savez(inp, a=a, b=b)
    code, _, err = convert(str(inp), str(tmp_path / "out"), "--max_row_mb", "2.5", capsys=capsys)
    assert code == 2 and "One row holds 2,800,000 bytes (2.7 MiB) of array values, over the limit of 2.5 MiB" in err
    code, _, err = convert(str(inp), str(tmp_path / "out"), "--max_row_mb", "3", capsys=capsys)
    assert code == 0, err
    got = list(reader.iter_numpy(str(tmp_path / "out")))
    assert len(got) == 4
    for i, e in enumerate(got):
        np.testing.assert_array_equal(e["a"], a[i])
        np.testing.assert_array_equal(e["b"], b[i])


_OPENS: dict = {}  # path -> times opened, while counting (an audit hook cannot be removed: it counts when asked)


def _count_opens(event, args):
    if event == "open" and _OPENS.get(None) and isinstance(args[0], str):
        _OPENS[args[0]] = _OPENS.get(args[0], 0) + 1


def test_planning_many_tiny_files_opens_each_a_fixed_number_of_times(tmp_path):
    """Hostile group 20: a pattern over very many tiny files (200,000 .npy files: see docs/reliability.md for the
    time and memory of their planning). Planning stays linear: each input file is opened the same number of times
    (3: the Zarr zip-store check and the magic bytes when the format is sniffed, then its header) whether there are
    100 or 300 of them, and nothing else is opened per file (counted with Python's audit events, not timed)."""
    import sys

    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.config import ConvertConfig

    if not _OPENS:
        sys.addaudithook(_count_opens)
        _OPENS[None] = False
    totals, per_file = {}, {}
    for n in (5, 100, 300):  # (the first plan imports what planning needs: not counted)
        root = tmp_path / f"n{n}"
        for i in range(n):
            (root / f"d{i % 7}").mkdir(parents=True, exist_ok=True)
            np.save(root / f"d{i % 7}" / f"f{i:04d}.npy", np.arange(i, i + 4, dtype="<i8"))
        cfg = ConvertConfig(input=str(root / "*" / "*.npy"), output_dir=str(tmp_path / "out"))
        for key in [k for k in _OPENS if k is not None]:
            del _OPENS[key]
        _OPENS[None] = True
        try:
            plan = planning.plan_inputs(cfg.input, planning.source_options(cfg))
        finally:
            _OPENS[None] = False
        assert plan.num_rows == 4 * n
        opened = {k: v for k, v in _OPENS.items() if k is not None}
        per_file[n] = {v for k, v in opened.items() if k.startswith(str(root))}
        totals[n] = sum(opened.values())
        assert len([k for k in opened if k.startswith(str(root))]) == n  # every file opened, each by its path
    assert per_file[100] == per_file[300] and len(per_file[300]) == 1 and max(per_file[300]) <= 3, per_file
    k = max(per_file[300])
    assert totals[300] - totals[100] == 200 * k, totals  # nothing else is opened once per file
