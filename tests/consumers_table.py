"""Which reader loads an output of each compression: every consumer installed here is run on one small output
converted with ``--compression none``, ``gzip`` and ``zlib``, and must read every record with its exact values.

    python -m tests.consumers_table        # runs them all and prints the Markdown table of docs/reading.md

``tests/test_consumers.py`` checks each cell against :data:`EXPECTED` and that docs/reading.md holds
``markdown(EXPECTED)``, so the table, the tests and the readers' behaviour cannot drift apart.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import shutil
import subprocess
import sys
import zlib

import numpy as np

COMPRESSIONS = ("none", "gzip", "zlib")
ROWS = 60

# consumer -> compression -> "yes", or "no: <exception type>" as the consumer fails on it
EXPECTED = {
    "tf.data `TFRecordDataset(compression_type=...)`": {"none": "yes", "gzip": "yes", "zlib": "yes"},
    "Beam `ReadFromTFRecord` (compression AUTO)": {"none": "yes", "gzip": "yes", "zlib": "yes"},
    "TFXIO `TFExampleRecord(...).TensorFlowDataset` (tfx-bsl 1.21)": {
        "none": "yes",
        "gzip": "yes",
        "zlib": "no: DataLossError",
    },
    "`tfrecord` package `tfrecord_loader` (PyTorch `TFRecordDataset`)": {
        "none": "yes",
        "gzip": "yes",
        "zlib": "no: ValueError",
    },
    "TFDS `builder_from_directory` (4.9.10)": {"none": "yes", "gzip": "no: DataLossError", "zlib": "no: DataLossError"},
    "`reader.iter_numpy`, `reader.to_tf_dataset`": {"none": "yes", "gzip": "yes", "zlib": "yes"},
    "`reader.RandomAccess` / `reader.get` (PyTorch map-style, Grain)": {
        "none": "yes",
        "gzip": "no: ConfigError",
        "zlib": "no: ConfigError",
    },
}
NOT_TESTED = {
    "Ray `read_tfrecords`": "not tested here: Ray is not installed (a large install for one check); "
    "its TFRecord reader is known to fail on zlib shards"
}


def make_outputs(tmp: pathlib.Path) -> dict[str, pathlib.Path]:
    """Converts one .npz (``x`` float32, ``code`` fixed-width bytes, provenance) with each compression, and with
    ``--tfds_name`` (then compresses copies of that TFDS directory's shards in place: convert refuses
    ``--tfds_name`` with ``--compression``). Returns ``{"none": dir, ..., "tfds-none": dir, ...}``."""
    from tests.conftest import convert

    np.savez(
        tmp / "in.npz",
        x=np.arange(ROWS, dtype=np.float32) / 4,
        code=np.array([b"c%03d" % i for i in range(ROWS)], dtype="S4"),
    )
    outs = {}
    for compression in COMPRESSIONS:
        outs[compression] = tmp / compression
        assert (
            convert(
                tmp / "in.npz", outs[compression], "--provenance", "--num_shards", "2", "--compression", compression
            )[0]
            == 0
        )
    outs["tfds-none"] = tmp / "tfds-none"
    assert (
        convert(tmp / "in.npz", outs["tfds-none"], "--provenance", "--num_shards", "2", "--tfds_name", "consumers")[0]
        == 0
    )
    for compression, pack in (("gzip", gzip.compress), ("zlib", zlib.compress)):
        outs[f"tfds-{compression}"] = tmp / f"tfds-{compression}"
        shutil.copytree(outs["tfds-none"], outs[f"tfds-{compression}"])
        for shard in json.loads((outs["tfds-none"] / "metadata.json").read_text())["shards"]:
            path = outs[f"tfds-{compression}"] / shard["file"]
            path.write_bytes(pack(path.read_bytes()))
    return outs


def _shards(out: pathlib.Path) -> list[str]:
    return [str(out / s["file"]) for s in json.loads((out / "metadata.json").read_text())["shards"]]


def _check(rows: list[int], xs: list[float]) -> None:
    """Every record once, with its exact ``x``."""
    assert sorted(rows) == list(range(ROWS)), sorted(rows)[:10]
    assert dict(zip(rows, xs)) == {r: r / 4 for r in range(ROWS)}


def tf_data(out, compression):
    import tensorflow as tf

    spec = {"_source/row": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([], tf.float32)}
    ds = tf.data.TFRecordDataset(
        _shards(out), compression_type={"none": "", "gzip": "GZIP", "zlib": "ZLIB"}[compression]
    ).map(lambda r: tf.io.parse_single_example(r, spec))
    parsed = [(int(e["_source/row"]), float(e["x"])) for e in ds.as_numpy_iterator()]
    _check(*zip(*parsed))


def _example_values(serialized: bytes) -> tuple[int, float]:
    import tensorflow as tf

    e = tf.train.Example.FromString(serialized).features.feature
    return e["_source/row"].int64_list.value[0], e["x"].float_list.value[0]


def beam_read(out, compression):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that

    from tests.conftest import BEAM_FLAGS

    with beam.Pipeline(options=PipelineOptions(BEAM_FLAGS)) as p:
        values = p | beam.io.ReadFromTFRecord(str(out / "data-*")) | beam.Map(_example_values)
        assert_that(values, lambda got: _check(*zip(*got)))


def tfxio(out, compression):
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.public import tfxio as tfxio_lib

    schema = text_format.Parse((out / "schema.pbtxt").read_text(), schema_pb2.Schema())
    source = tfxio_lib.TFExampleRecord(_shards(out), schema=schema)
    ds = source.TensorFlowDataset(tfxio_lib.TensorFlowDatasetOptions(batch_size=16, shuffle=False, num_epochs=1))
    rows, xs = [], []
    for batch in ds.as_numpy_iterator():
        rows += np.asarray(batch["_source/row"]).ravel().tolist()
        xs += np.asarray(batch["x"]).ravel().tolist()
    _check(rows, xs)


# in a fresh interpreter: the package's example_pb2 cannot share a process with TensorFlow's
TFRECORD_PACKAGE = """
import json, sys
from tfrecord.reader import tfrecord_loader
compression = {"none": None, "gzip": "gzip", "zlib": "zlib"}[sys.argv[1]]
try:
    got = [(int(e["_source/row"][0]), float(e["x"][0])) for path in sys.argv[2:]
           for e in tfrecord_loader(path, None, {"_source/row": "int", "x": "float"}, compression_type=compression)]
    print(json.dumps({"rows": got}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)[:200]}))
