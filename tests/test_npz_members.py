"""Members of .npz archives a user chooses (--datasets, --exclude_datasets) and structured arrays in every mode
of .npz and .npy: exact round trips, read back with plain TensorFlow, checked by verify --source."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from tests.conftest import convert, run_command
from tfrecord_etl.transforms import reader
from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.planning import plan_inputs
from tfrecord_etl.transforms.sources import SourceOptions
from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions

# a structured dtype with a nested compound, a big-endian field, bytes and a subarray field
STRUCT = np.dtype([("a", "<f4"), ("b", [("c", ">i2"), ("d", "S3")]), ("e", "<f8", (2, 3))])


def structured(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    s = np.zeros(n, STRUCT)
    s["a"] = rng.standard_normal(n)
    s["b"]["c"] = rng.integers(-300, 300, n)
    s["b"]["d"] = [(b"x", b"yy", b"zzz", b"", b"q", b"ab")[i % 6] for i in range(n)]
    s["e"] = rng.standard_normal((n, 2, 3))
    return s


def leaves(s: np.ndarray, prefix: str) -> dict:
    """The flattened fields of ``s`` as an independent reference (NumPy field access)."""
    return {f"{prefix}/a": s["a"], f"{prefix}/b/c": s["b"]["c"], f"{prefix}/b/d": s["b"]["d"], f"{prefix}/e": s["e"]}


@pytest.fixture(scope="module")
def tf():
    from tfrecord_etl.pipelines import common

    common.preload_tensorflow()
    import tensorflow as tf

    return tf


def pickled_archive(path) -> None:
    """19 plain members and one pickled object member (what a Python user's np.savez of a dict leaves)."""
    np.savez(path, **{f"m{i}": np.arange(4) * 10 + i for i in range(19)}, obj=np.array([{"a": 1}, None], dtype=object))


def ok(*args, capsys=None):
    code, out, err = convert(*args, capsys=capsys)
    assert code == 0, err
    return out, err


def verified(out, source):
    from tfrecord_etl.pipelines import verify

    code, _, err = run_command(verify.main, [str(out), "--source", str(source)])
    assert code == 0, err


def plain_tf_rows(out, tf) -> list[dict]:
    """Every record parsed by tf.io.parse_example with the recorded feature spec (plain TensorFlow)."""
    spec = reader.tf_feature_spec(str(out))
    files = sorted(str(p) for p in out.glob("*.tfrecord"))
    rows = []
    for serialized in tf.data.TFRecordDataset(files).batch(16):
        parsed = tf.io.parse_example(serialized, spec)
        for i in range(int(serialized.shape[0])):
            rows.append(
                {
                    k: (tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v)[i].numpy()
                    for k, v in parsed.items()
                }
            )
    return rows


def test_datasets_and_exclude_datasets_choose_npz_members(tmp_path):
    src = tmp_path / "in.npz"
    pickled_archive(src)
    ok(src, tmp_path / "x", "--exclude_datasets", "obj")
    got = list(reader.iter_numpy(str(tmp_path / "x")))
    assert sorted(got[0]) == sorted(f"m{i}" for i in range(19))
    for i in range(19):
        np.testing.assert_array_equal([r[f"m{i}"] for r in got], np.arange(4) * 10 + i)
    verified(tmp_path / "x", src)
    ok(src, tmp_path / "s", "--datasets", "m3,m17.npy")
    got = list(reader.iter_numpy(str(tmp_path / "s")))
    assert sorted(got[0]) == ["m17", "m3"] and [int(r["m17"]) for r in got] == [17, 27, 37, 47]
    verified(tmp_path / "s", src)
    ok(src, tmp_path / "a", "--npz_mode", "arrays", "--exclude_datasets", "obj,m0")
    keys = {np.asarray(r["key"]).item().decode(): r["array"] for r in reader.iter_numpy(str(tmp_path / "a"))}
    assert sorted(keys) == sorted(f"m{i}" for i in range(1, 19))
    np.testing.assert_array_equal(keys["m5"], np.arange(4) * 10 + 5)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--datasets", "m1,nope"], "No member named 'nope' (--datasets); the archive's members: m0, m1, m2"),
        (["--exclude_datasets", "obj,nope"], "No member named 'nope' (--exclude_datasets)"),
        (["--datasets", "m1", "--exclude_datasets", "m1"], "leave no member to convert"),
    ],
)
def test_unknown_or_empty_member_selections_are_refused_in_one_line(tmp_path, capsys, flags, message):
    src = tmp_path / "in.npz"
    pickled_archive(src)
    code, _, err = convert(src, tmp_path / "out", *flags, capsys=capsys)
    assert code == 2  # an input error
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: SourceError: ") and message in line and f"file='{src}'" in line
    assert "obj" in line and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_an_unselected_pickled_member_is_never_opened(tmp_path, monkeypatch):
    src = tmp_path / "in.npz"
    pickled_archive(src)
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(
        zipfile.ZipFile,
        "open",
        lambda self, name, *a, **k: (
            opened.append(name if isinstance(name, str) else name.filename),
            real_open(self, name, *a, **k),
        )[1],
    )
    for options in (
        SourceOptions(formats=(NumpyOptions(exclude_datasets=("obj",)),)),
        SourceOptions(datasets=("m2", "m4")),
        SourceOptions(formats=(NumpyOptions(npz_mode="arrays", exclude_datasets=("obj",)),)),
    ):
        plan = plan_inputs(str(src), options)
        source = plan.source
        for rr in plan.ranges:
            source.read(rr)
        source.close()
    assert opened and "obj.npy" not in opened
    # without a selection the pickled member is refused, and the error says how to leave it out
    with pytest.raises(SchemaError, match="never unpickled.*--exclude_datasets obj") as e:
        plan_inputs(str(src), SourceOptions())
    assert e.value.context["member"] == "obj"


