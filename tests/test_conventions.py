"""The row group convert takes by default follows the container's conventions (``transforms/sources/conventions``):
CF data variables over their coordinates and bounds, the unlimited (record) dimension as the row axis, dimension
scales deciding which datasets share a row axis, datasets under different top-level groups never merged by equal
length (the run refuses when it cannot tell which one is the data), metadata groups (``Header``) after the data.

The netCDF-4 files are written with h5py in the layout the netCDF-C library writes (dimension scales with
``_Netcdf4Dimid``, a dimension without a variable as a ``This is a netCDF dimension but not a netCDF variable``
scale, unlimited dimensions resizable); NetCDF-3 with SciPy's ``netcdf_file``. Expected values come from h5py and
SciPy. The real NEMO file (iris-sample-data) is in tests/test_real_containers.py.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from scipy.io import netcdf_file

from tests.conftest import convert, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.output import metadata


def nc4(path, dims: dict, variables: dict, attrs: dict | None = None):
    """A netCDF-4 layout: ``dims`` = {name: (size, unlimited)}; ``variables`` = {name: (dims, values, attrs)}.
    A dimension without a variable of its name becomes a placeholder scale."""
    with h5py.File(path, "w") as f:
        f.attrs["_NCProperties"] = np.bytes_(b"version=2,netcdf=4.9.2,hdf5=1.14.3")
        scales = {}
        for i, (name, (size, unlimited)) in enumerate(dims.items()):
            values = np.asarray(variables[name][1]) if name in variables else np.zeros(size, ">f4")
            d = f.create_dataset(
                name,
                data=values,
                maxshape=(None,) if unlimited else None,
                chunks=(max(size, 1),) if unlimited else None,
            )
            d.make_scale(
                name if name in variables else f"This is a netCDF dimension but not a netCDF variable.{size:10d}"
            )
            d.attrs["_Netcdf4Dimid"] = np.int32(i)
            scales[name] = d
        for name, (vdims, values, vattrs) in variables.items():
            if name in dims:
                continue
            values = np.asarray(values)
            unlimited = [dims[d][1] for d in vdims]
            d = f.create_dataset(
                name,
                data=values,
                maxshape=tuple(None if u else n for u, n in zip(unlimited, values.shape)),
                chunks=values.shape if any(unlimited) else None,
            )
            for axis, dim in enumerate(vdims):
                d.dims[axis].attach_scale(scales[dim])
            for k, v in vattrs.items():
                d.attrs[k] = np.bytes_(v.encode())
        for k, v in (attrs or {}).items():
            f.attrs[k] = np.bytes_(v.encode())


def converted(tmp_path, path, *flags, name="out", capsys=None):
    code, _, err = convert(path, tmp_path / name, *flags, capsys=capsys)
    assert code == 0, err
    return list(reader.iter_numpy(str(tmp_path / name)))


def features(tmp_path, name="out") -> list[str]:
    return sorted(s.name for s in metadata.load(str(tmp_path / name))["features"])


def inspect_text(path, capsys) -> str:
    from tfrecord_etl.pipelines import inspect

    code, out, err = run_command(inspect.main, [str(path)], capsys)
    assert code == 0, err
    return out


# ------------------------------------------------------------------------------------------------ CF netCDF-4


def cf_grid_file(path):
    """A NEMO-like ocean file: ``tos(time_counter=1, y=33, x=36)`` with ``coordinates = "time_centered nav_lat
    nav_lon"``, the 2-D coordinates and their 4-vertex cell bounds (33 rows, 10x the bytes of tos)."""
    rng = np.random.default_rng(0)
    tos = rng.normal(size=(1, 33, 36)).astype("f4")
    lat, lon = rng.normal(size=(2, 33, 36)).astype("f4")
    nc4(
        path,
        {
            "y": (33, False),
            "x": (36, False),
            "nvertex": (4, False),
            "time_counter": (1, True),
            "axis_nbounds": (2, False),
        },
        {
            "time_counter": (("time_counter",), [1.5], {}),
            "time_centered": (("time_counter",), [1.5], {"bounds": "time_centered_bounds"}),
            "time_centered_bounds": (("time_counter", "axis_nbounds"), [[1.0, 2.0]], {}),
            "nav_lat": (("y", "x"), lat, {"bounds": "bounds_lat"}),
            "nav_lon": (("y", "x"), lon, {"bounds": "bounds_lon"}),
            "bounds_lat": (("y", "x", "nvertex"), np.repeat(lat[..., None], 4, -1), {}),
            "bounds_lon": (("y", "x", "nvertex"), np.repeat(lon[..., None], 4, -1), {}),
            "tos": (("time_counter", "y", "x"), tos, {"coordinates": "time_centered nav_lat nav_lon"}),
        },
        {"Conventions": "CF-1.5"},
    )
    return tos


