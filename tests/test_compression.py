"""The compression backend (transforms/compression.py): gzip and zlib shards, sidecars and the per-tensor zlib
encoding written through ISA-L, zlib-ng or zlib, chosen once and recorded; the same bytes for the same records,
level and backend; every reader (ours, verify, inspect, augment's input, TensorFlow, Beam, TFXIO, the `tfrecord`
package) reading what every backend wrote; --compression_level checked per backend."""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib

import numpy as np
import pytest

from tests import consumers_table
from tests.conftest import BEAM_FLAGS, convert, run_command
from tfrecord_etl.transforms import compression
from tfrecord_etl.transforms.output import tfrecord

BACKENDS = compression.available()
RECORDS = [bytes([i % 251]) * (i % 300) + b"r%05d" % i for i in range(2000)]


def test_isal_zlib_ng_and_zlib_are_all_installed_and_isal_is_the_default(monkeypatch):
    monkeypatch.delenv(compression.ENV, raising=False)
    assert BACKENDS == ["isal", "zlib-ng", "zlib"]
    assert compression.get().name == "isal"
    assert compression.settings("gzip") == {"name": "isal", "version": compression.get().version, "level": 3}
    assert compression.settings("none") is None


def _write(kind: str, backend: str, level: int | None = None, records=RECORDS) -> bytes:
    buf = io.BytesIO()
    w = tfrecord.ShardWriter(buf, kind, level=level, backend=backend)
    w.write_batch(records[:700])
    w.write_batch(records[700:])
    w.close()
    assert w.bytes_out == len(buf.getvalue())
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_writes_a_standard_stream_every_backend_reads(kind, backend):
    data = _write(kind, backend)
    framed = tfrecord.frame_records(RECORDS)
    assert (gzip.decompress(data) if kind == "gzip" else zlib.decompress(data)) == framed  # CPython's reader
    if kind == "gzip":  # one header for every backend: no name, mtime 0, XFL 0, OS 255
        assert data[:10] == compression.GZIP_HEADER
    assert data == _write(kind, backend)  # same records, level and backend: the same bytes
    for reader in BACKENDS:
        stream = tfrecord.open_decompressed(io.BytesIO(data), kind, reader)
        assert [r for _, _, r in tfrecord.iter_records(stream, "s")] == RECORDS


@pytest.mark.parametrize("backend", BACKENDS)
def test_levels_are_each_backends_own_and_change_the_bytes(backend):
    low, high = compression.LEVELS[backend]
    assert _write("gzip", backend, low) != _write("gzip", backend, high)
    assert _write("gzip", backend) == _write("gzip", backend, compression.DEFAULT_LEVELS[backend])
    with pytest.raises(
        ValueError,
        match=rf"--compression_level {high + 1} is out of range for the {backend} "
        rf"backend \({low}-{high}; default {compression.DEFAULT_LEVELS[backend]}\)",
    ):
        tfrecord.ShardWriter(io.BytesIO(), "gzip", level=high + 1, backend=backend)


def test_a_missing_backend_falls_back_in_order_and_a_forced_one_is_never_replaced(monkeypatch):
    monkeypatch.setattr(compression, "_CACHE", {})
    monkeypatch.setitem(compression._MODULES, "isal", ("no_such_isal.zlib", "no_such_isal.gzip", "isal"))
    monkeypatch.delenv(compression.ENV, raising=False)
    assert compression.get().name == "zlib-ng" and compression.available() == ["zlib-ng", "zlib"]
    monkeypatch.setitem(compression._MODULES, "zlib-ng", ("no_such_ng.zlib", "no_such_ng.gzip", "zlib-ng"))
    compression._CACHE.clear()  # a new process: nothing probed yet
    assert compression.get().name == "zlib"
    monkeypatch.setenv(compression.ENV, "isal")
    with pytest.raises(
        compression.BackendUnavailable, match="isal compression backend is not installed.*pip install isal"
    ):
        compression.get()
    with pytest.raises(compression.BackendUnavailable, match="Unknown compression backend 'lz4'"):
        compression.get("lz4")