def test_member_flags_are_refused_where_they_would_be_ignored(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.arange(4))
    code, _, err = convert(tmp_path / "a.npy", tmp_path / "out", "--exclude_datasets", "x", capsys=capsys)
    assert code == 2 and "ConfigError: --exclude_datasets leaves out members of .npz archives; the input is npy" in err
    code, _, err = convert(tmp_path / "a.npy", tmp_path / "out", "--datasets", "x", capsys=capsys)
    assert code == 2 and "ConfigError: --datasets names the arrays inside a container" in err
    assert "the input is npy" in err and not (tmp_path / "out" / "metadata.json").exists()


def test_zero_d_member_hint_names_exclude_datasets(tmp_path):
    np.savez(tmp_path / "in.npz", s=structured(5), scalar=np.float64(3.0))
    with pytest.raises(SchemaError, match="--exclude_datasets scalar"):
        plan_inputs(str(tmp_path / "in.npz"), SourceOptions())


def test_structured_npz_members_in_rows_and_arrays_mode_round_trip_exactly(tmp_path, tf):
    s, t = structured(6, 1), structured(4, 2)
    src = tmp_path / "in.npz"
    np.savez(src, s=s, t=t, z=s[2], scalar=np.float64(3.0))  # a 0-d member beside structured ones
    # rows mode: the structured member with rows, chosen by name; its fields are member/field features
    ok(src, tmp_path / "rows", "--datasets", "s")
    got = list(reader.iter_numpy(str(tmp_path / "rows")))
    for name, want in leaves(s, "s").items():
        np.testing.assert_array_equal(np.stack([r[name] for r in got]), want)
    tf_rows = plain_tf_rows(tmp_path / "rows", tf)
    assert [r["s/b/d"] for r in tf_rows] == list(s["b"]["d"])
    assert [int(r["s/b/c"]) for r in tf_rows] == s["b"]["c"].tolist()
    verified(tmp_path / "rows", src)
    # arrays mode: each structured member (0-d too) -> one Example with array/FIELD features
    ok(src, tmp_path / "arrays", "--npz_mode", "arrays", "--exclude_datasets", "scalar")
    got = {np.asarray(r["key"]).item().decode(): r for r in reader.iter_numpy(str(tmp_path / "arrays"))}
    assert sorted(got) == ["s", "t", "z"]
    for key, want in (("s", s), ("t", t), ("z", s[2])):
        for name, field in leaves(want, "array").items():
            assert got[key][name].dtype == field.dtype.newbyteorder("<") or field.dtype.kind == "S", name
            np.testing.assert_array_equal(got[key][name], field)
    assert got["z"]["array/e"].shape == (2, 3) and got["t"]["array/e"].shape == (4, 2, 3)
    verified(tmp_path / "arrays", src)
    # the 0-d member beside them: its own run
    ok(src, tmp_path / "scalar", "--npz_mode", "arrays", "--datasets", "scalar")
    (only,) = list(reader.iter_numpy(str(tmp_path / "scalar")))
    assert only["array"] == 3.0


