"""What the object-store engine tests share (test_stores.py: Prism, credentials, faults; test_stores_clusters*.py:
Flink and Spark): the stores' switches, a bucket's objects (upload, list, download), the small inputs' cases, the
DirectRunner reference of each, and the terabyte configuration itself (convert of three formats, augment in both
modes, a two-span incremental collection, from the store to the store, compared byte for byte). The fixtures that
start the stores, the private mount namespace and the isolated clusters are in conftest.py.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile

import numpy as np
import pytest

from configs.engines import common, stores
from configs.engines.engines import ENGINES, ROOT

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


def store_env(seaweed, fakegcs) -> dict:
    """What every process that talks to the stores gets (the launcher, a worker pool): endpoints and
    credentials."""
    return {**(seaweed.env() if seaweed else {}), **(fakegcs.env() if fakegcs else {})}


def cluster_dir(name: str) -> pathlib.Path:
    CLUSTER_WORK.mkdir(parents=True, exist_ok=True)
    return pathlib.Path(tempfile.mkdtemp(prefix=f"{name}-", dir=CLUSTER_WORK))


def prism(prism_bin, pool) -> list[str]:
    return [
        "--runner=PrismRunner",
        f"--prism_location={prism_bin}",
        "--environment_type=EXTERNAL",
        f"--environment_config={pool[0]}",
    ]


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


def converts(engine_flags, store, bucket_name, prefix, cases, store_inputs, reference, tmp_path, seaweed, fakegcs):
    """Each case converted from the store to the store on the engine, compared with the DirectRunner's local run;
    returns the bucket, the inputs' url and {case: (out key, local copy, the finished process)}."""
    local_dir, _ = store_inputs
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


def augments(engine_flags, store, bucket, source_key, store_inputs, reference, tmp_path, seaweed, fakegcs):
    """augment in both modes (rewrite, sidecar) of the engine's own remote convert ``source_key`` into the same
    bucket, each compared with the DirectRunner's augment of the local convert."""
    local_dir, _ = store_inputs
    converted = direct_reference(reference, local_dir, "h5")
    for mode in ("rewrite", "sidecar"):
        extra = ["--mode", "sidecar"] if mode == "sidecar" else []
        want = reference("augment", ["--input", converted, "--output_dir", "OUT", *AUGMENT, *extra])
        out = f"augment-{mode}"
        common.ok(
            run(
                "augment",
                ["--input", bucket.url(source_key), "--output_dir", bucket.url(out), *AUGMENT, *extra],
                engine_flags,
                seaweed,
                fakegcs,
                store.flags(),
            )
        )
        # the augment's source is the remote convert, so its recorded input is that url
        assert_same_remote(bucket, out, want, tmp_path, converted, bucket.url(source_key))


def incremental_collection(engine_flags, store, bucket, tmp_path, seaweed, fakegcs) -> None:
    """A two-span ``--incremental`` collection on the store (raw/ grows by one file between the runs), span for
    span byte-identical to the DirectRunner's on local files; collection.json the same but for the inputs'
    identities (an ETag or generation there, a file's mtime here)."""
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
                engine_flags,
                seaweed,
                fakegcs,
                store.flags(),
            )
        )
    got = bucket.download("coll", tmp_path / "coll-copy")
    spans = sorted(p.name for p in got.iterdir() if p.is_dir())
    assert len(spans) == 2, spans
    mapping = {bucket.url("raw"): str(raw)}
    for span in spans:
        common.assert_same_output_mapped(got / span, want / span, mapping)

    def identities(out):
        meta = common.metadata(out, "collection.json")
        meta["input_pattern"] = meta["input_pattern"].rsplit("/", 1)[1]
        for span in meta["spans"]:
            span["inputs"] = [(i["path"].rsplit("/", 1)[1], i["size"]) for i in span["inputs"]]
        return meta

    assert identities(got) == identities(want)


def engine_flags(request, engine: str) -> list[str]:
    """The pipeline options that run a command on ``engine`` (its module fixture started on first use)."""
    if engine == "prism":
        return prism(request.getfixturevalue("prism_bin"), request.getfixturevalue("pool"))
    cluster = request.getfixturevalue(f"isolated_{engine}")
    return cluster.flags(2) if engine == "flink" else cluster.flags()


def reads_in_place(bucket, inputs, done, store, seaweed, fakegcs) -> None:
    """The remote outputs read where they are: verify --source, inspect, iter_numpy, RandomAccess and to_tf_dataset
    give what they give on the local copy."""
    out, _copy, _ = done["h5"]
    verify = run("verify", [bucket.url(out), "--source", f"{inputs}/in.h5"], [], seaweed, fakegcs, store.flags())
    assert verify.returncode == 0 and verify.stdout.startswith("OK"), verify.stdout + verify.stderr[-2000:]
    inspect = run("inspect", [bucket.url(out)], [], seaweed, fakegcs)  # the store from the environment
    assert inspect.returncode == 0 and "240" in inspect.stdout, inspect.stdout + inspect.stderr[-2000:]
    # RandomAccess: uncompressed and indexed shards
    read_in_place(bucket.url(done["npy"][0]), done["npy"][1], store_env(seaweed, fakegcs))


def terabyte_configuration(engine, store, request, isolation, seaweed, fakegcs, store_inputs, reference, tmp_path):
    """convert (a chunked + gzip HDF5 file, a folder of .npy files, a Zarr store), augment (rewrite and sidecar) of
    the engine's own remote convert and a two-span --incremental collection, inputs and outputs on the store, every
    worker where the launcher's files are not: each output byte-identical to the DirectRunner's on local files, no
    temporary object left; on Prism (once per store) the outputs are then read in place."""
    flags = engine_flags(request, engine)
    # the launcher's files are not there for the workers; the code is (as a worker image holds the package)
    assert not isolation.sees(tmp_path) and not isolation.sees(store_inputs[0])
    assert isolation.sees(ROOT / "transforms" / "__init__.py")
    the_store = seaweed if store == "s3" else fakegcs
    bucket, inputs, done = converts(
        flags, the_store, engine, "out", ["h5", "npy", "zarr"], store_inputs, reference, tmp_path, seaweed, fakegcs
    )
    augments(flags, the_store, bucket, "out/h5", store_inputs, reference, tmp_path, seaweed, fakegcs)
    incremental_collection(flags, the_store, bucket, tmp_path, seaweed, fakegcs)
    if engine == "prism":  # the readers do not depend on the engine that wrote: once per store
        reads_in_place(bucket, inputs, done, the_store, seaweed, fakegcs)
