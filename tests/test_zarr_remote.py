"""Zarr stores on object storage: a store under an s3:// prefix (moto behind the counting proxy) converts to the
same shards as its local copy, the server sending at most 1.05x the store's bytes (every chunk read once, metadata
from the consolidated document); a store without consolidated metadata is listed and read too. A byte count, not a
timing."""

from __future__ import annotations

import os

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from bench.s3proxy import CountingProxy  # noqa: E402
from tests.test_s3 import BUCKET, convert, s3  # noqa: E402,F401 - the moto server fixture
from tfrecord_etl.transforms.storage import remote  # noqa: E402


@pytest.fixture(scope="module")
def proxied(s3):
    client, flags = s3
    endpoint = next(f for f in flags if f.startswith("--s3_endpoint_url=")).split("=", 1)[1]
    host, port = endpoint.rsplit("/", 1)[1].split(":")
    proxy = CountingProxy((host, int(port))).start()
    flags = [f for f in flags if not f.startswith("--s3_endpoint_url=")] + [
        f"--s3_endpoint_url=http://127.0.0.1:{proxy.port}"
    ]
    remote.CLIENTS.clear()
    yield client, proxy, flags
    remote.CLIENTS.clear()
    proxy.close()


def upload(client, local, prefix) -> int:
    """Uploads the directory ``local`` under ``prefix``; returns its bytes."""
    total = 0
    for top, _, files in os.walk(local):
        for f in files:
            path = os.path.join(top, f)
            key = f"{prefix}/{os.path.relpath(path, local)}"
            with open(path, "rb") as f:
                data = f.read()
            total += len(data)
            client.put_object(Bucket=BUCKET, Key=key, Body=data)
    return total


@pytest.mark.parametrize("consolidated", [True, False])
def test_s3_store_converts_like_its_local_copy_within_egress(proxied, tmp_path, consolidated):
    client, proxy, flags = proxied
    rng = np.random.default_rng(3)
    local = tmp_path / "s.zarr"
    g = zarr.open_group(str(local), mode="w", zarr_format=2)
    import numcodecs

    g.create_array(
        "img", shape=(512, 16, 16), chunks=(64, 16, 16), dtype="f4", compressors=numcodecs.Blosc(cname="zstd")
    )[:] = rng.standard_normal((512, 16, 16)).astype("f4")
    g.create_array("label", shape=(512,), chunks=(64,), dtype="i8")[:] = np.arange(512)
    if consolidated:
        zarr.consolidate_metadata(str(local))
    name = f"store-{consolidated}.zarr"
    size = upload(client, local, name)
    common = ["--num_shards", "2", "--runner=DirectRunner", "--direct_running_mode=in_memory", "--writer", "planned"]
    assert convert(["--input", local, "--output_dir", tmp_path / "local", *common])[0] == 0
    proxy.reset()
    assert convert(["--input", f"s3://{BUCKET}/{name}", "--output_dir", tmp_path / "remote", *common, *flags])[0] == 0
    ratio = proxy.egress_bytes / size
    print(f"consolidated={consolidated}: {proxy.egress_bytes} bytes sent for a store of {size}: {ratio:.3f}x")
    limit = 1.05 if consolidated else 1.25  # (without it: the listing's XML besides the objects)
    assert ratio <= limit, f"the server sent {proxy.egress_bytes} bytes = {ratio:.3f}x the store's {size}"
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert shards == sorted(p.name for p in (tmp_path / "remote").glob("data-*"))
    for shard in shards:
        assert (tmp_path / "local" / shard).read_bytes() == (tmp_path / "remote" / shard).read_bytes()


def test_gcs_store_converts_like_its_local_copy_within_egress(tmp_path):
    """The same on the GCS emulator (``tests/gcs_emulator.py``) behind the counting proxy, consolidated metadata,
    a v3 store with zstd."""
    pytest.importorskip("gcp_storage_emulator")
    from tests import gcs_emulator

    local = tmp_path / "g.zarr"
    g = zarr.open_group(str(local), mode="w", zarr_format=3)
    g.create_array("v", shape=(300, 512), chunks=(50, 512), dtype="<f8", compressors=[zarr.codecs.ZstdCodec()])[:] = (
        np.random.default_rng(4).standard_normal((300, 512))
    )  # chunks of 200 KB
    zarr.consolidate_metadata(str(local))
    bucket_name = "etl-zarr-gcs"
    common = ["--num_shards", "2", "--runner=DirectRunner", "--direct_running_mode=in_memory", "--writer", "planned"]
    assert convert(["--input", local, "--output_dir", tmp_path / "local", *common])[0] == 0
    with gcs_emulator.server(bucket_name) as port:
        proxy = CountingProxy(("127.0.0.1", port)).start()
        try:
            with gcs_emulator.emulator_host(f"http://127.0.0.1:{proxy.port}"):
                from google.cloud import storage

                bucket = storage.Client.create_anonymous_client().bucket(bucket_name)
                size = 0
                for top, _, files in os.walk(local):
                    for f in files:
                        with open(os.path.join(top, f), "rb") as fh:
                            data = fh.read()
                        size += len(data)
                        bucket.blob(f"g.zarr/{os.path.relpath(os.path.join(top, f), local)}").upload_from_string(data)
                proxy.reset()
                code, _, err = convert(
                    ["--input", f"gs://{bucket_name}/g.zarr", "--output_dir", tmp_path / "remote", *common]
                )
                assert code == 0, err
                ratio = proxy.egress_bytes / size
                print(f"gcs: {proxy.egress_bytes} bytes sent for a store of {size}: {ratio:.3f}x")
        finally:
            proxy.close()
    assert ratio <= 1.05  # (each object opened costs a JSON metadata answer of about 1 KB besides its bytes)
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert shards == sorted(p.name for p in (tmp_path / "remote").glob("data-*"))
    for shard in shards:
        assert (tmp_path / "local" / shard).read_bytes() == (tmp_path / "remote" / shard).read_bytes()