def _npz(tmp_path):
    path = tmp_path / "in.npz"
    if not path.exists():
        np.savez(
            path, x=np.arange(3000, dtype=np.float32) / 4, code=np.array([b"c%03d" % (i % 7) for i in range(3000)])
        )
    return path


def _convert_with(monkeypatch, backend, *args, **kwargs):
    monkeypatch.setenv(compression.ENV, backend)
    try:
        return convert(*args, **kwargs)
    finally:
        monkeypatch.delenv(compression.ENV)


@pytest.mark.parametrize("backend", BACKENDS)
def test_convert_records_the_backend_and_reruns_are_byte_identical(tmp_path, monkeypatch, capsys, backend):
    code, out, err = _convert_with(
        monkeypatch,
        backend,
        _npz(tmp_path),
        tmp_path / "a",
        "--compression",
        "gzip",
        "--num_shards",
        "2",
        capsys=capsys,
    )
    assert code == 0, err
    meta = json.loads((tmp_path / "a" / "metadata.json").read_text())
    chosen = compression.get(backend)
    assert meta["compression_backend"] == {"name": backend, "version": chosen.version, "level": chosen.default_level}
    assert f"(gzip through {backend} {chosen.version}, level {chosen.default_level})" in out
    assert (
        _convert_with(
            monkeypatch, backend, _npz(tmp_path), tmp_path / "b", "--compression", "gzip", "--num_shards", "2"
        )[0]
        == 0
    )
    for shard in meta["shards"]:
        assert (tmp_path / "a" / shard["file"]).read_bytes() == (tmp_path / "b" / shard["file"]).read_bytes()
    level = compression.LEVELS[backend][1]
    assert (
        _convert_with(
            monkeypatch,
            backend,
            _npz(tmp_path),
            tmp_path / "c",
            "--compression",
            "zlib",
            "--compression_level",
            str(level),
        )[0]
        == 0
    )
    assert json.loads((tmp_path / "c" / "metadata.json").read_text())["compression_backend"]["level"] == level


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--compression", "gzip", "--compression_level", "5"],
            r"--compression_level 5 is out of range for the isal backend \(0-3; default 3\)",
        ),
        (["--compression_level", "1"], "pass --compression gzip or zlib"),
        (["--compression", "gzip", "--writer", "beam", "--compression_level", "1"], "Beam's own zlib at level 6"),
        (["--compression", "gzip", "--compression_level", "10"], "compression_level"),
    ],
)
def test_convert_refuses_a_level_it_cannot_write_with(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.delenv(compression.ENV, raising=False)
    code, _out, err = convert(_npz(tmp_path), tmp_path / "o", *flags, capsys=capsys)
    assert code == 2 and not (tmp_path / "o" / "metadata.json").exists()
    assert __import__("re").search(message, err), err


def test_the_beam_writer_records_beams_own_compressor(tmp_path, monkeypatch):
    monkeypatch.delenv(compression.ENV, raising=False)
    assert convert(_npz(tmp_path), tmp_path / "o", "--compression", "gzip", "--writer", "beam")[0] == 0
    meta = json.loads((tmp_path / "o" / "metadata.json").read_text())
    assert meta["compression_backend"] == {
        "name": "zlib",
        "version": zlib.ZLIB_RUNTIME_VERSION,
        "level": 6,
        "by": "Beam WriteToTFRecord",
    }


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The consumers' test input (tests/consumers_table.py) converted with gzip through each backend:
    ``{backend: directory}``."""
    tmp = tmp_path_factory.mktemp("backends")
    rows = consumers_table.ROWS
    np.savez(
        tmp / "in.npz",
        x=np.arange(rows, dtype=np.float32) / 4,
        code=np.array([b"c%03d" % i for i in range(rows)], dtype="S4"),
    )
    outs = {}
    old = os.environ.get(compression.ENV)
    try:
        for backend in BACKENDS:
            os.environ[compression.ENV] = backend
            outs[backend] = tmp / backend
            assert (
                convert(tmp / "in.npz", outs[backend], "--provenance", "--num_shards", "2", "--compression", "gzip")[0]
                == 0
            )
    finally:
        os.environ.pop(compression.ENV, None) if old is None else os.environ.__setitem__(compression.ENV, old)
    return outs


READERS = {
    "tf.data": consumers_table.tf_data,
    "Beam": consumers_table.beam_read,
    "TFXIO": consumers_table.tfxio,
    "tfrecord package": consumers_table.tfrecord_package,
    "ours": consumers_table.our_readers,
}


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_reader_reads_the_gzip_output_of_every_backend(outputs, backend, reader):
    assert json.loads((outputs[backend] / "metadata.json").read_text())["compression_backend"]["name"] == backend
    READERS[reader](outputs[backend], "gzip")  # every record once, with its exact value


@pytest.mark.parametrize("reading", BACKENDS)
def test_verify_inspect_and_augment_read_every_backends_output_through_the_chosen_one(
    outputs, tmp_path, monkeypatch, capsys, reading
):
    from tfrecord_etl.pipelines import augment, inspect, verify

    monkeypatch.setenv(compression.ENV, reading)
    for backend, out in outputs.items():
        code, stdout, err = run_command(verify.main, [out, "--source", out.parent / "in.npz"], capsys)
        assert code == 0 and "OK" in stdout, stdout + err
        code, stdout, err = run_command(inspect.main, [out / "*.gz"], capsys)  # no metadata: every record read
        assert code == 0 and f"features learned from all {consumers_table.ROWS} records" in stdout, stdout + err
        aug = tmp_path / f"aug-{backend}"
        code, stdout, err = run_command(
            augment.main,
            ["--input", out, "--output_dir", aug, "--constants", "k=7", "--compression_level", "1", *BEAM_FLAGS],
            capsys,
        )
        assert code == 0, err
        meta = json.loads((aug / "metadata.json").read_text())
        assert meta["compression"] == "gzip"
        assert meta["compression_backend"] == {"name": reading, "version": compression.get(reading).version, "level": 1}
        consumers_table.tf_data(aug, "gzip")


def test_augment_refuses_a_level_for_uncompressed_output(outputs, tmp_path, capsys):
    from tfrecord_etl.pipelines import augment

    code, _, err = run_command(
        augment.main,
        [
            "--input",
            outputs["zlib"],
            "--output_dir",
            tmp_path / "a",
            "--constants",
            "k=7",
            "--output_compression",
            "none",
            "--compression_level",
            "1",
            *BEAM_FLAGS,
        ],
        capsys,
    )
    assert code == 2 and "--compression_level sets the level of gzip or zlib output shards" in err


def test_augment_sidecar_shards_are_compressed_through_the_backend(outputs, tmp_path, monkeypatch, capsys):
    from tfrecord_etl.pipelines import augment
    from tfrecord_etl.transforms import reader

    monkeypatch.setenv(compression.ENV, "zlib-ng")
    side = tmp_path / "side"
    code, _, err = run_command(
        augment.main,
        ["--input", outputs["isal"], "--output_dir", side, "--constants", "k=7", "--mode", "sidecar", *BEAM_FLAGS],
        capsys,
    )
    assert code == 0, err
    meta = json.loads((side / "metadata.json").read_text())
    assert meta["compression_backend"] == {"name": "zlib-ng", "version": compression.get("zlib-ng").version, "level": 3}
    for shard in meta["shards"]:
        data = (side / shard["file"]).read_bytes()
        assert shard["file"].endswith(".gz") and data[:10] == compression.GZIP_HEADER
        plain = gzip.decompress(data)
        assert data == _recompress(plain, "zlib-ng", 3)  # the backend's own stream at its level, nothing else
    merged = reader.open_sidecar(str(outputs["isal"]), str(side))
    assert len(merged.pairs) == 2


def _recompress(plain: bytes, backend: str, level: int) -> bytes:
    buf = io.BytesIO()
    c = compression.StreamCompressor(buf, "gzip", compression.get(backend), level)
    c.write(plain)
    c.finish()
    return buf.getvalue()