def test_cf_data_variable_is_converted_not_its_coordinates_and_bounds(tmp_path, caplog):
    path = tmp_path / "grid_T.nc"
    tos = cf_grid_file(path)
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        examples = converted(tmp_path, path)
    assert len(examples) == 1
    np.testing.assert_array_equal(examples[0]["tos"], tos[0])
    # the coordinates on the row axis come along as context; the 2-D grid (33 rows of y) does not
    assert features(tmp_path) == ["time_centered", "time_centered_bounds", "time_counter", "tos"]
    assert examples[0]["time_centered_bounds"].tolist() == [1.0, 2.0]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert (
        "(data variables on the unlimited (record) dimension; the others hold coordinates, bounds or metadata only)"
        in said
        and "group 2: 33 rows on dimension '/y'" in said
    )
    grid = converted(tmp_path, path, "--row_group", "2", name="grid")  # the grid stays one flag away
    with h5py.File(path) as f:
        np.testing.assert_array_equal(np.stack([e["bounds_lat"] for e in grid]), f["bounds_lat"][()])


def test_inspect_shows_the_roles_the_groups_and_the_default(tmp_path, capsys):
    path = tmp_path / "grid_T.nc"
    cf_grid_file(path)
    out = inspect_text(path, capsys)
    assert "[bounds of /nav_lat]" in out and "[coordinates of /tos]" in out
    assert "group 2: 33 rows on '/y', 4 datasets, 47520 bytes (coordinates, bounds or metadata only)" in out
    assert (
        "default: convert takes group 1: data variables on the unlimited (record) dimension; the others hold "
        "coordinates, bounds or metadata only" in out
    )


# ------------------------------------------------------------------------- record dimension, dimension scales


def test_the_unlimited_dimension_is_the_row_axis(tmp_path):
    path = tmp_path / "obs.nc"
    series = np.arange(6 * 3, dtype="f4").reshape(6, 3)
    field = np.arange(50 * 40, dtype="f8").reshape(50, 40)  # 50 rows on 'lat', 18x the bytes of the series
    nc4(
        path,
        {"time": (6, True), "lat": (50, False), "lon": (40, False), "station": (3, False)},
        {"series": (("time", "station"), series, {}), "field": (("lat", "lon"), field, {})},
    )
    examples = converted(tmp_path, path)
    assert features(tmp_path) == ["series"]
    np.testing.assert_array_equal(np.stack([e["series"] for e in examples]), series)


def test_dimension_scales_decide_the_row_axis_not_equal_length(tmp_path, caplog):
    path = tmp_path / "scales.nc"
    temp = np.arange(8 * 2, dtype="f4").reshape(8, 2)
    nc4(
        path,
        {"time": (8, False), "depth": (2, False)},
        {"time": (("time",), np.arange(8.0), {}), "temp": (("time", "depth"), temp, {})},
    )
    with h5py.File(path, "a") as f:
        f["lookup"] = np.arange(8, dtype="i1")  # 8 rows too, but on no dimension
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        examples = converted(tmp_path, path)
    assert features(tmp_path) == ["temp", "time"]  # (before: lookup joined them by its length alone)
    np.testing.assert_array_equal(np.stack([e["temp"] for e in examples]), temp)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "group 2: 8 rows, 1 dataset(s) (/lookup) -> --row_group 2" in said


# --------------------------------------------------------------------------------------------- NetCDF-3 CF


def test_netcdf3_cf_record_variable_over_its_coordinates(tmp_path):
    path = tmp_path / "cf3.nc"
    rng = np.random.default_rng(1)
    sst = rng.normal(size=(2, 20, 30)).astype("f4")
    with netcdf_file(path, "w", version=2) as f:
        f.createDimension("time", None)
        f.createDimension("y", 20)
        f.createDimension("x", 30)
        f.createDimension("nv", 4)
        t = f.createVariable("time", "f8", ("time",))
        t[:] = [0.0, 1.0]
        for name in ("lat", "lon"):
            v = f.createVariable(name, "f8", ("y", "x"))
            v[:] = rng.normal(size=(20, 30))
            v.bounds = f"{name}_bnds"
            b = f.createVariable(f"{name}_bnds", "f8", ("y", "x", "nv"))
            b[:] = rng.normal(size=(20, 30, 4))
        s = f.createVariable("sst", "f4", ("time", "y", "x"))
        s[:] = sst
        s.coordinates = "lat lon"
    examples = converted(tmp_path, path)
    assert features(tmp_path) == ["sst", "time"]
    np.testing.assert_array_equal(np.stack([e["sst"] for e in examples]), sst)


# ---------------------------------------------------------------------------------- top-level groups, Header


def scans_file(path, scans=("Scan 1", "Scan 2"), header=True):
    """An h5ebsd-like file: per scan, 9 rows of 6x6 patterns and per-pattern metadata in ``EBSD/Data``, and (with
    ``header``) four 351-row bitmaps in ``EBSD/Header/Schematic N`` outweighing the patterns."""
    out = {}
    with h5py.File(path, "w") as f:
        f["Manufacturer"] = np.bytes_(b"EDAX")
        for k, scan in enumerate(scans):
            patterns = np.arange(9 * 36, dtype="u1").reshape(9, 6, 6) + k
            f[f"{scan}/EBSD/Data/Pattern"] = patterns
            f[f"{scan}/EBSD/Data/X Position"] = np.arange(9, dtype="f4") + 10 * k
            if header:
                for n in range(1, 5):
                    f[f"{scan}/EBSD/Header/Coordinate System/Schematic {n}"] = np.full((351, 170, 3), n, "u1")
            out[scan] = patterns
    return out


