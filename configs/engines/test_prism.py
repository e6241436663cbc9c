"""Prism, Beam's Go portable runner, for real: the convert and augment commands with ``--runner PrismRunner
--prism_location BINARY`` write the same bytes as the FnApiRunner (what ``--runner DirectRunner`` runs).

The binary is built by configs/engines/setup_prism.sh (``go install .../go/cmd/prism@v2.77.0``, cached in
.engines/prism; the fixture runs it, a no-op when the binary is there). Prism's default environment is LOOPBACK (the
SDK harness runs in the launcher's process, PrismRunner.default_environment); the EXTERNAL case starts Beam's worker
pool (``python -m apache_beam.runners.worker.worker_pool_main``) in a process of its own, so the DoFns run in SDK
harness processes that only got them pickled, as on a cluster.

Then the question of a user's own pipeline: in Beam 2.77 ``DirectRunner`` (SwitchingDirectRunner) first runs the
pipeline on Prism when it finds the release binary in Beam's cache, ``~/.apache_beam/cache/prism/bin/
apache_beam-v2.77.0-prism-linux-amd64.zip`` (or can download it from GitHub into that cache), and falls back to
the FnApiRunner only when Prism fails to start. The test puts the binary there as the download would and checks
that a pipeline with ``ConvertToTFRecord`` on plain ``DirectRunner`` does run on Prism and writes the same bytes,
and that the commands still run the FnApiRunner (pipelines.common.local_runner) with the binary present.

Part of the engines stage (configs/engines/run_engines_test.sh; TFRECORD_ETL_PRISM=0 skips it).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from configs.engines.common import full_only
from tests.conftest import BEAM_FLAGS, ROOT, _beam_home, run_command  # noqa: F401 - _beam_home: HOME in a temp dir
from tests.test_augment import tf_parse, tf_records
from tests.test_runners import CONVERT_FLAGS, ROWS, comparable_metadata, make_inputs, shard_bytes
from tfrecord_etl.transforms import reader

SETUP = ROOT / "configs" / "engines" / "setup_prism.sh"
AUGMENT_FLAGS = {
    "rewrite": [
        "--fn",
        "tests.augment_fns:add_one",
        "--fn_inputs",
        "id",
        "--join_input",
        "LABELS",
        "--join_fields",
        "array=label",
        "--constants",
        "w=0.5:float32",
    ],
    "sidecar": [
        "--mode",
        "sidecar",
        "--fn",
        "tests.augment_fns:add_one",
        "--fn_inputs",
        "id",
        "--constants",
        "w=0.5:float32",
    ],
}


@pytest.fixture(scope="module")
def prism_bin() -> str:
    """The Prism binary setup_prism.sh built (or reused)."""
    proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = proc.stdout.strip().splitlines()[-1]
    assert os.access(path, os.X_OK), path
    return path


@pytest.fixture(scope="module")
def worker_pool():
    """Beam's SDK worker pool in its own process on 127.0.0.1: each SDK harness Prism asks for is a new process."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the pool starts each harness as `python -c ...` from PATH: this interpreter's
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # in pytest's process group: the stage's trap stops it too
    try:
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the worker pool exited at start-up"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("the worker pool did not listen within 60 s")
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)  # its atexit hook stops the harness processes it started (SIGTERM would not)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def prism_flags(prism_bin, environment, request) -> list[str]:
    flags = ["--runner=PrismRunner", f"--prism_location={prism_bin}"]
    if environment == "external":
        flags += ["--environment_type=EXTERNAL", f"--environment_config={request.getfixturevalue('worker_pool')}"]
    return flags


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("prism_inputs")
    return d, make_inputs(d)


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory):
    """convert, then augment (rewrite and sidecar), on the FnApiRunner: what --runner DirectRunner runs."""
    from tfrecord_etl.pipelines import augment, convert

    directory, _ = inputs
    out = tmp_path_factory.mktemp("reference")
    code, _, _ = run_command(
        convert.main, ["--input", directory / "in.h5", "--output_dir", out / "convert", *CONVERT_FLAGS, *BEAM_FLAGS]
    )
    assert code == 0
    for mode, flags in AUGMENT_FLAGS.items():
        flags = [str(directory / "labels.npy") if f == "LABELS" else f for f in flags]
        code, _, _ = run_command(
            augment.main, ["--input", out / "convert", "--output_dir", out / mode, *flags, *BEAM_FLAGS]
        )
        assert code == 0, mode
    return out


def assert_same_output(out, expected):
    assert shard_bytes(out) == shard_bytes(expected)  # every shard, byte for byte
    assert comparable_metadata(out) == comparable_metadata(expected)
    assert (out / "schema.pbtxt").read_bytes() == (expected / "schema.pbtxt").read_bytes()


