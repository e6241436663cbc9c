"""gs:// inputs take the same bounded-read path as s3:// (one code path for both stores):
against a Google Cloud Storage API (the gcp-storage-emulator server, reached through ``STORAGE_EMULATOR_HOST``
as google-cloud-storage and therefore Beam's GCS filesystem do) behind the counting TCP proxy, converting a
chunked gzip HDF5 file, a contiguous one, a .npy and both kinds of .npz makes the server send at most 1.25x the
file, and the shards are byte-identical to the local run. Beam's own GCS stream (google-cloud-storage's
``BlobReader``: 16 MiB at every read outside its buffer) is measured next to it. A byte count, not a timing."""

from __future__ import annotations

import os

import pytest

from bench.remote import egress_inputs
from bench.s3proxy import CountingProxy
from tests import gcs_emulator
from tests.conftest import run_command
from tfrecord_etl.transforms.storage import fileio

pytest.importorskip("gcp_storage_emulator", reason="pip install -e .[test]")

BUCKET = "etl-gcs-test"
ROWS = 1024  # x 4096 bytes: 4 MiB of images per file


@pytest.fixture(scope="module")
def gcs():
    """The emulator (``tests/gcs_emulator.py``: with GCS's ``ifGenerationMatch``) in its own process behind a
    CountingProxy; yields (proxy, {name: bytes} uploaded under gs://BUCKET/egress/)."""
    with gcs_emulator.server(BUCKET) as port:
        proxy = CountingProxy(("127.0.0.1", port)).start()
        try:
            with gcs_emulator.emulator_host(f"http://127.0.0.1:{proxy.port}"):
                from google.cloud import storage

                bucket = storage.Client.create_anonymous_client().bucket(BUCKET)
                files = egress_inputs(ROWS)
                for name, data in files.items():
                    bucket.blob(f"egress/{name}").upload_from_string(data)
                yield proxy, files
        finally:
            proxy.close()


def convert(argv):
    from tfrecord_etl.pipelines import convert as convert_module

    return run_command(convert_module.main, [str(a) for a in argv])


RUN = ["--num_shards", "2", "--runner=DirectRunner", "--direct_running_mode=in_memory"]


@pytest.mark.parametrize("name", ["chunked_gzip.h5", "contiguous.h5", "img.npy", "stored.npz", "deflated.npz"])
def test_gcs_convert_reads_only_what_it_needs(gcs, tmp_path, name):
    proxy, files = gcs
    local = tmp_path / name
    local.write_bytes(files[name])
    assert convert(["--input", local, "--output_dir", tmp_path / "local", *RUN])[0] == 0
    proxy.reset()
    code, _out, err = convert(["--input", f"gs://{BUCKET}/egress/{name}", "--output_dir", tmp_path / "remote", *RUN])
    assert code == 0, err
    ratio = proxy.egress_bytes / len(files[name])
    assert ratio <= 1.25, f"{name}: the server sent {proxy.egress_bytes} bytes = {ratio:.2f}x the file"
    shards = sorted(p.name for p in (tmp_path / "local").glob("data-*"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "remote").glob("data-*"))
    for shard in shards:
        assert (tmp_path / "local" / shard).read_bytes() == (tmp_path / "remote" / shard).read_bytes()


