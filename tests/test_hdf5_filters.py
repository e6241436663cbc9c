"""HDF5 filter plugins just work: files written through hdf5plugin (Blosc, Blosc2, BZip2, LZ4, Zstd, Bitshuffle, SZ,
ZFP) convert exactly in the launcher and in every worker process (2 DirectRunner worker processes; a fresh command
process reading s3://), and verify --source reads them; a filter that no plugin provides, or a chunk that fails to
decode, is reported with its known cause only.

The test process itself imports hdf5plugin to write the files, so the conversions that must prove that our code
registers the filters run in processes that never imported it: Beam's worker processes and a command run as a
subprocess. Expected values are what h5py (with the plugins) reads from the file: SZ is lossy, and conversion must
reproduce the stored values bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT, convert, fixture_file, run_command
from tests.test_hdf5_subarrays import plain_tf_rows, tf  # noqa: F401 - tf is a fixture
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import SourceError
from tfrecord_etl.transforms.sources import Hdf5Source, RowRange, SourceOptions

hdf5plugin = pytest.importorskip("hdf5plugin", reason="a dependency: pip install -e .")
try:
    from tests.test_s3 import BUCKET, s3  # the moto S3 server fixture
except pytest.skip.Exception:

    @pytest.fixture
    def s3():
        pytest.skip("the moto S3 server is in the test extra: pip install -e .[test]")


ROWS = 240
MULTI_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
IN_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def filters_file(path) -> dict:
    """One chunked dataset per hdf5plugin filter (20-row chunks), each of another dtype; returns what h5py reads
    back from the file (the stored values)."""
    rng = np.random.default_rng(5)
    normal = rng.normal(size=(ROWS, 6))
    datasets = {
        "blosc": (rng.integers(-3000, 3000, (ROWS, 6)).astype("<i2"), hdf5plugin.Blosc(cname="lz4", clevel=5)),
        "blosc2": (normal, hdf5plugin.Blosc2(cname="zstd", filters=hdf5plugin.Blosc2.BITSHUFFLE)),
        "bzip2": (rng.integers(0, 255, (ROWS, 4, 4)).astype("u1"), hdf5plugin.BZip2()),
        "lz4": (rng.integers(-(2**31), 2**31 - 1, (ROWS, 3)).astype(">i4"), hdf5plugin.LZ4()),
        "zstd": (normal.astype("<f4"), hdf5plugin.Zstd(clevel=9)),
        "bitshuffle": (rng.integers(0, 2**40, (ROWS, 2)).astype("<i8"), hdf5plugin.Bitshuffle(cname="lz4")),
        "sz": (normal.astype("<f4") * 100, hdf5plugin.SZ(absolute=0.01)),  # lossy: the stored values count
        "zfp": (normal, hdf5plugin.Zfp(reversible=True)),
    }
    with h5py.File(path, "w") as f:
        for name, (data, flt) in datasets.items():
            f.create_dataset(name, data=data, chunks=(20,) + data.shape[1:], **flt)
    with h5py.File(path) as f:
        assert sorted(f[n].id.get_create_plist().get_filter(0)[0] for n in datasets) == sorted(
            [
                hdf5plugin.BLOSC_ID,
                hdf5plugin.BLOSC2_ID,
                hdf5plugin.BZIP2_ID,
                hdf5plugin.LZ4_ID,
                hdf5plugin.ZSTD_ID,
                hdf5plugin.BSHUF_ID,
                hdf5plugin.SZ_ID,
                hdf5plugin.ZFP_ID,
            ]
        )
        return {name: f[name][()] for name in datasets}


def assert_rows_exact(examples, expected: dict):
    assert len(examples) == ROWS
    for name, values in expected.items():
        got = np.stack([e[name] for e in examples])
        assert got.dtype == values.dtype.newbyteorder("<") and got.shape == values.shape, name
        assert got.tobytes() == values.astype(values.dtype.newbyteorder("<")).tobytes(), name


def command(module: str, *args) -> subprocess.CompletedProcess:
    """``python -m pipelines.MODULE ARGS`` in a fresh process (which has not imported hdf5plugin)."""
    return subprocess.run(
        [sys.executable, "-m", f"pipelines.{module}", *map(str, args)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_plugin_filter_converts_exactly_in_two_worker_processes_and_verifies(tmp_path, tf):
    """The launcher (this process) has the filters; Beam's 2 worker processes only unpickle the source and read,
    and failed with "can't open directory (/usr/local/hdf5/lib/plugin)" until the source registered them."""
    expected = filters_file(tmp_path / "filters.h5")
    out = tmp_path / "out"
    code, _, err = convert(
        tmp_path / "filters.h5",
        out,
        "--num_shards",
        "2",
        "--target_range_mb",
        "0.01",
        "--provenance",
        *MULTI_PROCESS,
        beam=False,
    )
    assert code == 0, err
    examples = sorted(reader.iter_numpy(str(out)), key=lambda e: int(e["_source/row"]))
    assert_rows_exact(examples, expected)
    assert_rows_exact(plain_tf_rows(out, tf), expected)  # plain tf.io.parse_example, shards in order
    from tfrecord_etl.pipelines import verify

    code, stdout, err = run_command(verify.main, [out, "--source", tmp_path / "filters.h5"])
    assert code == 0, stdout + err


def test_plugin_filters_on_s3_in_a_fresh_command_process(s3, tmp_path):
    """A command process that never imported hdf5plugin plans (the launcher) and reads (its in-process worker) an
    s3:// file of every filter: shards byte-identical to a local run; verify --source, also a fresh process,
    compares every value with the file."""
    client, s3_flags = s3
    filters_file(tmp_path / "filters.h5")
    client.upload_file(str(tmp_path / "filters.h5"), BUCKET, "filters/filters.h5")
    flags = ["--num_shards", "2", "--target_range_mb", "0.01", "--compression", "gzip", *IN_PROCESS]
    code, _, err = convert(tmp_path / "filters.h5", tmp_path / "local", *flags, beam=False)
    assert code == 0, err
    done = command(
        "convert",
        "--input",
        f"s3://{BUCKET}/filters/filters.h5",
        "--output_dir",
        tmp_path / "remote",
        *flags,
        *s3_flags,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert len(shards) == 2
    for name in shards + ["schema.pbtxt"]:
        assert (tmp_path / "remote" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    done = command("verify", tmp_path / "remote", "--source", tmp_path / "filters.h5")
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize("name,rows", [("blosc_bigendian.h5", 10), ("b2nd-no-chunkshape.h5", 6)])
def test_real_pytables_blosc_files_convert_exactly_from_the_command(tmp_path, tf, name, rows):
    """Real files PyTables wrote with Blosc (filter 32001: big-endian int8-int64 datasets) and Blosc2 (32026, its
    b2nd format), converted by the command in a fresh process, equal h5py's values and pass verify --source."""
    path = fixture_file("tables/tests/" + name)
    with h5py.File(path) as f:
        expected = {k.strip("/"): f[k][()] for k in f if isinstance(f[k], h5py.Dataset)}
        assert {f[k].id.get_create_plist().get_filter(0)[0] for k in expected} <= {
            hdf5plugin.BLOSC_ID,
            hdf5plugin.BLOSC2_ID,
        }
    out = tmp_path / "out"
    done = command("convert", "--input", path, "--output_dir", out, "--provenance", *IN_PROCESS)
    assert done.returncode == 0, done.stderr[-3000:]
    examples = sorted(reader.iter_numpy(str(out)), key=lambda e: int(e["_source/row"]))
    plain = plain_tf_rows(out, tf)
    assert len(examples) == len(plain) == rows
    for key, values in expected.items():
        for got in (np.stack([e[key] for e in examples]), np.stack([r[key] for r in plain])):
            assert got.dtype == values.dtype.newbyteorder("<") and got.tolist() == values.tolist(), key
    from tfrecord_etl.pipelines import verify

    code, stdout, err = run_command(verify.main, [out, "--source", path])
    assert code == 0, stdout + err


