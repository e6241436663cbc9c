"""--format fits: the FITS files astropy ships (images, unsigned and scaled images, tile-compressed images, binary
and ASCII tables, random groups) and generated ones, converted with default options and compared with astropy's
own reading: our reader and plain TensorFlow, both writers, the HDU chosen (default, --row_group, --datasets),
header cards as features, verify --source, inspect's tree, an augment join, and the refusals (truncated files,
absurd dimensions, compression bombs, random groups) in one line before anything is allocated."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import BEAM_FLAGS, convert, fixture_file, run_command
from tfrecord_etl.transforms import reader, sources
from tfrecord_etl.transforms.errors import SchemaError, SourceError
from tfrecord_etl.transforms.sources import SourceOptions

fits = pytest.importorskip("astropy.io.fits")
DATA = "astropy/io/fits/tests/data"


def real(name: str):
    return fixture_file(f"{DATA}/{name}")


def metadata(out) -> dict:
    return json.loads((out / "metadata.json").read_text())


def rows(out, feature: str) -> np.ndarray:
    return np.stack([e[feature] for e in reader.iter_numpy(str(out))])


def tf_rows(out, feature: str, dtype, shape) -> np.ndarray:
    """``feature`` of every record read with plain TensorFlow (the tensor encoding's little-endian bytes, or a
    list feature cast back)."""
    import tensorflow as tf

    files = sorted(str(p) for p in out.iterdir() if p.name.endswith(".tfrecord"))
    meta = metadata(out)
    encoding = next(f["encoding"] for f in meta["features"] if f["name"] == feature)
    got = []
    for record in tf.data.TFRecordDataset(files):
        example = tf.train.Example.FromString(record.numpy())
        value = example.features.feature[feature]
        if encoding == "tensor":
            got.append(np.frombuffer(value.bytes_list.value[0], np.dtype(dtype).newbyteorder("<")).reshape(shape))
        else:
            kind = value.WhichOneof("kind")
            got.append(np.array(getattr(value, kind).value).astype(dtype).reshape(shape))
    return np.stack(got)


IMAGES = {  # file -> (HDU, dtype written): astropy's own values (uint=True applies the unsigned convention)
    "arange.fits": (0, "int32"),
    "fixed-1890.fits": (0, "uint16"),  # BZERO 32768: unsigned 16-bit
    "comp.fits": (1, "int16"),  # RICE_1 tile-compressed
    "compressed_float_bzero.fits": (1, "uint16"),  # tile-compressed, unsigned
    "double_ext.fits": (1, "uint16"),
    "o4sp040b0_raw.fits": (1, "uint16"),  # HST STIS: two SCI extensions, the first is the default
}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_astropys_images_convert_exactly_with_default_options(tmp_path, capsys, name):
    ext, dtype = IMAGES[name]
    want = fits.getdata(real(name), ext=ext)
    out = tmp_path / "out"
    code, _, err = convert(real(name), out, "--num_shards", "2", capsys=capsys)
    assert code == 0, err
    feature = metadata(out)["features"][0]["name"]
    got = rows(out, feature)
    assert got.dtype == np.dtype(dtype) == want.dtype.newbyteorder("=") and np.array_equal(got, want)
    assert np.array_equal(tf_rows(out, feature, dtype, want.shape[1:]), want)


@pytest.mark.parametrize("writer", ["planned", "beam"])
def test_a_chandra_event_table_becomes_one_feature_per_column(tmp_path, capsys, writer):
    path = real("chandra_time.fits")
    out = tmp_path / "out"
    code, _, err = convert(path, out, "--writer", writer, "--provenance", capsys=capsys)
    assert code == 0, err
    got = sorted(reader.iter_numpy(str(out)), key=lambda e: int(e["_source/row"]))
    table = fits.getdata(path, ext=1)
    for column in table.columns.names:
        values = np.stack([e[column] for e in got])
        assert np.array_equal(values, np.asarray(table.field(column))), column
    assert np.stack([e["status"] for e in got]).dtype == bool  # a bit (X) column: booleans


@pytest.mark.parametrize("name", ["btable.fits", "tdim.fits", "table.fits", "ascii.fits", "memtest.fits"])
def test_binary_and_ascii_tables_equal_astropys_columns(tmp_path, capsys, name):
    out = tmp_path / "out"
    assert convert(real(name), out, capsys=capsys)[0] == 0
    table = fits.getdata(real(name), ext=1)
    for column in table.columns.names:
        want = np.asarray(table.field(column))
        if want.dtype.kind == "U":  # text: bytes, without FITS's trailing blanks
            want = np.char.encode(want, "ascii")
        got = rows(out, column)
        assert got.shape == want.shape and np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), column


def test_scaled_values_are_the_stored_ones_with_the_scaling_recorded(tmp_path, capsys):
    """BSCALE/BZERO other than the unsigned convention, and a column's TSCAL/TZERO: the stored numbers, exact."""
    out = tmp_path / "out"
    assert convert(real("scale.fits"), out, capsys=capsys)[0] == 0
    stored = fits.getdata(real("scale.fits"), do_not_scale_image_data=True)
    assert np.array_equal(rows(out, "PRIMARY"), stored) and rows(out, "PRIMARY").dtype == np.int16
    entry = metadata(out)["sources"][0]
    assert entry["attributes"] == {"PRIMARY": {"BSCALE": 0.045777764213996, "BZERO": 1500.0}}
    assert convert(real("tb.fits"), tmp_path / "tb", capsys=capsys)[0] == 0
    with fits.open(real("tb.fits")) as hdul:
        assert np.array_equal(rows(tmp_path / "tb", "c3"), hdul[1].data.view(np.ndarray)["c3"])
    assert metadata(tmp_path / "tb")["sources"][0]["attributes"] == {
        "HDU1/c1": {"TNULL": -2147483647},  # the stored value that means undefined
        "HDU1/c3": {"TSCAL": 3, "TZERO": 0.4},
    }


