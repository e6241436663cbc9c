"""The light reader: reading an output (reader.RandomAccess, iter_numpy, get, verify's checks, the verify and inspect
commands) with NumPy and google-crc32c alone, as after ``pip install .`` without the ``beam`` extra.

Each check runs in a fresh interpreter whose imports of anything but the standard library, NumPy, google-crc32c and
tfrecord_etl fail as for a package that is not installed (a meta path finder raising ModuleNotFoundError first), so
Beam, TensorFlow, tfx-bsl, pyarrow, h5py, pydantic, PyYAML ... are absent; the remote reads allow boto3 or
google-cloud-storage and still block Beam and the rest. The output is made by this suite's convert (Beam) and read
back exactly against the arrays converted. ``.ci/run_reader_test.sh`` does the same in a real venv with PyTorch and
the reader's install only, through a DataLoader with 2 workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, convert
from tests.test_s3 import s3  # noqa: F401 - the moto S3 server fixture
from tests.test_torch_io import ROWS, make_npz
from tfrecord_etl._install import pip_install

PIPELINE_DEPS = (
    "apache_beam",
    "tensorflow",
    "tfx_bsl",
    "tensorflow_metadata",
    "pyarrow",
    "h5py",
    "hdf5plugin",
    "pydantic",
    "yaml",
    "scipy",
    "tqdm",
    "tensorflow_datasets",
    "grain",
    "torch",
    "tfrecord",
)

# prepended to every child script: ALLOW=None admits the standard library, numpy, google_crc32c and tfrecord_etl
# only; else every top-level name but those of BLOCK
BLOCKER = """
import importlib.abc, sys
STRICT = {strict!r}
BLOCK = set({block!r})
ALLOW = set(sys.stdlib_module_names) | {{"numpy", "google_crc32c", "tfrecord_etl"}}

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if (top not in ALLOW) if STRICT else (top in BLOCK):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""

# reads TARGET (local, s3:// or gs://) back against the arrays of EXPECTED (.npz); prints a JSON summary
CHECK = """
import json, sys
import numpy as np
from tfrecord_etl.transforms import reader, verify

target, expected = sys.argv[1], np.load(sys.argv[2])

def same(row, example):
    for name in ("image", "x", "w", "flag", "label"):
        got = np.asarray(example[name])
        assert got.dtype == expected[name].dtype and np.array_equal(got, expected[name][row]), (name, row)
    assert example["code"] == expected["code"][row].item(), row
    assert example["name"] == expected["name"][row].item(), row

random_access = sys.argv[3] == "random"
ra = reader.RandomAccess(target, split="train") if random_access else []
train = []
for i in range(len(ra)):
    example = ra[i]
    assert type(example["code"]) is bytes and type(example["name"]) is str
    same(int(example["_source/row"]), example)
    train.append(int(example["_source/row"]))
streamed = []
for split in ("train", "test"):
    for example in reader.iter_numpy(target, split=split):
        same(int(example["_source/row"]), example)
        streamed.append(int(example["_source/row"]))
if random_access:
    one = reader.get(target, 2, split="test", features=["name", "_source/row"])
    assert one["name"] == expected["name"][int(one["_source/row"])].item()
report = verify.verify(target)
print(json.dumps({"train": train, "streamed": streamed, "ok": report.ok, "records": report.num_records,
                  "problems": [str(p) for p in report.problems],
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in PIPELINE_DEPS)}))
"""


