"""Each format owns its options: the options models the registered sources declare (``Source.options_models``)
are what the convert command's config model, its flags, ``--help``'s groups, the flag reference and planning's
``SourceOptions`` are built from; a format registered with a model of its own gets all of these with no other edit."""

from __future__ import annotations

import sys
import types
from typing import Literal

import pytest
from pydantic import Field

from tfrecord_etl.pipelines import flaghelp
from tfrecord_etl.transforms import planning, sources
from tfrecord_etl.transforms.config import ConvertConfig, parse_args
from tfrecord_etl.transforms.config.flags import ConvertOptions
from tfrecord_etl.transforms.config.model import build_config_model
from tfrecord_etl.transforms.sources.envi_options import EnviOptions
from tfrecord_etl.transforms.sources.options import FlagGroup, FormatOptions
from tfrecord_etl.transforms.sources.options_raw import RawOptions
from tfrecord_etl.transforms.sources.raw import RawSource
from tfrecord_etl.transforms.sources.registry import option_models


def test_every_registered_sources_options_are_flags_in_their_groups_in_help_and_the_reference():
    help_text = flaghelp.command_parser("convert").format_help()
    reference = flaghelp.reference_markdown(["convert"])
    titles = [g.title for g in flaghelp.GROUPS["convert"]]
    for cls in sources.REGISTRY.values():
        for model in sources.models_of(cls):
            grouped = [flag for group in model.flag_groups for flag in group.flags]
            assert sorted(grouped) == sorted(f"--{name}" for name in model.model_fields), model.__name__
            for name, field in model.model_fields.items():
                assert ConvertConfig.model_fields[name].description == field.description
                assert f"--{name}" in help_text and f'<span id="convert-{name}"></span>`--{name}`' in reference
            for group in model.flag_groups:
                assert group.title in titles
                assert f"\n{group.title}:\n" in help_text
                assert f"### convert: {group.title} " in reference


def test_the_formats_own_groups_follow_input_in_registry_order_and_shared_groups_take_their_flags_last():
    groups = {g.title: g for g in flaghelp.GROUPS["convert"]}
    titles = list(groups)
    assert titles[:6] == ["input", "HDF5 and containers", "NumPy files", "raw files", "image and file collections"] + [
        "ENVI files"
    ]
    assert groups["limits"].flags == (
        "--max_empty_rows",
        "--max_row_mb",
        "--max_datasets",
        "--max_compression_ratio",
        "--max_mat_variable_mb",
        "--max_mat_nesting",
    )
    assert groups["safety"].flags[-2:] == ("--allow_external_storage", "--allow_fill_value")


def test_a_formats_option_reaches_its_source_through_planning(tmp_path):
    cfg, _ = parse_args(
        ["--input", "x.img", "--output_dir", str(tmp_path / "o"), "--envi_rows", "pixels", "--shape", "-1,2"],
        ConvertConfig,
        ConvertOptions,
        "convert",
        "",
    )
    options = planning.source_options(cfg)
    assert options.of(EnviOptions) == EnviOptions(envi_rows="pixels")  # carried whole: the new format's way
    assert sources.make_source("envi", options).options.of(EnviOptions).envi_rows == "pixels"
    assert options.of(RawOptions).shape == [-1, 2]  # raw's options reach it the same way
    default = planning.source_options(ConvertConfig(input="x", output_dir="o"))
    assert default.of(EnviOptions).envi_rows == "storage"


class _TileOptions(FormatOptions):
    flag_groups = (
        FlagGroup("tiles", "tiles of a test format", "converting/raw.md", ("--tile_size",)),
        FlagGroup("limits", flags=("--max_tiles",)),
    )

    tile_size: int = Field(256, ge=1, description="tiles: the tile's side in pixels")
    max_tiles: int = Field(1000, ge=1, description="tiles: most tiles of one file")


class _TileSource(RawSource):
    format_name = "tiles"
    suffixes = (".tiles",)
    options_models = ("_tiles._TileOptions",)


def register(monkeypatch, source, module: str, **models) -> None:
    """``source`` in the registry, its options models in a module ``sources.<module>`` (for this test only)."""
    fake = types.ModuleType(f"tfrecord_etl.transforms.sources.{module}")
    for name, model in models.items():
        setattr(fake, name, model)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(sources.REGISTRY, source.format_name, source)


def test_a_newly_registered_format_gets_its_config_keys_groups_and_planning(monkeypatch):
    register(monkeypatch, _TileSource, "_tiles", _TileOptions=_TileOptions)
    model = build_config_model()
    cfg = model(input="a.tiles", output_dir="o", tile_size=64)
    assert cfg.tile_size == 64 and cfg.max_tiles == 1000
    with pytest.raises(ValueError, match="tile_size"):
        model(input="a.tiles", output_dir="o", tile_size=0)
    groups = {g.title: g for g in flaghelp.convert_groups()}
    assert groups["tiles"].flags == ("--tile_size",) and groups["limits"].flags[-1] == "--max_tiles"
    shared = ("limits", "safety")  # a format's group of these titles adds its flags to the shared group
    registered = [g.title for m in option_models() if m is not _TileOptions for g in m.flag_groups]
    last = [t for t in registered if t not in shared][-1]  # the last registered format's own group
    assert list(groups).index("ENVI files") < list(groups).index("tiles") == list(groups).index(last) + 1
    assert planning.source_options(cfg).of(_TileOptions) == _TileOptions(tile_size=64)


def test_two_formats_claiming_one_group_title_is_refused(monkeypatch):
    class Clash(FormatOptions):
        flag_groups = (FlagGroup("raw files", "again", "converting/raw.md", ("--clash",)),)
        clash: Literal["a", "b"] = Field("a", description="a second raw files group")

    class ClashSource(RawSource):
        format_name = "clash"
        options_models = ("_clash.Clash",)

    register(monkeypatch, ClashSource, "_clash", Clash=Clash)
    with pytest.raises(ValueError, match="Clash: a second flag group titled 'raw files'"):
        flaghelp.convert_groups()


def test_yaml_and_flags_keep_their_comma_syntax_for_the_formats_list_options(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("datasets: /X,/obs\nexclude_datasets: [a, b]\nshape: -1,28,28\n")
    cfg, _ = parse_args(
        ["--input", "i", "--output_dir", "o", "--config", str(config)], ConvertConfig, ConvertOptions, "convert", ""
    )
    assert (cfg.datasets, cfg.exclude_datasets, cfg.shape) == (["/X", "/obs"], ["a", "b"], [-1, 28, 28])
    cfg, _ = parse_args(
        ["--input", "i", "--output_dir", "o", "--shape", "-1,3"], ConvertConfig, ConvertOptions, "c", ""
    )
    assert cfg.shape == [-1, 3]