@pytest.mark.parametrize("environment", ["loopback", "external"])
def test_convert_on_prism_is_byte_identical(prism_bin, environment, inputs, reference, tmp_path, request, capsys):
    from tfrecord_etl.pipelines import convert

    directory, data = inputs
    out = tmp_path / "out"
    code, stdout, err = run_command(
        convert.main,
        [
            "--input",
            directory / "in.h5",
            "--output_dir",
            out,
            *CONVERT_FLAGS,
            *prism_flags(prism_bin, environment, request),
        ],
        capsys,
    )
    assert code == 0, err
    assert f"wrote {ROWS} examples in 3 shards" in stdout
    assert "examples_written" in stdout  # Prism reports our Beam metrics
    assert_same_output(out, reference / "convert")
    examples = list(reader.iter_numpy(str(out)))
    assert [int(e["_source/row"]) for e in examples] == list(range(ROWS))
    tf = pytest.importorskip("tensorflow")
    meta = json.loads((out / "metadata.json").read_text())
    records = tf_records(tf, [out / s["file"] for s in meta["shards"]], "GZIP")  # plain tf.data, shard order
    parsed = tf_parse(tf, records, reader.tf_feature_spec(str(out)))  # plain tf.io.parse_example
    features = {f["name"]: f for f in meta["features"]}
    for name in ("id", "x", "img", "table/a", "table/b"):
        expected, f = np.asarray(data[name]), features[name]
        got = parsed[name]
        if f["encoding"] == "tensor":  # raw little-endian bytes
            got = np.stack([np.frombuffer(v, f["dtype"]) for v in got])
        np.testing.assert_array_equal(got.reshape(expected.shape), expected)
        np.testing.assert_array_equal(np.stack([e[name] for e in examples]), expected)
    assert [e["name"].item() for e in examples] == data["name"]


@pytest.mark.parametrize("mode", ["rewrite", pytest.param("sidecar", marks=full_only)])
def test_augment_on_prism_is_byte_identical(prism_bin, mode, inputs, reference, tmp_path, request):
    from tfrecord_etl.pipelines import augment

    directory, data = inputs
    out = tmp_path / mode
    flags = [str(directory / "labels.npy") if f == "LABELS" else f for f in AUGMENT_FLAGS[mode]]
    code, _, _ = run_command(
        augment.main,
        ["--input", reference / "convert", "--output_dir", out, *flags, *prism_flags(prism_bin, "loopback", request)],
    )
    assert code == 0
    assert_same_output(out, reference / mode)
    if mode == "sidecar":
        manifests = [json.loads((d / "manifest.json").read_text()) for d in (out, reference / mode)]
        for m in manifests:
            m.pop("created")
        assert manifests[0] == manifests[1]
    else:
        examples = list(reader.iter_numpy(str(out)))
        np.testing.assert_array_equal([int(e["id_plus_one"]) for e in examples], np.arange(ROWS) + 1)
        np.testing.assert_array_equal([int(e["label"]) for e in examples], np.arange(ROWS) * 10)
        np.testing.assert_array_equal(np.stack([e["x"] for e in examples]), data["x"])


# ----------------------------------------------------------------------------------------------
# What plain DirectRunner does when Beam's Prism binary is cached (a connected laptop that ran Beam once)
# ----------------------------------------------------------------------------------------------


def beam_cached_prism(home, prism_bin) -> str:
    """The binary where Beam 2.77's PrismJobServer looks before downloading it: the release zip's name under
    ~/.apache_beam/cache/prism/bin (PrismJobServer.BIN_CACHE; the URL's basename, _download_to_local_path)."""
    from apache_beam.version import __version__

    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    name = f"apache_beam-v{__version__}-prism-{platform.system().lower()}-{arch}"
    cache = home / ".apache_beam" / "cache" / "prism" / "bin"
    cache.mkdir(parents=True)
    with zipfile.ZipFile(cache / f"{name}.zip", "w", zipfile.ZIP_STORED) as z:  # as the GitHub release packs it
        z.write(prism_bin, name)
    return str(cache / f"{name}.zip")


USER_PIPELINE = """
import logging, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from tfrecord_etl import ConvertToTFRecord
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
    _ = p | ConvertToTFRecord(sys.argv[1], sys.argv[2], num_shards=3, target_range_mb=0.004, compression="gzip",
                              provenance=True)
"""


def test_a_user_pipeline_on_direct_runner_runs_on_a_cached_prism_byte_identically(
    prism_bin, inputs, reference, tmp_path
):
    """Beam 2.77's DirectRunner picks Prism whenever it finds (or can download) the binary: a pipeline of the
    user's own with ConvertToTFRecord then runs there, not on the FnApiRunner, and must write the same bytes."""
    directory, _ = inputs
    home = tmp_path / "home"
    zipped = beam_cached_prism(home, prism_bin)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", USER_PIPELINE, str(directory / "in.h5"), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Running pipeline with PrismRunner." in proc.stderr
    assert f"Using cached prism binary/zip from {zipped}" in proc.stderr  # nothing downloaded
    assert "Falling back" not in proc.stderr and "falling back" not in proc.stderr, proc.stderr[-3000:]
    assert "Job state changed to DONE" in proc.stderr
    assert_same_output(out, reference / "convert")

    # the command, with the same cache: the FnApiRunner (pipelines.common.local_runner), no Prism
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.convert",
            "--input",
            str(directory / "in.h5"),
            "--output_dir",
            str(tmp_path / "c"),
            *CONVERT_FLAGS,
            "--verbose",
            "--runner=DirectRunner",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prism" not in proc.stderr.lower(), proc.stderr[-2000:]
    assert_same_output(tmp_path / "c", reference / "convert")
