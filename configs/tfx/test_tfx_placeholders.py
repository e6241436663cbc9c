"""TFX's span / version / date placeholders and range configs over ArraysExampleGen, in real TFX pipelines (run by
configs/tfx/run_tfx_test.sh in .venv-tfx, not by the main suite).

One pipeline ("spans", LocalDagRunner, a SQLite ML Metadata store) over HDF5 inputs laid out as
``span-{SPAN}/v-{VERSION}/data.h5``: span 1 version 1, span 2 versions 1 and 2 (different rows), span 3 version 1.
Three runs, in this order:

  1. ``StaticRange(2, 2)``: TFX's driver takes span 2 at its latest version, 2;
  2. ``StaticRange(1, 1)``: span 1 (version 1), ingested after span 2;
  3. ``RollingRange(num_spans=1)``: the latest span, 3; a ``Resolver`` with ``SpanRangeStrategy`` and
     ``RollingRange(num_spans=2)`` then hands the two latest spans' artifacts (2 and 3, by span number, not span 1
     that was ingested last) to a function component that reads them with ``read_split``. The same run holds two
     more ArraysExampleGens over ``{YYYY}-{MM}-{DD}/data.h5`` folders: the latest day without a range config, and
     the day before through ``StaticRange`` of its span (days since 1970-01-01, TFX's date span).

Checked: each artifact's ``span`` / ``version`` properties in MLMD, the files the executor read (from the pattern
TFX's driver resolved; recorded in ``tfrecord_etl.json``), every example read back exactly against the source of
that span and version (plain TensorFlow over the split files and our decoder), the resolver's output artifacts in
MLMD and the ids the downstream component read. Also TFX's limit of one span per ExampleGen run: a
``RollingRange`` of two spans or a ``StaticRange`` of 1 to 2 fails the run (more spans are the resolver's job).
"""

import datetime
import glob
import json
import os
from typing import List, TypedDict  # noqa: UP035 - typing.List in the component's signature, as TFX documents it

import h5py
import numpy as np
import pytest

tfx = pytest.importorskip("tfx")
from test_tfx_pipeline import latest, plain_tf_read  # noqa: E402  (configs/tfx is on sys.path under pytest)
from tfx import v1 as tfx_v1  # noqa: E402
from tfx.dsl.component.experimental.annotations import InputArtifact  # noqa: E402
from tfx.dsl.component.experimental.decorators import component  # noqa: E402
from tfx.orchestration import metadata as tfx_metadata, pipeline as tfx_pipeline  # noqa: E402
from tfx.orchestration.local.local_dag_runner import LocalDagRunner  # noqa: E402
from tfx.proto import example_gen_pb2, range_config_pb2  # noqa: E402
from tfx.types import standard_artifacts  # noqa: E402

from tfrecord_etl.tfx import ArraysExampleGen, load_info, read_split, split_files  # noqa: E402

ROWS = 40
ENCODINGS = {"feature_encodings": {"image": "tensor", "x": "list", "id": "list"}}  # plain_tf_read's layout
SPANS = {(1, 1): "span-1/v-1", (2, 1): "span-2/v-1", (2, 2): "span-2/v-2", (3, 1): "span-3/v-1"}
DAYS = {"2026-11-25": 25, "2026-11-26": 26}  # folder -> seed / id block


def epoch_days(day: str) -> int:
    return (datetime.date.fromisoformat(day) - datetime.date(1970, 1, 1)).days


def write_h5(folder: str, block: int) -> dict:
    """``folder/data.h5``: ROWS rows of an (8, 8, 3) uint8 image, a float32 x and int64 ids block*1000 + row."""
    rng = np.random.default_rng(block)
    data = {
        "image": rng.integers(0, 256, (ROWS, 8, 8, 3), dtype=np.uint8),
        "x": rng.normal(0.0, 1.0, ROWS).astype(np.float32),
        "id": np.arange(block * 1000, block * 1000 + ROWS, dtype=np.int64),
    }
    os.makedirs(folder)
    with h5py.File(os.path.join(folder, "data.h5"), "w") as f:
        for name, value in data.items():
            f.create_dataset(name, data=value)
    return data


class _Ids(TypedDict):
    ids: str


