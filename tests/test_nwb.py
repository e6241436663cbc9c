"""NWB files (Neurodata Without Borders 2.x, HDF5) converted by their conventions (``docs/converting/nwb.md``):
a TimeSeries' data with its timestamps by default, file metadata never joined to data rows, a file with no data
refused in one line, object references named as references by inspect.

Two kinds of files: NWB-shaped files written here with h5py (the attributes and layout pynwb writes:
``nwb_version``/``neurodata_type``/``namespace`` on the root, TimeSeries under /acquisition and /processing,
the electrodes DynamicTable, object references, a soft-linked ``timestamps``), and pynwb's own back-compat files
(``tests/back_compat/*.nwb`` of its 4.2.0 sdist, fetched by .ci/env.sh into .fixtures/site/pynwb-tests; those
tests skip, saying so, where the folder is absent). Expected values come from h5py, never from our reader.
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.conftest import FIXTURES, convert, run_command
from tfrecord_etl.transforms import reader

STR = h5py.string_dtype()
PYNWB = FIXTURES / "pynwb-tests"


def typed(group, kind: str, namespace: str = "core"):
    group.attrs["neurodata_type"] = kind
    group.attrs["namespace"] = namespace
    return group


def nwb_file(path, *, electrical=True, regular=False, table=True, metadata_rows=1, version="2.8.0", root=True):
    """An NWB-shaped file: file metadata at the root (``file_create_date`` of ``metadata_rows`` entries),
    ``/acquisition/ElectricalSeries`` (5 rows of 4 channels, float32 microvolts, timestamps in seconds),
    ``/processing/behavior/Position/pos`` (a SpatialSeries, 7 rows, starting_time 0.5 s at 30 Hz), the
    electrodes DynamicTable (4 rows: ``location`` strings, ``x`` floats, ``group`` object references) and a
    Units table whose ``spike_times`` column is ragged."""
    rng = np.random.default_rng(7)
    with h5py.File(path, "w") as f:
        if root:
            typed(f, "NWBFile").attrs["nwb_version"] = version
        f.create_dataset(
            "file_create_date", data=np.array(["2026-01-01T00:00:00"] * metadata_rows, dtype=object), dtype=STR
        )
        f.create_dataset("identifier", data="session-1", dtype=STR)
        f.create_dataset("session_start_time", data="2026-01-01T00:00:00", dtype=STR)
        f.create_dataset("session_description", data="a test session", dtype=STR)
        for g in ("acquisition", "analysis", "processing", "stimulus/presentation", "stimulus/templates"):
            f.require_group(g)
        ephys = f.require_group("general/extracellular_ephys")
        for k in range(2):
            typed(ephys.create_group(f"shank{k}"), "ElectrodeGroup")
        f.create_dataset("specifications/core/2.8.0/namespace", data='{"namespaces": []}', dtype=STR)
        if electrical:
            es = typed(f.create_group("acquisition/ElectricalSeries"), "ElectricalSeries")
            d = es.create_dataset("data", data=rng.normal(size=(5, 4)).astype(np.float32))
            d.attrs.update(unit="volts", conversion=1e-6, offset=0.0, resolution=-1.0)
            t = es.create_dataset("timestamps", data=np.array([0.0, 0.1, 0.25, 0.3, 0.5]))
            t.attrs.update(unit="seconds", interval=1)
            typed(es.create_dataset("electrodes", data=np.arange(4)), "DynamicTableRegion", "hdmf-common")
        if regular:
            pos = typed(f.create_group("processing/behavior"), "ProcessingModule")
            pos = typed(pos.create_group("Position"), "Position")
            ss = typed(pos.create_group("pos"), "SpatialSeries")
            d = ss.create_dataset("data", data=rng.normal(size=(7, 2)))
            d.attrs.update(unit="meters", conversion=1.0, offset=0.0, resolution=-1.0)
            st = ss.create_dataset("starting_time", data=0.5)
            st.attrs.update(rate=30.0, unit="seconds")
        if table:
            el = typed(ephys.create_group("electrodes"), "DynamicTable", "hdmf-common")
            el.attrs["colnames"] = np.array(["location", "group", "x"], dtype=object)
            typed(el.create_dataset("id", data=np.arange(4)), "ElementIdentifiers", "hdmf-common")
            el.create_dataset("location", data=np.array(["CA1", "CA1", "CA3", "DG"], dtype=object), dtype=STR)
            el.create_dataset("x", data=np.array([1.5, 2.5, 3.5, 4.5]))
            refs = [ephys[f"shank{k % 2}"].ref for k in range(4)]
            el.create_dataset("group", data=refs, dtype=h5py.ref_dtype)
            units = typed(f.create_group("units"), "Units")
            units.attrs["colnames"] = np.array(["spike_times"], dtype=object)
            units.create_dataset("id", data=np.arange(2))
            units.create_dataset("spike_times", data=np.array([0.1, 0.2, 0.3]))
            units.create_dataset("spike_times_index", data=np.array([1, 3], dtype=np.uint8))
    return path


def converted(out, source, *flags):
    code, _, err = convert(source, out, *flags)
    assert code == 0, err
    return list(reader.iter_numpy(str(out)))


def one_line_error(code, err) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    return lines[0]


def verified(out, source):
    from tfrecord_etl.pipelines import verify

    code, _, err = run_command(verify.main, [str(out), "--source", str(source)])
    assert code == 0, err


def test_a_timeseries_converts_with_its_timestamps_and_never_with_file_metadata(tmp_path):
    # file_create_date has as many entries as the series has rows: by length alone they would share rows
    src = nwb_file(tmp_path / "s.nwb", metadata_rows=5)
    rows = converted(tmp_path / "out", src)
    with h5py.File(src) as f:
        data, stamps = f["acquisition/ElectricalSeries/data"][()], f["acquisition/ElectricalSeries/timestamps"][()]
    assert [set(r) for r in rows] == [
        {"acquisition/ElectricalSeries/data", "acquisition/ElectricalSeries/timestamps"}
    ] * 5
    assert np.array_equal(np.stack([r["acquisition/ElectricalSeries/data"] for r in rows]), data)
    assert rows[0]["acquisition/ElectricalSeries/data"].dtype == np.float32
    assert np.array_equal(np.array([r["acquisition/ElectricalSeries/timestamps"] for r in rows]), stamps)
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["sources"][0]["attributes"] == {
        "/acquisition/ElectricalSeries": {"neurodata_type": "ElectricalSeries"},
        "/acquisition/ElectricalSeries/data": {"unit": "volts", "conversion": 1e-6, "offset": 0.0, "resolution": -1.0},
        "/acquisition/ElectricalSeries/timestamps": {"unit": "seconds"},
    }
    verified(tmp_path / "out", src)


def test_a_regular_series_keeps_starting_time_and_rate_as_metadata(tmp_path):
    src = nwb_file(tmp_path / "r.nwb", electrical=False, regular=True, table=False, metadata_rows=7)
    rows = converted(tmp_path / "out", src)
    with h5py.File(src) as f:
        data = f["processing/behavior/Position/pos/data"][()]
    assert [set(r) for r in rows] == [{"processing/behavior/Position/pos/data"}] * 7
    assert np.array_equal(np.stack([r["processing/behavior/Position/pos/data"] for r in rows]), data)
    attrs = json.loads((tmp_path / "out" / "metadata.json").read_text())["sources"][0]["attributes"]
    assert attrs["/processing/behavior/Position/pos"] == {
        "neurodata_type": "SpatialSeries",
        "starting_time": 0.5,
        "rate": 30.0,
    }
    assert attrs["/processing/behavior/Position/pos/data"]["unit"] == "meters"


def test_several_timeseries_are_refused_in_one_line_and_row_group_picks_one(tmp_path, capsys):
    src = nwb_file(tmp_path / "two.nwb", regular=True)
    code, _, err = convert(src, tmp_path / "out", capsys=capsys)
    line = one_line_error(code, err)
    assert "SchemaError: Which NWB data to convert is not clear: the file holds 2 TimeSeries" in line
    assert "/acquisition/ElectricalSeries (ElectricalSeries, 5 rows) -> --row_group 1" in line
    assert "/processing/behavior/Position/pos (SpatialSeries, 7 rows) -> --row_group 2" in line
    assert str(src) in line and "--row_group N" in line
    assert not (tmp_path / "out").exists()
    rows = converted(tmp_path / "out2", src, "--row_group", "2")
    with h5py.File(src) as f:
        assert np.array_equal(
            np.stack([r["processing/behavior/Position/pos/data"] for r in rows]),
            f["processing/behavior/Position/pos/data"][()],
        )
    rows = converted(tmp_path / "out3", src, "--row_group", "3")  # the electrodes table: id, location, x
    assert [set(r) for r in rows] == [
        {"general/extracellular_ephys/electrodes/" + c for c in ("id", "location", "x")}
    ] * 4
    assert [r["general/extracellular_ephys/electrodes/location"].item() for r in rows] == [
        b"CA1",
        b"CA1",
        b"CA3",
        b"DG",
    ]
    assert [r["general/extracellular_ephys/electrodes/x"].item() for r in rows] == [1.5, 2.5, 3.5, 4.5]
    code, _, err = convert(src, tmp_path / "out4", "--row_group", "9", capsys=capsys)
    assert "--row_group 9 asked, but the NWB file holds 4 row group(s)" in one_line_error(code, err)
    code, _, err = convert(src, tmp_path / "out5", "--max_datasets", "3", capsys=capsys)  # the NWB walk's limit
    assert "The file holds more than 3 datasets (--max_datasets)" in one_line_error(code, err)


def test_a_file_with_no_data_is_refused_in_one_line(tmp_path, capsys):
    src = nwb_file(tmp_path / "empty.nwb", electrical=False, table=False)
    code, _, err = convert(src, tmp_path / "out", capsys=capsys)
    line = one_line_error(code, err)
    assert "The NWB file holds no data: no TimeSeries with data and no table with rows" in line
    assert "/file_create_date" in line and str(src) in line
    assert not (tmp_path / "out").exists()
    assert "name a metadata dataset with --datasets" in line
    rows = converted(tmp_path / "named", src, "--datasets", "/file_create_date")  # the hint's way: exactly that
    with h5py.File(src) as f:
        assert [r["file_create_date"].item() for r in rows] == list(f["file_create_date"][()])


def test_tables_are_the_default_only_without_timeseries(tmp_path):
    src = nwb_file(tmp_path / "t.nwb", electrical=False, metadata_rows=4)  # 4 dates, 4 electrodes: never joined
    with h5py.File(src, "a") as f:
        del f["units"]  # one table left: the electrodes
    rows = converted(tmp_path / "out", src)
    with h5py.File(src) as f:
        ids = f["general/extracellular_ephys/electrodes/id"][()]
    assert [set(r) for r in rows] == [
        {"general/extracellular_ephys/electrodes/" + c for c in ("id", "location", "x")}
    ] * 4
    assert np.array_equal(np.array([r["general/extracellular_ephys/electrodes/id"] for r in rows]), ids)
    attrs = json.loads((tmp_path / "out" / "metadata.json").read_text())["sources"][0]["attributes"]
    assert attrs == {"/general/extracellular_ephys/electrodes": {"neurodata_type": "DynamicTable"}}


def test_shared_timestamps_through_a_soft_link_are_read(tmp_path):
    src = nwb_file(tmp_path / "link.nwb", table=False)
    with h5py.File(src, "a") as f:
        lfp = typed(f.create_group("acquisition/LFP"), "ElectricalSeries")
        lfp.create_dataset("data", data=np.arange(10, dtype=np.int16).reshape(5, 2))
        lfp["timestamps"] = h5py.SoftLink("/acquisition/ElectricalSeries/timestamps")
    rows = converted(
        tmp_path / "out", src, "--row_group", "2"
    )  # /acquisition/LFP (sorted before /acquisition/E...? no)
    with h5py.File(src) as f:
        stamps = f["acquisition/ElectricalSeries/timestamps"][()]
        data = f["acquisition/LFP/data"][()]
    assert np.array_equal(np.array([r["acquisition/LFP/timestamps"] for r in rows]), stamps)
    assert np.array_equal(np.stack([r["acquisition/LFP/data"] for r in rows]), data)


def test_detection_by_nwb_version_or_by_suffix_and_type(tmp_path, capsys):
    # nwb_version at the root names an NWB file whatever its suffix
    src = nwb_file(tmp_path / "s.h5", metadata_rows=5)
    assert {k for r in converted(tmp_path / "a", src) for k in r} == {
        "acquisition/ElectricalSeries/data",
        "acquisition/ElectricalSeries/timestamps",
    }
    # a .nwb name and neurodata_type at the root, without nwb_version (a damaged root): NWB too
    src = nwb_file(tmp_path / "n.nwb", electrical=False, table=False, root=False)
    with h5py.File(src, "a") as f:
        typed(f, "NWBFile")
    code, _, err = convert(src, tmp_path / "b", capsys=capsys)
    assert "The NWB file holds no data" in one_line_error(code, err)


def test_inspect_names_object_references_and_the_nwb_groups(tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect

    src = nwb_file(tmp_path / "s.nwb", regular=True)
    code, out, err = run_command(inspect.main, [src], capsys)
    assert code == 0, err
    assert out.startswith("NWB 2.8.0 (HDF5) file")
    assert (
        "[object references -> /general/extracellular_ephys/shank0, /general/extracellular_ephys/shank1: not converted]"
        in out
    )
    assert "MATLAB cell" not in out
    assert (
        "group 1: 5 rows, 2 datasets" in out and "(TimeSeries /acquisition/ElectricalSeries: ElectricalSeries)" in out
    )
    assert "group 2: 7 rows, 1 dataset" in out and "regular: starting_time and rate in metadata.json" in out
    assert "not converted: group (ragged or references)" in out
    assert "default: none, convert refuses to choose: the file holds 2 TimeSeries" in out
    assert "/file_create_date" in out and "[NWB file metadata: never joined to data rows]" in out
    assert "[a regular series' start: in metadata.json with its rate]" in out


# ------------------------------------------------------------------------- pynwb's own files (its sdist)


def pynwb_file(name: str):
    path = PYNWB / name
    if not path.exists():
        pytest.skip(f"{path} is missing: .ci/env.sh fetches pynwb's sdist (NWB_SDIST) into .fixtures/site/pynwb-tests")
    return path


def test_pynwb_file_without_data_is_refused(tmp_path, capsys):
    src = pynwb_file("1.0.2_nwbfile.nwb")
    code, _, err = convert(src, tmp_path / "out", capsys=capsys)
    line = one_line_error(code, err)
    assert "The NWB file holds no data" in line and "/file_create_date" in line


def test_pynwb_series_without_unit_is_its_data_alone(tmp_path):
    src = pynwb_file("1.5.1_timeseries_no_unit.nwb")
    rows = converted(tmp_path / "out", src)
    with h5py.File(src) as f:
        data = f["acquisition/test_timeseries/data"][()]
    assert [set(r) for r in rows] == [{"acquisition/test_timeseries/data"}]  # no file_create_date joined
    assert np.array_equal(np.array([r["acquisition/test_timeseries/data"] for r in rows]), data)
    attrs = json.loads((tmp_path / "out" / "metadata.json").read_text())["sources"][0]["attributes"]
    assert attrs["/acquisition/test_timeseries"] == {"neurodata_type": "TimeSeries", "starting_time": 0.0, "rate": 1.0}


def test_pynwb_electrical_series_is_the_default(tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect

    src = pynwb_file("3.0.0_electrodes_dynamic_table.nwb")
    rows = converted(tmp_path / "out", src)
    with h5py.File(src) as f:
        data, stamps = f["acquisition/ElectricalSeries/data"][()], f["acquisition/ElectricalSeries/timestamps"][()]
    assert np.array_equal(np.stack([r["acquisition/ElectricalSeries/data"] for r in rows]), data)
    assert np.array_equal(np.array([r["acquisition/ElectricalSeries/timestamps"] for r in rows]), stamps)
    verified(tmp_path / "out", src)
    code, out, err = run_command(inspect.main, [src], capsys)
    assert code == 0, err
    assert "/general/extracellular_ephys/electrodes/group" in out and "[object references -> " in out
    assert "MATLAB cell" not in out and "default: convert takes group 1: the only TimeSeries" in out
