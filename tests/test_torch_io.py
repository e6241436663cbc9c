"""PyTorch readers of an output: reader.RandomAccess as a map-style dataset (scalar strings as Python bytes/str, so
default_collate batches them), reader.collate_varlen for shapes that vary, and reader.torch_description for the
`tfrecord` package. The docs' PyTorch recipe is run as written (extracted from docs/reading.md) when PyTorch is
installed; it is not in the test extras (PyPI's torch wheels pull the CUDA libraries: 3.0 GB to download).

``.ci/run_reader_test.sh`` runs this module in a venv with PyTorch (CPU) and the reader's install only (no Beam, no
TensorFlow: ``pip install .``): there the output is the one the project's venv converted
(TFRECORD_ETL_TORCH_OUTPUT, with the flags of :data:`MIXED_FLAGS`), the tests that convert or need the `tfrecord`
package skip, and a DataLoader with 2 workers reads it through the installed copy."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, convert
from tfrecord_etl.transforms import reader

ROWS = 120


def make_npz(path):
    """Strings (fixed-width bytes and UTF-8), floats, images, bools, one row per index."""
    rng = np.random.default_rng(3)
    data = {
        "image": rng.integers(0, 255, (ROWS, 6, 5, 3), dtype=np.uint8),
        "x": np.linspace(-1, 1, ROWS, dtype=np.float32),
        "w": np.arange(ROWS, dtype=np.float64) / 7,
        "flag": np.arange(ROWS) % 3 == 0,
        "code": np.array([b"c%03d" % i for i in range(ROWS)], dtype="S4"),
        "name": np.array([f"n\u00e9{i}" for i in range(ROWS)], dtype="U6"),
        "label": np.arange(ROWS, dtype=np.int16) - 60,
    }
    np.savez(path, **data)
    return data


MIXED_FLAGS = ("--provenance", "--num_shards", "2", "--index", "--splits", "train=4,test=1")
READER_ENV = os.environ.get("TFRECORD_ETL_TORCH_OUTPUT")  # set by .ci/run_reader_test.sh (the reader's venv)


def make_mixed(tmp) -> pathlib.Path:
    """Converts :func:`make_npz`'s arrays in ``tmp`` with :data:`MIXED_FLAGS`; returns the output directory."""
    tmp = pathlib.Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    make_npz(tmp / "in.npz")
    code, _, _ = convert(tmp / "in.npz", tmp / "out", *MIXED_FLAGS)
    assert code == 0
    return tmp / "out"


def needs_the_pipelines():
    pytest.importorskip("apache_beam", reason="converts: not in the reader's install (.ci/run_reader_test.sh)")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch")
    if READER_ENV:  # made by the project's venv, from the same seeded arrays
        return make_npz(tmp / "in.npz"), pathlib.Path(READER_ENV)
    return make_npz(tmp / "in.npz"), make_mixed(tmp)


def check_row(data, row, example):
    for name in ("image", "x", "w", "flag", "label"):
        np.testing.assert_array_equal(np.asarray(example[name]), data[name][row])
    assert example["code"] == data["code"][row].item() and example["name"] == data["name"][row].item()


def test_random_access_yields_python_bytes_and_str_for_scalar_strings(mixed):
    data, out = mixed
    ra = reader.RandomAccess(str(out), split="train")
    for i in (0, 1, len(ra) - 1):
        example = ra[i]
        row = int(example["_source/row"])
        assert type(example["code"]) is bytes and type(example["name"]) is str
        assert type(example["_source/file"]) is bytes and example["_source/file"].endswith(b"in.npz")
        assert isinstance(example["image"], np.ndarray) and example["image"].dtype == np.uint8
        assert example["flag"].dtype == np.bool_ and example["w"].dtype == np.float64
        check_row(data, row, example)
    got = reader.get(str(out), 0, split="test", features=["code", "name", "_source/row"])
    assert got["code"] == b"c%03d" % int(got["_source/row"]) and got["name"] == f"n\u00e9{int(got['_source/row'])}"


def test_a_shuffled_numpy_batching_of_random_access_reads_every_row_once(mixed):
    """The DataLoader's work without PyTorch: shuffled indices, batches of 16 through collate_varlen."""
    data, out = mixed
    ra = reader.RandomAccess(str(out), split="train")
    order = np.random.default_rng(0).permutation(len(ra))
    rows = []
    for start in range(0, len(ra), 16):
        batch = reader.collate_varlen([ra[int(i)] for i in order[start : start + 16]])
        assert batch["image"].shape == (len(batch["code"]), 6, 5, 3) and batch["flag"].dtype == np.bool_
        for k, row in enumerate(batch["_source/row"].tolist()):
            check_row(data, row, {name: values[k] for name, values in batch.items()})
            rows.append(row)
    test_rows = [int(e["_source/row"]) for e in reader.iter_numpy(str(out), split="test")]
    assert len(rows) == len(set(rows)) and sorted(rows + test_rows) == list(range(ROWS))


