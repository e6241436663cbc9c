"""MATLAB text: char arrays convert to strings and cells of char row vectors to string lists, the same from a v7 file
(SciPy) and its v7.3 twin (hdf5storage, read by h5py), exact, read back with plain TensorFlow, checked by verify."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.io import savemat

from tests.conftest import convert, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.sources import mattext

NEIGHBOURS = [("Fp1", ["Fp2", "Fz"]), ("Fp2", ["Fp1"]), ("Fz", ["Fp1", "Fp2", "Cz"]), ("Cz", [])]


def neighbour_files(tmp_path):
    """A FieldTrip-style channel-neighbour file (a 1x4 struct array: label, a char row; neighblabel, a cell of
    char rows, one of them empty) as MATLAB v7 (scipy.io.savemat) and v7.3 (hdf5storage)."""
    import hdf5storage

    nb = np.zeros((1, len(NEIGHBOURS)), dtype=[("label", object), ("neighblabel", object)])
    for k, (label, near) in enumerate(NEIGHBOURS):
        cell = np.empty((len(near), 1), dtype=object)
        cell[:, 0] = near
        nb[0, k]["label"], nb[0, k]["neighblabel"] = label, cell
    v7, v73 = tmp_path / "v7.mat", tmp_path / "v73.mat"
    savemat(v7, {"neighbours": nb, "names": np.array(["ab c", "de  ", "f   "])}, do_compression=True)
    from scipy.io import loadmat

    loaded = loadmat(v7, chars_as_strings=False)
    hdf5storage.savemat(str(v73), {k: loaded[k] for k in ("neighbours", "names")}, format="7.3", matlab_compatible=True)
    return v7, v73


def converted(src, out, *flags):
    code, _, err = convert(src, out, *flags)
    assert code == 0, err
    return out


def verified(out, source):
    from tfrecord_etl.pipelines import verify

    code, _, err = run_command(verify.main, [str(out), "--source", str(source)])
    assert code == 0, err


def test_channel_neighbours_convert_to_strings_and_string_lists_equal_to_the_v73_twin(tmp_path):
    v7, v73 = neighbour_files(tmp_path)
    a = converted(v7, tmp_path / "a", "--container_mode", "datasets")
    b = converted(v73, tmp_path / "b", "--container_mode", "datasets")
    shards = sorted(p.name for p in a.glob("*.tfrecord"))
    assert shards and shards == sorted(p.name for p in b.glob("*.tfrecord"))
    for name in shards:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    got = {e["key"].item().decode(): e["array"] for e in reader.iter_numpy(str(a))}
    for k, (label, near) in enumerate(NEIGHBOURS, 1):
        assert got[f"/neighbours/label{{{k}}}"].tolist() == [label]
        if near:
            assert got[f"/neighbours/neighblabel{{{k}}}"].tolist() == near
            assert got[f"/neighbours/neighblabel{{{k}}}"].dtype.kind == "U"
        else:
            assert f"/neighbours/neighblabel{{{k}}}" not in got  # an empty cell array: nothing to convert
    assert got["/names"].tolist() == ["ab c", "de  ", "f   "]  # one string per row, the padding kept
    verified(a, v7)
    verified(b, v73)


def test_char_rows_are_string_rows_in_rows_mode_read_by_plain_tensorflow(tmp_path):
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    v7, v73 = neighbour_files(tmp_path)
    out = converted(v7, tmp_path / "rows", "--datasets", "names")
    twin = converted(v73, tmp_path / "rows73", "--datasets", "names")
    spec = reader.tf_feature_spec(str(out))
    records = list(tf.data.TFRecordDataset(sorted(str(p) for p in out.glob("*.tfrecord"))))
    assert [tf.io.parse_single_example(r, spec)["names"].numpy() for r in records] == [b"ab c", b"de  ", b"f   "]
    assert [r.numpy() for r in records] == [
        r.numpy() for r in tf.data.TFRecordDataset(sorted(str(p) for p in twin.glob("*.tfrecord")))
    ]


def test_text_that_no_string_holds_exactly_is_refused():
    units = np.array([[0xD83D, 0xDE00, 0x41]], "<u2")  # a surrogate pair (one character) and 'A'
    assert mattext.char_strings(units, "f.mat").tolist() == ["\U0001f600A"]
    with pytest.raises(SchemaError, match="unpaired UTF-16 surrogate"):
        mattext.char_strings(np.array([[0xD83D, 0x41]], "<u2"), "f.mat")
    with pytest.raises(SchemaError, match="U\\+0000"):
        mattext.char_strings(np.array([[0x41, 0]], "<u2"), "f.mat")
    # a 2x3x2 char array: the second MATLAB dimension is the text
    codes = np.array([ord(c) for c in "abcdefghijkl"], "<u2").reshape(2, 3, 2)
    got = mattext.char_strings(codes, "f.mat")
    assert got.shape == (2, 2) and got[0, 0] == "".join(map(chr, codes[0, :, 0]))
