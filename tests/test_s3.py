"""Object storage: convert reads s3:// inputs and writes s3:// outputs through Beam's S3 filesystem, against a
real S3 API (a moto server on 127.0.0.1), and writes the same bytes as a local run.

Beam's ``FileSystems`` gets the ``--s3_*`` options from ``pipelines.common.run_main`` (configure_filesystems)
before the launcher plans, and from the pipeline options on the workers.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, run_command
from tests.test_convert import make_h5
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import outdir

boto3 = pytest.importorskip("boto3", reason="pip install -e .[s3]")
moto_server = pytest.importorskip("moto.server", reason="pip install -e .[s3]")

BUCKET = "etl-test"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}  # never ask an instance-metadata endpoint for credentials


class AtomicMotoServer(moto_server.ThreadedMotoServer):
    """moto's threaded S3 server with its writes (PUT, POST, DELETE) handled one at a time. moto evaluates
    ``If-None-Match: *`` / ``If-Match`` on PutObject and ``If-Match`` on DeleteObject (``moto/s3/responses.py``)
    as a read and then a write in the request's thread; S3 evaluates a conditional write atomically
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html). Serialized, two racing
    conditional writes cannot both pass on moto either (none did in 200 races of two threads without it, but the
    race tests must not depend on the scheduler)."""

    def _server_entry(self) -> None:
        import threading

        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        app, writes = DomainDispatcherApplication(create_backend_app), threading.Lock()

        def serialized(environ, start_response):
            if environ.get("REQUEST_METHOD") in ("PUT", "POST", "DELETE"):
                with writes:
                    return app(environ, start_response)
            return app(environ, start_response)

        self._server = make_server(self._ip_address, self._port, serialized, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (free port, writes serialized: :class:`AtomicMotoServer`) with one bucket;
    yields (boto3 client, Beam's S3 flags)."""
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    server = AtomicMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    flags = [
        f"--s3_endpoint_url={endpoint}",
        "--s3_access_key_id=testing",
        "--s3_secret_access_key=testing",
        "--s3_region_name=us-east-1",
    ]
    yield client, flags
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def keys(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def convert(argv):
    from tfrecord_etl.pipelines import convert as convert_module

    return run_command(convert_module.main, [str(a) for a in argv])


def comparable_metadata(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k not in ("created", "options", "sources")}


def write_inputs(directory, fmt):
    """Two input files of ``fmt`` in ``directory`` (and a stray file the pattern must not match)."""
    ids = np.arange(300, dtype=">i8")
    if fmt == "h5":
        make_h5(directory / "a.h5", rows=300)
        make_h5(directory / "b.h5", rows=120)
    elif fmt == "npz":
        np.savez_compressed(directory / "a.npz", id=ids, x=np.stack([ids, -ids], 1).astype("<f4"))
        np.savez(directory / "b.npz", id=ids[:50], x=np.ones((50, 2), "<f4"))
    else:
        np.save(directory / "a.npy", np.asfortranarray(np.arange(300 * 6, dtype=">f8").reshape(300, 6)))
        np.save(directory / "b.npy", np.zeros((7, 6), "<f8"))
    (directory / "notes.txt").write_text("not an input")
    return sorted(p for p in directory.iterdir() if p.name.endswith(f".{fmt}"))


@pytest.mark.parametrize(
    "fmt,runner",
    [
        ("h5", ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]),
        ("npz", BEAM_FLAGS),
        ("npy", BEAM_FLAGS),
    ],
)
def test_s3_input_and_output_equal_a_local_run(s3, tmp_path, fmt, runner):
    client, s3_flags = s3
    local_in = tmp_path / "in"
    local_in.mkdir()
    files = write_inputs(local_in, fmt)
    for p in local_in.iterdir():
        client.upload_file(str(p), BUCKET, f"{fmt}/in/{p.name}")
    flags = ["--num_shards", "2", "--compression", "gzip", "--target_range_mb", "0.01", *runner]

    code, _, _ = convert(["--input", local_in / f"*.{fmt}", "--output_dir", tmp_path / "out", *flags])
    assert code == 0
    out_s3 = f"s3://{BUCKET}/{fmt}/out"
    code, _, _ = convert(["--input", f"s3://{BUCKET}/{fmt}/in/*.{fmt}", "--output_dir", out_s3, *flags, *s3_flags])
    assert code == 0

    local = {p.name: p.read_bytes() for p in sorted((tmp_path / "out").iterdir())}
    names = keys(client, f"{fmt}/out/")
    assert [n.rsplit("/", 1)[1] for n in names] == sorted(local)  # no temporaries left on S3
    for name in names:
        body = client.get_object(Bucket=BUCKET, Key=name)["Body"].read()
        if name.endswith(outdir.MARKER_FILE):  # the run marker: the same files listed, another run id
            assert json.loads(body)["files"] == json.loads(local[outdir.MARKER_FILE])["files"]
        elif name.endswith(".json"):
            remote, here = json.loads(body), json.loads(local["metadata.json"])
            assert comparable_metadata(remote) == comparable_metadata(here)
            assert [s["path"] for s in remote["sources"]] == [f"s3://{BUCKET}/{fmt}/in/{p.name}" for p in files]
        else:
            assert body == local[name.rsplit("/", 1)[1]], name  # shards and schema: byte for byte

    # our reader reads the output straight from S3 too
    assert sum(1 for _ in reader.iter_numpy(out_s3)) == json.loads(local["metadata.json"])["num_records"]

    if fmt == "h5":  # a re-run of the same command replaces the complete output, on S3 as locally
        code, _, _ = convert(["--input", f"s3://{BUCKET}/{fmt}/in/*.{fmt}", "--output_dir", out_s3, *flags, *s3_flags])
        # staged: the new shards beside the old ones (the other generation's names), the old ones deleted after
        expected = [n.replace("/data-", "/data-g1-") if "/data-" in n else n for n in names]
        assert code == 0 and keys(client, f"{fmt}/out/") == sorted(expected)
        assert sum(1 for _ in reader.iter_numpy(out_s3)) == json.loads(local["metadata.json"])["num_records"]