def test_structured_npy_in_files_mode_round_trips_exactly(tmp_path, tf):
    s = structured(5, 3)
    np.save(tmp_path / "a.npy", s)
    np.save(tmp_path / "b.npy", s[:2])
    ok(tmp_path / "*.npy", tmp_path / "out", "--npy_mode", "files")
    got = {np.asarray(r["key"]).item().decode(): r for r in reader.iter_numpy(str(tmp_path / "out"))}
    for key, want in (("a", s), ("b", s[:2])):
        for name, field in leaves(want, "array").items():
            np.testing.assert_array_equal(got[key][name], field)
    verified(tmp_path / "out", tmp_path / "*.npy")
    tf_rows = plain_tf_rows(tmp_path / "out", tf)
    assert sorted(r["key"] for r in tf_rows) == [b"a", b"b"]


def test_members_of_different_fields_in_arrays_mode_are_refused_naming_both(tmp_path):
    np.savez(tmp_path / "in.npz", s=structured(3), x=np.arange(3.0))
    with pytest.raises(
        SchemaError,
        match=r"members 's' \(array/a, array/b/c, array/b/d, array/e\) and 'x' "
        r"\(array\).*--exclude_datasets",
    ) as e:
        plan_inputs(str(tmp_path / "in.npz"), SourceOptions(formats=(NumpyOptions(npz_mode="arrays"),)))
    assert "in.npz" in str(e.value)


def comma_archive(path) -> None:
    np.savez(path, **{"a,b": np.arange(3) * 10, "c": np.arange(3)})


