"""``--row_group`` and ``--container_mode``, the format-neutral names of the container flags (HDF5, NetCDF-3,
MATLAB, Zarr), and their old names ``--hdf5_group`` / ``--hdf5_mode``: still accepted as flags, config keys and
keyword arguments, with one deprecation line on stderr per process; ``--help`` and messages name the new ones."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest

from tests.conftest import convert
from tfrecord_etl.transforms import reader, renamed_flags
from tfrecord_etl.transforms.config import ConvertConfig
from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.sources import container

DEPRECATED = "is deprecated: use"


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test starts as a new process would: no old name warned about yet."""
    monkeypatch.setattr(renamed_flags, "_WARNED_RENAMED", set())


@pytest.fixture
def two_groups(tmp_path):
    path = tmp_path / "two.h5"
    with h5py.File(path, "w") as f:
        f["X"] = np.arange(12.0).reshape(4, 3)
        f["names"] = np.array([b"a", b"b", b"c"])
    return path


def rows(out) -> list[dict]:
    return [{k: np.asarray(v).tolist() for k, v in e.items()} for e in reader.iter_numpy(str(out))]


def test_old_flag_names_work_as_the_new_ones_with_one_deprecation_line(two_groups, tmp_path, capsys):
    code, _, err = convert(two_groups, tmp_path / "new", "--row_group", "2", "--container_mode", "rows", capsys=capsys)
    assert code == 0 and DEPRECATED not in err, err
    code, _, err = convert(two_groups, tmp_path / "old", "--hdf5_group", "2", "--hdf5_mode", "rows", capsys=capsys)
    assert code == 0, err
    assert rows(tmp_path / "old") == rows(tmp_path / "new") == [{"names": b"a"}, {"names": b"b"}, {"names": b"c"}]
    said = [line for line in err.splitlines() if DEPRECATED in line]
    assert said == [
        "tfrecord-etl: --hdf5_group (config key hdf5_group) is deprecated: use --row_group (row_group), "
        "which works the same",
        "tfrecord-etl: --hdf5_mode (config key hdf5_mode) is deprecated: use --container_mode "
        "(container_mode), which works the same",
    ], err
    code, _, err = convert(two_groups, tmp_path / "again", "--hdf5_group", "2", capsys=capsys)
    assert code == 0 and DEPRECATED not in err, err  # once per process


def test_old_yaml_keys_work_and_the_new_ones_too(two_groups, tmp_path, capsys):
    for name, text in (("old", "hdf5_mode: datasets\n"), ("new", "container_mode: datasets\n")):
        (tmp_path / f"{name}.yaml").write_text(text)
        code, _, err = convert(two_groups, tmp_path / name, "--config", tmp_path / f"{name}.yaml", capsys=capsys)
        assert code == 0, err
        assert (DEPRECATED in err) == (name == "old"), err
        assert sorted(e["key"] for e in rows(tmp_path / name)) == [b"/X", b"/names"]  # one Example per dataset


def test_old_and_new_name_together_are_refused_and_conflicts_name_the_new_flag():
    with pytest.raises(ValueError, match="hdf5_mode is the old name of container_mode: give only container_mode"):
        ConvertConfig(input="a.h5", output_dir="o", hdf5_mode="rows", container_mode="rows")
    with pytest.raises(
        ValueError,
        match="row_group chooses a row group in rows mode: it cannot be combined with "
        "datasets or container_mode datasets",
    ):
        ConvertConfig(input="a.h5", output_dir="o", hdf5_group=2, container_mode="datasets")
    assert ConvertConfig(input="a.h5", output_dir="o", hdf5_group=2).row_group == 2  # Python callers too


def test_help_shows_the_new_names_only(capsys):
    from tfrecord_etl.pipelines import common, convert as convert_module

    with pytest.raises(SystemExit):
        common.run_main(convert_module.main, ["--help"])
    text = capsys.readouterr().out
    assert "--row_group ROW_GROUP" in text and "--container_mode {auto,rows,datasets}" in text
    assert not re.search(r"^  --hdf5_", text, re.M)  # (a description may say the old name)


def test_container_messages_name_the_new_flags(tmp_path):
    with pytest.raises(SchemaError, match=r"different leading lengths \('/a': 5, '/b': 6\).*--row_group N"):
        container.check_leading_lengths({"/a": 5, "/b": 6}, "f.h5", "datasets")
    with pytest.raises(SchemaError, match="--row_group 3 asked, but the file holds 2 row group"):
        container.choose_group([("/a", 5, None, 40), ("/b", 6, None, 48)], 3, "f.h5")
    with pytest.raises(SchemaError, match=r"holds no row group .*--container_mode datasets"):
        container.choose_group([], None, "f.h5")  # one message, with or without conventions' roles


def test_an_output_recorded_under_the_old_names_verifies_and_reruns_as_before(two_groups, tmp_path, capsys):
    """``metadata.json`` (and the run marker) of an output written before the rename record ``hdf5_mode``: verify
    plans its source in that mode, and the same conversion again is the same run, not another one."""
    import json

    from tests.conftest import run_command
    from tfrecord_etl.pipelines import verify

    out = tmp_path / "out"
    code, _, err = convert(two_groups, out, "--container_mode", "datasets", capsys=capsys)
    assert code == 0, err
    for name in ("metadata.json", ".tf-etl-run.json"):
        if (out / name).exists():
            doc = json.loads((out / name).read_text())
            if isinstance(doc.get("options"), dict):
                options = doc["options"]
                doc["options"] = {
                    {"container_mode": "hdf5_mode", "row_group": "hdf5_group"}.get(k, k): v for k, v in options.items()
                }
                assert "hdf5_mode" in doc["options"]
                (out / name).write_text(json.dumps(doc))
    code, _, err = run_command(verify.main, [out, "--source", two_groups], capsys)
    assert code == 0 and DEPRECATED not in err, err  # datasets mode: 2 Examples, as converted
    code, _, err = convert(two_groups, out, "--container_mode", "datasets", capsys=capsys)
    assert code == 0 and "another run" not in err, err