def test_collate_varlen_keeps_varying_shapes_as_lists(tmp_path):
    needs_the_pipelines()
    arrays = {
        "a": np.arange(6, dtype=np.int32).reshape(2, 3),
        "b": np.arange(4, dtype=np.int32),
        "c": np.ones((2, 3), np.int32),
    }
    np.savez(tmp_path / "m.npz", **arrays)
    assert convert(tmp_path / "m.npz", tmp_path / "out", "--npz_mode", "arrays")[0] == 0
    ra = reader.RandomAccess(str(tmp_path / "out"))
    batch = reader.collate_varlen([ra[i] for i in range(len(ra))], to_tensor=np.ascontiguousarray)
    assert batch["key"] == [b"a", b"b", b"c"] and isinstance(batch["array"], list)
    for name, got in zip(batch["key"], batch["array"]):
        name = name.decode()
        np.testing.assert_array_equal(got, arrays[name])
    same = reader.collate_varlen([ra[0], ra[2]])
    assert same["array"].shape == (2, 2, 3) and same["array"].dtype == np.int32
    with pytest.raises(ValueError, match="different features"):
        reader.collate_varlen([{"a": 1}, {"b": 1}])


# the decoding notes of reader.torch_description (docs/reading.md), applied by a process with the tfrecord package only
TFRECORD_DECODE = """
import json, sys
import numpy as np
from tfrecord.reader import tfrecord_loader
meta = json.load(open(sys.argv[1] + "/metadata.json"))
description = json.loads(sys.argv[2])
specs = {f["name"]: f for f in meta["features"]}
rows = {}
for shard in meta["shards"]:
    for e in tfrecord_loader(sys.argv[1] + "/" + shard["file"], sys.argv[1] + "/" + shard["index"], description):
        out = {}
        for name, x in e.items():
            spec = specs[name]
            if spec["encoding"] == "tensor":
                x = np.frombuffer(x, spec["dtype"]).reshape(spec["shape"])
            elif isinstance(x, bytes):
                x = x.decode("utf-8") if spec["dtype"].startswith("<U") else x.decode("latin-1")
            else:
                x = x.astype(spec["dtype"]).reshape(spec["shape"])
            out[name] = x.tolist() if isinstance(x, np.ndarray) else x
        rows[int(out["_source/row"])] = out
print(json.dumps(rows))
"""


def test_torch_description_reads_every_feature_with_the_tfrecord_package(mixed):
    import importlib.util

    if importlib.util.find_spec("tfrecord") is None:  # not imported here: its protos clash with TensorFlow's
        pytest.skip("the tfrecord package is in the test extras only")
    from tests.test_index import in_tfrecord_package

    data, out = mixed
    description = reader.torch_description(str(out))
    meta = json.loads((out / "metadata.json").read_text())
    assert description == {
        "image": "byte",
        "x": "float",
        "w": "byte",
        "flag": "int",
        "code": "byte",
        "name": "byte",
        "label": "int",
        "_source/file": "byte",
        "_source/row": "int",
    }
    assert {f["name"]: f["encoding"] for f in meta["features"]}["w"] == "tensor"  # float64: exact as tensor bytes
    rows = in_tfrecord_package(TFRECORD_DECODE, out, json.dumps(description))
    assert sorted(map(int, rows)) == list(range(ROWS))
    for row, example in rows.items():
        row = int(row)
        for name in ("image", "x", "w", "flag", "label"):
            np.testing.assert_array_equal(np.asarray(example[name], data[name].dtype), data[name][row])
        assert example["code"] == data["code"][row].decode() and example["name"] == data["name"][row]
    assert reader.torch_description(str(out), features=["x", "code"]) == {"x": "float", "code": "byte"}