def write_images(path, **more):
    """A FITS file: an empty primary HDU (with the card OBSERVER), then one image HDU per keyword."""
    primary = fits.PrimaryHDU()
    primary.header["OBSERVER"] = "Hubble"
    hdus = [primary] + [fits.ImageHDU(data, name=name.upper()) for name, data in more.items()]
    fits.HDUList(hdus).writeto(path)
    return path


@pytest.mark.parametrize(
    "dtype", ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"]
)
def test_every_dtype_round_trips_over_many_row_ranges(tmp_path, capsys, dtype):
    """Random bytes of every dtype (NaNs and infinities among the floats), compared bit for bit."""
    data = np.random.default_rng(7).integers(0, 256, 600 * 7 * np.dtype(dtype).itemsize, np.uint8).view(dtype)
    data = data.reshape(600, 7)
    write_images(tmp_path / "a.fits", cube=data)
    out = tmp_path / "out"
    code, _, err = convert(tmp_path / "a.fits", out, "--target_range_mb", "0.001", "--num_shards", "3", capsys=capsys)
    assert code == 0, err
    bits = f"u{np.dtype(dtype).itemsize}"
    got = rows(out, "CUBE")
    assert got.dtype == np.dtype(dtype) and np.array_equal(got.view(bits), data.view(bits))
    floats = np.dtype(dtype).kind == "f"  # (a float list's NaN payloads pass through Python floats in TensorFlow)
    assert np.array_equal(tf_rows(out, "CUBE", dtype, (7,)), data, equal_nan=floats)


