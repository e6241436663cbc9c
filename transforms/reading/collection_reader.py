"""What the readers of :mod:`transforms.reading.reader` read: one output directory, or the selected spans of a collection.

A collection directory (``collection.json`` + ``span-N/``, see :mod:`transforms.collections.collection`) is read span by span,
in span order, each span at its latest version; each span directory is a complete output directory, read with its
own ``metadata.json`` (its shards, their sizes and CRC32Cs, its splits). Before any record is read, the selected
spans are checked to agree: the schema fingerprints ``collection.json`` records (:func:`collection.check_same_schema`)
and the features actually read (name, dtype, shape, encoding, from each span's ``metadata.json``).

Each output directory is opened with :func:`schemacheck.load_output`: its ``schema.pbtxt`` must agree with its
``metadata.json`` (features, types, shapes, our dtype tags), else SchemaError. Each span's ``metadata.json`` must be
the one ``collection.json`` lists (the SHA-256 of its bytes is the entry's ``metadata``, :func:`check_span`): a
span directory replaced by hand (a copy of another span, a restore of an older one) or re-converted by a run that
committed the span and not, or not yet, the collection (it is committing, or crashed between its two commits) is
refused with IncompleteOutputError naming the span. The ways on: run the convert of that span again (its commit
lists the span: the documented recovery of a crash between the two commits), or read the directory as it is with
``trust_spans=True`` (every reader takes it) or by naming the span's directory itself; ``verify`` shows what
differs.

    from tfrecord_etl.transforms.reading import reader
    for example in reader.iter_numpy("coll/", spans="latest:30"):   # the newest 30 spans, in span order
        ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfrecord_etl.transforms.codec import FeatureSpec
from tfrecord_etl.transforms.collections import collection, schemacheck
from tfrecord_etl.transforms.errors import ConfigError, IncompleteOutputError, SchemaError
from tfrecord_etl.transforms.output import metadata
from tfrecord_etl.transforms.storage import fileio


def select_features(specs: Sequence[FeatureSpec], features: Sequence[str] | None) -> list[FeatureSpec]:
    """The specs of ``features`` (by name, in that order) among ``specs``; all of them for None.

    Raises:
      SchemaError: a feature that is not there (naming the ones that are).
    """
    if features is None:
        return list(specs)
    by_name = {s.name: s for s in specs}
    missing = [f for f in features if f not in by_name]
    if missing:
        raise SchemaError(f"No such features {missing}", hint=f"features are {sorted(by_name)}")
    return [by_name[f] for f in features]


@dataclasses.dataclass(frozen=True)
class Part:
    """One output directory to read: a plain output directory, or one span of a collection.

    Attributes:
      dir: the output directory (``COLL/span-N`` or ``COLL/span-N/version-V`` for a span).
      meta: its ``metadata.json``, only the shards of the split asked for (``metadata.select_split``).
      span, version: the span's number and version; None for a plain output directory.
      entry: the span's ``collection.json`` entry; None for a plain output directory.
    """

    dir: str
    meta: dict
    span: int | None = None
    version: int | None = None
    entry: dict | None = None


def span_dir(collection_dir: str, entry: dict) -> str:
    """The output directory of a span entry (its ``dir`` is checked to be ``span-N[/version-V]`` when
    ``collection.json`` is loaded, so it never leaves the collection directory)."""
    return fileio.join(collection_dir, *entry["dir"].split("/"))


def refuse_spans(target: str, spans) -> None:
    """Refuses ``spans`` for a target that is not a collection directory.

    Raises:
      ConfigError: ``spans`` is not None.
    """
    if spans is not None:
        raise ConfigError(
            f"spans={spans!r} needs a collection directory (one that holds "
            f"{collection.COLLECTION_FILE}); this is not one",
            file=target,
            hint="leave spans out to read this output directory, or name the collection directory "
            "that holds its span-N/ directories",
        )


def selected_entries(collection_dir: str, spans=None) -> list[dict]:
    """The entries of the selected spans (:func:`collection.select`), checked to have one schema.

    Raises:
      IncompleteOutputError, SchemaError (also: spans of different schemas), ConfigError: a span not committed.
    """
    entries = collection.select(collection.load(collection_dir), spans, collection_dir)
    collection.check_same_schema(entries, collection_dir)
    return entries


def parts(
    target: str, spans=None, split: str | None = None, features: Sequence[str] | None = None, trust_spans: bool = False
) -> tuple[list[FeatureSpec], list[Part]]:
    """``(features read, parts)``: the features ``features`` names (all when None) and the output directories to
    read, in order: ``target`` itself, or the selected spans of the collection ``target`` (``spans``: None = all,
    an int, a list or range of ints, ``"latest"``, ``"latest:N"``, or a ``--spans`` string). Each output directory's
    ``schema.pbtxt`` is checked to agree with its ``metadata.json`` (:func:`schemacheck.load_output`), and each
    span's ``metadata.json`` to be the one ``collection.json`` lists (:func:`check_span`; not with ``trust_spans``).

    Raises:
      IncompleteOutputError: no ``metadata.json`` (in ``target`` or in a listed span's directory); a span whose
        ``metadata.json`` is not the one ``collection.json`` lists (without ``trust_spans``).
      ConfigError: ``spans`` for a plain output directory; a span that is not committed; no span selected.
      SchemaError: a feature or split that is not there (naming the directory); spans whose schemas differ
        (``collection.json``'s fingerprints, or the features read: naming both spans and the feature); a
        ``schema.pbtxt`` that disagrees with its ``metadata.json``.
    """
    if not collection.is_collection(target):
        refuse_spans(target, spans)
        meta = metadata.select_split(schemacheck.load_output(target)[0], split, target)
        return select_features(meta["features"], features), [Part(target, meta)]
    out: list[Part] = []
    specs: list[FeatureSpec] | None = None
    for entry in selected_entries(target, spans):
        where = span_dir(target, entry)
        meta, digest = schemacheck.load_output(where)
        check_span(entry, where, digest, trust_spans)
        meta = metadata.select_split(meta, split, where)
        try:
            chosen = select_features(meta["features"], features)
        except SchemaError as e:
            raise e.with_context(file=where) from None
        if specs is None:
            specs = chosen
        elif chosen != specs:
            _refuse_other_features(target, out[0], entry, specs, chosen)
        out.append(Part(where, meta, entry["span"], entry["version"], entry))
    return specs, out


def check_span(entry: dict, where: str, digest: str, trust_spans: bool = False) -> None:
    """Refuses a span whose ``metadata.json`` (the SHA-256 of its bytes, ``digest``) is not the one its
    ``collection.json`` entry lists (``entry["metadata"]``; an entry without one is not checked), unless
    ``trust_spans``.

    Raises:
      IncompleteOutputError: one line naming the span, its ``metadata.json`` and the ways on.
    """
    listed = entry.get("metadata")
    if trust_spans or not isinstance(listed, str) or digest == listed:
        return
    name = f"Span {entry['span']}" + (f" version {entry['version']}" if entry.get("version") is not None else "")
    raise IncompleteOutputError(
        f"{name}'s metadata.json is not the one collection.json lists: its directory was re-converted by a run that "
        "has not committed the collection (it is committing, or crashed between its two commits) or was replaced "
        "after the commit",
        file=fileio.join(where, metadata.METADATA_FILE),
        hint=f"run the convert of span {entry['span']} again (it lists the span); or read the directory as it is "
        "with trust_spans=True; tfrecord-etl verify on the collection shows what differs",
    )


def _refuse_other_features(
    target: str, first: Part, entry: dict, want: list[FeatureSpec], got: list[FeatureSpec]
) -> None:
    by_name = {s.name: s for s in got}
    name = next((s.name for s in want if by_name.get(s.name) != s), None) or got[0].name
    have = by_name.get(name)
    theirs = next((s for s in want if s.name == name), None)

    def show(s):
        return "absent" if s is None else f"{s.dtype} {list(s.shape) if s.shape is not None else None} {s.encoding}"

    raise SchemaError(
        f"Spans {first.span} and {entry['span']} record different features: '{name}' is "
        f"{show(theirs)} in span {first.span}, {show(have)} in span {entry['span']}",
        file=target,
        feature=name,
        hint="read the spans on either side of the change separately (spans=...), "
        "or leave the feature out (features=[...])",
    )


def tf_shard_groups(found: Sequence[Part]) -> list[tuple[str, list[str]]]:
    """``(compression, shard paths)`` runs over the parts, in order: one run when every part has the same
    compression (one ``tf.data.TFRecordDataset`` reads them all), else one run per change of compression."""
    groups: list[tuple[str, list[str]]] = []
    for part in found:
        paths = metadata.shard_paths(part.dir, part.meta)
        if groups and groups[-1][0] == part.meta["compression"]:
            groups[-1][1].extend(paths)
        else:
            groups.append((part.meta["compression"], list(paths)))
    return groups


def tfds_builder(collection_dir: str, spans=None, trust_spans: bool = False):
    """One TFDS builder over the selected spans of a collection converted with ``--tfds_name``:
    ``tfds.builder_from_directories`` over the span directories, in span order (TFDS merges each split's shards of
    every directory into one split: ``builder.as_dataset(split="train")`` reads all spans' records, in span order
    with ``shuffle_files=False`` and ``interleave_cycle_length=1``; slices such as ``train[:10%]`` run across spans).
    TFDS does not check that the directories agree (its source says so), so this checks first that the spans
    have one schema and one TFDS name and version.

    Raises:
      ConfigError: a span written without ``--tfds_name``, or spans of different TFDS names or versions.
      SchemaError, IncompleteOutputError: as :func:`parts`.
    """
    import tensorflow_datasets as tfds

    _, found = parts(collection_dir, spans, trust_spans=trust_spans)
    names = set()
    for part in found:
        info = part.meta.get("tfds")
        if not info:
            raise ConfigError(
                f"Span {part.span} is not a TFDS directory (converted without --tfds_name)",
                file=part.dir,
                hint="convert every span with the same --tfds_name, or read the spans with reader.to_tf_dataset",
            )
        names.add((info.get("name"), info.get("version")))
    if len(names) > 1:
        raise ConfigError(
            f"The spans hold different TFDS datasets {sorted(names, key=str)}",
            file=collection_dir,
            hint="convert every span with the same --tfds_name",
        )
    return tfds.builder_from_directories([part.dir for part in found])