def private_filter_file(path, code=54321):
    """A dataset whose chunks were written through filter ``code`` (no plugin anywhere provides it): chunks stored
    with HDF5's direct chunk write, filter mask 0 (every filter applied), as a writer holding the plugin leaves
    them."""
    data = np.arange(100.0).reshape(25, 4)
    with h5py.File(path, "w") as f:
        dset = f.create_dataset(
            "x", shape=data.shape, dtype="<f8", chunks=(5, 4), compression=code, allow_unknown_filter=True
        )
        for start in range(0, 25, 5):
            dset.id.write_direct_chunk((start, 0), data[start : start + 5].tobytes(), filter_mask=0)
    return data


def test_a_filter_no_plugin_provides_is_named_with_where_to_get_it(tmp_path, capsys):
    path = tmp_path / "private.h5"
    private_filter_file(path)
    code, _, err = convert(path, tmp_path / "out", capsys=capsys)  # refused at planning
    assert code == 2
    assert "SourceError: HDF5 filter 54321 (no name stored in the file) is not available in this process" in err
    assert "dataset='/x'" in err and "private.h5" in err
    assert "32768-65535 are for private use" in err and "HDF5_PLUGIN_PATH" in err
    assert not (tmp_path / "out" / "metadata.json").exists()
    # a worker that reads it (planning skipped) names the filter too, not HDF5's "can't open directory"
    with pytest.raises(SourceError) as e:
        Hdf5Source(SourceOptions()).read(RowRange(str(path), 0, 5, ("/x",)))
    assert (
        e.value.message == "Cannot read rows 0-4: HDF5 filter 54321 (no name stored in the file) is not "
        "available in this process"
    )
    assert "can't open directory" not in str(e.value) and "corrupt" not in str(e.value)


