"""File collections (``--format files``): every matched file becomes one Example holding its bytes untouched, its
name relative to the pattern's base directory and a label, the layout of TFDS's / torchvision's ImageFolder
(``train/cat/001.jpg``) and of seed 001's hand-written loop.

Labels come from the parent directory's name (``--file_labels dir``, the default: class names sorted, numbered from 0,
stable across reruns, the mapping written to ``metadata.json``), from a CSV table (``--file_labels labels.csv``:
columns ``file,label[,more]``, joined on the file name relative to the base, or on the bare name when the table
holds no ``/``), or not at all (``--file_labels none``). Images get ``<feature>/format``, ``/height``, ``/width`` and
``/channels`` from the header (Pillow reads only the header; ``--decode_check`` decodes every image). Planning
lists the files (sizes from the listing, no file opened) into row ranges of about ``--target_range_mb``; a range
that fails is retried file by file (``beam.encode.read_and_encode``), so an unreadable, empty or corrupt file is one
dead letter naming it (``--dead_letter_dir``) while the others are written.
"""

from __future__ import annotations

import csv
import io
import logging
import re

import numpy as np

from tfrecord_etl.transforms.codec import VLEN_BYTES, FeatureSpec
from tfrecord_etl.transforms.errors import ConfigError, SourceError
from tfrecord_etl.transforms.sources import filekinds
from tfrecord_etl.transforms.sources.base import Columns, FileIndex, RowRange, Source, refuse_special_file
from tfrecord_etl.transforms.storage import fileio

log = logging.getLogger(__name__)
MAX_LABELS_BYTES = 64 * 2**20  # a labels table over this is refused (it is read into memory at planning)
_GLOB = re.compile(r"[*?\[]")


def pattern_base(pattern: str) -> str:
    """The directory part of ``pattern`` before its first glob character (``data/train/*/*.jpg`` ->
    ``data/train``); file names are reported relative to it."""
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        if _GLOB.search(part):
            return "/".join(parts[:i]) or "."
    return "/".join(parts[:-1]) or "."


def relative_name(path: str, base: str) -> str:
    base = base.rstrip("/")
    if base in ("", "."):
        return path
    return path[len(base) + 1 :] if path.startswith(base + "/") else path


