"""The terabyte topology on this machine: Prism, Flink and Spark jobs whose inputs AND outputs are on real object
stores (SeaweedFS for ``s3://``, fake-gcs-server for ``gs://``: configs/engines/stores.py), with every worker (the
SDK harnesses, and for Flink and Spark the whole cluster: JobManager, TaskManagers, master, workers, executors and
job server) in a private mount namespace where the launcher's files are not (an empty tmpfs over /tmp and /var/tmp:
stores.Isolation). A worker reaches the data only through the store and the job only through the job server; the
store's credentials reach it only through the worker pool's environment, as a cluster gives them.

Every output must be byte-identical to the DirectRunner's on the same inputs as local files (shards byte for byte;
schema; metadata less its times, with the inputs' paths mapped), read in place by verify --source, inspect and the
three readers, and leave no temporary object behind (the bucket listed). The store's secret key must be nowhere in
what a run wrote or printed. Storage faults (configs/engines/faultproxy.py between the workers and the store, a
volume server SIGKILLed, the store stopped during the commit) end in the same bytes or in one line with the previous
output complete.

    bash configs/engines/setup_s3.sh && bash configs/engines/setup_gcs.sh && bash configs/engines/setup_prism.sh
    PYTHONPATH=$PWD .venv/bin/python -m pytest configs/engines/test_stores.py

Part of the engines stage (run_engines_test.sh). TFRECORD_ETL_S3=0 / TFRECORD_ETL_GCS=0 skip one store's tests,
TFRECORD_ETL_FLINK=0 / TFRECORD_ETL_SPARK=0 / TFRECORD_ETL_PRISM=0 one engine's. Where no private mount namespace
can be made (not root, no unshare), the tests that need one are skipped with the reason (SKIP no shared disk).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from configs.engines import common, stores
from configs.engines.engines import ENGINES, ROOT, FlinkCluster, Processes, SparkCluster, worker_pool
from configs.engines.faultproxy import Fault, FaultProxy
from tests.test_runners import make_inputs

pytestmark = pytest.mark.timeout(900)
S3 = os.environ.get("TFRECORD_ETL_S3") != "0"
GCS = os.environ.get("TFRECORD_ETL_GCS") != "0"
ENGINE_ON = {e: os.environ.get(f"TFRECORD_ETL_{e.upper()}") != "0" for e in ("prism", "flink", "spark")}
# the cluster's own folders (configuration, logs, Flink's io.tmp.dirs): outside /tmp, which the isolation hides
CLUSTER_WORK = ENGINES / "work"
# the small convert: 3 shards of a chunked, gzip-compressed HDF5 file (with big-endian, compound and string data)
CONVERT = ["--num_shards", "3", "--target_range_mb", "0.004", "--compression", "gzip"]
AUGMENT = ["--fn", "tests.augment_fns:add_one", "--fn_inputs", "id", "--constants", "w=0.5:float32"]


def needs(store: str, engine: str | None = None):
    on = {"s3": S3, "gs": GCS}[store] and (engine is None or ENGINE_ON[engine])
    return pytest.mark.skipif(not on, reason=f"{store} or {engine} skipped (TFRECORD_ETL_*=0)")


def setup(script: str) -> None:
    proc = subprocess.run(["bash", str(ROOT / "configs" / "engines" / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ----------------------------------------------------------------------------------------------------------------
# The stores, the isolation, the engines
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    if not S3:
        yield None
        return
    setup("setup_s3.sh")
    store = stores.SeaweedFS(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture
def own_seaweed(seaweed, tmp_path_factory):
    """A SeaweedFS of the test's own (a test that kills a part of it), with the module store's credentials (the
    worker pool's environment has them); the command's --s3_endpoint_url names it."""
    if not S3:
        pytest.skip("TFRECORD_ETL_S3=0")
    store = stores.SeaweedFS(
        tmp_path_factory.mktemp("seaweedfs-own"), access_key=seaweed.access_key, secret_key=seaweed.secret_key
    ).start()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="module")
def fakegcs(tmp_path_factory):
    if not GCS:
        yield None
        return
    setup("setup_gcs.sh")
    store = stores.FakeGCS(tmp_path_factory.mktemp("fakegcs")).start()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="module")
def isolation():
    reason = stores.Isolation.unavailable()
    if reason:
        pytest.skip(f"SKIP no shared disk: cannot make a private mount namespace here: {reason}")
    iso = stores.Isolation().start()
    try:
        yield iso
    finally:
        iso.stop()


def store_env(seaweed, fakegcs) -> dict:
    """What every process that talks to the stores gets (the launcher, a worker pool): endpoints and
    credentials."""
    return {**(seaweed.env() if seaweed else {}), **(fakegcs.env() if fakegcs else {})}


def cluster_dir(name: str) -> pathlib.Path:
    CLUSTER_WORK.mkdir(parents=True, exist_ok=True)
    return pathlib.Path(tempfile.mkdtemp(prefix=f"{name}-", dir=CLUSTER_WORK))


@pytest.fixture(scope="module")
def pool(isolation, seaweed, fakegcs):
    """A worker pool (Prism's EXTERNAL environment) in the private mount namespace; its address."""
    work = cluster_dir("pool")
    procs = Processes(work / "logs", wrap=isolation.wrap)
    try:
        proc, port = worker_pool(procs, env=store_env(seaweed, fakegcs))
        yield f"127.0.0.1:{port}", proc
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def prism_bin():
    setup("setup_prism.sh")
    return str(ENGINES / "prism" / "prism")


def prism(prism_bin, pool) -> list[str]:
    return [
        "--runner=PrismRunner",
        f"--prism_location={prism_bin}",
        "--environment_type=EXTERNAL",
        f"--environment_config={pool[0]}",
    ]


@pytest.fixture(scope="module")
def flink(isolation, seaweed, fakegcs):
    if not ENGINE_ON["flink"]:
        pytest.skip("TFRECORD_ETL_FLINK=0")
    work = cluster_dir("flink")
    cluster = FlinkCluster(
        work, taskmanagers=2, slots=1, restarts=(3, 10), pool_env=store_env(seaweed, fakegcs), wrap=isolation.wrap
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def spark(isolation, seaweed, fakegcs):
    if not ENGINE_ON["spark"]:
        pytest.skip("TFRECORD_ETL_SPARK=0")
    work = cluster_dir("spark")
    cluster = SparkCluster(work, workers=2, cores=1, pool_env=store_env(seaweed, fakegcs), wrap=isolation.wrap)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# Objects: upload, list, download
# ----------------------------------------------------------------------------------------------------------------


def gcs_client(fakegcs):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": fakegcs.endpoint}
    )


class Bucket:
    """One bucket of one store: ``url(key)``, upload a local tree, list keys, download a prefix."""

    def __init__(self, store, name: str):
        self.store, self.name = store, name
        self.scheme = "s3" if isinstance(store, stores.SeaweedFS) else "gs"
        store.bucket(name)
        self.client = store.client() if self.scheme == "s3" else gcs_client(store)

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.name}/{key}"

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "s3":
            self.client.put_object(Bucket=self.name, Key=key, Body=data)
        else:
            self.client.bucket(self.name).blob(key).upload_from_string(data)

    def upload(self, local, key: str) -> str:
        """Uploads the file or directory tree ``local`` as ``key`` (a tree: under ``key/``); returns its url."""
        local = pathlib.Path(local)
        items = (
            [(local, key)]
            if local.is_file()
            else [(p, f"{key}/{p.relative_to(local).as_posix()}") for p in sorted(local.rglob("*")) if p.is_file()]
        )
        for path, k in items:
            self.put(k, path.read_bytes())
        return self.url(key)

    def keys(self, prefix: str) -> list[str]:
        if self.scheme == "s3":
            found, token = [], None
            while True:
                page = self.client.list_objects_v2(
                    Bucket=self.name, Prefix=prefix, **({"ContinuationToken": token} if token else {})
                )
                found += [o["Key"] for o in page.get("Contents", [])]
                token = page.get("NextContinuationToken")
                if not token:
                    return sorted(found)
        return sorted(b.name for b in self.client.list_blobs(self.name, prefix=prefix))

    def get(self, key: str) -> bytes:
        if self.scheme == "s3":
            return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()
        return self.client.bucket(self.name).blob(key).download_as_bytes()

    def download(self, prefix: str, local) -> pathlib.Path:
        local = pathlib.Path(local)
        for key in self.keys(prefix + "/"):
            target = local / key[len(prefix) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.get(key))
        return local


# ----------------------------------------------------------------------------------------------------------------
# Inputs and references
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_inputs(tmp_path_factory):
    """The inputs as local files: ``in.h5`` (chunked + gzip), ``npy/`` (4 .npy files), ``s.zarr`` (a Zarr store)."""
    import zarr

    d = tmp_path_factory.mktemp("store_inputs")
    data = make_inputs(d)
    (d / "npy").mkdir()
    for i in range(4):
        np.save(d / "npy" / f"part{i}.npy", np.arange(i * 600, (i + 1) * 600, dtype="<f4").reshape(300, 2))
    g = zarr.open_group(str(d / "s.zarr"), mode="w", zarr_format=2)
    g.create_array("img", shape=(256, 8, 8), chunks=(32, 8, 8), dtype="f4")[:] = (
        np.random.default_rng(5).standard_normal((256, 8, 8)).astype("f4")
    )
    g.create_array("label", shape=(256,), chunks=(32,), dtype="i8")[:] = np.arange(256)
    zarr.consolidate_metadata(str(d / "s.zarr"))
    return d, data


CASES = {  # name -> (input under the inputs folder, the convert's flags)
    "h5": ("in.h5", CONVERT),
    "npy": ("npy/*.npy", ["--num_shards", "2", "--target_range_mb", "0.002", "--compression", "none", "--index"]),
    "zarr": ("s.zarr", ["--num_shards", "2", "--target_range_mb", "0.004"]),
}


def uploaded(bucket: Bucket, local_dir: pathlib.Path, prefix: str) -> str:
    """The inputs folder uploaded under ``prefix`` (once per bucket and prefix); its url."""
    if not bucket.keys(prefix + "/"):
        bucket.upload(local_dir, prefix)
    return bucket.url(prefix)


def direct_reference(reference, local_dir, case: str):
    path, flags = CASES[case]
    return reference("convert", ["--input", local_dir / path, "--output_dir", "OUT", *flags])


def run(module, args, engine_flags, seaweed, fakegcs, store_flags=(), timeout=600):
    """The command with the stores' environment (the launcher's credentials) and ``store_flags``."""
    return common.run(module, [*args, *store_flags], engine_flags, timeout=timeout, env=store_env(seaweed, fakegcs))


def assert_same_remote(bucket: Bucket, out_key: str, want, tmp_path, local_dir, remote_inputs: str) -> pathlib.Path:
    """The output under ``out_key`` is byte-identical to the local output ``want`` (its inputs' paths mapped);
    no temporary object is left under it. Returns the local copy."""
    keys = bucket.keys(out_key + "/")
    left = [k for k in keys if "/.tmp-" in k or "beam-temp" in k or ".tf-etl.lock" in k or k.endswith(".tmp")]
    assert left == [], f"temporary objects left after a successful run: {left}"
    got = bucket.download(out_key, tmp_path / f"copy-{out_key.replace('/', '_')}")
    common.assert_same_output_mapped(got, want, {remote_inputs: str(local_dir)})
    return got


def read_in_place(url: str, local_copy: pathlib.Path, env: dict) -> None:
    """The remote output read where it is, in a process with the store's environment: every reader gives what the
    local copy gives."""
    script = f"""
import json, sys, numpy as np
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.reading.random_access import RandomAccess
url, local = {url!r}, {str(local_copy)!r}
a = list(reader.iter_numpy(url)); b = list(reader.iter_numpy(local))
assert len(a) == len(b) > 0, (len(a), len(b))
for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for k in x:
        np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]))
ra = RandomAccess(url)
assert len(ra) == len(b)
for i in (0, len(b) // 2, len(b) - 1):
    for k, v in ra[i].items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(b[i][k]))
n = sum(int(next(iter(batch.values())).shape[0]) for batch in reader.to_tf_dataset(url, batch_size=64))
assert n == len(b), (n, len(b))
print("read", len(a))
"""
    full = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", **env)
    proc = subprocess.run(
        [common.PYTHON, "-c", script], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


# ----------------------------------------------------------------------------------------------------------------
# Prism: s3:// and gs:// in and out, the harnesses isolated
# ----------------------------------------------------------------------------------------------------------------


def converts(engine_flags, store, bucket_name, prefix, cases, local_inputs, reference, tmp_path, seaweed, fakegcs):
    """Each case converted from the store to the store on the engine, compared with the DirectRunner's local run;
    returns {case: (out key, local copy)}."""
    local_dir, _ = local_inputs
    bucket = Bucket(store, bucket_name)
    inputs = uploaded(bucket, local_dir, "inputs")
    done = {}
    for case in cases:
        path, flags = CASES[case]
        out = f"{prefix}/{case}"
        proc = run(
            "convert",
            ["--input", f"{inputs}/{path}", "--output_dir", bucket.url(out), *flags],
            engine_flags,
            seaweed,
            fakegcs,
            store.flags(),
        )
        common.ok(proc)
        copy = assert_same_remote(
            bucket, out, direct_reference(reference, local_dir, case), tmp_path, local_dir, inputs
        )
        done[case] = (out, copy, proc)
    return bucket, inputs, done


@needs("s3", "prism")
def test_prism_s3_converts_h5_npy_and_zarr_byte_identically_and_reads_in_place(
    prism_bin, pool, seaweed, fakegcs, local_inputs, reference, tmp_path
):
    bucket, inputs, done = converts(
        prism(prism_bin, pool),
        seaweed,
        "prism",
        "out",
        ["h5", "npy", "zarr"],
        local_inputs,
        reference,
        tmp_path,
        seaweed,
        fakegcs,
    )
    out, _copy, _ = done["h5"]
    verify = run("verify", [bucket.url(out), "--source", f"{inputs}/in.h5"], [], seaweed, fakegcs, seaweed.flags())
    assert verify.returncode == 0 and verify.stdout.startswith("OK"), verify.stdout + verify.stderr[-2000:]
    inspect = run("inspect", [bucket.url(out)], [], seaweed, fakegcs)  # the store from the environment
    assert inspect.returncode == 0 and "240" in inspect.stdout, inspect.stdout + inspect.stderr[-2000:]
    read_in_place(bucket.url(done["npy"][0]), done["npy"][1], store_env(seaweed, fakegcs))  # (RandomAccess:
    # uncompressed and indexed shards)


@needs("s3", "prism")
def test_prism_s3_augment_and_incremental_collection_byte_identical(
    prism_bin, pool, seaweed, fakegcs, local_inputs, reference, tmp_path
):
    local_dir, _ = local_inputs
    bucket = Bucket(seaweed, "prism")
    flags = prism(prism_bin, pool)
    converted = direct_reference(reference, local_dir, "h5")
    source = bucket.upload(converted, "augment-in")
    for mode in ("rewrite", "sidecar"):
        extra = ["--mode", "sidecar"] if mode == "sidecar" else []
        want = reference("augment", ["--input", converted, "--output_dir", "OUT", *AUGMENT, *extra])
        out = f"augment-{mode}"
        common.ok(
            run(
                "augment",
                ["--input", source, "--output_dir", bucket.url(out), *AUGMENT, *extra],
                flags,
                seaweed,
                fakegcs,
                seaweed.flags(),
            )
        )
        assert_same_remote(bucket, out, want, tmp_path, converted, source)

    # a two-span --incremental collection: raw/ grows by one file between the runs
    import h5py

    raw = tmp_path / "raw"
    raw.mkdir()
    args = ["--incremental", "--num_shards", "1"]
    want = tmp_path / "coll-direct"
    for i in range(2):
        with h5py.File(raw / f"f{i}.h5", "w") as f:
            f.create_dataset("id", data=np.arange(100 * i, 100 * i + 40, dtype="<i8"), chunks=(8,), compression="gzip")
        bucket.upload(raw / f"f{i}.h5", f"raw/f{i}.h5")
        common.ok(common.run("convert", ["--input", raw / "*.h5", "--output_dir", want, *args], common.DIRECT))
        common.ok(
            run(
                "convert",
                ["--input", bucket.url("raw/*.h5"), "--output_dir", bucket.url("coll"), *args],
                flags,
                seaweed,
                fakegcs,
                seaweed.flags(),
            )
        )
    got = bucket.download("coll", tmp_path / "coll-copy")
    spans = sorted(p.name for p in got.iterdir() if p.is_dir())
    assert len(spans) == 2, spans
    mapping = {bucket.url("raw"): str(raw)}
    for span in spans:
        common.assert_same_output_mapped(got / span, want / span, mapping)

    def spans(out):  # an input's identity is the store's own (an ETag there, a file's mtime here): name and size
        meta = common.metadata(out, "collection.json")
        meta["input_pattern"] = meta["input_pattern"].rsplit("/", 1)[1]
        for span in meta["spans"]:
            span["inputs"] = [(i["path"].rsplit("/", 1)[1], i["size"]) for i in span["inputs"]]
        return meta

    assert spans(got) == spans(want)


@needs("gs", "prism")
def test_prism_gcs_convert_and_augment_byte_identical(
    prism_bin, pool, seaweed, fakegcs, local_inputs, reference, tmp_path
):
    bucket, _inputs, done = converts(
        prism(prism_bin, pool), fakegcs, "prism", "out", ["h5"], local_inputs, reference, tmp_path, seaweed, fakegcs
    )
    local_dir, _ = local_inputs
    converted = direct_reference(reference, local_dir, "h5")
    want = reference("augment", ["--input", converted, "--output_dir", "OUT", *AUGMENT])
    common.ok(
        run(
            "augment",
            ["--input", bucket.url("out/h5"), "--output_dir", bucket.url("aug"), *AUGMENT],
            prism(prism_bin, pool),
            seaweed,
            fakegcs,
        )
    )
    # the augment's source is the remote convert, so its recorded input is that url
    assert_same_remote(bucket, "aug", want, tmp_path, converted, bucket.url("out/h5"))
    bucket, _, done = converts(
        prism(prism_bin, pool), fakegcs, "prism", "out", ["npy"], local_inputs, reference, tmp_path, seaweed, fakegcs
    )
    read_in_place(bucket.url("out/npy"), done["npy"][1], store_env(seaweed, fakegcs))


# ----------------------------------------------------------------------------------------------------------------
# Flink and Spark clusters that share no disk with the launcher
# ----------------------------------------------------------------------------------------------------------------


@needs("s3", "flink")
def test_flink_s3_convert_and_augment_byte_identical(
    flink, isolation, seaweed, fakegcs, local_inputs, reference, tmp_path
):
    # the launcher's files are not there for the cluster; the code is (as a worker image holds the package)
    assert not isolation.sees(tmp_path) and not isolation.sees(local_inputs[0])
    assert isolation.sees(ROOT / "transforms" / "__init__.py")
    bucket, _inputs, _done = converts(
        flink.flags(2), seaweed, "flink", "out", ["h5"], local_inputs, reference, tmp_path, seaweed, fakegcs
    )
    local_dir, _ = local_inputs
    converted = direct_reference(reference, local_dir, "h5")
    want = reference("augment", ["--input", converted, "--output_dir", "OUT", *AUGMENT])
    common.ok(
        run(
            "augment",
            ["--input", bucket.url("out/h5"), "--output_dir", bucket.url("aug"), *AUGMENT],
            flink.flags(2),
            seaweed,
            fakegcs,
            seaweed.flags(),
        )
    )
    assert_same_remote(bucket, "aug", want, tmp_path, converted, bucket.url("out/h5"))


@needs("gs", "flink")
def test_flink_gcs_convert_byte_identical(flink, seaweed, fakegcs, local_inputs, reference, tmp_path):
    converts(flink.flags(2), fakegcs, "flink", "out", ["h5"], local_inputs, reference, tmp_path, seaweed, fakegcs)


@needs("s3", "spark")
def test_spark_s3_convert_byte_identical(spark, seaweed, fakegcs, local_inputs, reference, tmp_path):
    converts(spark.flags(), seaweed, "spark", "out", ["h5"], local_inputs, reference, tmp_path, seaweed, fakegcs)


# ----------------------------------------------------------------------------------------------------------------
# Credentials: the secret key reaches the workers through the pool's environment, and is nowhere a run writes
# ----------------------------------------------------------------------------------------------------------------


@needs("s3", "prism")
def test_the_secret_key_is_nowhere_a_run_wrote(prism_bin, pool, seaweed, fakegcs, local_inputs, reference, tmp_path):
    """Two runs: the credentials in the environment (the launcher's, the worker pool's), and given as pipeline
    options (``--s3_access_key_id``/``--s3_secret_access_key``, which Beam hands to the workers); then everything
    they wrote (every object of the output, the dead letters, the run marker), printed (stdout, stderr, every
    error line) and logged (the runner log the launcher keeps, the worker pool's log) is searched for the key."""
    local_dir, _ = local_inputs
    bucket = Bucket(seaweed, "secrets")
    inputs = uploaded(bucket, local_dir, "inputs")
    secret = seaweed.secret_key.encode()
    printed, logs = [], []
    for name, extra in (
        ("env", []),
        ("flags", [f"--s3_access_key_id={seaweed.access_key}", f"--s3_secret_access_key={seaweed.secret_key}"]),
    ):
        proc = run(
            "convert",
            [
                "--input",
                f"{inputs}/in.h5",
                "--output_dir",
                bucket.url(f"out-{name}"),
                "--dead_letter_dir",
                bucket.url(f"dead-{name}"),
                "--provenance",
                "--verbose",
                *CONVERT,
            ],
            prism(prism_bin, pool),
            seaweed,
            fakegcs,
            [*seaweed.flags(), *extra],
        )
        common.ok(proc)
        printed += [proc.stdout, proc.stderr]
        logs += [
            w.split("[runner log: ", 1)[1].split(";", 1)[0] for w in proc.stderr.splitlines() if "[runner log: " in w
        ]
    # a failing run too: its error line and its runner log
    bad = run(
        "convert",
        ["--input", bucket.url("inputs/missing.h5"), "--output_dir", bucket.url("out-bad"), *CONVERT],
        prism(prism_bin, pool),
        seaweed,
        fakegcs,
        [*seaweed.flags(), f"--s3_secret_access_key={seaweed.secret_key}", f"--s3_access_key_id={seaweed.access_key}"],
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error:"), bad.stderr[-2000:]
    printed += [bad.stdout, bad.stderr]
    written = {key: bucket.get(key) for key in bucket.keys("") if not key.startswith("inputs/")}
    assert any(k.startswith("out-flags/") for k in written) and any(k.endswith("metadata.json") for k in written)
    found = [k for k, data in written.items() if secret in data]
    found += [f"printed #{i}" for i, text in enumerate(printed) if seaweed.secret_key in text]
    for path in [*logs, pool[1].log]:
        if os.path.exists(path) and secret in pathlib.Path(path).read_bytes():
            found.append(str(path))
    assert found == [], f"the secret key is in: {found}"


# ----------------------------------------------------------------------------------------------------------------
# Storage faults
# ----------------------------------------------------------------------------------------------------------------


@needs("s3", "prism")
def test_503s_500s_cut_off_bodies_a_stall_and_latency_between_workers_and_store_are_survived(
    prism_bin, pool, seaweed, fakegcs, local_inputs, reference, tmp_path
):
    """Between the workers (and the launcher) and SeaweedFS: 50 ms on every request, three 503 SlowDown to PUTs,
    two 500 InternalError to GETs, two GET bodies cut off by a connection reset after 512 bytes, one GET held
    10 s. The job retries (botocore the 5xx, our reader the cut-off bodies) and writes the same bytes."""
    local_dir, _ = local_inputs
    bucket = Bucket(seaweed, "faults")
    inputs = uploaded(bucket, local_dir, "inputs")
    proxy = FaultProxy(("127.0.0.1", seaweed.s3_port), latency_ms=50).start()
    try:
        rules = [
            proxy.add(Fault("status", status=503, times=3, method="PUT")),
            proxy.add(Fault("status", status=500, times=2, method="GET")),
            proxy.add(Fault("reset", times=2, method="GET", after_bytes=512, min_body=2048)),
            proxy.add(Fault("stall", times=1, method="GET", seconds=10)),
        ]
        proc = run(
            "convert",
            ["--input", f"{inputs}/in.h5", "--output_dir", bucket.url("out"), *CONVERT],
            prism(prism_bin, pool),
            seaweed,
            fakegcs,
            seaweed.flags(proxy.url),
        )
        common.ok(proc)
        assert [r.applied for r in rules] == [r.times for r in rules], [(r.kind, r.applied) for r in rules]
    finally:
        proxy.stop()
    assert_same_remote(bucket, "out", direct_reference(reference, local_dir, "h5"), tmp_path, local_dir, inputs)


def start_run(args, engine_flags, env: dict, log: pathlib.Path) -> subprocess.Popen:
    full = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3", **env)
    with open(log, "wb") as f:
        return subprocess.Popen(
            [common.PYTHON, "-m", "pipelines.convert", *map(str, args), *engine_flags],
            cwd=ROOT,
            env=full,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def one_error_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return lines[-1]


@needs("s3", "prism")
def test_a_volume_server_killed_while_shards_are_written(
    prism_bin, pool, own_seaweed, fakegcs, big_input, big_reference, tmp_path
):
    """SIGKILL to one of SeaweedFS's two volume servers while the shards of an --overwrite run are written over a
    complete output: the run either ends complete and byte-identical, or fails with one line, the previous output
    complete (read back once the volume server is back)."""
    from configs.engines.conftest import KILL_FLAGS

    seaweed = own_seaweed
    bucket = Bucket(seaweed, "volumekill")
    source = bucket.upload(big_input, "in/large.h5")
    args = ["--input", source, "--output_dir", bucket.url("out"), *KILL_FLAGS, *seaweed.flags()]
    env = store_env(seaweed, fakegcs)
    common.ok(run("convert", args[:-2], prism(prism_bin, pool), seaweed, fakegcs, seaweed.flags()))
    previous = bucket.get("out/metadata.json")
    log = tmp_path / "run.log"
    proc = start_run([*args, "--overwrite"], prism(prism_bin, pool), env, log)
    try:
        common.wait_until(
            lambda: any("/.tmp-" in k or "-g1-" in k for k in bucket.keys("out/")), 600, "a shard written", proc
        )
        seaweed.kill_volume(1)
        proc.wait(600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        seaweed.add_volume(1)
    text = log.read_text(errors="replace")
    if proc.returncode == 0:  # the same bytes under the replacing run's names (data-g1-...)
        keys = bucket.keys("out/")
        assert not [k for k in keys if "/.tmp-" in k or ".tf-etl.lock" in k], keys
        got = bucket.download("out", tmp_path / "replaced")
        for path in list(got.iterdir()):
            if "-g1-" in path.name:
                path.rename(got / path.name.replace("-g1-", "-"))
        (got / "metadata.json").write_text((got / "metadata.json").read_text().replace("-g1-", "-"))
        common.assert_same_output_mapped(got, big_reference, {bucket.url("in"): str(big_input.parent)})
    else:
        assert proc.returncode == 2, text[-3000:]
        one_error_line(text)
        assert bucket.get("out/metadata.json") == previous  # the previous output is the committed one
        got = bucket.download("out", tmp_path / "previous")
        common.assert_same_output_mapped(got, big_reference, {bucket.url("in"): str(big_input.parent)})


@needs("s3")
def test_the_store_stopped_during_the_commit_is_one_line_and_the_previous_output_stays(
    own_seaweed, fakegcs, local_inputs, reference, tmp_path
):
    """The S3 gateway SIGKILLed while the commit waits (failpoint ``before-commit:sleep=8``: every shard final, no
    metadata.json yet) in an --overwrite run over a complete output: one line naming the store, exit 2; once the
    gateway is back the previous output is complete and verifies."""
    local_dir, _ = local_inputs
    seaweed = own_seaweed
    bucket = Bucket(seaweed, "commitstop")
    inputs = uploaded(bucket, local_dir, "inputs")
    args = ["--input", f"{inputs}/in.h5", "--output_dir", bucket.url("out"), *CONVERT, *seaweed.flags()]
    common.ok(run("convert", args, common.DIRECT, seaweed, fakegcs))
    previous = bucket.get("out/metadata.json")
    env = {**store_env(seaweed, fakegcs), "TFRECORD_ETL_FAILPOINT": "before-commit:sleep=8"}
    log = tmp_path / "run.log"
    proc = start_run([*args, "--overwrite"], common.DIRECT, env, log)
    try:
        common.wait_until(lambda: sum("-g1-" in k for k in bucket.keys("out/")) == 3, 300, "3 final shards", proc)
        seaweed.kill_gateway()
        proc.wait(600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        seaweed.start_gateway()
    text = log.read_text(errors="replace")
    assert proc.returncode == 2, text[-3000:]
    line = one_error_line(text)
    assert "out" in line and ("s3://" in line or "127.0.0.1" in line), line
    assert bucket.get("out/metadata.json") == previous
    want = direct_reference(reference, local_dir, "h5")
    got = bucket.download("out", tmp_path / "previous")
    # the failed run's shards and temporaries may stay (the store was gone when it cleaned up: metadata.json does
    # not list them, the next run removes them), and so does its lock (the next run takes it over as stale)
    shards = {
        k: v
        for k, v in common.files(got).items()
        if "-g1-" not in k and k != ".tf-etl.lock" and not k.startswith(".tmp-")
    }
    assert shards == common.files(want), "the previous output's shards changed"
    verify = run("verify", [bucket.url("out")], [], seaweed, fakegcs, seaweed.flags())
    assert verify.returncode in (0, 1) and verify.stdout.startswith("OK"), verify.stdout + verify.stderr[-2000:]
    again = run("convert", [*args, "--overwrite"], common.DIRECT, seaweed, fakegcs)
    common.ok(again)
    listed = {shard["file"] for shard in json.loads(bucket.get("out/metadata.json"))["shards"]}
    left = [k for k in bucket.keys("out/") if "/.tmp-" in k or ".tf-etl.lock" in k]
    left += [k for k in bucket.keys("out/") if "/data-" in k and k.rsplit("/", 1)[1] not in listed]
    assert left == [], f"the re-run left what the failed run wrote: {left}"


@needs("s3")
def test_a_store_that_ignores_conditional_writes_is_refused_in_one_line(seaweed, fakegcs, local_inputs, tmp_path):
    """SeaweedFS behind a proxy that answers its 412 to a conditional PUT with 200 (what a store that ignores
    ``If-None-Match`` answers: an older S3-compatible API): the lock could no longer exclude a second launcher, so
    the run stops before anything is written, in one line; the probe object it wrote is gone."""
    local_dir, _ = local_inputs
    bucket = Bucket(seaweed, "noconditions")
    inputs = uploaded(bucket, local_dir, "inputs")
    proxy = FaultProxy(("127.0.0.1", seaweed.s3_port)).start()
    try:
        strip = proxy.add(Fault("accept", times=1000, method="PUT"))
        proc = run(
            "convert",
            ["--input", f"{inputs}/in.h5", "--output_dir", bucket.url("out"), *CONVERT],
            common.DIRECT,
            seaweed,
            fakegcs,
            seaweed.flags(proxy.url),
        )
    finally:
        proxy.stop()
    assert proc.returncode == 2 and strip.applied >= 1, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    assert "ignores conditional writes" in line and "If-None-Match" in line, line
    assert bucket.keys("out/") == []
