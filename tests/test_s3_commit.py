"""The commit protocol on an object store (a moto S3 server): a replaced output is staged beside the old one; the
lock is created with a conditional write (``If-None-Match: *``), so of two launchers exactly one gets it; and
``metadata.json`` is committed with ``If-Match`` on the version the run started from, so a run whose directory
another run committed meanwhile commits nothing."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.test_s3 import BUCKET, convert, keys, s3  # noqa: F401 - the moto server fixture
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.output import metadata, outdir, runlock
from tfrecord_etl.transforms.storage import conditional


def make_h5(path, start, rows=300):
    with h5py.File(path, "w") as f:
        f["id"] = np.arange(start, start + rows, dtype="<i8")
    return path


def ids(out):
    return [int(e["id"]) for e in reader.iter_numpy(out)]


def test_overwrite_on_s3_is_staged_and_deletes_the_old_objects_after_the_commit(s3, tmp_path):
    client, flags = s3
    out = f"s3://{BUCKET}/staged/out"
    run = ["--num_shards", "2", "--runner=DirectRunner", "--direct_running_mode=in_memory", *flags]
    assert convert(["--input", make_h5(tmp_path / "a.h5", 0), "--output_dir", out, *run])[0] == 0
    code, _, err = convert(["--input", make_h5(tmp_path / "b.h5", 1000), "--output_dir", out, "--overwrite", *run])
    assert code == 0, err
    assert ids(out) == list(range(1000, 1300))
    names = [k.rsplit("/", 1)[1] for k in keys(client, "staged/out/")]
    assert sorted(names) == sorted(
        [
            "data-g1-00000-of-00002.tfrecord",
            "data-g1-00001-of-00002.tfrecord",
            "metadata.json",
            "schema.pbtxt",
            outdir.MARKER_FILE,
        ]
    )


def test_the_lock_on_s3_is_created_once(s3, tmp_path):
    client, flags = s3
    from tests.conftest import run_command  # noqa: F401 - the filesystems get the flags from run_main
    from tfrecord_etl.pipelines import common

    common.configure_filesystems(flags)
    path = f"s3://{BUCKET}/locked/{runlock.LOCK_FILE}"
    assert runlock._create(path, b'{"run_id": "first"}') is True
    assert runlock._create(path, b'{"run_id": "second"}') is False  # If-None-Match: * refused it
    assert json.loads(client.get_object(Bucket=BUCKET, Key=f"locked/{runlock.LOCK_FILE}")["Body"].read()) == {
        "run_id": "first"
    }
    first = runlock.Lock(f"s3://{BUCKET}/locked2", "a").acquire()
    try:
        with pytest.raises(ConfigError, match="Another run"):
            runlock.Lock(f"s3://{BUCKET}/locked2", "b").acquire()
    finally:
        first.release()
    assert not keys(client, "locked2/")


def test_a_run_whose_directory_another_run_committed_meanwhile_commits_nothing(s3, tmp_path, monkeypatch, capsys):
    client, flags = s3
    out = f"s3://{BUCKET}/race/out"
    run = ["--num_shards", "2", "--runner=DirectRunner", "--direct_running_mode=in_memory", *flags]
    assert convert(["--input", make_h5(tmp_path / "a.h5", 0), "--output_dir", out, *run])[0] == 0
    original = metadata.write
    theirs = client.get_object(Bucket=BUCKET, Key="race/out/metadata.json")["Body"].read()
    theirs = theirs.replace(b'"rows_read"', b'"committed_by": "another run",\n "rows_read"')

    def another_run_commits_first(output_dir, meta, specs, expected_version=None):
        assert expected_version not in (None, conditional.ABSENT)  # the version this run started from
        client.put_object(Bucket=BUCKET, Key="race/out/metadata.json", Body=theirs)
        return original(output_dir, meta, specs, expected_version)

    monkeypatch.setattr(metadata, "write", another_run_commits_first)
    from tests.conftest import run_command
    from tfrecord_etl.pipelines import convert as convert_module

    code, _, err = run_command(
        convert_module.main,
        ["--input", make_h5(tmp_path / "b.h5", 1000), "--output_dir", out, "--overwrite", *run],
        capsys,
    )
    assert code == 2 and "Another run committed this output directory while this run wrote it" in err, err
    body = client.get_object(Bucket=BUCKET, Key="race/out/metadata.json")["Body"].read()
    assert body == theirs  # the other run's commit stands
    assert ids(out) == list(range(300))  # and lists its own shards, all still there
