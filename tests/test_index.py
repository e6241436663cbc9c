"""--index: a tfrecord2idx index file beside each shard, read by the `tfrecord` package's multi-worker path
(what its PyTorch TFRecordDataset runs in each DataLoader worker) and by reader.RandomAccess / reader.get."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import convert
from tests.test_convert import assert_same, make_h5
from tfrecord_etl.pipelines import verify as verify_module
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import ConfigError, RecordError
from tfrecord_etl.transforms.output import tfrecord


@pytest.fixture(scope="module", params=["planned", "beam"])
def indexed(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("idx")
    data = make_h5(tmp / "in.h5", rows=300)
    out = tmp / "out"
    code, _, _ = convert(
        tmp / "in.h5",
        out,
        "--provenance",
        "--num_shards",
        "3",
        "--target_range_mb",
        "0.01",
        "--writer",
        request.param,
        "--index",
    )
    assert code == 0
    return data, out


def in_tfrecord_package(script: str, *args):
    """Runs ``script`` with the `tfrecord` package in a fresh interpreter (its example_pb2 registers the same proto
    names as TensorFlow's, so the two cannot share a process; a PyTorch user does not load TensorFlow) and returns
    what it prints as JSON."""
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def tfrecord2idx(path) -> str:
    """The index the tfrecord package's own tool writes for ``path``."""
    return in_tfrecord_package(
        "import io, json, sys, tempfile\n"
        "from tfrecord.tools.tfrecord2idx import create_index\n"
        "with tempfile.NamedTemporaryFile('r') as f:\n"
        "    create_index(sys.argv[1], f.name)\n"
        "    print(json.dumps(open(f.name).read()))\n",
        path,
    )


# each DataLoader worker of the package's TFRecordDataset calls tfrecord_loader(..., shard=(worker, workers))
LOADER = """
import json, sys
from tfrecord.reader import tfrecord_loader
data, index, workers = sys.argv[1], (None if sys.argv[2] == "-" else sys.argv[2]), int(sys.argv[3])
rows = [int(e["_source/row"][0]) for w in range(workers)
        for e in tfrecord_loader(data, index, {"_source/row": "int"}, shard=(w, workers) if index else None)]
print(json.dumps(rows))
"""


def test_index_files_match_tfrecord2idx_and_are_listed(indexed):
    _, out = indexed
    meta = json.loads((out / "metadata.json").read_text())
    assert [s["index"] for s in meta["shards"]] == [f"data-{i:05d}-of-00003.idx" for i in range(3)]
    for shard in meta["shards"]:
        text = (out / shard["index"]).read_text()
        assert text == tfrecord2idx(out / shard["file"])
        assert len(text.splitlines()) == shard["records"]
    assert sorted(p.name for p in out.glob("[!.]*.tfrecord*")) == [s["file"] for s in meta["shards"]]


def test_tfrecord_package_workers_read_every_record_once(indexed):
    _, out = indexed
    meta = json.loads((out / "metadata.json").read_text())
    seen = []
    for shard in meta["shards"]:
        rows = in_tfrecord_package(LOADER, out / shard["file"], out / shard["index"], 2)
        assert len(rows) == shard["records"] == len(set(rows))
        seen += rows
    assert sorted(seen) == list(range(300))
    # without the index, each worker reads the whole shard: the records twice (the measurement)
    shard = meta["shards"][0]
    assert len(in_tfrecord_package(LOADER, out / shard["file"], "-", 2)) == 2 * shard["records"]


def test_random_access_returns_the_exact_rows(indexed):
    data, out = indexed
    ra = reader.RandomAccess(str(out))
    assert len(ra) == 300
    in_order = list(reader.iter_numpy(str(out)))
    for i in (0, 1, 99, 100, 101, 199, 200, 299, -1, -300):
        example = ra[i]
        assert ra.record(i) and example.keys() == in_order[i].keys()
        row = int(example["_source/row"])
        assert row == int(in_order[i]["_source/row"])  # the beam writer's record order is its own
        for name in ("images", "meta/labels", "meta/z", "table/pos"):
            assert_same(data[name][row], example[name])
        assert example["names"] == data["names"][row]
    assert int(reader.get(str(out), 123, features=["_source/row"])["_source/row"]) == int(in_order[123]["_source/row"])
    assert sorted(int(ra[i]["_source/row"]) for i in range(300)) == list(range(300))
    with pytest.raises(IndexError, match="record 300 of an output of 300 records"):
        ra[300]


def test_grain_reads_random_access_as_a_data_source(indexed):
    """Grain's MapDataset over reader.RandomAccess: a seeded shuffle and batches, every record exactly once."""
    import grain

    _, out = indexed
    in_order = {int(e["_source/row"]): e for e in reader.iter_numpy(str(out))}
    ds = grain.MapDataset.source(reader.RandomAccess(str(out))).shuffle(seed=7).batch(64)
    rows = []
    for batch in ds:
        for i, row in enumerate(batch["_source/row"].tolist()):
            np.testing.assert_array_equal(batch["images"][i], in_order[row]["images"])
            assert batch["table/tag"][i] == in_order[row]["table/tag"]
            rows.append(row)
    assert sorted(rows) == list(range(300)) and rows != sorted(rows)


def test_random_access_without_index_scans_the_headers(tmp_path):
    make_h5(tmp_path / "in.h5", rows=100)
    assert convert(tmp_path / "in.h5", tmp_path / "out", "--provenance", "--num_shards", "2")[0] == 0
    assert not list((tmp_path / "out").glob("*.idx"))
    ra = reader.RandomAccess(str(tmp_path / "out"))
    assert [int(ra[i]["_source/row"]) for i in range(50)] == list(range(50))
    assert convert(tmp_path / "in.h5", tmp_path / "gz", "--compression", "gzip")[0] == 0
    with pytest.raises(ConfigError, match="Random access needs uncompressed shards; these are gzip"):
        reader.RandomAccess(str(tmp_path / "gz"))


def test_index_is_refused_with_compression(tmp_path, capsys):
    make_h5(tmp_path / "in.h5", rows=100)
    code, _, err = convert(tmp_path / "in.h5", tmp_path / "out", "--index", "--compression", "gzip", capsys=capsys)
    assert code != 0 and "--index cannot be combined with --compression gzip" in err
    assert not (tmp_path / "out").exists()


def test_a_tampered_index_is_caught_by_the_reader_and_verify(tmp_path, capsys):
    make_h5(tmp_path / "in.h5", rows=100)
    out = tmp_path / "out"
    assert convert(tmp_path / "in.h5", out, "--num_shards", "1", "--index")[0] == 0
    idx = out / "data-00000-of-00001.idx"
    lines = idx.read_text().splitlines()
    original = list(lines)
    offset, length = map(int, lines[5].split())
    lines[5], lines[6] = f"{offset} {length}", f"{offset + length + 1} {length}"  # record 6 one byte late
    idx.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match="Index line 7: record at byte"):
        reader.RandomAccess(str(out))[6]
    code, stdout, _ = verify_module_run(out, capsys)
    assert code == 1 and "[index]" in stdout and "Index line 7" in stdout
    idx.write_text("\n".join(original[:-1]) + "\n")  # a record missing from the index
    with pytest.raises(RecordError, match="Index of 99 records ending at byte .* does not match the shard"):
        reader.RandomAccess(str(out))[0]
    code, stdout, _ = verify_module_run(out, capsys)
    assert code == 1 and "Index lists 99 records, the shard holds 100" in stdout