def run_light(script: str, *args, strict: bool = True, env: dict | None = None, cwd=None):
    """Runs ``script`` in a fresh interpreter without the pipeline dependencies (:data:`BLOCKER`); returns the
    CompletedProcess (text)."""
    code = BLOCKER.format(strict=strict, block=PIPELINE_DEPS) + f"PIPELINE_DEPS = {PIPELINE_DEPS!r}\n" + script
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=cwd or ROOT,
        timeout=300,
    )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Two outputs of strings (fixed-width bytes, UTF-8), floats (float32 lists, float64 tensors), images (uint8),
    bools and int16 in train/test splits, {"random": uncompressed with index files, "gzip": gzip-compressed}; and
    the .npz they were converted from."""
    tmp = tmp_path_factory.mktemp("light")
    make_npz(tmp / "in.npz")
    flags = {"random": ["--index"], "gzip": ["--compression", "gzip"]}
    for name, extra in flags.items():
        code, _, _ = convert(
            tmp / "in.npz", tmp / name, "--provenance", "--num_shards", "2", "--splits", "train=4,test=1", *extra
        )
        assert code == 0
    return {name: tmp / name for name in flags}, tmp / "in.npz"


@pytest.fixture
def output(outputs):
    """The uncompressed output with index files, and the .npz."""
    return outputs[0]["random"], outputs[1]


def check_summary(result, random_access: bool = True) -> dict:
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["loaded"] == []  # none of the pipeline dependencies was imported
    assert sorted(summary["streamed"]) == list(range(ROWS)) and len(summary["train"]) == len(set(summary["train"]))
    if random_access:
        assert set(summary["train"]) < set(summary["streamed"]) and len(summary["train"]) > ROWS // 2
    assert summary["ok"] and summary["records"] == ROWS, summary["problems"]
    return summary


@pytest.mark.parametrize("kind", ["random", "gzip"])
def test_the_reader_imports_and_reads_exactly_with_numpy_and_crc32c_alone(outputs, kind):
    """Before: ``from tfrecord_etl.transforms import reader`` -> ModuleNotFoundError: No module named 'apache_beam'
    (reader -> collection_reader -> collection -> fileio -> apache_beam), then pyarrow (the codec)."""
    out, npz = outputs[0][kind], outputs[1]
    check_summary(run_light(CHECK, out, npz, "random" if kind == "random" else "stream"), kind == "random")


def test_verify_finds_a_corrupt_shard_without_beam(outputs, tmp_path):
    """verify's checks are real without Beam: one flipped byte in a copy of a gzip shard is a failed CRC."""
    import shutil

    out = outputs[0]["gzip"]
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    shard = sorted(bad.glob("data-train.tfrecord-*"))[0]
    raw = bytearray(shard.read_bytes())
    import gzip

    body = bytearray(gzip.decompress(bytes(raw)))
    body[40] ^= 0xFF
    shard.write_bytes(gzip.compress(bytes(body), mtime=0))
    result = run_light(
        "from tfrecord_etl.transforms import verify\nr = verify.verify(sys.argv[1])\n"
        "print(r.ok, r.num_problems)\nprint(r.problems[0])\n",
        bad,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ok, count = result.stdout.splitlines()[0].split()
    assert ok == "False" and int(count) >= 1
    assert shard.name in result.stdout


def test_schema_and_metadata_that_disagree_are_refused_without_protobuf(outputs, tmp_path):
    """The reader-only install (no protobuf, no tensorflow_metadata) compares schema.pbtxt with metadata.json too:
    'w' (float64, a tensor feature) edited to <i8 in metadata.json is refused by the reader, and verify reports it
    with its text parser; before, the reader decoded int64 garbage and verify said OK."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(outputs[0]["random"], bad)
    meta = json.loads((bad / "metadata.json").read_text())
    (w,) = [f for f in meta["features"] if f["name"] == "w"]
    assert w["dtype"] == "<f8" and w["encoding"] == "tensor"
    w["dtype"] = "<i8"
    (bad / "metadata.json").write_text(json.dumps(meta))
    script = """
import json
from tfrecord_etl.transforms import reader, verify
from tfrecord_etl.transforms.errors import SchemaError
try:
    next(reader.iter_numpy(sys.argv[1]))
    refused = None
except SchemaError as e:
    refused = e.message
r = verify.verify(sys.argv[1])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in PIPELINE_DEPS or m.startswith("google.protobuf"))
print(json.dumps({"refused": refused, "ok": r.ok, "schema": r.schema, "problems": [p.describe() for p in r.problems],
                  "loaded": loaded}))
