"""Real object stores on this machine (loopback only) for the engines stage and bench/engines.py: SeaweedFS for
``s3://`` (a master, two volume servers, a filer and the S3 gateway, each a process of its own, so one can be killed)
and fake-gcs-server for ``gs://``; and :class:`Isolation`, a private mount namespace where a cluster's processes run
without the launcher's files (an empty tmpfs over /tmp, /var/tmp and the folders named), reaching their inputs and
outputs through the store only, as the workers of a cluster do.

``setup_s3.sh`` / ``setup_gcs.sh`` build the two servers into ``.engines/`` (git-ignored).

    python -m configs.engines.engines s3     # starts SeaweedFS, prints what a user passes; Ctrl-C or SIGTERM stops it
    python -m configs.engines.engines gcs
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import subprocess
import time

from configs.engines.engines import ENGINES, EngineError, Processes, free_port, port_open, wait_for

WEED = ENGINES / "seaweedfs" / "weed"
FAKE_GCS = ENGINES / "fake-gcs-server" / "fake-gcs-server"
REGION = "us-east-1"


def _weed_port() -> tuple[int, int]:
    """A free HTTP port and a free gRPC port (SeaweedFS would take HTTP + 10000, which may be taken or > 65535)."""
    return free_port(), free_port()


class SeaweedFS:
    """SeaweedFS on 127.0.0.1: ``weed master``, two ``weed volume`` servers, ``weed filer`` and ``weed s3`` (the S3
    gateway), each a process of its own in its own process group, data under ``workdir``. The S3 gateway takes one
    identity (``access_key`` / ``secret_key``, random unless given) and refuses anonymous requests.

    ``endpoint``: the S3 gateway's URL; :meth:`flags` the command's flags for it and :meth:`env` the environment a
    worker pool or a launcher gets (boto3's variables: the secret travels there, never on a command line)."""

    def __init__(self, workdir, access_key: str | None = None, secret_key: str | None = None, volumes: int = 2):
        self.workdir = pathlib.Path(workdir)
        self.access_key = access_key or "tfetl" + secrets.token_hex(4)
        self.secret_key = secret_key or "sk" + secrets.token_hex(16)
        self.n_volumes = volumes
        self.procs = Processes(self.workdir / "logs")
        self.volumes: list = []
        self._volume_ports: dict[int, tuple[int, int]] = {}

    def _weed(self, name: str, *args, port: int):
        proc = self.procs.start(name, [WEED, *args], cwd=self.workdir)
        wait_for(lambda: port_open(port), 120, f"SeaweedFS {name} on port {port}", [proc])
        return proc

    def start(self) -> SeaweedFS:
        if not WEED.exists():
            raise EngineError(f"{WEED} is missing: run bash configs/engines/setup_s3.sh")
        for d in ("master", "filer"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        ip = ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        try:
            self.master_port, master_grpc = _weed_port()
            self.master = self._weed(
                "master",
                "master",
                *ip,
                f"-port={self.master_port}",
                f"-port.grpc={master_grpc}",
                f"-mdir={self.workdir / 'master'}",
                "-volumeSizeLimitMB=512",
                "-defaultReplication=000",
                "-peers=none",
                port=self.master_port,
            )
            self.master_address = f"127.0.0.1:{self.master_port}.{master_grpc}"
            for _ in range(self.n_volumes):
                self.add_volume()
            filer_port, filer_grpc = _weed_port()
            self.filer = self._weed(
                "filer",
                "filer",
                *ip,
                f"-port={filer_port}",
                f"-port.grpc={filer_grpc}",
                f"-master={self.master_address}",
                f"-defaultStoreDir={self.workdir / 'filer'}",
                port=filer_port,
            )
            self.filer_address = f"127.0.0.1:{filer_port}.{filer_grpc}"
            config = self.workdir / "identities.json"
            config.write_text(
                json.dumps(
                    {
                        "identities": [
                            {
                                "name": "tfrecord-etl",
                                "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                            }
                        ]
                    }
                )
            )
            config.chmod(0o600)
            self.s3_port, s3_grpc = _weed_port()
            self._gateway_args = [
                "s3",
                "-ip.bind=127.0.0.1",
                f"-port={self.s3_port}",
                f"-port.grpc={s3_grpc}",
                "-port.iceberg=0",
                "-port.lance=0",
                f"-filer={self.filer_address}",
                f"-config={config}",
                f"-localSocket={self.workdir / 's3.sock'}",
            ]
            self.gateway = self._weed("s3", *self._gateway_args, port=self.s3_port)
            wait_for(self._writable, 120, "SeaweedFS to accept a write", [self.master, self.filer, self.gateway])
        except BaseException:
            self.stop()
            raise
        return self

    def add_volume(self, index: int | None = None):
        """Starts a volume server: one more, or with ``index`` the one of that number again (after a kill: its
        folder, so the objects it held are back)."""
        if index is None:
            index = len(self.volumes)
            self.volumes.append(None)
        folder = self.workdir / f"volume{index}"
        folder.mkdir(parents=True, exist_ok=True)
        # the same ports again after a kill: the master knows a volume server by ip:port
        port, grpc = self._volume_ports.setdefault(index, _weed_port())
        proc = self._weed(
            f"volume{index}",
            "volume",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-port={port}",
            f"-port.grpc={grpc}",
            f"-dir={folder}",
            "-max=100",
            f"-master={self.master_address}",
            "-preStopSeconds=0",
            port=port,
        )
        self.volumes[index] = proc
        return proc

    def kill_volume(self, index: int = 0) -> None:
        """SIGKILL to one volume server (no shutdown: what it was writing is cut off)."""
        self.procs.kill(self.volumes[index])

    def kill_gateway(self) -> None:
        """SIGKILL to the S3 gateway: the store stops answering (connections refused)."""
        self.procs.kill(self.gateway)

    def start_gateway(self):
        """The S3 gateway again, on its port (after :meth:`kill_gateway`)."""
        (self.workdir / "s3.sock").unlink(missing_ok=True)
        self.gateway = self._weed("s3", *self._gateway_args, port=self.s3_port)
        wait_for(self._writable, 60, "SeaweedFS to accept a write", [self.gateway])
        return self.gateway

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def client(self, endpoint: str | None = None):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30),
        )

    def _writable(self) -> bool:
        try:
            c = self.client()
            if "tfrecord-etl-probe" not in [b["Name"] for b in c.list_buckets().get("Buckets", [])]:
                c.create_bucket(Bucket="tfrecord-etl-probe")
            c.put_object(Bucket="tfrecord-etl-probe", Key="probe", Body=b"ok")
            return c.get_object(Bucket="tfrecord-etl-probe", Key="probe")["Body"].read() == b"ok"
        except Exception:  # noqa: BLE001 - not ready yet: volumes still registering
            return False

    def bucket(self, name: str) -> str:
        """Creates the bucket ``name`` (if missing) and returns ``s3://name``."""
        c = self.client()
        try:
            c.create_bucket(Bucket=name)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{name}"

    def flags(self, endpoint: str | None = None) -> list[str]:
        """The command's flags for this store (Beam's S3Options): the endpoint and region; credentials come from
        the environment (:meth:`env`), as a cluster's workers get them."""
        return [f"--s3_endpoint_url={endpoint or self.endpoint}", f"--s3_region_name={REGION}"]

    def env(self, endpoint: str | None = None) -> dict:
        """boto3's environment for this store: credentials, region and endpoint (the launcher's and a worker
        pool's: every S3 client a process makes reads them)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": endpoint or self.endpoint,
        }

    def stop(self) -> None:
        """Every process SIGKILLed at once (SeaweedFS did not stop on SIGTERM within 5 s: nothing of it is kept)."""
        self.procs.stop_all(grace=0)


class FakeGCS:
    """fake-gcs-server on 127.0.0.1 (``-backend filesystem`` under ``workdir``): the GCS JSON API that
    google-cloud-storage (and so Beam's gcsio and our reader) reaches through ``STORAGE_EMULATOR_HOST``."""

    def __init__(self, workdir):
        self.workdir = pathlib.Path(workdir)
        self.procs = Processes(self.workdir / "logs")

    def start(self) -> FakeGCS:
        if not FAKE_GCS.exists():
            raise EngineError(f"{FAKE_GCS} is missing: run bash configs/engines/setup_gcs.sh")
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        try:
            self.server = self.procs.start(
                "fake-gcs-server",
                [
                    FAKE_GCS,
                    "-scheme=http",
                    "-host=127.0.0.1",
                    f"-port={self.port}",
                    f"-public-host=127.0.0.1:{self.port}",
                    f"-external-url=http://127.0.0.1:{self.port}",
                    "-backend=filesystem",
                    f"-filesystem-root={self.workdir / 'data'}",
                    "-log-level=warn",
                ],
                cwd=self.workdir,
            )
            wait_for(lambda: port_open(self.port), 60, f"fake-gcs-server on port {self.port}", [self.server])
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bucket(self, name: str) -> str:
        """Creates the bucket ``name`` (if missing) and returns ``gs://name``."""
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=10).read()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already there
                raise
        return f"gs://{name}"

    def flags(self, endpoint: str | None = None) -> list[str]:
        """The command's flags for this store: none (the emulator is named by the environment, :meth:`env`)."""
        return []

    def env(self, endpoint: str | None = None) -> dict:
        """google-cloud-storage's environment for this server (the launcher's and a worker pool's)."""
        return {"STORAGE_EMULATOR_HOST": endpoint or self.endpoint, "GOOGLE_CLOUD_PROJECT": "test"}

    def stop(self) -> None:
        self.procs.stop_all(grace=5)


class Isolation:
    """A private mount namespace (``unshare --mount``, root only) held open by a sleeping process, with an empty
    tmpfs over /tmp, /var/tmp and each folder of ``hide`` (the launcher's work folders): whatever a cluster's process started in it
    (:meth:`wrap`: ``nsenter --mount=...``) would read or write there of the launcher's is not there. The checkout
    (the code the worker pool imports, as a worker image would hold the package) and ``.engines/`` stay visible.
    Processes in it share its tmpfs /tmp, as the processes of one cluster node share its disk."""

    def __init__(self, hide=()):
        self.hide = [str(pathlib.Path(h)) for h in hide]
        self.holder: subprocess.Popen | None = None

    @staticmethod
    def unavailable() -> str | None:
        """Why no private mount namespace can be made here (not root, no unshare/nsenter, refused), or None."""
        if os.geteuid() != 0:
            return "needs root (unshare --mount)"
        for tool in ("unshare", "nsenter"):
            if subprocess.run(["which", tool], capture_output=True).returncode != 0:
                return f"{tool} is not installed (util-linux)"
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /tmp"],
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0:
            return f"unshare --mount refused: {probe.stderr.strip()[-300:]}"
        return None

    def start(self) -> Isolation:
        mounts = " && ".join(
            f"mount -t tmpfs -o size=8g,mode=1777 tfrecord-etl-hidden {d}" for d in ["/tmp", "/var/tmp", *self.hide]
        )
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{mounts} && echo ready && exec sleep 1d"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = self.holder.stdout.readline()
        if line.strip() != "ready":
            raise EngineError(f"the private mount namespace did not start: {self.holder.stderr.read()[-500:]}")
        return self

    def wrap(self, command: list) -> list:
        """``command`` run inside the namespace (``nsenter`` execs it: same pid, same process group)."""
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", *command]

    def sees(self, path) -> bool:
        """Whether ``path`` exists inside the namespace."""
        return subprocess.run(self.wrap(["test", "-e", str(path)])).returncode == 0

    def stop(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(10)


def wait_until_gone(proc, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while proc.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
