"""Hostile HDF5 inputs that reach outside the named file, invent values or blow up: external raw
storage, virtual datasets, FIFOs and devices, declared sizes, unallocated storage, chunk re-reads and
deep nesting (hostile groups 9, 10, 13, 15, 16)."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT, convert
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import EtlError, SourceError
from tfrecord_etl.transforms.sources import Hdf5Source, RowRange, SourceOptions

SECRET = b"root:x:0:0:SECRET-BYTES-NEVER-TO-BE-READ:/root:/bin/bash\n" * 4


def all_output_bytes(out) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file())


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "elsewhere" / "passwd"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def external_h5(path, target, n=len(SECRET)):  # noqa: B008 - an int, computed once on purpose
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(n,), dtype="u1", external=[(str(target), 0, n)])


def test_external_storage_outside_is_refused(tmp_path, secret, capsys):
    """Hostile group 9: a 1.4 KB .h5 whose dataset lives in an external file (here a stand-in for
    /etc/passwd) is refused at planning; the secret's bytes never reach the output."""
    (tmp_path / "in").mkdir()
    external_h5(tmp_path / "in" / "ext.h5", secret)
    out = tmp_path / "out"
    code, _, err = convert(tmp_path / "in" / "ext.h5", out, capsys=capsys)
    assert code == 2 and "stored in external file(s)" in err and str(secret) in err and "dataset='/x'" in err
    assert "--allow_external_storage" in err
    code, _, err = convert(tmp_path / "in" / "ext.h5", out, "--allow_external_storage", capsys=capsys)
    assert code == 2 and "lies outside the input file's directory" in err
    assert not out.exists() or b"SECRET" not in all_output_bytes(out)


def test_external_storage_through_augment_join_and_verify_source(tmp_path, secret, capsys):
    """Hostile group 9: the same file given to augment --join_input or verify --source is refused too
    (they read sources through the same Hdf5Source); the secret never reaches the augmented output."""
    from tests.conftest import BEAM_FLAGS, run_command
    from tfrecord_etl.pipelines import augment as augment_main, verify as verify_main

    (tmp_path / "in").mkdir()
    n = len(SECRET)
    np.save(tmp_path / "ids.npy", np.arange(n))
    assert convert(tmp_path / "ids.npy", tmp_path / "coll", capsys=capsys)[0] == 0
    external_h5(tmp_path / "in" / "ext.h5", secret)
    code, _, err = run_command(
        augment_main.main,
        [
            "--input",
            tmp_path / "coll",
            "--output_dir",
            tmp_path / "aug",
            "--join_input",
            tmp_path / "in" / "ext.h5",
            *BEAM_FLAGS,
        ],
        capsys,
    )
    assert code == 2 and "stored in external file(s)" in err
    assert not (tmp_path / "aug").exists() or b"SECRET" not in all_output_bytes(tmp_path / "aug")
    code, _, err = run_command(verify_main.main, [tmp_path / "coll", "--source", tmp_path / "in" / "ext.h5"], capsys)
    assert code == 2 and "stored in external file(s)" in err


def test_external_storage_in_the_inputs_directory_with_the_flag(tmp_path, capsys):
    """Hostile group 9: with --allow_external_storage, an external file next to the .h5 (named relatively)
    is read exactly, wherever the command runs from (HDF5 alone would resolve it against the cwd)."""
    (tmp_path / "in").mkdir()
    data = np.arange(64, dtype="u1")
    (tmp_path / "in" / "raw.bin").write_bytes(data.tobytes())
    (tmp_path / "decoy").mkdir()
    (tmp_path / "decoy" / "raw.bin").write_bytes(b"\xff" * 64)
    cwd = os.getcwd()
    os.chdir(tmp_path / "decoy")
    try:
        with h5py.File(tmp_path / "in" / "ext.h5", "w") as f:
            f.create_dataset("x", shape=(64,), dtype="u1", external=[("raw.bin", 0, 64)])
        code, _, err = convert(tmp_path / "in" / "ext.h5", tmp_path / "out", "--allow_external_storage", capsys=capsys)
    finally:
        os.chdir(cwd)
    assert code == 0, err
    got = np.array([e["x"] for e in reader.iter_numpy(str(tmp_path / "out"))])
    np.testing.assert_array_equal(got, data)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_external_storage_on_a_fifo_or_device_is_never_opened(tmp_path, capsys, kind):
    """Hostile group 9: an external file that is a FIFO (which hung the worker) or a device (/dev/urandom
    was read) is refused without being opened, even with --allow_external_storage."""
    (tmp_path / "in").mkdir()
    target = tmp_path / "in" / "special"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/urandom")  # inside by name, a device by realpath: outside and not regular
    external_h5(tmp_path / "in" / "ext.h5", "special", 100)
    code, _, err = convert(tmp_path / "in" / "ext.h5", tmp_path / "out", "--allow_external_storage", capsys=capsys)
    assert code == 2 and ("not a regular file" in err or "lies outside" in err), err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_fifo_or_device_inputs_are_never_opened(tmp_path, capsys, kind):
    """Hostile group 9: an input matched by --input that is a FIFO or a device is refused before opening."""
    path = tmp_path / "in.h5"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    code, _, err = convert(path, tmp_path / "out", "--format", "hdf5", capsys=capsys)
    assert code == 2 and "Not a regular file" in err, err


