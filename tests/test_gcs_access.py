"""A gs:// path that cannot be reached fails within seconds, with one line naming the cause and what to set.

Without the check a machine without network (or with a stopped emulator) waited over two minutes (Beam's search
for credentials, then google-cloud-storage's 120 s of retries) before a line that named neither cause. The
subprocesses below are bounded by 60 s: a guard against a hang, not a timing assertion."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.storage import gcsaccess

HANG_GUARD = 60  # seconds; the command used to take over 120 s here


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(tmp_path, argv, **env_vars):
    """``tfrecord-etl ARGV`` in a fresh process: no credentials (HOME is empty), no emulator or proxy unless given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.upper()
        not in {
            "STORAGE_EMULATOR_HOST",
            "API_ENDPOINT_OVERRIDE",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "ALL_PROXY",
            "NO_PROXY",
            "CLOUDSDK_CONFIG",
        }
    }
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), **env_vars)
    return subprocess.run(
        [sys.executable, "-m", "tfrecord_etl.pipelines.cli", *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def error_line(ran) -> str:
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr[-3000:]
    return lines[0]


def test_a_stopped_emulator_fails_at_once_naming_the_variable(tmp_path):
    port = closed_port()
    ran = run(
        tmp_path,
        ["convert", "--input", "gs://bucket/in/*.h5", "--output_dir", str(tmp_path / "out")],
        STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}",
    )
    assert ran.returncode == 2
    assert error_line(ran) == (
        f"error: ConfigError: Cannot reach the GCS emulator STORAGE_EMULATOR_HOST=http://127.0.0.1:{port} for "
        f"gs://bucket/in/*.h5: 127.0.0.1:{port}: the connection is refused (nothing listens there) Hint: start the "
        "emulator there, or set STORAGE_EMULATOR_HOST to its address (unset it to use Google Cloud Storage)"
    )
    assert not (tmp_path / "out").exists()


def test_no_network_and_no_credentials_fail_at_once_naming_both(tmp_path):
    """Google Cloud Storage behind a proxy that does not answer (as deterministic as no network at all: the proxy
    is the first hop), no credentials: the line names both and the variables to set. The output directory is a
    gs:// path given with --flag=value, verify's target a positional one."""
    proxy = f"http://127.0.0.1:{closed_port()}"
    ran = run(
        tmp_path, ["convert", "--input", str(tmp_path / "x.npy"), "--output_dir=gs://bucket/out"], HTTPS_PROXY=proxy
    )
    assert ran.returncode == 2
    line = error_line(ran)
    assert line.startswith(
        f"error: ConfigError: Cannot reach the proxy HTTPS_PROXY={proxy} in front of "
        f"https://storage.googleapis.com for gs://bucket/out: 127.0.0.1:"
    ), line
    assert "no Google credentials either (GOOGLE_APPLICATION_CREDENTIALS is unset" in line
    assert "set GOOGLE_APPLICATION_CREDENTIALS=KEY.json" in line and "--no_auth" in line
    ran = run(tmp_path, ["verify", "gs://bucket/out", "--no_auth"], HTTPS_PROXY=proxy)
    assert ran.returncode == 2
    line = error_line(ran)
    assert (
        line.startswith(f"error: ConfigError: Cannot reach the proxy HTTPS_PROXY={proxy}") and "credentials" not in line
    )  # --no_auth: credentials are not needed


def test_a_config_files_gs_input_is_checked_too(tmp_path):
    (tmp_path / "c.yaml").write_text("input: gs://bucket/in/*.npy\noutput_dir: out\n")
    port = closed_port()
    ran = run(tmp_path, ["convert", "--config", "c.yaml"], STORAGE_EMULATOR_HOST=f"127.0.0.1:{port}")
    assert ran.returncode == 2
    assert error_line(ran).startswith(
        f"error: ConfigError: Cannot reach the GCS emulator STORAGE_EMULATOR_HOST="
        f"127.0.0.1:{port} for gs://bucket/in/*.npy: "
    )


def test_google_cloud_storage_unreachable_names_network_emulator_and_credentials(monkeypatch, tmp_path):
    """The default endpoint (the case of a laptop offline): what to connect, or the emulator variable, and the
    credentials found or not."""
    for var in (
        "STORAGE_EMULATOR_HOST",
        "API_ENDPOINT_OVERRIDE",
        "HTTPS_PROXY",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUDSDK_CONFIG",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(gcsaccess, "_REACHED", set())
    seen = []
    monkeypatch.setattr(
        gcsaccess,
        "unreachable",
        lambda host, port: seen.append((host, port)) or "its name does not resolve (Name or service not known)",
    )
    monkeypatch.setattr(gcsaccess, "credential_files", lambda: None)
    with pytest.raises(ConfigError) as e:
        gcsaccess.check(["gs://b/x.h5"])
    assert seen == [("storage.googleapis.com", 443)]
    assert str(e.value) == (
        "Cannot reach Google Cloud Storage for gs://b/x.h5: storage.googleapis.com:443: its name does not resolve "
        "(Name or service not known); no Google credentials either (GOOGLE_APPLICATION_CREDENTIALS is unset and "
        "there is no gcloud application-default login) Hint: connect this machine to the network (behind a proxy: "
        "set HTTPS_PROXY=http://HOST:PORT), or set STORAGE_EMULATOR_HOST=http://HOST:PORT to use a GCS emulator; "
        "then set GOOGLE_APPLICATION_CREDENTIALS=KEY.json (a service account key) or run gcloud auth "
        "application-default login, or pass --no_auth to read a public bucket anonymously"
    )
    key = tmp_path / "key.json"
    key.write_text("{}")
    monkeypatch.setattr(gcsaccess, "credential_files", lambda: f"GOOGLE_APPLICATION_CREDENTIALS={key}")
    with pytest.raises(ConfigError, match=rf"; credentials: GOOGLE_APPLICATION_CREDENTIALS={key} Hint: connect"):
        gcsaccess.check(["gs://b/x.h5"])
    gcsaccess.check([])  # no gs:// path: nothing is checked
    assert len(seen) == 2


def test_credential_files_and_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("CLOUDSDK_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    assert gcsaccess.credential_files() is None  # named, but not there
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    adc = tmp_path / ".config" / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    adc.write_text("{}")
    assert gcsaccess.credential_files() == str(adc)
    assert gcsaccess.gcs_paths(["--input=gs://b/x", "gs://b/y", "--output_dir", "out", "s3://b/z", 3]) == [
        "gs://b/x",
        "gs://b/y",
    ]


def test_a_reachable_emulator_passes_and_is_checked_once(monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        monkeypatch.setattr(gcsaccess, "_REACHED", set())
        gcsaccess.check(["gs://b/x"])
        server.accept()[0].close()
        assert {("127.0.0.1", port)} == gcsaccess._REACHED
        calls = []
        monkeypatch.setattr(gcsaccess, "unreachable", lambda *a: calls.append(a))
        gcsaccess.check(["gs://b/y"])
        assert calls == []


def test_beams_own_path_options_are_not_checked():
    """``--temp_location gs://...`` and the like are the runner's (verify and inspect ignore them, the commands never
    read or write them): an offline run that names one must not be refused for it."""
    from tfrecord_etl.transforms.storage.gcsaccess import gcs_paths

    argv = [
        "--temp_location=gs://b/tmp",
        "--staging_location",
        "gs://b/staging",
        "--input",
        "gs://b/x",
        "--output_dir=gs://b/out",
        "gs://b/positional",
        "--template_location",
        "--source=gs://b/src",
    ]
    assert gcs_paths(argv) == ["gs://b/x", "gs://b/out", "gs://b/positional", "gs://b/src"]


@pytest.mark.parametrize(
    "value,reason",
    [("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1:70000", "Port out of range 0-65535")],
    ids=["bracket-unclosed", "port-above-65535"],
)
def test_a_malformed_emulator_variable_is_one_line_naming_it(tmp_path, value, reason):
    """A ValueError traceback of urllib before: the variable and its value, and what to set."""
    for argv in (["verify", "gs://bucket/out"], ["convert", "--input", "gs://b/x.npy", "--output_dir", "out"]):
        ran = run(tmp_path, argv, STORAGE_EMULATOR_HOST=value)
        assert ran.returncode == 2
        assert error_line(ran) == (
            f"error: ConfigError: STORAGE_EMULATOR_HOST={value} is not an address for gs:// requests: {reason} "
            "Hint: set STORAGE_EMULATOR_HOST to http://HOST:PORT (a port of 1-65535; an IPv6 host in brackets, "
            "http://[::1]:PORT), or unset it"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # HOME is tmp_path: nothing written there either


# The reader called from Python, in a fresh process (no probe done yet); the `socket` lines, when given, make every
# TCP connection of the process fail as an unroutable address does (EHOSTUNREACH), with no packet sent anywhere.
READ_GS = """
import errno, socket, sys
if sys.argv[1] == "unroutable":
    def no_route(self, address):
        raise OSError(errno.EHOSTUNREACH, "No route to host")
    socket.socket.connect = no_route
from tfrecord_etl import reader
try:
    next(iter(reader.iter_numpy("gs://bucket/out")))
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""


@pytest.mark.parametrize("case", ["stopped", "unroutable"])
def test_the_reader_fails_at_once_when_the_emulator_cannot_be_reached(tmp_path, case):
    """``reader.iter_numpy("gs://...")`` retried for over two minutes, then a raw RetryError (a stopped emulator),
    or took the endpoint for a missing bucket (an unroutable one): now the commands' one line, from the same probe."""
    port = closed_port()
    env = {k: v for k, v in os.environ.items() if k.upper() not in {"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"}}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}")
    ran = subprocess.run(
        [sys.executable, "-c", READ_GS, case],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    reason = {
        "stopped": "the connection is refused (nothing listens there)",
        "unroutable": "No route to host",
    }[case]
    assert ran.stdout.strip() == (
        f"ConfigError: Cannot reach the GCS emulator STORAGE_EMULATOR_HOST=http://127.0.0.1:{port} for "
        f"gs://bucket/out/collection.json: 127.0.0.1:{port}: {reason} Hint: start the emulator there, or set "
        "STORAGE_EMULATOR_HOST to its address (unset it to use Google Cloud Storage)"
    ), ran.stdout + ran.stderr[-3000:]


WORKER_PROBE = """
import sys
from apache_beam.internal.gcp import auth
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.gcp import gcsio
from apache_beam.options.pipeline_options import PipelineOptions
from tfrecord_etl.transforms.storage import fileio, remote
# Beam's search for credentials (4 retries with backoff where there are none), recorded instead of run
auth._Credentials._get_service_credentials = staticmethod(lambda options: print("searched") or None)
options = PipelineOptions(sys.argv[2:])
if sys.argv[1] == "options":
    FileSystems.set_options(options)  # as an SDK harness sets the job's options
    fileio._beam_filesystems()  # our first use of Beam's filesystems in the process
    gcsio.create_storage_client(options)  # then Beam's GCS filesystem makes its client
else:
    remote._gcs_client(type("FS", (), {"_pipeline_options": options})())  # the ranged reader's client, made first
print("done")
"""


@pytest.mark.parametrize(
    "entry,argv,emulator,anonymous",
    [
        ("options", [], True, True),  # a worker of a job on an emulator (the worker pool's environment)
        ("options", ["--no_auth"], False, True),  # a worker of a job on public buckets
        ("options", [], False, False),  # real GCS with credentials to find: Beam's own search, as before
        ("client", [], True, True),  # the ranged reader's client, made first
        ("client", ["--no_auth"], False, True),
    ],
)
def test_a_worker_skips_the_credential_search_where_no_credentials_apply(entry, argv, emulator, anonymous):
    """Every process that opens gs:// objects (a worker too, which never runs the launcher's setup) connects
    anonymously to an emulator or with --no_auth, instead of Beam's search for credentials: about 20 s of retries
    per process where there are none (measured 23 s for one SDK harness against fake-gcs-server), which every job
    of the engines stage on gs:// paid in each of its workers."""
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    if emulator:
        env["STORAGE_EMULATOR_HOST"] = "http://127.0.0.1:9"  # never connected to: only the credentials are made
    proc = subprocess.run(
        [sys.executable, "-c", WORKER_PROBE, entry, *argv],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == (["done"] if anonymous else ["searched", "done"]), proc.stdout
