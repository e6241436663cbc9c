"""--format files: image/file collections with labels, on real images (matplotlib's sample photos
and its toolbar icons, arranged into class folders here) plus a truncated JPEG and an empty file: file bytes
byte-identical through our reader and plain TensorFlow, labels from folders or a CSV table, dead letters, both
writers, verify, inspect."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.conftest import convert, fixture_file, run_command
from tfrecord_etl.transforms import reader

MPL = "matplotlib/mpl-data"


@pytest.fixture
def collection(tmp_path):
    """train/photos: 3 real photos/logos; train/icons: matplotlib's 20+ toolbar PNGs; returns (base, files)."""
    base = tmp_path / "train"
    (base / "photos").mkdir(parents=True)
    (base / "icons").mkdir()
    for name in ("grace_hopper.jpg", "logo2.png", "Minduka_Present_Blue_Pack.png"):
        shutil.copy(fixture_file(f"{MPL}/sample_data/{name}"), base / "photos" / name)
    icons = sorted(fixture_file(f"{MPL}/images").glob("*.png"))
    assert len(icons) >= 10
    for p in icons:
        shutil.copy(p, base / "icons" / p.name)
    return base, sorted(p for p in base.rglob("*") if p.is_file())


def tf_examples(out):
    import tensorflow as tf

    files = sorted(str(p) for p in out.iterdir() if p.name.endswith((".tfrecord", ".tfrecord.gz")))
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "filename": tf.io.FixedLenFeature([], tf.string),
        "label/text": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    return [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files)]