"""


class ConsumerError(Exception):
    """A consumer's failure in another process: ``args[0]`` is its exception type's name."""


def tfrecord_package(out, compression):
    result = json.loads(
        subprocess.run(
            [sys.executable, "-c", TFRECORD_PACKAGE, compression, *_shards(out)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    if "error" in result:
        raise ConsumerError(result["error"], result["message"])
    _check(*zip(*result["rows"]))


def tfds(out, compression):
    import tensorflow_datasets as tfds_lib

    ds = tfds_lib.builder_from_directory(str(out)).as_dataset(split="train")
    got = [(int(e["_source"]["row"]), float(e["x"])) for e in tfds_lib.as_numpy(ds)]
    _check(*zip(*got))


def our_readers(out, compression):
    from tfrecord_etl.transforms import reader

    got = [(int(e["_source/row"]), float(e["x"])) for e in reader.iter_numpy(str(out))]
    _check(*zip(*got))
    got = [(int(e["_source/row"]), float(e["x"])) for e in reader.to_tf_dataset(str(out)).as_numpy_iterator()]
    _check(*zip(*got))


def random_access(out, compression):
    from tfrecord_etl.transforms import reader

    ra = reader.RandomAccess(str(out))
    _check(*zip(*[(int(ra[i]["_source/row"]), float(ra[i]["x"])) for i in range(len(ra))]))


READERS = dict(zip(EXPECTED, (tf_data, beam_read, tfxio, tfrecord_package, tfds, our_readers, random_access)))


def run(consumer: str, outs: dict, compression: str) -> str:
    """``"yes"`` when ``consumer`` reads the output of ``compression`` exactly, else ``"no: <exception type>"``."""
    out = outs[("tfds-" if READERS[consumer] is tfds else "") + compression]
    try:
        READERS[consumer](out, compression)
    except AssertionError:
        raise
    except ConsumerError as e:
        return f"no: {e.args[0]}"
    except Exception as e:  # the consumer's own refusal or failure: its type is the table's cell
        return f"no: {type(e).__name__}"
    return "yes"


def markdown(results: dict) -> str:
    """The docs' table (docs/reading.md) of ``results`` (``{consumer: {compression: cell}}``) and the consumers not tested."""
    lines = ["| consumer | none | gzip (`.gz`) | zlib (`.deflate`) |", "|---|---|---|---|"]
    lines += [
        f"| {consumer} | " + " | ".join(cells[c] for c in COMPRESSIONS) + " |" for consumer, cells in results.items()
    ]
    lines += [f"| {consumer} | {why} | | |" for consumer, why in NOT_TESTED.items()]
    return "\n".join(lines)


def main() -> int:
    import os
    import tempfile

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with tempfile.TemporaryDirectory() as tmp:
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            outs = make_outputs(pathlib.Path(tmp))
            results = {consumer: {c: run(consumer, outs, c) for c in COMPRESSIONS} for consumer in EXPECTED}
    print(markdown(results))
    return 0 if results == EXPECTED else 1


if __name__ == "__main__":
    sys.exit(main())