def test_scans_under_different_top_level_groups_are_not_merged(tmp_path, capsys):
    path = tmp_path / "two_scans.h5"
    patterns = scans_file(path)
    code, _, err = convert(path, tmp_path / "refused", capsys=capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert (
        "SchemaError: Which data to convert is not clear: the data variables lie under 2 top-level groups "
        "that share no dimension scale (/Scan 1, /Scan 2): group 1: 9 rows, 2 dataset(s) (/Scan 1/EBSD/Data/"
        "Pattern, /Scan 1/EBSD/Data/X Position) -> --row_group 1; group 2: 9 rows, 2 dataset(s) (/Scan 2/" in err
    )
    assert not list((tmp_path / "refused").glob("*.tfrecord")) if (tmp_path / "refused").exists() else True
    examples = converted(tmp_path, path, "--row_group", "2", name="scan2", capsys=capsys)
    assert features(tmp_path, "scan2") == ["Scan 2/EBSD/Data/Pattern", "Scan 2/EBSD/Data/X Position"]
    np.testing.assert_array_equal(np.stack([e["Scan 2/EBSD/Data/Pattern"] for e in examples]), patterns["Scan 2"])
    out = inspect_text(path, capsys)
    assert "group 1: 9 rows under '/Scan 1', 2 datasets" in out
    assert "default: none, convert refuses to choose: the data variables lie under 2 top-level groups" in out


def test_metadata_of_other_top_level_groups_is_not_merged_with_the_data(tmp_path, capsys):
    path = tmp_path / "master.h5"
    with h5py.File(path, "w") as f:  # an EMsoft-like master pattern file: length-1 metadata beside the stack
        for i in range(6):
            f[f"CrystalData/Param{i}"] = np.array([i], "i4")
        f["EMData/EBSDmaster/mLPNH"] = np.zeros((1, 48, 64), "f4")
    code, _, err = convert(path, tmp_path / "refused", capsys=capsys)
    assert code != 0 and "lie under 2 top-level groups that share no dimension scale (/CrystalData, /EMData)" in err
    assert "group 1: 1 rows, 1 dataset(s) (/EMData/EBSDmaster/mLPNH) -> --row_group 1; group 2: 1 rows, 6 " in err
    converted(tmp_path, path, "--row_group", "1", name="stack", capsys=capsys)
    assert features(tmp_path, "stack") == ["EMData/EBSDmaster/mLPNH"]


def test_header_bitmaps_give_way_to_the_data(tmp_path, caplog):
    path = tmp_path / "one_scan.h5"
    patterns = scans_file(path, scans=("Scan 1",))
    with caplog.at_level("WARNING", logger="tfrecord_etl"):
        examples = converted(tmp_path, path)
    assert features(tmp_path) == ["Scan 1/EBSD/Data/Pattern", "Scan 1/EBSD/Data/X Position"]
    np.testing.assert_array_equal(np.stack([e["Scan 1/EBSD/Data/Pattern"] for e in examples]), patterns["Scan 1"])
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "(data variables; the others hold coordinates, bounds or metadata only)" in said


@pytest.mark.parametrize("layout", ["root", "one group"])
def test_files_without_conventions_keep_the_largest_group(tmp_path, layout):
    path = tmp_path / "plain.h5"
    prefix = "" if layout == "root" else "data/"
    with h5py.File(path, "w") as f:
        f[f"{prefix}images"] = np.arange(5 * 16, dtype="u1").reshape(5, 4, 4)
        f[f"{prefix}labels"] = np.arange(5, dtype="i8")
        f[f"{prefix}meta/names"] = np.array([b"a", b"b"])  # under one top-level group at most: no refusal
    converted(tmp_path, path)
    assert features(tmp_path) == [f"{prefix}images", f"{prefix}labels"]


def test_cf_references_parse_every_form_and_resolve_by_proximity():
    from tfrecord_etl.transforms.sources.conventions import _names, _resolve

    assert _names(np.bytes_(b"time_centered nav_lat nav_lon")) == ["time_centered", "nav_lat", "nav_lon"]
    assert _names("area: cell_area volume: cell_volume") == ["cell_area", "cell_volume"]  # cell_measures
    assert _names("crsOSGB: x y crsWGS84: lat lon", keys=True) == ["crsOSGB", "x", "y", "crsWGS84", "lat", "lon"]
    assert _names(np.array([b"lat_bnds"])) == ["lat_bnds"] and _names(np.int32(3)) == []
    known = {"/lat", "/forecast/lat", "/forecast/run/t", "/obs/lon"}
    assert _resolve("lat", "/forecast/run/t", known) == "/forecast/lat"  # the nearest enclosing group first
    assert _resolve("lat", "/obs/sst", known) == "/lat" and _resolve("/obs/lon", "/x", known) == "/obs/lon"
    assert _resolve("missing", "/obs/sst", known) is None