def test_hdf5_row_range_is_read_from_s3_without_downloading_the_file(s3, tmp_path, monkeypatch):
    """h5py reads an s3:// file through Beam's seekable stream (transforms.storage.fileio.open_read): a row range
    costs the superblock/B-tree reads plus the range's chunks, in Beam's 16 MB read-buffer steps, not
    the whole object. Counted on the client: the bytes Beam's boto3 client returns from ranged GETs."""
    import h5py

    from tfrecord_etl.pipelines import common
    from tfrecord_etl.transforms.sources import Hdf5Source, RowRange, SourceOptions
    from tfrecord_etl.transforms.storage import fileio, remote

    client, s3_flags = s3
    rows, width = 32_000, 1024  # 32000 x 1024 float32: 125 MB in chunks of 256 rows (1 MB)
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(rows * width, dtype="<f4").reshape(rows, width), chunks=(256, width))
        f.create_dataset("y", data=np.arange(rows, dtype="<i8"), chunks=(1024,))
    size = path.stat().st_size
    client.upload_file(str(path), BUCKET, "big/big.h5")

    fetched = {"bytes": 0, "gets": 0}
    original = remote.RangeReader._get

    def counting_get(self, start, n):
        fetched["bytes"] += n
        fetched["gets"] += 1
        return original(self, start, n)

    monkeypatch.setattr(remote.RangeReader, "_get", counting_get)
    common.configure_filesystems(s3_flags)
    start, stop = 16_000, 16_512  # 2 MB in the middle of the file
    columns = Hdf5Source(SourceOptions()).read(RowRange(f"s3://{BUCKET}/big/big.h5", start, stop, ("/x", "/y")))
    np.testing.assert_array_equal(columns["y"], np.arange(start, stop))
    np.testing.assert_array_equal(columns["x"][:, 0], np.arange(start, stop) * width)
    print(
        f"\nrow range {start}-{stop} of a {size / 2**20:.1f} MB HDF5 file on S3: "
        f"{fetched['bytes'] / 2**20:.2f} MB fetched in {fetched['gets']} ranged reads"
    )

    # every read is a bounded GET of what h5py asks (small metadata reads: one read-ahead of
    # fileio.READ_AHEAD), the chunks holding the rows fetched together first (adjacent chunks coalesced into
    # one request per dataset here); Beam's own 16 MB-buffered stream fetched 64 MB in 5 GETs
    def chunk_bytes(chunk_rows, row_bytes):  # h5py reads whole chunks: those the row range touches
        return (-(-stop // chunk_rows) - start // chunk_rows) * chunk_rows * row_bytes

    needed = chunk_bytes(256, width * 4) + chunk_bytes(1024, 8)  # 3 chunks of /x (3 MB), 2 of /y
    assert needed <= fetched["bytes"] <= needed + 16 * fileio.READ_AHEAD, fetched
    assert fetched["gets"] <= 8, fetched  # the first 64 KiB came with the open; metadata; one GET per dataset


@pytest.mark.parametrize("fmt", ["raw", "files", "mat"])
def test_s3_raw_and_file_collections_equal_a_local_run(s3, tmp_path, fmt):
    """The raw, files and MATLAB sources read s3:// as the others do (raw: the layout from a directory sidecar on S3,
    ranged reads; files: listing sizes, class folders, labels; a MATLAB v7 .mat: sniffed by its first bytes,
    scanned and loaded through fileio's ranged stream), and write the same shards as a local run."""
    client, s3_flags = s3
    local_in = tmp_path / "in"
    if fmt == "mat":
        from tests.conftest import fixture_file

        local_in.mkdir()
        (local_in / "v7.mat").write_bytes(fixture_file("pymatreader-tests/v7.mat").read_bytes())
        pattern, flags = "*.mat", ["--container_mode", "datasets"]
    elif fmt == "raw":
        local_in.mkdir()
        (local_in / "raw.yaml").write_text("dtype: '>f4'\nshape: [-1, 3]\norder: F\n")
        np.arange(90, dtype=">f4").reshape(30, 3).tofile(local_in / "a.raw")  # C bytes read as F: still exact
        np.arange(12, dtype=">f4").reshape(3, 4).T.tofile(local_in / "b.raw")
        pattern, flags = "*.raw", []
    else:
        for c in ("cats", "dogs"):
            (local_in / c).mkdir(parents=True)
        from tests.conftest import fixture_file

        for i, name in enumerate(("grace_hopper.jpg", "logo2.png", "Minduka_Present_Blue_Pack.png")):
            data = fixture_file(f"matplotlib/mpl-data/sample_data/{name}").read_bytes()
            (local_in / ("cats", "dogs")[i % 2] / name).write_bytes(data)
        pattern, flags = "*/*", ["--format", "files", "--decode_check"]
    for p in local_in.rglob("*"):
        if p.is_file():
            client.upload_file(str(p), BUCKET, f"{fmt}/in/{p.relative_to(local_in)}")
    flags += ["--num_shards", "2", *BEAM_FLAGS]
    code, _, _ = convert(["--input", local_in / pattern, "--output_dir", tmp_path / "out", *flags])
    assert code == 0
    out_s3 = f"s3://{BUCKET}/{fmt}/out"
    code, _, _ = convert(["--input", f"s3://{BUCKET}/{fmt}/in/{pattern}", "--output_dir", out_s3, *flags, *s3_flags])
    assert code == 0
    for name in ("data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord", "schema.pbtxt"):
        body = client.get_object(Bucket=BUCKET, Key=f"{fmt}/out/{name}")["Body"].read()
        assert body == (tmp_path / "out" / name).read_bytes(), name  # file names are relative to the base
    got = list(reader.iter_numpy(out_s3))
    here = list(reader.iter_numpy(str(tmp_path / "out")))
    assert len(got) == len(here) and all(np.array_equal(a[k], b[k]) for a, b in zip(got, here) for k in a)