def test_image_folder_round_trips_byte_identically(collection, tmp_path, capsys):
    import tensorflow as tf
    from PIL import Image

    base, files = collection
    out = tmp_path / "out"
    code, _, err = convert(
        base / "*" / "*", out, "--format", "files", "--encoding", "list", "--num_shards", "2", capsys=capsys
    )
    assert code == 0, err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["files"]["label_names"] == ["icons", "photos"] and meta["num_records"] == len(files)
    got = list(reader.iter_numpy(str(out)))
    assert [e["filename"] for e in got] == [str(p.relative_to(base)).encode() for p in files]
    for e, p in zip(got, files):
        assert e["image"] == p.read_bytes()  # untouched bytes
        assert e["label/text"] == p.parent.name.encode() and int(e["label"]) == ["icons", "photos"].index(p.parent.name)
        with Image.open(p) as im:
            assert (e["image/format"], int(e["image/width"]), int(e["image/height"]), int(e["image/channels"])) == (
                im.format.encode(),
                *im.size,
                len(im.getbands()),
            )
    for ex, p in zip(tf_examples(out), files):  # plain TensorFlow; decode_image equals Pillow's decode
        assert ex["image"].numpy() == p.read_bytes() and ex["label/text"].numpy() == p.parent.name.encode()
        if p.suffix == ".png":
            with Image.open(p) as im:
                want = np.asarray(im.convert("RGBA" if "A" in im.getbands() else "RGB"))
            decoded = tf.io.decode_image(ex["image"], channels=want.shape[-1]).numpy()
            assert np.array_equal(decoded, want), p.name
    # the same collection again: the same label numbers and the same bytes (the planned writer is deterministic)
    code, _, _ = convert(
        base / "*" / "*",
        tmp_path / "again",
        "--format",
        "files",
        "--encoding",
        "list",
        "--num_shards",
        "2",
        capsys=capsys,
    )
    assert code == 0
    for name in ("data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord"):
        assert (out / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def test_corrupt_and_empty_files_are_dead_letters_and_counts_add_up(collection, tmp_path, capsys):
    base, files = collection
    jpeg = (base / "photos" / "grace_hopper.jpg").read_bytes()
    (base / "photos" / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 3])  # a truncated JPEG: the header reads fine
    (base / "icons" / "empty.png").write_bytes(b"")
    (base / "icons" / "notes.png").write_bytes(b"not an image at all")
    out, dead = tmp_path / "out", tmp_path / "dead"
    code, _, err = convert(
        base / "*" / "*", out, "--format", "files", "--decode_check", "--dead_letter_dir", dead, capsys=capsys
    )
    assert code == 0, err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["num_records"] == len(files) and meta["rows_dead_lettered"] == 3
    assert meta["rows_read"] == len(files) + 3
    letters = [json.loads(line) for f in sorted(dead.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted(f.rsplit("/", 1)[-1] for d in letters for f in d["files"]) == ["cut.jpg", "empty.png", "notes.png"]
    text = " ".join(d["message"] for d in letters)
    assert "empty" in text and "corrupt image" in text and "not an image" in text
    # without --decode_check the truncated JPEG's header is enough; without dead letters planning names the first bad file
    code, _, err = convert(base / "*" / "*", tmp_path / "strict", "--format", "files", capsys=capsys)
    assert code == 2 and err.startswith("error: SourceError: The file is empty") and "empty.png" in err
    assert not (tmp_path / "strict" / "metadata.json").exists()


def test_labels_from_a_csv_table_with_more_columns(collection, tmp_path, capsys):
    base, files = collection
    table = tmp_path / "labels.csv"
    rows = ["file,label,source"] + [f"{p.name},{'big' if p.stat().st_size > 5000 else 'small'},mpl" for p in files]
    table.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    code, _, err = convert(
        base / "*" / "*",
        out,
        "--format",
        "files",
        "--file_labels",
        table,
        "--no-image_header",
        "--writer",
        "beam",
        capsys=capsys,
    )
    assert code == 0, err
    got = {e["filename"].item(): e for e in reader.iter_numpy(str(out))}  # the beam writer keeps no order
    for p in files:
        e = got[str(p.relative_to(base)).encode()]
        size = "big" if p.stat().st_size > 5000 else "small"
        assert e["label/text"] == size.encode() and int(e["label"]) == ["big", "small"].index(size)
        assert e["source"] == b"mpl" and e["image"] == p.read_bytes() and "image/format" not in e
    # a file with no row, and a row with no file: an error each, or reported with --dead_letter_dir
    table.write_text("\n".join(rows[:-1] + ["ghost.png,small,mpl"]) + "\n")
    code, _, err = convert(
        base / "*" / "*", tmp_path / "o2", "--format", "files", "--file_labels", table, capsys=capsys
    )
    assert code == 2 and "have no row in the labels table" in err and files[-1].name in err
    dead = tmp_path / "dead"
    code, _, err = convert(
        base / "*" / "*",
        tmp_path / "o3",
        "--format",
        "files",
        "--file_labels",
        table,
        "--dead_letter_dir",
        dead,
        capsys=capsys,
    )
    assert code == 0, err
    letters = {f.name: [json.loads(x) for x in f.read_text().splitlines()] for f in dead.glob("*.jsonl")}
    assert [d["files"] for d in letters.pop("labels_without_files.jsonl")] == [["ghost.png"]]
    assert [f.rsplit("/", 1)[-1] for ds in letters.values() for d in ds for f in d["files"]] == [files[-1].name]


def test_verify_and_inspect_a_file_collection(collection, tmp_path, capsys):
    from tfrecord_etl.pipelines import inspect as inspect_module, verify as verify_module

    base, _files = collection
    out = tmp_path / "out"
    assert convert(base / "*" / "*", out, "--format", "files", capsys=capsys)[0] == 0
    code, stdout, _ = run_command(verify_module.main, [out, "--source", str(base / "*" / "*")], capsys)
    assert code == 0, stdout
    code, stdout, _ = run_command(inspect_module.main, [out], capsys)
    assert code == 0 and "image/width" in stdout
    changed = base / "photos" / "logo2.png"
    changed.write_bytes(changed.read_bytes() + b"\0")  # the source changed after the conversion
    code, stdout, _ = run_command(verify_module.main, [out, "--source", str(base / "*" / "*")], capsys)
    assert code == 1 and "image" in stdout


@pytest.mark.parametrize(
    "flags, mode",
    [([], "sequential"), (["--provenance"], "sequential"), (["--writer", "beam", "--provenance"], "provenance")],
)
def test_verify_expects_the_dead_lettered_file_absent_and_compares_the_rest(collection, tmp_path, capsys, flags, mode):
    """One file of the collection is not an image: it is dead-lettered, metadata.json lists it, and verify
    --source compares the other files exactly (their range was read again without it) and expects it absent;
    a changed file that has a record still fails."""
    from tfrecord_etl.pipelines import verify as verify_module

    base, files = collection
    bad = base / "icons" / "move_broken.png"  # in the middle of the sorted collection
    bad.write_bytes(b"not an image at all")
    out, pattern = tmp_path / "out", str(base / "*" / "*")
    code, _, err = convert(
        pattern,
        out,
        "--format",
        "files",
        "--num_shards",
        "2",
        "--dead_letter_dir",
        tmp_path / "dead",
        *flags,
        capsys=capsys,
    )
    assert code == 0, err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["rows_dead_lettered"] == 1 and meta["num_records"] == len(files)
    (letter,) = meta["dead_letters"]
    assert letter["files"] == [str(bad)] and letter["stop"] - letter["start"] == 1
    code, stdout, _ = run_command(verify_module.main, [out, "--source", pattern], capsys)
    assert code == 0, stdout
    rows = len(files) + 1
    assert f"({rows - 1} of {rows} rows compared, 1 dead-lettered, {mode})" in stdout
    changed = base / "photos" / "logo2.png"
    changed.write_bytes(changed.read_bytes() + b"\0")  # the source changed after the conversion
    code, stdout, _ = run_command(verify_module.main, [out, "--source", pattern], capsys)
    assert code == 1 and "feature 'image': Value differs from the source" in stdout, stdout


def test_a_flat_folder_converts_without_labels_and_says_so(tmp_path, capsys, caplog):
    d = tmp_path / "flat"
    d.mkdir()
    shutil.copy(fixture_file(f"{MPL}/sample_data/logo2.png"), d / "a.png")
    code, _, err = convert(d / "*.png", tmp_path / "out", "--format", "files", capsys=capsys)
    assert code == 0, err
    (ex,) = list(reader.iter_numpy(str(tmp_path / "out")))
    assert ex["filename"] == b"a.png" and "label" not in ex and ex["image/format"] == b"PNG"
    assert ex["image"] == (d / "a.png").read_bytes()
    said = [r.getMessage() for r in caplog.records if "in no class folder" in r.getMessage()]
    assert len(said) == 1 and "converting them without labels" in said[0]
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["files"]["labels_from"] == "none"
    # files beside class folders are still an error: their labels would be ambiguous
    (d / "cls").mkdir()
    shutil.copy(d / "a.png", d / "cls" / "b.png")
    code, _, err = convert(d / "**", tmp_path / "o2", "--format", "files", capsys=capsys)
    assert code == 2 and "not in a class folder, beside 1 in class folders" in err and "--file_labels none" in err


def test_a_folder_of_other_files_converts_as_bytes_and_names(tmp_path, capsys, caplog):
    import tensorflow as tf

    d = tmp_path / "notes"
    d.mkdir()
    files = {"a.txt": b"hello\n", "b.csv": b"x,y\n1,2\n", "c.bin": bytes(range(256))}
    for name, data in files.items():
        (d / name).write_bytes(data)
    code, _, err = convert(d / "*", tmp_path / "out", "--format", "files", capsys=capsys)
    assert code == 0, err
    got = {e["filename"].item().decode(): e for e in reader.iter_numpy(str(tmp_path / "out"))}
    assert {n: e["image"] for n, e in got.items()} == files
    assert all(sorted(e) == ["filename", "image"] for e in got.values())
    assert any("is an image Pillow can identify" in r.getMessage() for r in caplog.records)
    parsed = [
        tf.io.parse_single_example(
            r, {"image": tf.io.FixedLenFeature([], tf.string), "filename": tf.io.FixedLenFeature([], tf.string)}
        )
        for r in tf.data.TFRecordDataset(sorted(str(p) for p in (tmp_path / "out").glob("*.tfrecord")))
    ]
    assert {p["filename"].numpy().decode(): p["image"].numpy() for p in parsed} == files
    from tfrecord_etl.pipelines import verify as verify_module

    code, stdout, _ = run_command(verify_module.main, [tmp_path / "out", "--source", str(d / "*")], capsys)
    assert code == 0, stdout
    # --image_header asks for images: the first file that is not one is named at planning, nothing is written
    code, _, err = convert(d / "*", tmp_path / "o2", "--format", "files", "--image_header", capsys=capsys)
    assert code == 2 and not (tmp_path / "o2" / "metadata.json").exists()
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: SourceError: The file is not an image Pillow can identify (3 of 3 files are not")
    assert f"file='{d / 'a.txt'}'" in line and "--no-image_header" in line


def test_a_file_that_is_not_an_image_among_images_is_named_at_planning(collection, tmp_path, capsys, monkeypatch):
    from tfrecord_etl.transforms.beam import encode as beam_encode

    base, _files = collection
    bad = base / "icons" / "move_broken.png"
    bad.write_bytes(b"not an image at all")
    started = []
    monkeypatch.setattr(beam_encode, "read_and_encode", lambda *a, **k: started.append(a))  # no row is ever read
    code, _, err = convert(base / "*" / "*", tmp_path / "out", "--format", "files", capsys=capsys)
    assert code == 2 and not started
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: SourceError: The file is not an image Pillow can identify (1 of ")
    assert f"file='{bad}'" in line and "--no-image_header" in line and "--dead_letter_dir" in line
