"""Parquet from s3:// reads only what it needs: through a counting TCP proxy in front of a moto server, converting
a Parquet file of 8 row groups sends at most 1.05x the file (the footer once, then each row group's column chunks,
fetched together), the column chunks of the converted columns only with --datasets, and the shards are
byte-identical to the local run's; a Feather (Arrow IPC) file at most 2.1x (its record batches are read at planning
too). A byte count, not a timing."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from bench.s3proxy import CountingProxy
from tests.test_s3 import BUCKET, convert, s3  # noqa: F401 - the moto server fixture
from tfrecord_etl.transforms.storage import remote

ROWS = 4096


def table() -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table(
        {
            "image": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 255, ROWS * 768, np.uint8)), 768),
            "score": pa.array(rng.standard_normal(ROWS)),
            "tags": pa.array([["a"] * (i % 4) for i in range(ROWS)], pa.list_(pa.string())),
            "label": pa.array(rng.integers(0, 10, ROWS)),
        }
    )


@pytest.fixture(scope="module")
def proxied(s3):
    client, flags = s3
    endpoint = [f for f in flags if f.startswith("--s3_endpoint_url=")][0].split("=", 1)[1]
    host, port = endpoint.rsplit("/", 1)[1].split(":")
    proxy = CountingProxy((host, int(port))).start()
    buffer = io.BytesIO()
    pq.write_table(table(), buffer, row_group_size=ROWS // 8, compression="snappy")
    data = buffer.getvalue()
    client.put_object(Bucket=BUCKET, Key="tables/t.parquet", Body=data)
    ipc = io.BytesIO()
    feather.write_feather(table(), ipc, chunksize=ROWS // 8, compression="uncompressed")
    client.put_object(Bucket=BUCKET, Key="tables/t.feather", Body=ipc.getvalue())
    flags = [f for f in flags if not f.startswith("--s3_endpoint_url=")]
    flags.append(f"--s3_endpoint_url=http://127.0.0.1:{proxy.port}")
    remote.CLIENTS.clear()
    yield proxy, flags, data, ipc.getvalue()
    remote.CLIENTS.clear()
    proxy.close()


def run(src, out, flags=(), *more):
    argv = ["--input", src, "--output_dir", out, "--num_shards", "3", "--runner=DirectRunner"]
    return convert([*argv, "--direct_running_mode=in_memory", *more, *flags])[0]


@pytest.mark.parametrize("columns", [None, "label,score"])
def test_remote_parquet_reads_the_footer_and_its_chunks_once(proxied, tmp_path, columns):
    proxy, flags, data, _ = proxied
    (tmp_path / "t.parquet").write_bytes(data)
    more = ("--datasets", columns) if columns else ()
    assert run(tmp_path / "t.parquet", tmp_path / "local", (), *more) == 0
    proxy.reset()
    assert run(f"s3://{BUCKET}/tables/t.parquet", tmp_path / "remote", flags, *more) == 0
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    wanted = len(data)
    if columns:  # the chunks of the two columns, and the footer
        names = columns.split(",")
        wanted = meta.serialized_size + sum(
            meta.row_group(g).column(c).total_compressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
            if meta.row_group(g).column(c).path_in_schema in names
        )
    ratio = proxy.egress_bytes / wanted
    print(f"parquet egress, columns {columns}: {proxy.egress_bytes} bytes for {wanted} needed ({ratio:.3f}x)")
    assert ratio <= 1.05, f"the server sent {proxy.egress_bytes} bytes = {ratio:.3f}x the {wanted} needed"
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "remote").glob("data-*"))
    for shard in shards:
        assert (tmp_path / "local" / shard).read_bytes() == (tmp_path / "remote" / shard).read_bytes()


def test_remote_feather_is_read_once_at_planning_and_once_by_the_workers(proxied, tmp_path):
    """An Arrow IPC file declares no row counts before its record batches: planning reads them (1x), the workers
    read them again (1x)."""
    proxy, flags, _, data = proxied
    (tmp_path / "t.feather").write_bytes(data)
    assert run(tmp_path / "t.feather", tmp_path / "local") == 0
    proxy.reset()
    assert run(f"s3://{BUCKET}/tables/t.feather", tmp_path / "remote", flags) == 0
    ratio = proxy.egress_bytes / len(data)
    print(f"feather egress: {proxy.egress_bytes} bytes for a file of {len(data)} ({ratio:.3f}x)")
    assert ratio <= 2.1, f"the server sent {ratio:.3f}x the file"
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "remote").glob("data-*"))
    for shard in shards:
        assert (tmp_path / "local" / shard).read_bytes() == (tmp_path / "remote" / shard).read_bytes()