def test_gcs_range_reader_is_exact_and_bounded_where_beams_stream_is_not(gcs, monkeypatch):
    """Seeks and reads of exact bytes, each a bounded request; Beam's GCS stream (FileSystems.open) fetches 16 MiB
    at a read outside its buffer (here the whole 4 MiB object for 5 reads of 1,000 bytes)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    proxy, files = gcs
    data, path = files["img.npy"], f"gs://{BUCKET}/egress/img.npy"

    def seeks(f):
        got = []
        for offset in (10, 1_000_000, 3_000_000, 2_000_000):
            f.seek(offset)
            got.append(f.read(1000))
        f.seek(-3, os.SEEK_END)
        got.append(f.read(100))
        return got

    expected = [data[o : o + 1000] for o in (10, 1_000_000, 3_000_000, 2_000_000)] + [data[-3:]]
    proxy.reset()
    with fileio.open_read(path) as f:
        assert seeks(f) == expected
    ours = proxy.egress_bytes
    assert ours < 6 * (fileio.READ_AHEAD + 2000)  # the opening read-ahead and one per seek, plus headers
    proxy.reset()
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        assert seeks(f) == expected
    assert proxy.egress_bytes >= len(data) > 10 * ours


def test_missing_gcs_object_is_a_one_line_source_error(gcs, tmp_path, capsys):
    from tfrecord_etl.pipelines import convert as convert_module

    code, _out, err = run_command(
        convert_module.main,
        ["--input", f"gs://{BUCKET}/egress/nothing-here.npy", "--output_dir", str(tmp_path / "o"), *RUN],
        capsys,
    )
    assert code != 0 and "No input file matches the pattern" in err and "nothing-here.npy" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
    with pytest.raises(Exception, match="nothing-here.npy"):  # opened directly (no match first): names the object
        fileio.open_read(f"gs://{BUCKET}/egress/nothing-here.npy")


def uploaded(name: str):
    """``(blob, gs:// path, its bytes, other bytes of the same size)``: a 256 KiB object just uploaded."""
    from google.cloud import storage

    blob = storage.Client.create_anonymous_client().bucket(BUCKET).blob(name)
    old, new = bytes(range(256)) * 1024, bytes(reversed(range(256))) * 1024
    blob.upload_from_string(old)
    return blob, f"gs://{BUCKET}/{name}", old, new


def test_gcs_reopen_reuses_what_it_read_of_the_same_generation(gcs):
    """A second open of an unchanged object asks for its metadata only (the head and metadata reads of the same
    generation are reused); a replaced object (a new generation) is read anew."""
    proxy, _ = gcs
    blob, path, old, new = uploaded("pinned/x.bin")
    with fileio.open_read(path) as f:
        assert f.read(10) == old[:10]
    proxy.reset()
    with fileio.open_read(path) as f:
        assert f.read(10) == old[:10] and proxy.egress_bytes < 4000  # the metadata (JSON), not the 64 KiB head
    blob.upload_from_string(new)
    with fileio.open_read(path) as f:
        assert f.read(10) == new[:10]
        f.seek(200_000)
        assert f.read(10) == new[200_000:200_010]


def test_gcs_object_replaced_while_read_fails_instead_of_mixing_generations(gcs):
    """Reads after the open are pinned to the generation first read (``ifGenerationMatch``): a replaced object
    fails with "changed while it was read" rather than returning bytes of the new generation."""
    blob, path, old, new = uploaded("pinned/y.bin")
    with fileio.open_read(path) as f:
        assert f.read(10) == old[:10]
        blob.upload_from_string(new)
        f.seek(200_000)
        with pytest.raises(OSError, match="changed while it was read"):
            f.read(10)


def test_a_launcher_on_an_emulator_or_with_no_auth_does_not_search_for_credentials():
    """With ``STORAGE_EMULATOR_HOST`` set (or ``--no_auth``), a fresh process connects to gs:// anonymously without
    asking ``google.auth.default``: Beam's own search for Application Default Credentials retries for about 20 s
    on a machine without them, and returns no credentials either way. Without either, Beam searches (the control)."""
    import subprocess
    import sys

    code = (
        "import sys, google.auth; searched = []; google.auth.default = lambda *a, **k: searched.append(1) or "
        "(_ for _ in ()).throw(RuntimeError('none')); from tfrecord_etl.pipelines import common; "
        "common.configure_filesystems(sys.argv[1:]); from apache_beam.internal.gcp import auth; "
        "from apache_beam.options.pipeline_options import PipelineOptions; "
        "auth._Credentials._get_credentials_with_retrys = staticmethod(lambda o: google.auth.default()); "
        "c = auth.get_service_credentials(PipelineOptions([])); print(c is None, len(searched))"
    )

    def run(env, *argv):
        ran = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=120)
        return ran.stdout.split(), ran.stderr[-2000:]

    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    assert run(dict(env, STORAGE_EMULATOR_HOST="http://127.0.0.1:9"))[0] == ["True", "0"]
    assert run(env, "--no_auth")[0] == ["True", "0"]
    assert run(env)[0] == ["True", "1"]  # the control: Beam asks google.auth (here patched to fail at once)