def vds(tmp_path, source_path, rows=10):
    (tmp_path / "in").mkdir(exist_ok=True)
    layout = h5py.VirtualLayout(shape=(2 * rows,), dtype="<i4")
    layout[0:rows] = h5py.VirtualSource("a.h5", "d", shape=(rows,))
    layout[rows:] = h5py.VirtualSource(str(source_path), "d", shape=(rows,))
    with h5py.File(tmp_path / "in" / "a.h5", "w") as f:
        f["d"] = np.arange(rows, dtype="<i4")
    with h5py.File(tmp_path / "in" / "vds.h5", "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    return tmp_path / "in" / "vds.h5"


def test_virtual_dataset_with_sources_beside_it_is_read_exactly(tmp_path, capsys):
    """Hostile group 10: a VDS whose sources lie in the input's directory converts to the real values
    (it converted to the fill value before: h5py's file-object driver could not open the sources)."""
    (tmp_path / "in").mkdir()
    with h5py.File(tmp_path / "in" / "b.h5", "w") as f:
        f["d"] = np.arange(100, 110, dtype="<i4")
    path = vds(tmp_path, "b.h5")
    code, _, err = convert(path, tmp_path / "out", "--datasets", "/v", capsys=capsys)
    assert code == 0, err
    got = np.array([int(e["v"]) for e in reader.iter_numpy(str(tmp_path / "out"))])
    np.testing.assert_array_equal(got, np.r_[np.arange(10), np.arange(100, 110)])


@pytest.mark.parametrize("where", ["outside", "missing"])
def test_virtual_dataset_with_a_source_outside_or_missing_is_refused(tmp_path, capsys, where):
    """Hostile group 10: a VDS source outside the input's directory (never read) or missing (which would
    read as the fill value) is a SourceError naming the dataset and the source, never zeros."""
    outside = tmp_path / "elsewhere.h5"
    if where == "outside":
        with h5py.File(outside, "w") as f:
            f["d"] = np.full(10, 7, dtype="<i4")
    path = vds(tmp_path, outside if where == "outside" else "gone.h5")
    code, _, err = convert(path, tmp_path / "out", "--datasets", "/v", capsys=capsys)
    assert code == 2 and "virtual dataset source file" in err and "dataset='/v'" in err
    assert ("lies outside" in err and str(outside) in err) if where == "outside" else "gone.h5" in err


def test_truncated_contiguous_dataset_is_refused_at_planning(tmp_path):
    """Hostile group 13: a contiguous dataset whose declared bytes lie beyond the end of the file (the
    superblock patched to agree) is refused while planning, naming the file and dataset."""
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(100_000, dtype="<f8"))
    new_eof = os.path.getsize(path) - 400_000
    with open(path, "r+b") as f:  # cut the data and make the superblock (v0) agree: HDF5 then sees no truncation
        f.truncate(new_eof)
        f.seek(40)
        f.write(new_eof.to_bytes(8, "little"))
    with pytest.raises(EtlError, match=r"invalid dataset size, likely file corruption.* dataset='/x'"):
        Hdf5Source(SourceOptions("hdf5")).index(str(path))  # HDF5's own check, at planning, named


def test_declared_rows_of_zero_bytes_are_capped(tmp_path):
    """Hostile group 13: a 1.4 KB file declaring shape (10**15, 0) is refused at once (--max_empty_rows)
    instead of planning 10**15 rows."""
    path = tmp_path / "z.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(10**15, 0), dtype="u1")
    assert os.path.getsize(path) < 4096
    with pytest.raises(SourceError, match="zero bytes .* 1000000000000000 rows: more than the limit of 1000000"):
        Hdf5Source(SourceOptions("hdf5")).index(str(path))