def verify_module_run(out, capsys):
    from tests.conftest import run_command

    return run_command(verify_module.main, [str(out)], capsys)


def test_rerun_replaces_our_index_files_and_verify_knows_them(tmp_path, capsys):
    make_h5(tmp_path / "in.h5", rows=100)
    out = tmp_path / "out"
    assert convert(tmp_path / "in.h5", out, "--num_shards", "2", "--index")[0] == 0
    code, stdout, _ = verify_module_run(out, capsys)
    assert code == 0 and "not listed in metadata.json" not in stdout
    # a rerun without --index removes the index files of the earlier run (they are ours)
    code, _, err = convert(tmp_path / "in.h5", out, "--num_shards", "2", "--overwrite", capsys=capsys)
    assert code == 0 and "data-00000-of-00002.idx" in err
    assert not list(out.glob("*.idx"))


def test_index_text_and_parse_index_round_trip():
    lengths = np.array([0, 5, 1000, 3], np.int64)
    text = tfrecord.index_text(lengths)
    assert text == b"0 16\n16 21\n37 1016\n1053 19\n"
    offsets, frames = tfrecord.parse_index(text)
    assert offsets.tolist() == [0, 16, 37, 1053] and frames.tolist() == [16, 21, 1016, 19]
    assert tfrecord.index_name("data-00001-of-00004.tfrecord") == "data-00001-of-00004.idx"
    assert tfrecord.index_name("mnist-train.tfrecord-00000-of-00001") == "mnist-train.idx-00000-of-00001"
    with pytest.raises(RecordError, match="Index line 2 is not 'offset length'"):
        tfrecord.parse_index(b"0 16\n16\n")