def test_the_largest_hdu_is_the_default_and_others_are_chosen_by_flag(tmp_path, capsys, caplog):
    small, large = np.arange(12, dtype=np.int16).reshape(4, 3), np.arange(60.0).reshape(10, 6)
    write_images(tmp_path / "a.fits", small=small, large=large)
    assert convert(tmp_path / "a.fits", tmp_path / "d", capsys=capsys)[0] == 0
    assert np.array_equal(rows(tmp_path / "d", "LARGE"), large)
    assert "--row_group 2" in caplog.text  # the other HDU named with its flag
    assert convert(tmp_path / "a.fits", tmp_path / "g", "--row_group", "2", capsys=capsys)[0] == 0
    assert np.array_equal(rows(tmp_path / "g", "SMALL"), small)
    assert convert(tmp_path / "a.fits", tmp_path / "n", "--datasets", "SMALL", capsys=capsys)[0] == 0
    assert np.array_equal(rows(tmp_path / "n", "SMALL"), small)
    code, _, err = convert(tmp_path / "a.fits", tmp_path / "x", "--datasets", "SCI", capsys=capsys)
    assert code == 2 and "No such HDU or column" in err and "SCI" in err and "LARGE" in err


def test_header_cards_become_features_of_every_example(tmp_path, capsys):
    data = np.arange(20, dtype=np.float32).reshape(5, 4)
    write_images(tmp_path / "a.fits", sci=data)
    with fits.open(tmp_path / "a.fits", mode="update") as hdul:
        hdul[1].header["EXPTIME"] = 1200.5
        hdul[1].header["NCOMBINE"] = 3
        hdul[1].header["FLATCOR"] = True
    out = tmp_path / "out"
    code, _, err = convert(tmp_path / "a.fits", out, "--fits_cards", "exptime,NCOMBINE,FLATCOR,OBSERVER", capsys=capsys)
    assert code == 0, err
    got = list(reader.iter_numpy(str(out)))
    assert len(got) == 5 and np.array_equal(np.stack([e["SCI"] for e in got]), data)
    for e in got:  # OBSERVER from the primary header
        assert float(e["header/EXPTIME"]) == 1200.5 and int(e["header/NCOMBINE"]) == 3
        assert bool(e["header/FLATCOR"]) is True and e["header/OBSERVER"] in (b"Hubble", [b"Hubble"])
    code, _, err = convert(tmp_path / "a.fits", tmp_path / "x", "--fits_cards", "AIRMASS", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "Header card 'AIRMASS' not found in HDU 'SCI'" in err


def test_verify_source_inspect_and_an_augment_join(tmp_path, capsys):
    from tfrecord_etl.pipelines import augment, inspect, verify

    path = tmp_path / "fixed-1890.fits"
    path.write_bytes(real("fixed-1890.fits").read_bytes())
    out = tmp_path / "out"
    assert convert(path, out, capsys=capsys)[0] == 0
    code, stdout, _ = run_command(verify.main, [out, "--source", path], capsys)
    assert code == 0, stdout
    with fits.open(path, mode="update", memmap=False) as hdul:  # one pixel of row 57 changed after the conversion
        hdul[0].data[57, 3] += 1
    code, stdout, _ = run_command(verify.main, [out, "--source", path], capsys)
    assert code == 1 and "57" in stdout
    path.write_bytes(real("fixed-1890.fits").read_bytes())
    code, text, _ = run_command(inspect.main, [real("o4sp040b0_raw.fits")], capsys)
    assert code == 0 and "FITS file" in text and "SCI_1" in text and "uint16" in text
    assert "default: convert takes group 1: the largest in bytes" in text and "--datasets SCI_2" in text
    code, text, _ = run_command(inspect.main, [real("tb.fits"), "--json"], capsys)
    tree = json.loads(text)
    assert tree["format"] == "FITS" and [g["datasets"] for g in tree["row_groups"]] == [
        ["HDU1/c1", "HDU1/c2", "HDU1/c3", "HDU1/c4"]
    ]
    np.save(tmp_path / "x.npy", np.arange(100))
    assert convert(tmp_path / "x.npy", tmp_path / "src", capsys=capsys)[0] == 0
    argv = ["--input", tmp_path / "src", "--output_dir", tmp_path / "side", "--mode", "sidecar"]
    argv += ["--join_input", path, "--join_fields", "PRIMARY=image", *BEAM_FLAGS]
    code, _, err = run_command(augment.main, argv, capsys)
    assert code == 0, err
    merged = reader.iter_numpy_merged(str(tmp_path / "src"), str(tmp_path / "side"))
    assert np.array_equal(np.stack([e["image"] for e in merged]), fits.getdata(path))


def test_a_truncated_file_and_absurd_dimensions_are_refused_before_reading(tmp_path):
    source = sources.make_source("fits", SourceOptions())
    whole = real("fixed-1890.fits").read_bytes()
    (tmp_path / "cut.fits").write_bytes(whole[: len(whole) - 5000])
    with pytest.raises(SourceError, match=r"HDU 'PRIMARY' declares 20,000 data bytes from byte offset 11,520, beyond"):
        source.index(str(tmp_path / "cut.fits"))
    header = fits.Header()
    for key, value in (("SIMPLE", True), ("BITPIX", 64), ("NAXIS", 3)):
        header[key] = value
    header["NAXIS1"], header["NAXIS2"], header["NAXIS3"] = 10**6, 10**6, 1
    (tmp_path / "huge.fits").write_bytes(header.tostring().encode() + bytes(2880))
    with pytest.raises(SourceError, match=r"declares 8,000,000,000,000 data bytes from byte offset 2,880.*huge.fits"):
        source.index(str(tmp_path / "huge.fits"))
    header["NAXIS3"] = 10**9  # beyond a file offset: astropy refuses the header itself
    (tmp_path / "huge.fits").write_bytes(header.tostring().encode() + bytes(2880))
    with pytest.raises(SourceError, match=r"Not a readable FITS file: Empty or corrupt FITS file.*huge.fits"):
        source.index(str(tmp_path / "huge.fits"))


def test_a_file_of_too_many_hdus_is_refused_while_its_headers_are_read(tmp_path, capsys):
    fits.HDUList([fits.PrimaryHDU()] + [fits.ImageHDU(np.zeros(2, np.int16)) for _ in range(30)]).writeto(
        tmp_path / "many.fits"
    )
    code, _, err = convert(tmp_path / "many.fits", tmp_path / "out", "--max_datasets", "20", capsys=capsys)
    assert code == 2 and "The file holds more than 20 HDUs (--max_datasets)" in err and "many.fits" in err
    assert convert(tmp_path / "many.fits", tmp_path / "out", "--datasets", "HDU30", capsys=capsys)[0] == 0


def test_a_compression_bomb_is_refused_unless_allowed(tmp_path, capsys):
    fits.HDUList(
        [
            fits.PrimaryHDU(),
            fits.CompImageHDU(np.zeros((1000, 1000), np.int32), tile_shape=(1000, 1000), compression_type="GZIP_1"),
        ]
    ).writeto(tmp_path / "z.fits")
    code, _, err = convert(tmp_path / "z.fits", tmp_path / "out", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "compressed image of 4,000,000 bytes" in err and "z.fits" in err
    code, _, err = convert(tmp_path / "z.fits", tmp_path / "out", "--max_compression_ratio", "1e6", capsys=capsys)
    assert code == 0, err
    assert not rows(tmp_path / "out", "COMPRESSED_IMAGE").any()


def test_random_groups_and_a_damaged_header_say_what_to_do(tmp_path):
    source = sources.make_source("fits", SourceOptions())
    with pytest.raises(SchemaError, match=r"random groups only \(HDU PRIMARY\).*hdul\[0\]\.data\.par"):
        source.index(str(real("random_groups.fits")))
    with pytest.raises(SchemaError, match=r"The file holds no image or table with data.*history_header\.fits"):
        source.index(str(real("history_header.fits")))  # a primary header and nothing else
    (tmp_path / "bad.fits").write_bytes(b"SIMPLE  =                    T" + b"x" * 3000)
    with pytest.raises(SourceError, match=r"Not a readable FITS file.*bad\.fits"):
        source.index(str(tmp_path / "bad.fits"))


def test_a_row_range_reads_only_its_rows(tmp_path, monkeypatch):
    """A range of an image reads through astropy's section (the rows asked), never the whole array (``data``)."""
    data = np.arange(1000 * 50, dtype=">i4").reshape(1000, 50)
    write_images(tmp_path / "a.fits", img=data)
    source = sources.make_source("fits", SourceOptions())
    index = source.index(str(tmp_path / "a.fits"))
    monkeypatch.setattr(fits.ImageHDU, "data", property(lambda hdu: pytest.fail("the whole image was read")))
    got = source.read(sources.RowRange(str(tmp_path / "a.fits"), 400, 410, index.items))
    assert np.array_equal(got["IMG"], data[400:410])
    source.close()


def test_datasets_mode_makes_each_image_one_example(tmp_path, capsys):
    path = real("o4sp040b0_raw.fits")
    out = tmp_path / "out"
    assert convert(path, out, "--container_mode", "datasets", capsys=capsys)[0] == 0
    got = {np.asarray(e["key"]).item().decode(): e["array"] for e in reader.iter_numpy(str(out))}
    assert sorted(got) == ["SCI_1", "SCI_2"]
    assert np.array_equal(got["SCI_2"], fits.getdata(path, "SCI", 2))
    flags = ["--container_mode", "datasets", "--fits_cards", "EXPTIME"]
    code, _, err = convert(path, tmp_path / "x", *flags, capsys=capsys)
    assert code == 2 and "--fits_cards adds features to the rows of one HDU: not in datasets mode" in err


def test_table_columns_of_the_unsigned_convention_and_scaled_ones(tmp_path, capsys):
    """Unsigned columns (astropy's Table writes uint16/uint32/uint64 with TZERO 2**(n-1)) and signed bytes (TZERO
    -128 on B, which astropy itself reads as floats) are written as those types, exactly; a column with TSCAL is
    written as stored, its TSCAL/TZERO/TNULL recorded."""
    from astropy.table import Table

    n = 300
    rng = np.random.default_rng(3)
    columns = {
        "u16": rng.integers(0, 2**16, n, dtype=np.uint16),
        "u32": rng.integers(0, 2**32, n, dtype=np.uint32),
        "u64": rng.integers(0, 2**63, n, dtype=np.uint64) * 2 + 1,
        "u8": rng.integers(0, 256, n, dtype=np.uint8),
        "vec": rng.normal(size=(n, 3)),
    }
    signed = rng.integers(-128, 128, n, dtype=np.int8)
    more = [
        fits.Column(name="i8", format="B", bzero=-128, array=signed),
        fits.Column(name="scaled", format="I", null=-1, array=np.arange(n, dtype=np.int16)),
    ]
    table = fits.BinTableHDU.from_columns(fits.table_to_hdu(Table(columns)).columns + fits.ColDefs(more), name="EVENTS")
    fits.HDUList([fits.PrimaryHDU(), table]).writeto(tmp_path / "t.fits")
    with fits.open(tmp_path / "t.fits", mode="update") as hdul:  # the stored integers scaled by the header
        hdul[1].header["TSCAL7"], hdul[1].header["TZERO7"] = 0.5, 10.0
    with fits.open(tmp_path / "t.fits") as hdul:
        assert hdul[1].columns["u16"].bzero == 2**15 and hdul[1].data.view(np.ndarray)["i8"].dtype == np.uint8
    out = tmp_path / "out"
    code, _, err = convert(tmp_path / "t.fits", out, "--num_shards", "2", capsys=capsys)
    assert code == 0, err
    for name, want in {**columns, "i8": signed}.items():
        got = rows(out, name)
        assert got.dtype == want.dtype.newbyteorder("=") and np.array_equal(got, want), name
    assert np.array_equal(rows(out, "scaled"), np.arange(n, dtype=np.int16))  # (the stored integers)
    assert metadata(out)["sources"][0]["attributes"] == {"EVENTS/scaled": {"TSCAL": 0.5, "TZERO": 10.0, "TNULL": -1}}
