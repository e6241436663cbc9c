"""Object storage reads only the bytes needed: converting from s3:// through a counting TCP proxy in front
of a moto server, the server sends at most 1.25x the file for a chunked gzip HDF5 file, a contiguous one, a .npy,
a stored and a deflated .npz (Beam's own S3 stream sent 3.6x-8x), and the shards are byte-identical to the local
run. A byte count, not a timing."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from bench.remote import egress_inputs
from bench.s3proxy import CountingProxy
from tests.test_s3 import BUCKET, CREDENTIALS, convert, s3  # noqa: F401 - the moto server fixture
from tfrecord_etl.transforms.storage import fileio, remote

ROWS = 1024  # x 4096 bytes: 4 MiB of images per file


@pytest.fixture(scope="module")
def proxied(s3):
    client, flags = s3
    endpoint = [f for f in flags if f.startswith("--s3_endpoint_url=")][0].split("=", 1)[1]
    host, port = endpoint.rsplit("/", 1)[1].split(":")
    proxy = CountingProxy((host, int(port))).start()
    files = egress_inputs(ROWS)
    for name, data in files.items():
        client.put_object(Bucket=BUCKET, Key=f"egress/{name}", Body=data)
    flags = [f for f in flags if not f.startswith("--s3_endpoint_url=")] + [
        f"--s3_endpoint_url=http://127.0.0.1:{proxy.port}"
    ]
    remote.CLIENTS.clear()
    yield proxy, flags, files
    remote.CLIENTS.clear()
    proxy.close()


# file -> the most egress allowed, as a multiple of the file's size
# (a deflate stream cannot be entered in the middle: the shards that continue a deflated member are written by the
# worker of the shard before them, sharding.group_sequential; before that, 2.0x on these files)
LIMITS = {"chunked_gzip.h5": 1.25, "contiguous.h5": 1.25, "img.npy": 1.25, "stored.npz": 1.25, "deflated.npz": 1.25}


@pytest.mark.parametrize("name", list(LIMITS))
def test_remote_convert_reads_only_what_it_needs(proxied, tmp_path, name):
    proxy, flags, files = proxied
    local = tmp_path / name
    local.write_bytes(files[name])
    assert (
        convert(
            [
                "--input",
                local,
                "--output_dir",
                tmp_path / "local",
                "--num_shards",
                "2",
                "--runner=DirectRunner",
                "--direct_running_mode=in_memory",
            ]
        )[0]
        == 0
    )
    proxy.reset()
    assert (
        convert(
            [
                "--input",
                f"s3://{BUCKET}/egress/{name}",
                "--output_dir",
                tmp_path / "remote",
                "--num_shards",
                "2",
                "--runner=DirectRunner",
                "--direct_running_mode=in_memory",
                *flags,
            ]
        )[0]
        == 0
    )
    ratio = proxy.egress_bytes / len(files[name])
    assert ratio <= LIMITS[name], f"{name}: the server sent {proxy.egress_bytes} bytes = {ratio:.2f}x the file"
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "remote").glob("data-*"))
    for shard in shards:
        assert (tmp_path / "local" / shard).read_bytes() == (tmp_path / "remote" / shard).read_bytes()


def test_range_reader_seeks_and_reads_exact_bytes(proxied):
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    proxy, flags, files = proxied
    FileSystems.set_options(PipelineOptions(flags))
    data = files["img.npy"]
    proxy.reset()
    with fileio.open_read(f"s3://{BUCKET}/egress/img.npy") as f:
        assert f.read(10) == data[:10]
        f.seek(1_000_000)
        assert f.read(5) == data[1_000_000:1_000_005]
        f.seek(-3, os.SEEK_END)
        assert f.read(100) == data[-3:] and f.read(1) == b""
        f.seek(2_000_000)
        assert f.read(3_000_000) == data[2_000_000:5_000_000]
    assert proxy.egress_bytes < 3_000_000 + 4 * (256 * 1024 + 2000)  # what was read, plus read-ahead and headers


def test_remote_planning_is_concurrent_and_fails_on_the_first_bad_file_in_order(proxied, monkeypatch):
    """plan_inputs indexes remote files with a bounded thread pool (planning.PLAN_THREADS), one request per small
    file; the plan equals the sequential one, and a bad file fails the plan with its own error, the first in path
    order (not the first to finish)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from tfrecord_etl.transforms import planning
    from tfrecord_etl.transforms.errors import SourceError
    from tfrecord_etl.transforms.sources import SourceOptions

    proxy, flags, _ = proxied
    client = boto3_client(flags)
    for i in range(24):
        buf = io.BytesIO()
        np.save(buf, np.arange(10 * (i + 1), dtype="<i8").reshape(-1, 2))
        client.put_object(Bucket=BUCKET, Key=f"many/f{i:02d}.npy", Body=buf.getvalue())
    FileSystems.set_options(PipelineOptions(flags))
    proxy.reset()
    plan = planning.plan_inputs(f"s3://{BUCKET}/many/*.npy", SourceOptions("npy"))
    assert [i.num_rows for i in plan.indexes] == [5 * (i + 1) for i in range(24)]
    assert proxy.connections <= 24 + 2  # one GET per file (size from Content-Range) and the listing
    monkeypatch.setattr(planning.inputs, "PLAN_THREADS", 1)  # where index_concurrently reads it
    sequential = planning.plan_inputs(f"s3://{BUCKET}/many/*.npy", SourceOptions("npy"))
    assert (sequential.indexes, sequential.ranges, sequential.specs) == (plan.indexes, plan.ranges, plan.specs)
    monkeypatch.undo()
    for i in (7, 19):  # two corrupt headers: the error names f07, whichever thread finishes first
        client.put_object(Bucket=BUCKET, Key=f"many/f{i:02d}.npy", Body=b"\x93NUMPY\x01\x00garbage")
    with pytest.raises(SourceError) as e:
        planning.plan_inputs(f"s3://{BUCKET}/many/*.npy", SourceOptions("npy"))
    assert "f07.npy" in str(e.value) and "f19" not in str(e.value)