@pytest.mark.parametrize("flag", ["--datasets", "--exclude_datasets"])
def test_a_member_name_with_a_comma_is_refused_saying_why_and_named_in_a_yaml_list(tmp_path, capsys, flag):
    src = tmp_path / "in.npz"
    comma_archive(src)
    code, _, err = convert(src, tmp_path / "out", flag, "a,b", capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    key = flag[2:]
    assert err.strip() == (
        f"error: SourceError: No member named 'a' ({flag}); the archive's members: 'a,b', c; 'a' is part of the "
        f"member 'a,b', whose name holds a comma, and {flag} splits its value at commas [file='{src}'] "
        f"Hint: name it in a YAML file passed with --config, as a list, which is not split: {key}: ['a,b']"
    )
    (tmp_path / "run.yaml").write_text(f"{key}: ['a,b']\n")  # the way the hint gives
    ok(src, tmp_path / "yaml", "--config", tmp_path / "run.yaml")
    got = list(reader.iter_numpy(str(tmp_path / "yaml")))
    kept = "a,b" if flag == "--datasets" else "c"
    assert [sorted(r) for r in got] == [[kept]] * 3
    assert [int(r[kept]) for r in got] == ([0, 10, 20] if kept == "a,b" else [0, 1, 2])
    verified(tmp_path / "yaml", src)


def test_a_typo_beside_a_member_with_a_comma_keeps_the_plain_message(tmp_path, capsys):
    src = tmp_path / "in.npz"
    comma_archive(src)
    code, _, err = convert(src, tmp_path / "out", "--datasets", "nope", capsys=capsys)
    assert code == 2 and err.strip() == (
        f"error: SourceError: No member named 'nope' (--datasets); the archive's members: 'a,b', c "
        f"[file='{src}'] Hint: pass member names as listed, without .npy"
    )


def npy_bytes(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.mark.parametrize("order", [("x.npy", "x"), ("x", "x.npy")])
def test_members_x_npy_and_x_are_refused_naming_both_by_convert_and_verify(tmp_path, capsys, order):
    """np.load names both 'x' (and reads 'x'): converting 'x.npy' would drop 'x' without a word."""
    from tfrecord_etl.pipelines import verify

    src = tmp_path / "twin.npz"
    values = {"x.npy": np.arange(3), "x": np.arange(3) * 10}
    with zipfile.ZipFile(src, "w") as z:
        for name in order:
            z.writestr(name, npy_bytes(values[name]))
    assert np.load(src).files == ["x", "x"]
    line = (
        "SourceError: The archive holds members 'x.npy' and 'x', both 'x' to np.load (which reads 'x'): "
        f"converting 'x.npy' would hide 'x' [file='{src}', member='x'] Hint: rewrite the archive with distinct "
        "member names (np.savez writes 'x.npy' for x=...)"
    )
    code, _, err = convert(src, tmp_path / "out", capsys=capsys)
    assert code == 2 and err.strip() == f"error: {line}"
    assert not (tmp_path / "out" / "metadata.json").exists()
    np.savez(tmp_path / "x.npz", x=np.arange(3))  # an output of the values convert took from 'x.npy'
    ok(tmp_path / "x.npz", tmp_path / "x_out")
    code, out, err = run_command(verify.main, [str(tmp_path / "x_out"), "--source", str(src)], capsys)
    assert code != 0 and line in out + err and "OK" not in out


ARRAYS_READERS = (
    "read with reader.iter_numpy or reader.RandomAccess (each member's own shape and dtype); "
    "reader.to_tf_dataset needs one dtype per feature, and fixed shapes to batch"
)


def test_members_of_different_shapes_hint_arrays_mode_and_the_readers_that_read_it(tmp_path, tf):
    src = tmp_path / "in.npz"
    a, b = np.arange(6, dtype=np.float32).reshape(3, 2), np.arange(5, dtype=np.float32) + 0.5
    np.savez(src, a=a, b=b)
    with pytest.raises(SchemaError) as e:
        plan_inputs(str(src), SourceOptions())
    assert str(e.value) == (
        f"Members have different leading lengths ({{'a': 3, 'b': 5}}): rows mode takes row i of every member "
        f"[file='{src}'] Hint: use --npz_mode arrays (each member -> one Example), {ARRAYS_READERS}"
    )
    ok(src, tmp_path / "out", "--npz_mode", "arrays")
    out = str(tmp_path / "out")
    for rows in (list(reader.iter_numpy(out)), reader.RandomAccess(out).__getitems__([0, 1])):
        assert [np.asarray(r["key"]).item() for r in rows] == [b"a", b"b"]
        assert all(r["array"].dtype == np.float32 for r in rows)
        np.testing.assert_array_equal(rows[0]["array"], a)
        np.testing.assert_array_equal(rows[1]["array"], b)
    with pytest.raises(SchemaError) as e:
        reader.to_tf_dataset(out, batch_size=2)
    assert str(e.value) == (
        f"Cannot batch: the shape of ['array'] varies between examples (tf.data batches fixed shapes only) "
        f"[file='{out}'] Hint: read batches with reader.iter_numpy(batch_size=N) or reader.RandomAccess (each "
        "example's array in an object array), pass batch_size=None (and batch them yourself, e.g. with "
        "ds.ragged_batch), or select fixed features with features=[...]"
    )


def test_members_of_different_dtypes_in_arrays_mode_name_both_numpy_readers(tmp_path):
    src = tmp_path / "in.npz"
    np.savez(src, a=np.arange(4, dtype=np.int16), b=np.arange(3.0))
    ok(src, tmp_path / "out", "--npz_mode", "arrays")
    out = str(tmp_path / "out")
    batch = reader.RandomAccess(out).batch([1, 0])
    assert [v.dtype.name for v in batch["array"]] == ["float64", "int16"]
    with pytest.raises(SchemaError) as e:
        reader.to_tf_dataset(out)
    assert e.value.hint == (
        "read them with reader.iter_numpy or reader.RandomAccess (each example's own dtype and shape), or leave "
        "them out with features=['key']"
    )
