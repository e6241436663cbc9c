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

import os
import pathlib
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from configs.engines import common, stores
from configs.engines.engines import ENGINES, ROOT, FlinkCluster, Processes, SparkCluster, worker_pool
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