def docs_recipe() -> str:
    """docs/reading.md's PyTorch map-style recipe, as written: the lines from `loader = torch.utils.data.DataLoader(` to
    the end of that statement."""
    lines = (ROOT / "docs" / "reading.md").read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("loader = torch.utils.data.DataLoader(")), None)
    assert start is not None, "docs/reading.md has no `loader = torch.utils.data.DataLoader(...)` recipe"
    for end in range(start + 1, min(start + 6, len(lines)) + 1):
        try:
            compile("\n".join(lines[start:end]), "docs/reading.md", "exec")
            return "\n".join(lines[start:end])
        except SyntaxError:
            continue
    raise AssertionError("docs/reading.md's DataLoader recipe is not a complete Python statement")


def test_the_docs_pytorch_recipe_runs_as_written(mixed, monkeypatch):
    torch = pytest.importorskip("torch", reason="PyTorch is not in the test extras (see the module docstring)")
    data, out = mixed
    recipe = docs_recipe()
    assert 'reader.RandomAccess("out/", split="train")' in recipe and "shuffle=True" in recipe
    monkeypatch.chdir(out.parent)  # the recipe's "out/"
    namespace = {"torch": torch, "reader": reader}
    exec(recipe, namespace)
    rows = []
    for batch in namespace["loader"]:
        assert isinstance(batch["image"], torch.Tensor) and batch["image"].dtype == torch.uint8
        assert isinstance(batch["code"], list) and isinstance(batch["name"], list)
        for k, row in enumerate(batch["_source/row"].tolist()):
            check_row(
                data, row, {name: (v[k].numpy() if isinstance(v, torch.Tensor) else v[k]) for name, v in batch.items()}
            )
            rows.append(row)
    assert len(rows) == len(set(rows)) == len(reader.RandomAccess(str(out), split="train"))
    loader = torch.utils.data.DataLoader(
        reader.RandomAccess(str(out), split="train"),
        batch_size=7,
        collate_fn=functools.partial(reader.collate_varlen, to_tensor=torch.as_tensor),
    )
    first = next(iter(loader))
    assert first["image"].shape == (7, 6, 5, 3) and first["flag"].dtype == torch.bool


# a DataLoader over RandomAccess with 2 worker processes in a fresh interpreter outside the checkout (the installed
# copy); asserts every value against the converted arrays and prints what it saw
DATALOADER = """
import importlib.util, json, sys
import numpy as np
import torch
import tfrecord_etl
from tfrecord_etl.transforms import reader

expected = np.load(sys.argv[2])


class Tagged(torch.utils.data.Dataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return {**self.dataset[i], "worker": torch.utils.data.get_worker_info().id}


loader = torch.utils.data.DataLoader(Tagged(reader.RandomAccess(sys.argv[1], split="train")), batch_size=8,
                                     shuffle=True, num_workers=2)
rows, workers = [], set()
for batch in loader:
    assert batch["image"].dtype == torch.uint8 and batch["flag"].dtype == torch.bool
    assert batch["w"].dtype == torch.float64 and batch["x"].dtype == torch.float32
    for k, row in enumerate(batch["_source/row"].tolist()):
        for name in ("image", "x", "w", "flag", "label"):
            got = batch[name][k].numpy()
            assert got.dtype == expected[name].dtype and np.array_equal(got, expected[name][row]), (name, row)
        assert batch["code"][k] == expected["code"][row].item() and batch["name"][k] == expected["name"][row].item()
        rows.append(row)
    workers.update(batch["worker"].tolist())
deps = ("apache_beam", "tensorflow", "tfx_bsl", "pyarrow", "h5py", "pydantic", "yaml", "scipy")
print(json.dumps({"rows": rows, "workers": sorted(workers), "module": tfrecord_etl.__file__,
                  "installed": [d for d in deps if importlib.util.find_spec(d) is not None],
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in deps)}))
"""


def test_a_dataloader_with_2_workers_reads_every_row_exactly(mixed, tmp_path):
    """In .ci/run_reader_test.sh's venv: PyTorch and ``pip install .`` only, the installed copy."""
    pytest.importorskip("torch", reason="PyTorch is not in the test extras (see the module docstring)")
    data, out = mixed
    np.savez(tmp_path / "expected.npz", **data)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(
        [sys.executable, "-c", DATALOADER, str(out), str(tmp_path / "expected.npz")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(seen["rows"]) == sorted({int(e["_source/row"]) for e in reader.iter_numpy(str(out), split="train")})
    assert len(seen["rows"]) == len(set(seen["rows"])) and seen["workers"] == [0, 1]
    assert seen["loaded"] == []
    if READER_ENV:  # the reader's install: nothing of the pipelines installed, the copy in site-packages
        assert seen["installed"] == [] and "site-packages" in seen["module"], seen