def boto3_client(flags):
    import boto3

    endpoint = [f for f in flags if f.startswith("--s3_endpoint_url=")][0].split("=", 1)[1]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


def test_dry_run_prints_the_plan_and_writes_nothing(proxied, tmp_path, capsys):
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import convert as convert_module

    proxy, flags, files = proxied
    out = tmp_path / "never"
    proxy.reset()
    code, stdout, err = run_command(
        convert_module.main,
        [
            "--input",
            f"s3://{BUCKET}/egress/chunked_gzip.h5",
            "--output_dir",
            out,
            "--dry_run",
            "--num_shards",
            "2",
            "--splits",
            "train=9,test=1",
            *flags,
        ],
        capsys,
    )
    assert code == 0 and not out.exists(), err
    for text in (
        "dry run: nothing written",
        "inputs: 1 files (hdf5), 1,024 rows, 4,202,496 bytes of arrays",
        "shards: 2 (4 files, e.g. data-train.tfrecord-00000-of-00002)",
        "ranged requests",
        "splits: train (weight 9), test (weight 1)",
        "features: img |u1 [4096] tensor, label <i8 [] list",
    ):
        assert text in stdout, (text, stdout)
    assert proxy.egress_bytes < 0.1 * len(files["chunked_gzip.h5"])  # planning reads metadata only


def test_prefetch_coalesces_ranges_and_serves_reads_without_requests(proxied, monkeypatch):
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    _proxy, flags, files = proxied
    FileSystems.set_options(PipelineOptions(flags))
    data = files["img.npy"]
    gets = []
    original = remote.RangeReader._get
    monkeypatch.setattr(
        remote.RangeReader, "_get", lambda self, start, n: gets.append((start, n)) or original(self, start, n)
    )
    with fileio.open_read(f"s3://{BUCKET}/egress/img.npy") as f:
        assert fileio.prefetch(f, [(200_000, 100), (200_150, 50_000), (3_000_000, 10), (0, 0)])
        assert gets == [(200_000, 50_150), (3_000_000, 10)] or sorted(gets) == [(200_000, 50_150), (3_000_000, 10)]
        f.seek(200_150)
        assert f.read(50_000) == data[200_150:250_150]
        f.seek(3_000_000)
        assert f.read(10) == data[3_000_000:3_000_010]
        assert len(gets) == 2  # both reads served from the prefetched blocks
        f.seek(4_000_000)
        assert f.read(10) == data[4_000_000:4_000_010] and len(gets) == 3
    with open(__file__, "rb") as local:
        assert not fileio.prefetch(local, [(0, 10)])  # local streams: nothing to do


