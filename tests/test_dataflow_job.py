"""The Dataflow job of a convert, built offline by Beam's own DataflowRunner and read back.

The command's pipeline (``configs/dataflow.yaml``: ``setup_file: ./setup.py``, runner v2) over gs:// paths on the
project's GCS emulator (tests/gcs_emulator.py), run by ``DataflowRunner`` with Beam's ``--dry_run`` (TestOptions:
the runner translates the pipeline and stops before any Dataflow API call); then what ``create_job`` does before
submitting, with the runner's own client (``DataflowApplicationClient.create_job_description``): it stages the
worker package (the sdist Beam's Stager builds from setup.py), the pickled main session and the pipeline proto to
``--staging_location`` (the emulator) and fills the job's environment; ``job.json()`` is the request body
``--dataflow_job_file`` would save. Nothing is submitted, no credentials are used, and every connection the
launcher opens is checked to go to 127.0.0.1.

Checked: the steps of the pipeline proto the workers run; the staged packages (gs:// only; the sdist holds the
pipelines and carries their requirements); the pipeline options from the config; no path of the launcher's
machine (the checkout, its temp dirs, HOME) in what a worker reads: the package locations, the options, the
pipeline proto (pickled DoFns included). Not checked (needs Google Cloud): that the service accepts the request,
that the workers start, install the sdist in the SDK container and run the job.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tarfile

import numpy as np
import pytest

from tests import gcs_emulator
from tests.conftest import ROOT

pytest.importorskip("gcp_storage_emulator", reason="pip install -e .[test]")

BUCKET = "etl-dataflow-job"


class LoopbackOnly:
    """Refuses (and records) any name lookup or connection of this process's Python sockets (HTTP clients:
    google-auth, google-cloud-storage, the metadata server probe) that is not to the loopback host. gRPC's C core
    opens its own sockets; the dry run creates the Dataflow API client but never calls it."""

    LOCAL = ("127.0.0.1", "localhost", "::1")

    def __init__(self, monkeypatch):
        self.refused: list = []
        connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

        def guarded_connect(sock, address):
            if isinstance(address, tuple) and address[0] not in self.LOCAL:
                self.refused.append(address)
                raise OSError(f"the test allows loopback only: {address}")
            return connect(sock, address)

        def guarded_getaddrinfo(host, *args, **kwargs):
            if host not in self.LOCAL and host is not None:
                self.refused.append(host)
                raise socket.gaierror(f"the test allows loopback only: {host}")
            return getaddrinfo(host, *args, **kwargs)

        monkeypatch.setattr(socket.socket, "connect", guarded_connect)
        monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)


@pytest.fixture(scope="module")
def gcs():
    with gcs_emulator.server(BUCKET) as port:
        with gcs_emulator.emulator_host(f"http://127.0.0.1:{port}"):
            from google.cloud import storage

            bucket = storage.Client.create_anonymous_client().bucket(BUCKET)
            ids = np.arange(300, dtype="<i8")
            import io

            for name, array in (("a.npy", ids), ("b.npy", ids * 2)):
                buf = io.BytesIO()
                np.save(buf, array)
                bucket.blob(f"in/{name}").upload_from_string(buf.getvalue())
            yield bucket


@pytest.fixture(scope="module")
def job(gcs, tmp_path_factory):
    """(the job's JSON request body, the staged pipeline proto, the staged objects {name: bytes}, refused hosts)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.runners.dataflow.internal import apiclient

    from tfrecord_etl.pipelines import common, convert
    from tfrecord_etl.transforms.config import ConvertConfig, ConvertOptions, parse_args

    mp = pytest.MonkeyPatch()
    guard = LoopbackOnly(mp)
    mp.chdir(ROOT)  # the config's setup_file: ./setup.py, as in the docs' command
    mp.setenv(common.WORKER_SDIST_ENV, "1")  # what run_main sets for the launcher: the workers' sdist
    try:
        argv = [
            "--config",
            "configs/dataflow.yaml",
            "--input",
            f"gs://{BUCKET}/in/*.npy",
            "--output_dir",
            f"gs://{BUCKET}/out",
            "--num_shards",
            "2",
            "--project",
            "offline-project",
            "--temp_location",
            f"gs://{BUCKET}/tmp",
            "--staging_location",
            f"gs://{BUCKET}/staging",
            "--no_auth",
        ]
        cfg, beam_argv = parse_args(argv, ConvertConfig, ConvertOptions, convert.PROG, "", convert.build_parser())
        common.configure_filesystems(beam_argv)
        options = PipelineOptions([*beam_argv, "--dry_run=true"])  # Beam's TestOptions.dry_run: no submission
        p = beam.Pipeline(options=options)
        convert.build_pipeline(p, cfg, convert.build_plan(cfg))
        result = p.run()
        job = result.job
        client = apiclient.DataflowApplicationClient(options, job.root_staging_location)
        client.create_job_description(job)  # stages to --staging_location: the emulator
        body = json.loads(job.json())
        staged = {b.name: b.download_as_bytes() for b in gcs.client.list_blobs(BUCKET, prefix="staging/")}
    finally:
        mp.undo()
    pipeline_url = body["environment"]["sdkPipelineOptions"]["options"]["pipelineUrl"]
    proto = beam_runner_api_pb2.Pipeline.FromString(staged[pipeline_url.split(f"gs://{BUCKET}/", 1)[1]])
    return body, proto, staged, guard.refused


def test_the_job_is_built_without_leaving_loopback(job):
    body, _, _, refused = job
    assert refused == []  # no Dataflow API, no metadata server, no credentials search
    assert body["type"] == "JOB_TYPE_BATCH" and body["name"] == "tfrecord-etl-convert"


def test_the_loopback_guard_refuses_and_records_other_hosts(monkeypatch):
    """The control for the test above: the guard does stop a lookup and a connection elsewhere."""
    guard = LoopbackOnly(monkeypatch)
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("dataflow.googleapis.com", 443)
    with socket.socket() as s, pytest.raises(OSError, match="loopback only"):
        s.connect(("192.0.2.1", 9))
    assert guard.refused == ["dataflow.googleapis.com", ("192.0.2.1", 9)]


def test_the_steps_are_the_convert_pipeline(job):
    _, proto, _, _ = job
    by_label = {t.unique_name: t for t in proto.components.transforms.values()}

    def children(label):
        return [proto.components.transforms[i].unique_name for i in by_label[label].subtransforms]

    assert children("ConvertToTFRecord") == ["ConvertToTFRecord/WritePlanned", "ConvertToTFRecord/FinalizeOutput"]
    # the shard plans (one element per shard, spread by a Reshuffle), the shard writer, the commit
    for label, urn in (
        ("ConvertToTFRecord/WritePlanned/WritePlannedShards/CreateShardPlans/Impulse", "beam:transform:impulse:v1"),
        (
            "ConvertToTFRecord/WritePlanned/WritePlannedShards/CreateShardPlans/MaybeReshuffle/Reshuffle",
            "beam:transform:reshuffle:v1",
        ),
        ("ConvertToTFRecord/WritePlanned/WritePlannedShards/WriteShards", "beam:transform:pardo:v1"),
        (
            "ConvertToTFRecord/FinalizeOutput/CollectShards/CollectShards/CombinePerKey",
            "beam:transform:combine_per_key:v1",
        ),
        ("ConvertToTFRecord/FinalizeOutput/WriteMetadata", "beam:transform:pardo:v1"),
    ):
        assert by_label[label].spec.urn == urn, label
    # every DoFn a worker runs is in the proto, pickled with cloudpickle
    pardos = [t for t in proto.components.transforms.values() if t.spec.urn == "beam:transform:pardo:v1"]
    assert len(pardos) >= 3
    envs = {e.urn for e in proto.components.environments.values()}
    assert envs == {"beam:env:docker:v1"}  # Dataflow runs Docker environments only


def test_the_worker_package_is_the_sdist_with_the_pipelines(job):
    body, _, staged, _ = job
    (pool,) = body["environment"]["workerPools"]
    packages = {p["name"]: p["location"] for p in pool["packages"]}
    assert set(packages) >= {"workflow.tar.gz", "pickled_main_session"}, packages
    assert all(loc.startswith(f"storage.googleapis.com/{BUCKET}/staging/") for loc in packages.values()), packages
    sdist = staged[packages["workflow.tar.gz"].split(f"/{BUCKET}/", 1)[1]]
    import io

    with tarfile.open(fileobj=io.BytesIO(sdist)) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        requirements = next(
            tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith("PIPELINE-REQUIREMENTS.txt")
        )
    # setup.py maps pipelines/ and transforms/ to tfrecord_etl.pipelines / tfrecord_etl.transforms at install
    for module in (
        "setup.py",
        "tfrecord_etl/__init__.py",
        "pipelines/convert.py",
        "transforms/convert.py",
        "transforms/beam_io.py",
        "transforms/beam/write.py",
    ):
        assert module in names, sorted(names)[:40]
    assert "apache-beam" in requirements and "tensorflow" in requirements  # installed without extras
    assert pool["workerHarnessContainerImage"].endswith("beam_python3.11_sdk:2.77.0")


def test_the_options_are_the_configs(job):
    body, _, _, _ = job
    options = body["environment"]["sdkPipelineOptions"]["options"]
    assert options["runner"] == "DataflowRunner" and options["project"] == "offline-project"
    assert options["region"] == "us-central1" and options["setup_file"] == "./setup.py"
    assert options["machine_type"] == "n2-standard-4" and options["max_num_workers"] == 20
    assert "use_runner_v2" in options["experiments"]
    assert options["temp_location"].startswith(f"gs://{BUCKET}/tmp/")
    assert options["staging_location"].startswith(f"gs://{BUCKET}/staging/")
    (pool,) = body["environment"]["workerPools"]
    assert pool["machineType"] == "n2-standard-4" and pool["autoscalingSettings"]["maxNumWorkers"] == 20


def local_paths() -> list[str]:
    import tempfile

    return [str(ROOT), tempfile.gettempdir() + "/", os.path.expanduser("~") + "/"]


def pickled_payloads(proto) -> list[bytes]:
    """The payloads of every DoFn and CombineFn in the pipeline proto, Beam's pickles decoded (base64, then bz2 or zlib: Beam's
    cloudpickle_pickler.dumps), so that the paths inside them can be searched."""
    import base64
    import bz2
    import zlib

    from apache_beam.portability.api import beam_runner_api_pb2

    out = []
    for t in proto.components.transforms.values():
        if t.spec.urn == "beam:transform:pardo:v1":
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload).do_fn.payload
        elif t.spec.urn in ("beam:transform:combine_per_key:v1", "beam:transform:combine_grouped_values:v1"):
            payload = beam_runner_api_pb2.CombinePayload.FromString(t.spec.payload).combine_fn.payload
        else:
            continue
        try:
            compressed = base64.b64decode(payload, validate=True)
            out.append(bz2.decompress(compressed) if compressed[:3] == b"BZh" else zlib.decompress(compressed))
        except (ValueError, OSError, zlib.error):  # not one of Beam's pickles (a standard payload): as it is
            out.append(payload)
    return out