def test_unallocated_dataset_is_refused_unless_allowed(tmp_path, capsys):
    """Hostile group 13: an unallocated chunked dataset of (10**13, 1) planned for 100 s and then wrote
    until the disk was full; now refused at planning within the memory budget, and --allow_fill_value is
    the explicit, bounded way to read never-written chunks (as their fill value)."""
    path = tmp_path / "u.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("u", shape=(10**13, 1), dtype="u1", chunks=(1024, 1))
    script = (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))\n"
        f"from tfrecord_etl.transforms.sources import Hdf5Source, SourceOptions\n"
        f"try:\n    Hdf5Source(SourceOptions('hdf5')).index({str(path)!r})\n"
        f"except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert "SourceError" in done.stdout and "never (fully) written" in done.stdout, done.stdout + done.stderr
    partial = tmp_path / "p.h5"
    with h5py.File(partial, "w") as f:
        d = f.create_dataset("p", shape=(40, 2), dtype="<i2", chunks=(10, 2), fillvalue=-5)
        d[0:10] = 1
    code, _, err = convert(partial, tmp_path / "out", capsys=capsys)
    assert code == 2 and "3 of its 4 chunks are not allocated" in err and "--allow_fill_value" in err
    code, _, err = convert(partial, tmp_path / "out", "--allow_fill_value", capsys=capsys)
    assert code == 0, err
    got = np.array([e["p"] for e in reader.iter_numpy(str(tmp_path / "out"))])
    np.testing.assert_array_equal(got, np.r_[np.ones((10, 2)), np.full((30, 2), -5)].astype("<i2"))


def test_a_chunk_spanning_many_row_ranges_is_decompressed_once(tmp_path, monkeypatch):
    """Hostile group 15: a gzip chunk of 4,000 rows read as 40 row ranges of 100 rows was re-read and
    re-decompressed per range (the file was opened per range); now one open file and one open dataset
    per worker thread keep HDF5's chunk cache (64 MiB) across the ranges of a shard."""
    from tfrecord_etl.transforms.sources import hdf5 as sources

    path = tmp_path / "c.h5"
    data = np.random.default_rng(0).integers(0, 1000, size=(4000, 16)).astype("<i4")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(4000, 16), compression="gzip")
    source = Hdf5Source(SourceOptions("hdf5"))
    opened, datasets = [], []
    real_open, real_dataset = Hdf5Source.open_file, sources.dataset_for_read
    monkeypatch.setattr(Hdf5Source, "open_file", lambda self, p: opened.append(p) or real_open(self, p))
    monkeypatch.setattr(sources, "dataset_for_read", lambda *a: datasets.append(a[1]) or real_dataset(*a))
    got = np.concatenate([source.read(RowRange(str(path), s, s + 100, ("/x",)))["x"] for s in range(0, 4000, 100)])
    np.testing.assert_array_equal(got, data)
    assert opened == [str(path)] and datasets == ["/x"]  # one open file and dataset for all 40 ranges
    dset = source._opened_dataset(str(path), "/x")
    assert dset.id.get_access_plist().get_chunk_cache()[1] >= 4000 * 16 * 4  # the chunk fits the cache
    source.close()


def test_deep_group_nesting_is_walked_without_recursion(tmp_path):
    """Hostile group 16: 1,200 nested groups ended in a RecursionError; the walk is iterative."""
    path = tmp_path / "deep.h5"
    with h5py.File(path, "w") as f:
        g = f
        for i in range(1200):
            g = g.create_group(f"g{i}")
        g["x"] = np.arange(3)
        f["a"] = np.arange(3)
    index = Hdf5Source(SourceOptions("hdf5")).index(str(path))
    assert index.items[0] == "/a" and index.items[1].count("/") == 1201 and len(index.items) == 2


def linked_h5(tmp_path):
    """``in/a.h5`` holding ``/y`` (100 rows) and external links: ``/x`` to a file outside ``in/``, ``/z`` to a file
    beside it, ``/g`` to a missing file; ``/s`` a soft link to ``/y``."""
    (tmp_path / "in").mkdir()
    with h5py.File(tmp_path / "outside.h5", "w") as f:
        f["d"] = np.full(100, 7, dtype="<i8")
    with h5py.File(tmp_path / "in" / "side.h5", "w") as f:
        f["d"] = np.arange(100, 200, dtype="<i8")
    with h5py.File(tmp_path / "in" / "a.h5", "w") as f:
        f["y"] = np.arange(100, dtype="<i8") * 2
        f["x"] = h5py.ExternalLink("../outside.h5", "/d")
        f["z"] = h5py.ExternalLink("side.h5", "/d")
        f["g"] = h5py.ExternalLink("gone.h5", "/d")
        f["s"] = h5py.SoftLink("/y")
    return tmp_path / "in" / "a.h5"