class FilesSource(Source):
    """One Example per matched file: the file's bytes, its name and its label (see the module docstring)."""

    options_models = ("options_files.FilesOptions",)  # its flags: sources/options_*.py

    format_name = "files"
    help_label = "folders of images and other files"
    suffixes = ()  # never chosen from a suffix: pass --format files
    modes = ("files",)
    takes_datasets = False  # a file is one Example

    def __init__(self, options):
        super().__init__(options)
        # deferred: pydantic (the options model); verify and inspect read the registry without it
        from tfrecord_etl.transforms.sources.options_files import FilesOptions

        self.files = options.of(FilesOptions)  # --file_labels, --file_feature, --image_header, --decode_check
        self.feature = self.files.file_feature
        self.labels: dict[str, tuple[str, dict]] = {}  # relative name -> (label text, more columns)
        self.label_names: list[str] = []
        self.columns: list[str] = []
        self.base = "."
        self.unlabelled: set[str] = set()
        self.orphans: list[str] = []
        self.labels_from = self.files.file_labels  # "none" for a flat folder under the default "dir"
        self.image_header = bool(self.files.image_header)  # decided at planning when None (auto)

    # -- planning ------------------------------------------------------------------------------------------
    def index_files(self, pattern: str, files: list[tuple[str, int]]) -> list[FileIndex]:
        """One :class:`FileIndex` for all files, from the listing alone (sizes from the match, nothing opened).

        Raises:
          SourceError: a file with no class folder (``--file_labels dir``) or no row in the labels table, a table row
            naming no file (unless ``--dead_letter_dir``: then they are reported, see :attr:`orphans`).
          ConfigError: an unreadable or malformed labels table.
        """
        self.base = pattern_base(pattern)
        names = [relative_name(p, self.base) for p, _ in files]
        mode = self.files.file_labels
        if mode == "dir":
            flat = [n for n in names if "/" not in n]
            if flat and len(flat) == len(names):  # a flat folder: no class folders at all
                log.warning(
                    "The %d files lie directly in '%s', in no class folder: converting them without labels "
                    "(as --file_labels none; --file_labels labels.csv gives labels from a table)",
                    len(names),
                    self.base,
                )
                mode = self.labels_from = "none"
            elif flat:
                raise SourceError(
                    f"{len(flat)} files lie directly in {self.base!r}, not in a class folder, beside "
                    f"{len(names) - len(flat)} in class folders (e.g. {flat[0]!r})",
                    file=pattern,
                    hint="arrange them as BASE/CLASS/FILE, or pass --file_labels labels.csv or --file_labels none",
                )
            else:
                self.labels = {n: (n.split("/", 1)[0], {}) for n in names}
        elif mode != "none":
            self.labels = self._read_table(mode, names, pattern)
        self.label_names = sorted({t for t, _ in self.labels.values()}, key=_natural)
        specs = [FeatureSpec(self.feature, VLEN_BYTES, (), "list"), FeatureSpec("filename", VLEN_BYTES, (), "list")]
        if mode != "none":
            specs += [FeatureSpec("label", "<i8", (), "list"), FeatureSpec("label/text", VLEN_BYTES, (), "list")]
            specs += [FeatureSpec(c, VLEN_BYTES, (), "list") for c in self.columns]
        self.image_header = self._decide_image_header(files, pattern)
        if self.image_header:
            specs += [FeatureSpec(f"{self.feature}/format", VLEN_BYTES, (), "list")]
            specs += [FeatureSpec(f"{self.feature}/{k}", "<i8", (), "list") for k in ("height", "width", "channels")]
        sizes = tuple(max(1, s) for _, s in files)
        return [
            FileIndex(
                pattern, len(files), tuple(specs), max(sizes), 1, tuple(p for p, _ in files), sizes, item_files=True
            )
        ]

    def _decide_image_header(self, files: list[tuple[str, int]], pattern: str) -> bool:
        """Whether Examples get the image header features: ``--no-image_header`` opens nothing; otherwise every
        file's header is identified here (:mod:`filekinds`), and a file Pillow cannot identify among images is an
        error naming it now, not during the write (a dead letter at the read with ``--dead_letter_dir``). By
        default (neither flag) a collection of which no file is an image converts as bytes and names.

        Raises:
          SourceError: a file that is not an image among images, or with ``--image_header`` any such file.
        """
        asked = self.files.image_header
        if asked is False:
            return False
        paths = [p for p, _ in files]
        kinds = filekinds.image_kinds(paths)
        others = [p for p, k in zip(paths, kinds) if k is None]
        if asked is None and len(others) == len(paths):
            log.warning(
                "No file of '%s' is an image Pillow can identify: each Example holds the file's bytes and "
                "name, no image header (as --no-image_header)",
                pattern,
            )
            return False
        if others and not self.options.files_dead_letters:
            images = len(paths) - len(others)
            what = "empty" if dict(files)[others[0]] == 0 else "not an image Pillow can identify"
            raise SourceError(
                f"The file is {what} ({len(others)} of {len(paths)} files are not images; {images} are)",
                file=others[0],
                hint="pass --no-image_header to convert every file as bytes, remove the files that "
                "are not images, or pass --dead_letter_dir to write the rest",
            )
        return True

    def _read_table(self, path: str, names: list[str], pattern: str) -> dict:
        refuse_special_file(path)
        with fileio.open_read(path) as f:
            raw = f.read(MAX_LABELS_BYTES + 1)
        if len(raw) > MAX_LABELS_BYTES:
            raise ConfigError(f"The labels table is over {MAX_LABELS_BYTES >> 20} MiB", file=path)
        try:
            rows = list(csv.reader(io.StringIO(raw.decode("utf-8-sig"))))
        except (UnicodeDecodeError, csv.Error) as e:
            raise ConfigError(f"The labels table is not a UTF-8 CSV file: {e}", file=path) from None
        if not rows or [c.strip() for c in rows[0][:2]] != ["file", "label"]:
            raise ConfigError(
                "The labels table must start with a header row 'file,label[,more columns]'",
                file=path,
                hint="first line: file,label",
            )
        self.columns = [c.strip() for c in rows[0][2:]]
        reserved = {"file", "label", "label/text", "filename", self.feature}
        bad = [c for c in self.columns if not c or c in reserved or c.startswith(self.feature + "/")]
        if bad or len(set(self.columns)) != len(self.columns):
            raise ConfigError(
                f"The labels table has empty, repeated or reserved column names {bad or self.columns}", file=path
            )
        by_key: dict[str, tuple[str, dict]] = {}
        for line, row in enumerate(rows[1:], 2):
            if not any(c.strip() for c in row):
                continue
            if len(row) != 2 + len(self.columns):
                raise ConfigError(
                    f"Line {line} of the labels table has {len(row)} columns, the header {2 + len(self.columns)}",
                    file=path,
                )
            key = row[0].strip()
            if key in by_key:
                raise ConfigError(f"Line {line} of the labels table names {key!r} a second time", file=path)
            by_key[key] = (row[1].strip(), dict(zip(self.columns, row[2:])))
        bare = not any("/" in k for k in by_key)
        keys = [n.rsplit("/", 1)[-1] if bare else n for n in names]
        if bare and len(set(keys)) != len(keys):
            raise ConfigError(
                "The labels table names files without their folders, but two matched files share a name",
                file=path,
                hint="write the file column relative to " + self.base,
            )
        out = {n: by_key[k] for n, k in zip(names, keys) if k in by_key}
        missing = [n for n in names if n not in out]
        self.orphans = sorted(set(by_key) - set(keys))
        if not self.options.files_dead_letters and (missing or self.orphans):
            what = (
                f"{len(missing)} files have no row in the labels table (e.g. {missing[0]!r})"
                if missing
                else f"{len(self.orphans)} rows of the labels table name no matched file (e.g. {self.orphans[0]!r})"
            )
            raise SourceError(
                what,
                file=path,
                hint="fix the table or the pattern, or pass --dead_letter_dir to write the rest and report these there",
            )
        self.unlabelled = set(missing)
        return out

    def describe(self) -> dict:
        """What metadata.json records of the collection: the label names in label order, where labels came from."""
        return {
            "files": {
                "base": self.base,
                "feature": self.feature,
                "labels_from": self.labels_from,
                "label_names": self.label_names,
            }
        }

    # -- reading -------------------------------------------------------------------------------------------
    def read(self, rr: RowRange) -> Columns:
        cols: dict[str, list] = {}
        for path in rr.items:
            for key, value in self._read_one(path).items():
                cols.setdefault(key, []).append(value)
        return {
            k: np.array(v, dtype=np.int64) if k.endswith(("/height", "/width", "/channels")) or k == "label" else v
            for k, v in cols.items()
        }

    def _read_one(self, path: str) -> dict:
        """The features of one file. Raises SourceError naming it (unreadable, empty, not an image, corrupt)."""
        refuse_special_file(path)
        name = relative_name(path, self.base)
        try:
            with fileio.open_read(path) as f:
                data = f.read()
        except OSError as e:
            raise SourceError(f"Cannot read the file: {e}", file=path) from None
        if not data:
            raise SourceError("The file is empty", file=path)
        out = {self.feature: data, "filename": name.encode("utf-8")}
        if self.labels_from != "none":
            if name in self.unlabelled or name not in self.labels:
                raise SourceError("The file has no row in the labels table", file=path)
            text, more = self.labels[name]
            out["label"] = self._label_index[text]
            out["label/text"] = text.encode("utf-8")
            out.update({k: v.encode("utf-8") for k, v in more.items()})
        if self.image_header:
            out.update(self._image_header(data, path))
        return out

    @property
    def _label_index(self) -> dict[str, int]:
        """Label text -> its number (the position in the sorted names)."""
        if len(getattr(self, "_index_cache", ())) != len(self.label_names):
            self._index_cache = {n: i for i, n in enumerate(self.label_names)}
        return self._index_cache

    def _image_header(self, data: bytes, path: str) -> dict:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as im:
                fmt, (width, height), channels = im.format, im.size, len(im.getbands())
                if self.files.decode_check:
                    im.load()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            what = (
                "not an image Pillow can identify"
                if isinstance(e, UnidentifiedImageError)
                else f"a corrupt image ({type(e).__name__}: {e})"
            )
            raise SourceError(
                f"The file is {what}",
                file=path,
                hint="remove it, pass --dead_letter_dir to go on without it, or --no-image_header "
                "for files that are not images",
            ) from None
        return {
            f"{self.feature}/format": (fmt or "").encode(),
            f"{self.feature}/height": height,
            f"{self.feature}/width": width,
            f"{self.feature}/channels": channels,
        }


def _natural(text: str):
    """Sort key: numbers in names by value (class ``10`` after ``9``)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]