def test_no_path_of_the_launchers_machine_reaches_the_workers(job):
    """The workers read the package locations, the pipeline options and the pipeline proto (the DoFns pickled in
    it): none may name a file on the launcher's disk. ``setup_file`` (``./setup.py``) is read by the launcher
    alone (the workers install the staged sdist)."""
    body, proto, _, _ = job
    env = body["environment"]
    options = dict(env["sdkPipelineOptions"]["options"])
    assert options.pop("setup_file") == "./setup.py"
    text = json.dumps({"options": options, "pools": env["workerPools"], "temp": env["tempStoragePrefix"]})
    pickles = pickled_payloads(proto)
    assert len(pickles) >= 8
    everything = proto.SerializeToString() + b"".join(pickles)
    for path in local_paths():  # a local absolute path starts a string, not inside gs://bucket/tmp/...
        pattern = r"(?<![\w.:/-])" + re.escape(path)
        assert not re.search(pattern, text), re.search(pattern, text)
        assert not re.search(pattern.encode(), everything), re.search(pattern.encode(), everything)
    # the control: the plan's inputs and output are in the pickles, as gs:// objects
    for name in (f"gs://{BUCKET}/in/a.npy", f"gs://{BUCKET}/in/b.npy", f"gs://{BUCKET}/out"):
        assert any(name.encode() in p for p in pickles), name