def test_a_registered_filter_that_hdf5plugin_lacks_points_to_the_registry(tmp_path, capsys):
    """PyTables' LZO (filter 305) is registered with The HDF Group, but hdf5plugin does not provide it."""
    code, _, err = convert(fixture_file("tables/tests/Tables_lzo1.h5"), tmp_path / "out", capsys=capsys)
    assert code == 2
    assert "HDF5 filter 305 (lzo) is not available" in err
    assert "hdf5plugin does not" in err and "RegisteredFilterPlugins.md" in err


def test_without_hdf5plugin_the_error_names_the_pip_command(tmp_path):
    """hdf5plugin is a dependency; a process where it cannot be imported refuses a Blosc file naming it."""
    filters_file(tmp_path / "filters.h5")
    probe = (
        "import sys; sys.modules['hdf5plugin'] = None\n"  # import hdf5plugin -> ImportError
        "from tfrecord_etl.transforms.planning import plan_inputs\n"
        "from tfrecord_etl.transforms.sources import SourceOptions\n"
        f"plan_inputs({str(tmp_path / 'filters.h5')!r}, SourceOptions(datasets=('/blosc',)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"},
    )
    assert done.returncode == 1
    assert "SourceError: HDF5 filter 32001 (blosc) is not available in this process" in done.stderr
    assert "pip install hdf5plugin" in done.stderr


def test_a_chunk_that_fails_to_decode_is_called_corrupt(tmp_path):
    """A Fletcher32 checksum mismatch is a decode error: the one read error whose hint says corrupt."""
    path = tmp_path / "sum.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(400.0).reshape(100, 4), chunks=(10, 4), fletcher32=True)
    with h5py.File(path) as f:
        offset = f["x"].id.get_chunk_info(3).byte_offset
    raw = bytearray(path.read_bytes())
    raw[offset + 8] ^= 0xFF  # one bit pattern of chunk 3 (rows 30-39) changed: its checksum no longer matches
    path.write_bytes(bytes(raw))
    source = Hdf5Source(SourceOptions())
    assert source.read(RowRange(str(path), 20, 30, ("/x",)))["x"][0, 0] == 80.0
    with pytest.raises(SourceError, match="Cannot read rows 30-39: .*filter returned failure") as e:
        source.read(RowRange(str(path), 30, 40, ("/x",)))
    assert "checksum or decompression error" in e.value.hint and "corrupt" in e.value.hint
    assert "plugin" not in e.value.hint


def test_virtual_dataset_over_plugin_filtered_sources_converts_in_fresh_worker_processes(tmp_path):
    """A virtual dataset has no filter of its own: the plugin its sources need is only met when HDF5 reads them,
    so the reader registers hdf5plugin's filters after the failed read and reads once more."""
    rng = np.random.default_rng(11)
    parts = [rng.integers(-(2**31), 2**31 - 1, (ROWS // 2, 3)).astype("<i4") for _ in range(2)]
    layout = h5py.VirtualLayout(shape=(ROWS, 3), dtype="<i4")
    for k, part in enumerate(parts):
        with h5py.File(tmp_path / f"src{k}.h5", "w") as f:
            f.create_dataset("x", data=part, chunks=(20, 3), **hdf5plugin.Zstd(clevel=3))
        layout[k * (ROWS // 2) : (k + 1) * (ROWS // 2)] = h5py.VirtualSource(f"src{k}.h5", "x", shape=part.shape)
    with h5py.File(tmp_path / "vds.h5", "w") as f:
        f.create_virtual_dataset("x", layout)
    out = tmp_path / "out"
    proc = command("convert", "--input", tmp_path / "vds.h5", "--output_dir", out, "--num_shards", 2, *MULTI_PROCESS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.stack([e["x"] for e in reader.iter_numpy(str(out))])
    assert got.tobytes() == np.concatenate(parts).tobytes()


def test_a_process_that_reads_only_built_in_filters_never_imports_hdf5plugin(tmp_path):
    """hdf5plugin's import (15-20 ms a process) is paid only where a dataset needs one of its filters."""
    with h5py.File(tmp_path / "gz.h5", "w") as f:
        f.create_dataset(
            "x",
            data=np.arange(ROWS * 2).reshape(ROWS, 2),
            chunks=(20, 2),
            compression="gzip",
            shuffle=True,
            fletcher32=True,
        )
    with h5py.File(tmp_path / "blosc.h5", "w") as f:
        f.create_dataset("x", data=np.arange(ROWS), chunks=(20,), **hdf5plugin.Blosc())
    for name, imported in (("gz.h5", "False"), ("blosc.h5", "True")):
        out = tmp_path / f"out-{name}"
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys\n"
                "from tfrecord_etl.pipelines import common, convert\n"
                "rc = common.run_main(convert.main, sys.argv[1:])\n"
                "print('hdf5plugin' in sys.modules, rc)",
                "--input",
                str(tmp_path / name),
                "--output_dir",
                str(out),
                "--runner=DirectRunner",
                "--direct_running_mode=in_memory",
            ],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.stdout.strip().splitlines()[-1] == f"{imported} 0", (name, proc.stdout[-2000:], proc.stderr[-2000:])
        assert len(list(reader.iter_numpy(str(out)))) == ROWS