@pytest.mark.parametrize("flags", [[], ["--allow_external_storage"]])
def test_external_link_outside_the_inputs_directory_is_refused(tmp_path, capsys, flags):
    """Hostile group 25: an external link to a file outside the input's directory, named with --datasets, put that
    file's 100 rows into the shards (exit 0); now refused naming the link and its target, with the flag too."""
    path = linked_h5(tmp_path)
    code, _, err = convert(path, tmp_path / "out", "--datasets", "x", *flags, capsys=capsys)
    assert code == 2 and "external link to '../outside.h5:/d'" in err and "dataset='x'" in err, err
    assert "whose file lies outside the input file's directory: refused, never read" in err
    assert "--allow_external_storage" in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.tfrecord*"))


@pytest.mark.parametrize("flags", [[], ["--allow_external_storage"]])
def test_external_links_the_walk_leaves_out_are_named(tmp_path, capsys, caplog, flags):
    """Hostile group 25: without --datasets an external link was left out without a word; now one warning line names
    each link not followed and why (outside, dangling, the flag); with --allow_external_storage the link to a file
    beside the input joins its row group and is read exactly."""
    path = linked_h5(tmp_path)
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        code, _, err = convert(path, tmp_path / "out", *flags, capsys=capsys)
    assert code == 0, err
    err = " ".join(r.getMessage() for r in caplog.records)
    assert "external link not followed (outside the input's directory)" in err and "/x -> ../outside.h5:/d" in err
    assert "external link not followed (dangling: its file is missing)" in err and "/g -> gone.h5:/d" in err
    assert ("(needs --allow_external_storage) (/z -> side.h5:/d)" in err) != bool(flags), err
    got = list(reader.iter_numpy(str(tmp_path / "out")))
    assert sorted(got[0]) == (["y", "z"] if flags else ["y"])
    np.testing.assert_array_equal([int(e["y"]) for e in got], np.arange(100) * 2)
    if flags:
        np.testing.assert_array_equal([int(e["z"]) for e in got], np.arange(100, 200))


def test_external_link_beside_the_input_needs_the_flag_and_is_read_exactly(tmp_path, capsys):
    """Hostile group 25: a link to a file in the input's directory follows the external-storage rule: refused
    without --allow_external_storage (naming the flag), read exactly with it, wherever the command runs from."""
    path = linked_h5(tmp_path)
    code, _, err = convert(path, tmp_path / "out", "--datasets", "z", capsys=capsys)
    assert code == 2 and "external link to 'side.h5:/d', in another file: refused" in err
    assert "pass --allow_external_storage" in err
    (tmp_path / "decoy").mkdir()
    with h5py.File(tmp_path / "decoy" / "side.h5", "w") as f:  # HDF5 alone may resolve against the cwd
        f["d"] = np.full(100, -1, dtype="<i8")
    cwd = os.getcwd()
    os.chdir(tmp_path / "decoy")
    try:
        code, _, err = convert(path, tmp_path / "out", "--datasets", "z", "--allow_external_storage", capsys=capsys)
    finally:
        os.chdir(cwd)
    assert code == 0, err
    np.testing.assert_array_equal([int(e["z"]) for e in reader.iter_numpy(str(tmp_path / "out"))], np.arange(100, 200))


def test_soft_links_unchanged_and_dangling_external_link_named(tmp_path, capsys):
    """Hostile group 25: a soft link inside the file is read as before (its target's values); a dangling external
    link named with --datasets is one line saying its file is missing, never a fill value."""
    path = linked_h5(tmp_path)
    code, _, err = convert(path, tmp_path / "out", "--datasets", "s", capsys=capsys)
    assert code == 0, err
    np.testing.assert_array_equal([int(e["s"]) for e in reader.iter_numpy(str(tmp_path / "out"))], np.arange(100) * 2)
    code, _, err = convert(path, tmp_path / "out2", "--datasets", "g", "--allow_external_storage", capsys=capsys)
    assert code == 2 and "external link to 'gone.h5:/d', whose file is missing (a dangling link)" in err, err


def test_inspect_says_what_convert_does_with_each_external_link(tmp_path):
    """Hostile group 25: inspect lists each external link with what convert does with it and why."""
    from tfrecord_etl.transforms.sources.hdf5tree import hdf5_tree, render_tree

    text = render_tree(hdf5_tree(str(linked_h5(tmp_path))))
    assert (
        "/x -> ../outside.h5:/d (external link, not followed; convert refuses it: outside the input's directory)"
        in text
    )
    assert "/g -> gone.h5:/d (external link, not followed; convert refuses it: dangling: its file is missing)" in text
    assert "/z -> side.h5:/d (external link, not followed; convert follows it with --allow_external_storage)" in text
    assert "/s -> /y (soft link, not followed)" in text
