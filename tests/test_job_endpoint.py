"""A portable runner's job server that is not there fails within seconds, in one line, before anything is touched.

Before, ``--runner PortableRunner --job_endpoint 127.0.0.1:PORT`` with nothing listening (also through
configs/flink-local.yaml or spark-local.yaml, also with --verbose) planned, wrote the output directory's run marker
and lock, then was silent for about 310 s and ended in a raw ``grpc.FutureTimeoutError`` traceback, exit status 1.
Loopback only: closed ports on 127.0.0.1. The subprocesses are bounded by :data:`HANG_GUARD`: a guard against the
old wait, not a timing assertion."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.test_gcs_access import closed_port, error_line
from tfrecord_etl.pipelines import jobserver

HANG_GUARD = 60  # seconds; the command used to take about 310 s here

HINT = (
    "Hint: start the job server there first (Beam's Flink or Spark job server: configs/flink-local.yaml and "
    "configs/spark-local.yaml say how), or name a running one with --job_endpoint HOST:PORT (the command line wins "
    "over a config file's pipeline_options); --job_endpoint embed runs Beam's own job server in this process"
)


def run(tmp_path, command, *flags):
    """``tfrecord-etl COMMAND`` in a fresh process from ``tmp_path``, on ``in.npy`` (convert) or ``c`` (augment)."""
    np.save(tmp_path / "in.npy", np.arange(12, dtype="<i8"))
    io = ["--input", "in.npy"] if command == "convert" else ["--input", "c", "--constants", "k=1"]
    return subprocess.run(
        [sys.executable, "-m", "tfrecord_etl.pipelines.cli", command, *io, "--output_dir", "out", *flags],
        env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


@pytest.mark.parametrize(
    "command,flags",
    [
        ("convert", ["--runner", "PortableRunner"]),
        ("convert", ["--config", str(ROOT / "configs" / "flink-local.yaml"), "--verbose"]),
        ("augment", ["--config", str(ROOT / "configs" / "spark-local.yaml")]),
    ],
    ids=["convert-flags", "convert-flink-local-verbose", "augment-spark-local"],
)
def test_a_job_endpoint_nobody_listens_on_is_one_line_before_anything_is_written(tmp_path, command, flags):
    port = closed_port()
    ran = run(tmp_path, command, *flags, "--job_endpoint", f"127.0.0.1:{port}")
    assert ran.returncode == 2, ran.stderr[-3000:]
    assert error_line(ran) == (
        f"error: ConfigError: Cannot reach the job server of --runner PortableRunner at --job_endpoint "
        f"127.0.0.1:{port}: the connection is refused (nothing listens there) {HINT}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy"]  # no output directory, no run marker


def test_an_artifact_endpoint_nobody_listens_on_is_one_line_too(tmp_path):
    """The job server answers (a listening socket), the artifact service named by --artifact_endpoint does not."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        job, artifact = server.getsockname()[1], closed_port()
        ran = run(
            tmp_path,
            "convert",
            "--runner=PortableRunner",
            f"--job_endpoint=127.0.0.1:{job}",
            f"--artifact_endpoint=127.0.0.1:{artifact}",
        )
    assert ran.returncode == 2, ran.stderr[-3000:]
    assert error_line(ran) == (
        f"error: ConfigError: Cannot reach the artifact service at --artifact_endpoint 127.0.0.1:{artifact}: the "
        "connection is refused (nothing listens there) Hint: start it there, or leave --artifact_endpoint out: the "
        "job server's own artifact service is used"
    )
    assert not (tmp_path / "out").exists()


def test_embed_and_other_targets_are_not_probed(monkeypatch):
    """``embed`` is Beam's job server in this process (tests/test_runners.py runs it); no --job_endpoint, or a gRPC
    target that is not HOST:PORT, is left to the runner."""
    probed = []
    monkeypatch.setattr(jobserver, "unreachable", lambda host, port: probed.append((host, port)))
    for argv in (
        ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
        ["--runner=FlinkRunner"],
        ["--runner=PortableRunner", "--job_endpoint=unix:/tmp/job.sock"],
        ["--runner=DirectRunner", "--job_endpoint=127.0.0.1:8099"],  # DirectRunner ignores it
    ):
        jobserver.check(argv)
    assert probed == []
    jobserver.check(["--runner=PortableRunner", "--job_endpoint=[::1]:8099", "--artifact_endpoint=localhost:8098"])
    jobserver.check(["--runner=flink", "--job_endpoint=127.0.0.1:8099"])  # Beam's short name of FlinkRunner
    assert probed == [("::1", 8099), ("localhost", 8098), ("127.0.0.1", 8099)]
    assert jobserver.host_port("127.0.0.1:70000") is None and jobserver.host_port("dns:///h:1") is None
