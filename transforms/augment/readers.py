"""The reader files of an augmented output: what other readers need beside the shards, carried over from the input.

An input written by convert may hold, beside its shards,

* ``tfrecord2idx`` index files (``--index``: one ``<name>.idx`` per shard, what the ``tfrecord`` package's
  multi-worker ``TFRecordDataset``, DALI and ``reader.RandomAccess`` seek with), and
* TFDS's ``dataset_info.json`` and ``features.json`` (``--tfds_name``, or a ``--splits`` output by default:
  ``tfds.builder_from_directory`` loads the directory).

Both describe the input's shards: byte offsets of its records, its features, its shard lengths. None of them is
true of the augmented shards (records are longer, features are added), so none is copied. Instead augment writes
them again for its own shards, from what it wrote (the record lengths its shard writer saw, the counts and bytes of
each shard, the output's features), in both modes:

* index files, when every input shard had one and the output is uncompressed (offsets index the uncompressed
  stream; a compressed output gets none, and the summary says why);
* TFDS's files, when the input had them, under the input's dataset name, with the same splits and shard lengths
  (``transforms.output.tfds_info.write``), when TFDS can read the output: uncompressed shards, features TFDS can describe,
  each split's whole set of ``{DATASET}-{SPLIT}.tfrecord-{SHARD_X_OF_Y}`` files, TensorFlow Datasets installed.
  Otherwise none, and the summary says why. In sidecar mode the directory's features are the new ones only: TFDS
  loads them, split by split, aligned record by record with the input's (zip the two datasets).

The decision (:func:`plan_reader_files`) is pure and made at planning; the files are written by the workers (index
files, committed just before their shard) and at the commit (TFDS's files, just before ``metadata.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfrecord_etl.transforms.errors import printable
from tfrecord_etl.transforms.output import tfds_info, tfrecord

TFDS_FILES = ("dataset_info.json", "features.json")


@dataclasses.dataclass(frozen=True)
class ReaderFiles:
    """Which reader files an augment writes beside its shards.

    Attributes:
      index: write a ``tfrecord2idx`` index file for each output shard (``tfrecord.index_name`` of its name).
      index_note: why the input's index files are not written for the output (None: written, or the input had none).
      tfds_name: the TFDS dataset name ``dataset_info.json`` is written under (the input's), or None.
      tfds_note: why the input's TFDS files are not written for the output (None: written, or the input had none).
    """

    index: bool = False
    index_note: str | None = None
    tfds_name: str | None = None
    tfds_note: str | None = None


def split_layout_problem(splits: Sequence[str | None], names: Sequence[str]) -> str | None:
    """Why the shard files ``names`` (with their ``splits``, in file order) are not, split by split, the whole set
    TFDS's file template names (``{PREFIX}-{SPLIT}.tfrecord-{i:05d}-of-{n:05d}`` for i in 0..n-1, one prefix per
    split), or None. A file pattern that selects some of a split's shards gives such a set: TFDS would look for the
    shards it did not select."""
    by_split: dict[str | None, list[str]] = {}
    for split, name in zip(splits, names):
        by_split.setdefault(split, []).append(name)
    if None in by_split:
        return f"shard '{by_split[None][0]}' belongs to no split"
    for split, files in by_split.items():
        n, prefixes = len(files), set()
        for i, name in enumerate(files):
            tail = f"-{split}.tfrecord-{i:05d}-of-{n:05d}"
            if not name.endswith(tail):
                return (
                    f"the input holds {n} shard{'s' if n != 1 else ''} of split '{split}' and '{name}' is not "
                    f"shard {i} of {n} (augment the whole directory)"
                )
            prefixes.add(name[: -len(tail)])
        if len(prefixes) > 1:
            return f"the shards of split '{split}' have several prefixes {sorted(prefixes)}"
    return None


def plan_reader_files(collection, mode: str, output_compression: str, output_specs) -> ReaderFiles:
    """The reader files an augment of ``collection`` (an ``InputCollection`` whose shards have their output names)
    writes, in ``mode``, with ``output_compression``, its output holding ``output_specs``. No TFDS import
    (``tfds_info.default_refusal`` only asks whether it is installed)."""
    index, index_note = False, None
    if collection.indexed:
        if output_compression == "none":
            index = True
        else:
            index_note = (
                f"the output is {output_compression} and index files give byte offsets into uncompressed "
                "shards (--output_compression none keeps them)"
            )
    tfds_name, tfds_note = None, None
    if collection.tfds_name:
        tfds_note = tfds_info.default_refusal(output_compression, output_specs) or split_layout_problem(
            [s.split for s in collection.shards], [s.output_file for s in collection.shards]
        )
        tfds_name = None if tfds_note else collection.tfds_name
    return ReaderFiles(index, index_note, tfds_name, tfds_note)


def file_names(readers: ReaderFiles, shard_files: Sequence[str]) -> list[str]:
    """The names of the reader files written beside ``shard_files`` (output generation 0)."""
    return ([tfrecord.index_name(f) for f in shard_files] if readers.index else []) + (
        list(TFDS_FILES) if readers.tfds_name else []
    )


def write_tfds(readers: ReaderFiles, output_dir: str, mode: str, input_pattern: str, specs, shards) -> dict | None:
    """Writes TFDS's files of the augmented output (``tfds_info.write``: ``shards`` are its metadata entries, in
    file order; ``specs`` its features) and returns the ``metadata.json`` entry ``{"name", "version", "files"}``, or
    None when the plan writes none.

    Raises:
      ConfigError: TensorFlow Datasets missing (it was installed at planning).
    """
    if not readers.tfds_name:
        return None

    what = "the input's features and" if mode == "rewrite" else "only"
    description = f"{readers.tfds_name}: {input_pattern} augmented by tfrecord-etl ({mode}: {what} the features added)"
    return {
        "name": readers.tfds_name,
        "version": tfds_info.VERSION,
        "files": tfds_info.write(output_dir, readers.tfds_name, specs, shards, description),
    }


def summary(readers: ReaderFiles, output_dir: str, mode: str, num_shards: int) -> dict[str, str]:
    """The summary lines of the reader files (``{label: text}``): said only when the input had them."""
    lines = {}
    if readers.tfds_name:
        what = (
            "the input's features and the new ones"
            if mode == "rewrite"
            else "the new features only, record by record as the input's splits"
        )
        lines["tfds"] = (
            f"tfds.builder_from_directory({printable(output_dir)!r}) loads {readers.tfds_name} "
            f"({what}; dataset_info.json, features.json)"
        )
    elif readers.tfds_note:
        lines["tfds"] = f"no dataset_info.json: {readers.tfds_note}"
    if readers.index:
        lines["index files"] = f"{num_shards} (tfrecord2idx of the new shards, one beside each)"
    elif readers.index_note:
        lines["index files"] = f"none: {readers.index_note}"
    return lines