def test_hdf5_filters_read_remotely_are_exact(proxied, tmp_path):
    """Every HDF5 filter that works locally works on s3:// (h5py decodes the chunks it reads through the
    bounded reader; the prefetch only fetches their bytes first): gzip + shuffle + fletcher32, lzf, scale-offset,
    next to a contiguous dataset. Shards byte-identical to the local run, egress within 1.25x."""
    import h5py

    rng = np.random.default_rng(7)
    rows = 2048
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f.create_dataset(
            "gz",
            data=rng.integers(0, 50, (rows, 64), dtype="<i4"),
            chunks=(128, 64),
            compression="gzip",
            shuffle=True,
            fletcher32=True,
        )
        f.create_dataset("lzf", data=rng.standard_normal((rows, 32)).astype("<f4"), chunks=(256, 32), compression="lzf")
        f.create_dataset("so", data=rng.integers(0, 1000, (rows, 16), dtype="<i8"), chunks=(512, 16), scaleoffset=0)
        f["plain"] = np.arange(rows, dtype="<f8")
    data = buf.getvalue()
    proxy, flags, _ = proxied
    boto3_client(flags).put_object(Bucket=BUCKET, Key="filters/f.h5", Body=data)
    (tmp_path / "f.h5").write_bytes(data)
    run = ["--num_shards", "3", "--target_range_mb", "0.1", "--runner=DirectRunner", "--direct_running_mode=in_memory"]
    assert convert(["--input", tmp_path / "f.h5", "--output_dir", tmp_path / "local", *run])[0] == 0
    proxy.reset()
    assert (
        convert(["--input", f"s3://{BUCKET}/filters/f.h5", "--output_dir", tmp_path / "remote", *run, *flags])[0] == 0
    )
    assert proxy.egress_bytes <= 1.25 * len(data), (proxy.egress_bytes, len(data))
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert len(shards) == 3
    for shard in shards:
        assert (tmp_path / "local" / shard).read_bytes() == (tmp_path / "remote" / shard).read_bytes()
    from tfrecord_etl.transforms import reader

    got = {k: np.concatenate(v) for k, v in _columns(reader.iter_numpy(str(tmp_path / "remote"))).items()}
    with h5py.File(io.BytesIO(data), "r") as f:
        for name in ("gz", "lzf", "so", "plain"):
            np.testing.assert_array_equal(got[name], f[name][...])


def _columns(batches):
    out: dict = {}
    for example in batches:
        for k, v in example.items():
            out.setdefault(k, []).append(np.asarray(v)[None])
    return out


def test_reads_are_pinned_to_the_version_first_opened(proxied, tmp_path):
    """What one process learns of an object (size, ETag, metadata reads) serves its next opens after a
    conditional request (If-None-Match: 304, no body), and every later read asks for that ETag (If-Match): an
    object replaced while it is read fails with an error naming it, never a mix of two versions, and the next
    open reads the new version."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    proxy, flags, _ = proxied
    FileSystems.set_options(PipelineOptions(flags))
    client = boto3_client(flags)
    old, new = bytes(range(256)) * 1024, bytes(reversed(range(256))) * 1024  # 256 KiB each
    path = f"s3://{BUCKET}/pinned/x.bin"
    client.put_object(Bucket=BUCKET, Key="pinned/x.bin", Body=old)
    with fileio.open_read(path) as f:
        assert f.read(10) == old[:10]
    proxy.reset()
    with fileio.open_read(path) as f:  # known: the open is answered 304, the head is not sent again
        assert f.read(10) == old[:10] and proxy.egress_bytes < 2000
        client.put_object(Bucket=BUCKET, Key="pinned/x.bin", Body=new)
        f.seek(200_000)
        with pytest.raises(OSError, match="x.bin changed while it was read"):
            f.read(10)
    with fileio.open_read(path) as f:
        f.seek(200_000)
        assert f.read(10) == new[200_000:200_010] and f.seek(0) == 0 and f.read(10) == new[:10]