"""
    result = run_light(script, bad)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["loaded"] == []
    assert summary["refused"] == (
        "schema.pbtxt and metadata.json disagree: feature 'w': its tfrecord_etl.dtype tag "
        "is <f8 in schema.pbtxt, <i8 in metadata.json"
    )
    assert not summary["ok"] and summary["schema"] == "text"
    assert [p for p in summary["problems"] if p.startswith("[schema]")] == [
        f"[schema] {bad}/schema.pbtxt, feature 'w': its tfrecord_etl.dtype tag is <f8 in schema.pbtxt, <i8 in "
        "metadata.json; one of the two files was edited or replaced after the output was written: convert it again"
    ]


def test_the_commands_without_the_pipeline_dependencies(output, tmp_path):
    """verify and inspect run; convert, augment and verify --source fail with one line saying what to install (exit
    status 2)."""
    out, npz = output
    script = "from tfrecord_etl.pipelines import cli\nsys.exit(cli.main(sys.argv[1:]))\n"
    result = run_light(script, "verify", out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"OK: {out}: output, {ROWS} records in 4 files, compression none")
    result = run_light(script, "inspect", out)
    assert result.returncode == 0 and "name: <U6" in result.stdout, result.stderr[-3000:]
    result = run_light(script, "verify", out, "--source", npz)  # comparing with the inputs reads them: h5py, ...
    assert result.returncode == 2 and result.stderr.startswith(
        "error: tfrecord-etl verify needs the pipeline dependencies ("
    ), result.stderr[-3000:]
    assert result.stderr.endswith(f"is not installed): {pip_install('beam')}\n")
    for command in ("convert", "augment"):
        result = run_light(script, command, "--input", npz, "--output_dir", tmp_path / "never")
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr == (
            f"error: tfrecord-etl {command} needs the pipeline dependencies (apache_beam is not "
            f"installed): {pip_install('beam')}\n"
        )
    assert not (tmp_path / "never").exists()


def test_writing_without_beam_says_what_to_install(tmp_path):
    result = run_light(
        "from tfrecord_etl.transforms.storage import fileio\nfileio.write_bytes(sys.argv[1], b'x')\n", tmp_path / "f"
    )
    assert result.returncode == 1 and not (tmp_path / "f").exists()
    assert result.stderr.strip().splitlines()[-1] == (
        f"ImportError: Writing {tmp_path / 'f'} needs Apache Beam: {pip_install('beam')} (reading needs "
        "only NumPy and google-crc32c)"
    )


def test_lightfs_paths_follow_beams_filesystems(tmp_path):
    """join, split and pattern matching as Beam's LocalFileSystem / GCSFileSystem / S3FileSystem do them."""
    from apache_beam.io.filesystems import FileSystems

    from tfrecord_etl.transforms.storage import lightfs

    for path in ("gs://b/a/c.txt", "s3://b/x", "gs://b/", "s3://b/dir/", str(tmp_path / "f"), "rel/f", "f"):
        assert lightfs.split(path) == FileSystems.split(path), path
    for base, parts in (("gs://b", ("a", "c")), ("s3://b/d/", ("/e",)), (str(tmp_path), ("a", "b")), ("x", ("y",))):
        assert lightfs.join(base, *parts) == FileSystems.join(base, *parts)
    (tmp_path / "d" / "e").mkdir(parents=True)
    for name in ("a.tfrecord", "b.tfrecord", "d/c.tfrecord", "d/e/f.tfrecord", "[x].gz"):
        (tmp_path / name).write_bytes(b"12345")
    for pattern in ("*.tfrecord", "d/*", "**/*.tfrecord", "[ab].tfrecord", "[!a]*", "?.tfrecord"):
        pattern = str(tmp_path / pattern)
        beam = sorted(
            (m.path, m.size_in_bytes) for m in FileSystems.match([pattern])[0].metadata_list if os.path.isfile(m.path)
        )
        assert sorted(lightfs.match(pattern)) == beam, pattern
    import re

    for pattern, path, hit in (
        ("gs://b/d/*.gz", "gs://b/d/x.gz", True),
        ("gs://b/d/*.gz", "gs://b/d/e/x.gz", False),
        ("gs://b/**.gz", "gs://b/d/e/x.gz", True),
        ("s3://b/[!x]?", "s3://b/ab", True),
        ("s3://b/[!x]?", "s3://b/xb", False),
        ("s3://b/a.b", "s3://b/aXb", False),
    ):
        assert bool(re.match(lightfs.translate_pattern(pattern), path)) is hit, (pattern, path)
        assert bool(re.match(FileSystems.get_filesystem(pattern).translate_pattern(pattern), path)) is hit


def test_s3_reads_without_beam(output, s3):
    """s3:// through boto3 (its endpoint from AWS_ENDPOINT_URL_S3), with Beam and the rest blocked."""
    client, flags = s3
    out, npz = output
    for path in sorted(out.iterdir()):
        client.put_object(Bucket="etl-test", Key=f"light/out/{path.name}", Body=path.read_bytes())
    endpoint = next(f.split("=", 1)[1] for f in flags if f.startswith("--s3_endpoint_url="))
    env = {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    check_summary(run_light(CHECK, "s3://etl-test/light/out", npz, "random", strict=False, env=env))


def test_gcs_reads_without_beam(output):
    """gs:// through google-cloud-storage (an anonymous client on STORAGE_EMULATOR_HOST), Beam and the rest
    blocked."""
    from tests import gcs_emulator

    out, npz = output
    with gcs_emulator.server("light") as port:
        url = f"http://127.0.0.1:{port}"
        with gcs_emulator.emulator_host(url):
            from google.cloud import storage

            bucket = storage.Client.create_anonymous_client().bucket("light")
            for path in sorted(out.iterdir()):
                bucket.blob(f"out/{path.name}").upload_from_string(path.read_bytes())
        env = {"STORAGE_EMULATOR_HOST": url, "GOOGLE_APPLICATION_CREDENTIALS": "", "GOOGLE_CLOUD_PROJECT": "p"}
        check_summary(run_light(CHECK, "gs://light/out", npz, "random", strict=False, env=env))