def test_a_template_build_is_refused_and_leaves_nothing_behind(gcs, monkeypatch, capsys):
    """``--template_location`` makes DataflowRunner write a classic template instead of running the job; the
    command used to plan, take the output directory's lock and write its run marker, have the template written,
    then fail reading a metadata.json no run wrote, leaving the marker in the output directory. A template of a job
    planned and locked at launch would replay a stale plan unchecked: refused in one line before anything is
    written."""
    from tfrecord_etl.pipelines import common, convert

    guard = LoopbackOnly(monkeypatch)
    monkeypatch.chdir(ROOT)
    argv = [
        "--config",
        "configs/dataflow.yaml",
        "--input",
        f"gs://{BUCKET}/in/*.npy",
        "--output_dir",
        f"gs://{BUCKET}/templated",
        "--num_shards",
        "2",
        "--project",
        "offline-project",
        "--temp_location",
        f"gs://{BUCKET}/tmp",
        "--staging_location",
        f"gs://{BUCKET}/template-staging",
        "--no_auth",
        "--template_location",
        f"gs://{BUCKET}/templates/convert",
    ]
    assert common.run_main(convert.main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"error: ConfigError: --template_location gs://{BUCKET}/templates/convert: a Dataflow classic template of "
        "this command cannot be built"
    ), err
    left = [
        b.name
        for prefix in ("templated", "templates", "template-staging")
        for b in gcs.client.list_blobs(BUCKET, prefix=prefix)
    ]
    assert left == []  # no run marker, no lock, no template, nothing staged
    assert guard.refused == []
