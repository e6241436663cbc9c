"""A real third-party Zarr store: the ``fixture/`` v2 store of zarr-python's 2.18.3 sdist (fetched by .ci/env.sh into
``zarr-fixture``), written by zarr 2 and numcodecs for zarr's own format-compatibility tests: integer, unsigned,
float (f2/f4/f8), bool and string dtypes, C and F order, 1-4 dimensions, uncompressed, zlib, bz2 and blosc
(zstd with no/byte/bit shuffle, lz4). Every array zarr 3 reads converts exactly as ``zarr.open_array(...)[...]``
reads it; the 14 that zarr 3.1 cannot open (``|S1``/``<U4`` arrays whose ``fill_value`` is ``0``) are skipped with one
warning and listed by inspect as unreadable."""

from __future__ import annotations

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from tests.conftest import convert, fixture_file, run_command  # noqa: E402
from tfrecord_etl.transforms import reader  # noqa: E402

STORE = "zarr-fixture"


def readable(store) -> dict:
    """Every array of the store that zarr 3 opens, by name (zarr's own reads: the reference)."""
    out = {}
    for top in sorted(p.name for p in store.iterdir() if p.is_dir()):
        for path in [store / top] + sorted(p for p in (store / top).iterdir() if p.is_dir()):
            name = str(path.relative_to(store))
            if (path / ".zarray").exists():
                try:
                    out[name] = zarr.open_array(str(store), path=name, mode="r")[...]
                except TypeError:
                    continue
    return out


def test_every_readable_array_converts_exactly_datasets_mode(tmp_path, caplog, capsys):
    store = fixture_file(STORE)
    expected = readable(store)
    assert len(expected) == 5 + 22 * 7  # flat, meta, nested, ... and groups 0-23 but the two string groups
    del expected["nested_legacy"]  # see the next test
    code, _, err = convert(
        str(store),
        str(tmp_path / "o"),
        "--container_mode",
        "datasets",
        "--writer",
        "planned",
        "--datasets",
        ",".join(sorted(expected)),
        beam=False,
        capsys=capsys,
    )
    assert code == 0, err
    got = {np.asarray(r["key"]).item().decode(): r["array"] for r in reader.iter_numpy(str(tmp_path / "o"))}
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
        assert got[name].dtype == value.dtype.newbyteorder("<") or got[name].dtype == value.dtype, name
    code, _, err = convert(
        str(store),
        str(tmp_path / "all"),
        "--container_mode",
        "datasets",
        "--writer",
        "planned",
        "--allow_fill_value",
        beam=False,
        capsys=capsys,
    )
    assert code == 0, err
    assert caplog.text.count("Skipping 14 node(s)") == 1 and "14/0 (TypeError" in caplog.text


def test_legacy_nested_chunks_zarr_reads_as_fill_are_refused(tmp_path, capsys):
    """``nested_legacy`` keeps its chunk at ``0/0`` (zarr 2's nested layout, undeclared in its ``.zarray``): zarr 3
    looks for ``0.0``, finds nothing and returns the fill value without a word; the conversion refuses it."""
    store = fixture_file(STORE)
    assert (store / "nested_legacy" / "0" / "0").is_file() and not (store / "nested_legacy" / "0.0").exists()
    assert not zarr.open_array(str(store), path="nested_legacy", mode="r")[...].any()  # zarr: all zeros
    np.testing.assert_array_equal(zarr.open_array(str(store), path="nested", mode="r")[...], [[1, 2], [3, 4]])
    code, _, err = convert(
        str(store), str(tmp_path / "o"), "--datasets", "nested_legacy", "--writer", "planned", beam=False, capsys=capsys
    )
    assert code != 0
    assert "The chunk 'nested_legacy/0.0' of array 'nested_legacy' was never written" in err


@pytest.mark.parametrize("group", ["0", "8", "17", "21"])  # ints (F order), f2/f4/f8, bool, 3-D F order
def test_rows_mode_group_with_every_compressor(tmp_path, capsys, group):
    store = fixture_file(STORE) / group  # a group of the store is a store
    names = [f"{group}/{i}" for i in range(7)]
    code, _, err = convert(str(store), str(tmp_path / "o"), "--writer", "planned", beam=False, capsys=capsys)
    assert code == 0, err
    rows = list(reader.iter_numpy(str(tmp_path / "o")))
    for i, name in enumerate(names):
        want = zarr.open_array(str(fixture_file(STORE)), path=name, mode="r")[...]
        np.testing.assert_array_equal(np.stack([np.asarray(r[str(i)]) for r in rows]), want, err_msg=name)


def test_inspect_lists_the_unreadable_arrays(capsys):
    from tfrecord_etl.pipelines import inspect as inspect_module

    code, out, _ = run_command(inspect_module.main, [str(fixture_file(STORE))], capsys)
    assert code == 0
    assert out.count("[unreadable: zarr cannot read it: TypeError") == 14
    assert "group 8: 1111 rows, 28 datasets" in out