@component
def ReadResolvedExamples(examples: InputArtifact[List[standard_artifacts.Examples]]) -> _Ids:  # noqa: N802, UP006
    """Reads every Examples artifact it is handed with ``read_split``: ``{"span/version": sorted ids}`` as JSON."""
    out = {}
    for artifact in examples:
        key = f"{artifact.get_int_custom_property('span')}/{artifact.get_int_custom_property('version')}"
        out[key] = sorted(int(e["id"][()]) for split in ("train", "eval") for e in read_split(artifact.uri, split))
    return {"ids": json.dumps(out, sort_keys=True)}


def _gen(input_base: str, pattern: str, range_config=None) -> ArraysExampleGen:
    return ArraysExampleGen(
        input_base=input_base,
        source_options=ENCODINGS,
        range_config=range_config,
        input_config=example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="all", pattern=pattern)]),
    )


def _static(span: int) -> range_config_pb2.RangeConfig:
    return range_config_pb2.RangeConfig(
        static_range=range_config_pb2.StaticRange(start_span_number=span, end_span_number=span)
    )


def _rolling(n: int) -> range_config_pb2.RangeConfig:
    return range_config_pb2.RangeConfig(rolling_range=range_config_pb2.RollingRange(num_spans=n))


def _pipeline(root, name: str, components) -> tfx_pipeline.Pipeline:
    return tfx_pipeline.Pipeline(
        pipeline_name=name,
        pipeline_root=str(root / "pipeline_root"),
        components=components,
        enable_cache=False,
        metadata_connection_config=tfx_metadata.sqlite_metadata_connection_config(str(root / "mlmd.sqlite")),
        beam_pipeline_args=["--direct_running_mode=in_memory", "--direct_num_workers=1"],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three runs of the "spans" pipeline; returns (root, sources, day sources, the MLMD store)."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    root = tmp_path_factory.mktemp("placeholders")
    spans_base, days_base = str(root / "spans"), str(root / "days")
    sources = {key: write_h5(os.path.join(spans_base, folder), key[0] * 10 + key[1]) for key, folder in SPANS.items()}
    days = {day: write_h5(os.path.join(days_base, day), block) for day, block in DAYS.items()}
    pattern = "span-{SPAN}/v-{VERSION}/*.h5"

    LocalDagRunner().run(_pipeline(root, "spans", [_gen(spans_base, pattern, _static(2))]))
    LocalDagRunner().run(_pipeline(root, "spans", [_gen(spans_base, pattern, _static(1))]))
    gen = _gen(spans_base, pattern, _rolling(1))
    # a Channel by producer (TFX's documented form): every run's artifacts of that node, not only this run's as
    # gen.outputs["examples"] would give; the explicit edge makes the resolver see this run's span too
    resolver = tfx_v1.dsl.Resolver(
        strategy_class=tfx_v1.dsl.experimental.SpanRangeStrategy,
        config={"range_config": _rolling(2)},
        examples=tfx_v1.dsl.Channel(
            type=standard_artifacts.Examples, producer_component_id=gen.id, output_key="examples"
        ),
    ).with_id("latest_two_spans")
    resolver.add_upstream_node(gen)
    reader = ReadResolvedExamples(examples=resolver.outputs["examples"])
    latest_day = _gen(days_base, "{YYYY}-{MM}-{DD}/*.h5").with_id("latest_day")
    day_before = _gen(days_base, "{YYYY}-{MM}-{DD}/*.h5", _static(epoch_days("2026-11-25"))).with_id("day_before")
    LocalDagRunner().run(_pipeline(root, "spans", [gen, resolver, reader, latest_day, day_before]))

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(root / "mlmd.sqlite")
    return root, sources, days, metadata_store.MetadataStore(config)


def _props(artifact) -> tuple[int, int | None]:
    props = artifact.custom_properties
    return props["span"].int_value, props["version"].int_value if "version" in props else None


def _gen_artifacts(store, component_id: str) -> list:
    """The Examples artifacts the ExampleGen node ``component_id`` produced, oldest first."""
    return [a for a in latest(store, "Examples") if f"/{component_id}/examples/" in a.uri]


def _assert_exact(uri: str, src: dict) -> None:
    """Every example of both splits of ``uri``, read with plain TensorFlow and our decoder, equals ``src``'s row."""
    by_id = {int(i): row for row, i in enumerate(src["id"])}
    seen = []
    for split in ("train", "eval"):
        plain = plain_tf_read(split_files(uri, split))
        ours = {int(e["id"][()]): e for e in read_split(uri, split)}
        assert sorted(plain) == sorted(ours)
        for i, (image, x) in plain.items():
            row = by_id[i]
            np.testing.assert_array_equal(image, src["image"][row])
            np.testing.assert_array_equal(ours[i]["image"], src["image"][row])
            assert x == src["x"][row] and ours[i]["x"].dtype == np.float32 and ours[i]["x"][()] == src["x"][row]
        seen += list(plain)
    assert sorted(seen) == sorted(by_id)  # every row once, no other rows


def _files_read(artifact, base: str) -> list[str]:
    """The input files the executor read for ``artifact`` (from the pattern TFX's driver resolved), relative to
    ``base``, from the artifact's ``tfrecord_etl.json``."""
    return [os.path.relpath(f["path"], base) for f in load_info(artifact.uri)["inputs"]["all"]["files"]]


def test_span_and_version_placeholders_take_the_latest_version(runs):
    root, sources, _, store = runs
    artifacts = _gen_artifacts(store, "ArraysExampleGen")
    # run 1: StaticRange(2, 2) -> span 2 at its latest version; run 2: span 1; run 3: RollingRange(1) -> span 3
    assert [_props(a) for a in artifacts] == [(2, 2), (1, 1), (3, 1)]
    assert [_files_read(a, str(root / "spans")) for a in artifacts] == [
        ["span-2/v-2/data.h5"],
        ["span-1/v-1/data.h5"],
        ["span-3/v-1/data.h5"],
    ]
    for artifact in artifacts:
        _assert_exact(artifact.uri, sources[_props(artifact)])
    assert not set(sources[(2, 1)]["id"]) & {int(e["id"][()]) for e in read_split(artifacts[0].uri, "train")}


def test_a_rolling_range_resolver_hands_the_latest_spans_downstream(runs):
    _, sources, _, store = runs
    resolver_runs = list(
        store.get_executions_by_context(store.get_context_by_type_and_name("node", "spans.latest_two_spans").id)
    )
    assert len(resolver_runs) == 1
    outputs = [
        e.artifact_id
        for e in store.get_events_by_execution_ids([resolver_runs[0].id])
        if e.type == e.INTERNAL_OUTPUT or e.type == e.OUTPUT
    ]
    resolved = store.get_artifacts_by_id(outputs)
    # spans 2 and 3 (the two highest span numbers, span 2 at version 2), not span 1 that was ingested last
    assert sorted(_props(a) for a in resolved) == [(2, 2), (3, 1)]
    ids_artifact = [a for a in latest(store, "String") if "/ReadResolvedExamples/" in a.uri][-1]
    got = json.loads(open(ids_artifact.uri).read())
    assert got == {f"{s}/{v}": sorted(int(i) for i in sources[(s, v)]["id"]) for s, v in ((2, 2), (3, 1))}


def test_date_placeholders_make_the_span_the_days_since_the_epoch(runs):
    root, _, days, store = runs
    (newest,) = _gen_artifacts(store, "latest_day")
    (older,) = _gen_artifacts(store, "day_before")
    assert epoch_days("2026-11-26") == 20783
    assert _props(newest) == (20783, None) and _files_read(newest, str(root / "days")) == ["2026-11-26/data.h5"]
    assert _props(older) == (20782, None) and _files_read(older, str(root / "days")) == ["2026-11-25/data.h5"]
    _assert_exact(newest.uri, days["2026-11-26"])
    _assert_exact(older.uri, days["2026-11-25"])


def test_an_example_gen_takes_one_span_a_run_tfx_s_limit(tmp_path):
    for span in (1, 2):
        write_h5(str(tmp_path / "data" / f"span-{span}"), span)
    two_spans = range_config_pb2.RangeConfig(
        static_range=range_config_pb2.StaticRange(start_span_number=1, end_span_number=2)
    )
    for name, range_config, message in (
        ("rolling2", _rolling(2), "ExampleGen only support single span for RangeConfig.RollingRange"),
        ("static12", two_spans, "start and end span numbers for RangeConfig.StaticRange must be equal"),
    ):
        gen = _gen(str(tmp_path / "data"), "span-{SPAN}/*.h5", range_config)
        with pytest.raises(ValueError, match=message):
            LocalDagRunner().run(_pipeline(tmp_path / name, name, [gen]))
        assert not glob.glob(str(tmp_path / name / "pipeline_root" / "ArraysExampleGen" / "examples" / "*" / "*"))
