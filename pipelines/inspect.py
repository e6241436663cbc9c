"""Summarize an output directory: features, shards, counts, sizes, compression, one decoded example.

    tfrecord-etl inspect OUTPUT_DIR_OR_PATTERN [--tf_read] [--json] [--max_record_mb MB] [--max_features N]
    tfrecord-etl inspect FILE.h5 [--json]     # the HDF5 (NetCDF-3, MATLAB .mat, Zarr) tree and its row groups
    tfrecord-etl inspect FILE.npy [--json]    # any input convert reads: what it makes of it (rows, features)
    tfrecord-etl inspect COLLECTION_DIR [--spans SPANS]   # spans, versions, dates, records, schema changes

An input file is told the way convert tells it (its first bytes, then its suffix: ``sources.format_of``); a
file of a format tfrecord-etl recognises but does not read (``sources.signatures.UNREAD``: WAV, IDL...) is
refused in one line with the way out (UnreadFormatError, exit 2).

``--tf_read`` also reads every shard back with plain tf.data + tf.io.parse_example and checks the
record counts against the metadata.

TFRecord files without metadata (a file, a quoted glob, or a directory of them, e.g. TFX's
``Split-train/``) are summarized too: the compression of each file is told from its suffix, else its
first bytes; every record is counted (CRCs checked) and the features are learned from all of them
(``codec.FeatureStats``: int64_list -> ``<i8``, float_list -> ``<f4``, bytes_list -> ``bytes``; a ``list`` of
shape ``[n]`` when every record holds n values, else ``varlen`` ``[null]``). Records that are not
``tf.train.Example`` (e.g. ``tf.train.SequenceExample``) are refused with a RecordError naming the file
and record. A directory with tfrecord-etl traces (``schema.pbtxt``, temporaries) but no metadata.json is
an incomplete output and is refused (IncompleteOutputError).

A collection directory (collection.json + span-N/) is summarized as a collection: its spans (--spans selects,
default all) with their versions, dates, record counts and schema fingerprints, the schema changes it recorded,
and span directories it does not list (uncommitted). When --spans names one span, that span's output directory
is summarized too, as above.
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m: hand over to tfrecord_etl.pipelines.inspect, the module's one name
    from tfrecord_etl.pipelines.cli import run_command

    run_command("inspect")

import argparse
import json

import numpy as np

from tfrecord_etl.pipelines import common, flaghelp, inspect_text
from tfrecord_etl.pipelines.inspect_text import render, render_collection
from tfrecord_etl.transforms import codec, sources, verify
from tfrecord_etl.transforms.collections import collection
from tfrecord_etl.transforms.errors import EtlError, RecordError, SourceError, UnreadFormatError
from tfrecord_etl.transforms.output import framing, metadata, outdir, tfrecord
from tfrecord_etl.transforms.reading import collection_reader, reader
from tfrecord_etl.transforms.storage import fileio


def summarize(
    output_dir: str, tf_read: bool = False, max_record_bytes: int | None = None, max_features: int | None = None
) -> dict:
    """The summary of an output directory, or of TFRecord files without metadata (see :func:`summarize_files`).

    ``max_record_bytes`` / ``max_features``: limits on one record's length header (checked before it is
    read; default ``tfrecord.record_limit()``, 1024 MB) and on its features and the distinct names
    inferred (default ``codec.MAX_FEATURES``, 10,000).

    Raises:
      IncompleteOutputError: a directory with tfrecord-etl traces but no metadata.json.
      RecordError: a corrupt record, a record over a limit, or (``tf_read``) tf.data reading another count
        than the metadata.
    """
    if not _has_metadata(output_dir):
        return summarize_files(output_dir, tf_read, max_record_bytes, max_features)
    meta = metadata.load(output_dir)
    sample = next(reader.iter_numpy(output_dir, None, max_record_bytes, max_features), None)
    out = {
        "output_dir": output_dir,
        "num_records": meta["num_records"],
        "num_shards": len(meta["shards"]),
        "bytes": sum(s["bytes"] for s in meta["shards"]),
        "compression": meta["compression"],
        "features": [s.to_json() for s in meta["features"]],
        "shards": meta["shards"],
        "sample": {k: inspect_text.short(v) for k, v in (sample or {}).items()},
    }
    if meta.get("splits"):
        out["splits"] = meta["splits"]
    if meta.get("tfds"):
        out["tfds"] = meta["tfds"]
    if tf_read:
        out["tf_read_records"] = _count_with_tf(output_dir)
        if out["tf_read_records"] != meta["num_records"]:
            raise RecordError(
                f"tf.data read {out['tf_read_records']} examples, metadata says {meta['num_records']}", file=output_dir
            )
    return out


def summarize_collection(
    collection_dir: str,
    spans=None,
    tf_read: bool = False,
    max_record_bytes: int | None = None,
    max_features: int | None = None,
) -> dict:
    """The summary of a collection directory: the selected spans (``collection.select``: span order, latest
    version) with every committed version of each, their dates, record counts and schema fingerprints (first 12
    hex digits), the schema changes recorded, the unlisted span directories; with one span selected by ``spans``,
    also that span's :func:`summarize`.

    Raises:
      IncompleteOutputError: no collection.json. SchemaError: an invalid one. ConfigError: a span not committed.
    """
    coll = collection.load(collection_dir)
    entries = collection.select(coll, spans, collection_dir)
    versions: dict[int, list] = {}
    for s in coll["spans"]:
        versions.setdefault(s["span"], []).append(s["version"])
    out = {
        "collection_dir": collection_dir,
        "input_pattern": coll.get("input_pattern"),
        "num_spans": len(versions),
        "num_records": sum(s["num_records"] for s in entries),
        "spans": [
            {
                "span": s["span"],
                "version": s["version"],
                "versions": versions[s["span"]],
                "dir": s["dir"],
                "date": s["date"],
                "num_records": s["num_records"],
                "schema": s["schema"][:12],
                "inputs": len(s["inputs"]),
                "committed": s["committed"],
            }
            for s in entries
        ],
        "schema_changes": coll["schema_changes"],
        "uncommitted": collection.unlisted_span_dirs(collection_dir, coll),
    }
    if tf_read:  # every record of the selected spans with plain tf.data, against collection.json's counts
        groups = collection_reader.tf_shard_groups(collection_reader.parts(collection_dir, spans)[1])
        out["tf_read_records"] = _count_files_with_tf(
            [{"path": p, "compression": c} for c, paths in groups for p in paths]
        )
        if out["tf_read_records"] != out["num_records"]:
            raise RecordError(
                f"tf.data read {out['tf_read_records']} records, collection.json lists {out['num_records']}",
                file=collection_dir,
            )
    if spans is not None and len(entries) == 1:
        out["span"] = summarize(
            collection_reader.span_dir(collection_dir, entries[0]), tf_read, max_record_bytes, max_features
        )
    return out


def _has_metadata(target: str) -> bool:
    """True for a directory with metadata.json; a directory with our traces but none is incomplete."""
    if not fileio.is_dir(target):
        return fileio.exists(fileio.join(target, metadata.METADATA_FILE))
    if fileio.exists(fileio.join(target, metadata.METADATA_FILE)):
        return True
    names = set(outdir.list_names(target))
    traces = (
        ".tmp-",
        "beam-temp-",
        f".{metadata.METADATA_FILE}",
        outdir.MARKER_FILE,
        outdir.LEGACY_MARKER_FILE,
    )  # a run's temporaries
    if metadata.SCHEMA_FILE in names or any(n.startswith(traces) for n in names) or outdir.nested_outputs(target):
        metadata.load(target)  # raises IncompleteOutputError with its message
    return False


def summarize_files(
    pattern: str, tf_read: bool = False, max_record_bytes: int | None = None, max_features: int | None = None
) -> dict:
    """The summary of TFRecord files without metadata: a file, a glob, or a directory of them.

    Every record is counted (framing and CRCs checked) and observed (``codec.FeatureStats``, one C++ decode per
    batch of up to 4,096 records or 64 MiB): the features are those every record satisfies, and the first record
    is decoded with them.
    ``compression`` is the files' compression, ``mixed`` when it differs between them.

    Raises:
      SourceError: nothing matches, or a match is not a regular file (a FIFO or device is never opened).
      RecordError: a corrupt frame, a record over ``max_record_bytes``, a record that is not a
      tf.train.Example or has more than ``max_features`` features (file, record index, byte offset).
      SchemaError: a feature with two list kinds (file, record).
    """
    shards, first = [], None
    stats = codec.FeatureStats()
    for path, size in verify.list_record_files(pattern):
        compression = verify.file_compression(path)
        count, batch, held = 0, [], 0
        for _, _, record in reader.iter_records(path, compression, max_record_bytes):
            first = record if first is None else first
            batch.append(record)
            count, held = count + 1, held + len(record)
            if len(batch) == 4096 or held > 64 << 20 or count == 1:  # the first alone: other records fail at once
                _observe(stats, batch, path, count - len(batch), max_features)
                batch, held = [], 0
        _observe(stats, batch, path, count - len(batch), max_features)
        shards.append(
            {"file": fileio.basename(path), "path": path, "records": count, "bytes": size, "compression": compression}
        )
    specs = stats.specs()
    try:
        example = codec.decode_example_lenient(first, specs, max_features) if first is not None else {}
    except EtlError as e:
        raise e.with_context(file=shards[0]["path"], record=0) from None
    compressions = {s["compression"] for s in shards}
    out = {
        "output_dir": pattern,
        "num_records": sum(s["records"] for s in shards),
        "num_shards": len(shards),
        "bytes": sum(s["bytes"] for s in shards),
        "compression": compressions.pop() if len(compressions) == 1 else "mixed",
        "features": [s.to_json() for s in specs],
        "shards": shards,
        "sample": {k: inspect_text.short(v) for k, v in example.items()},
        "inferred": {"from_records": stats.records, "metadata": False},
    }
    if tf_read:
        out["tf_read_records"] = _count_files_with_tf(shards)
        if out["tf_read_records"] != out["num_records"]:
            raise RecordError(
                f"tf.data read {out['tf_read_records']} records, we counted {out['num_records']}", file=pattern
            )
    return out


def _count_files_with_tf(shards: list[dict]) -> int:
    common.preload_tensorflow()
    import tensorflow as tf

    names = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}
    return sum(
        int(
            tf.data.TFRecordDataset(s["path"], compression_type=names[s["compression"]]).reduce(
                np.int64(0), lambda n, _: n + 1
            )
        )
        for s in shards
    )


def _count_with_tf(output_dir: str) -> int:
    common.preload_tensorflow()
    specs = metadata.load(output_dir)["features"]
    if all(s.is_fixed for s in specs):
        ds = reader.to_tf_dataset(output_dir, batch_size=1024)
        return int(sum(int(next(iter(batch.values())).shape[0]) for batch in ds))
    # shapes vary: one example at a time; a feature whose dtype varies has no tf.data form (iter_numpy reads it)
    return sum(1 for _ in reader.to_tf_dataset(output_dir, features=[s.name for s in specs if s.dtype is not None]))


def _observe(stats, records, path: str, first: int, max_features: int | None) -> None:
    """Adds a batch of one file's records to ``stats``; errors name the file and the record (or the batch's range)."""
    before = stats.records
    try:
        stats.observe_records(records, max_features)
    except EtlError as e:
        index = e.context.pop("record", None)
        where = f"{first}-{first + len(records) - 1}" if index is None else first + index - before
        if isinstance(e, RecordError) and index is not None:
            e = RecordError(
                f"Not a tf.train.Example: {e.message}",
                hint=e.hint or "inspect reads tf.train.Example records only (not SequenceExample)",
                **e.context,
            )
        raise e.with_context(file=path, record=where) from None


# the container formats, whose inspect shows the tree and row groups; any other format shows what convert makes of
# the file with its default options (summarize_input), so a new source needs no line here
CONTAINER_TREES = ("hdf5", "netcdf3", "matlab", "zarr")


def input_format(target: str) -> str | None:
    """The source format convert reads ``target`` as, told the way convert tells it (``sources.format_of``: a Zarr
    store, then the file's first bytes, then its suffix), for a Zarr store or one existing regular file; None for a
    TFRecord file (its first frame header's CRC holds, or no format is told), a directory, a glob or a missing path,
    which inspect summarizes as TFRecord files.

    Raises:
      UnreadFormatError: a file of a format tfrecord-etl recognises but does not read (WAV, IDL...),
        with the way out.
      SourceError: a match that is not a regular file (a FIFO or device is never opened).
    """
    globbed = any(c in target for c in "*?[")
    if not globbed and sources.zarr_store_format(target):
        return "zarr"
    if fileio.is_dir(target) or globbed or not fileio.exists(target):
        return None
    tfrecord.check_regular(target)
    head = sources.read_head(target)
    if len(head) >= 12 and framing.masked_crc(head[:8]) == int.from_bytes(head[8:12], "little"):
        return None  # an uncompressed TFRecord file, whatever its suffix (.bin, .dat: raw's suffixes)
    try:
        return sources.format_of(target, sources.SourceOptions())
    except UnreadFormatError:
        raise
    except SourceError:
        return None  # no format told: TFRecord (compressed, or not: the record reader says what it finds)


def summarize_input(path: str, fmt: str) -> dict:
    """What convert makes of the input file ``path`` of a non-container format (``npy``, ``npz``, ``raw``,
    ``envi``, ``nifti``, ...) with its default options: ``{"input", "format", "examples", "rows", "bytes_per_row",
    "features"}`` and, when the source records them, the file's ``attributes`` (what ``metadata.json`` keeps of
    it), from the source's own index (``Source.index``: headers only, no array is read).

    Raises:
      SourceError, SchemaError: what convert's planning raises for the file (e.g. a raw file without a layout).
    """
    index = sources.make_source(fmt, sources.SourceOptions()).index(path)
    return {
        "input": path,
        "format": fmt,
        "label": sources.REGISTRY[fmt].help_label or fmt,
        "examples": index.num_rows,
        "per": "member" if index.sizes else "row",
        "bytes_per_row": index.row_bytes,
        "features": [s.to_json() for s in index.specs],
        **({"attributes": index.attributes} if index.attributes else {}),
    }


def build_parser() -> common.CommandParser:
    """The command's argument parser, its flags in the argument groups of ``flaghelp.GROUPS`` (``--help``, the
    docs' flag reference)."""
    parser = common.CommandParser(
        prog="tfrecord-etl inspect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "output_dir", help="an output directory of tfrecord-etl, or a TFRecord file, glob or directory without metadata"
    )
    parser.add_argument("--tf_read", action="store_true", help="also read every record with tf.data (default: off)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")
    common.add_record_limit_flags(parser)
    parser.add_argument("--verbose", action="store_true", help="show TensorFlow logs (default: off)")
    parser.add_argument(
        "--spans",
        default=None,
        help="a collection's spans to summarize: 7, 3,5,9, 3-9, latest, "
        "latest:N or all (default: all); one span: its output directory too",
    )
    return flaghelp.group_flags(parser, "inspect")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if collection.is_collection(args.output_dir):
        summary = summarize_collection(args.output_dir, args.spans, args.tf_read, *common.record_limits(args))
        print(json.dumps(summary, indent=1) if args.json else render_collection(summary))
        return 0
    collection_reader.refuse_spans(args.output_dir, args.spans)
    kind = input_format(args.output_dir)
    own = sources.make_source(kind, sources.SourceOptions()).tree(args.output_dir) if kind else None
    if own is not None:  # a source that lists its own tree (Source.tree)
        # deferred: the container formats' modules, for a container's tree only
        from tfrecord_etl.transforms.sources.hdf5tree import render_tree

        print(json.dumps(own, indent=1) if args.json else render_tree(own))
        return 0
    if kind and kind not in CONTAINER_TREES:  # an input convert reads: what it makes of it
        summary = summarize_input(args.output_dir, kind)
        print(json.dumps(summary, indent=1) if args.json else inspect_text.render_input(summary))
        return 0
    if kind:  # the dataset tree and row groups, so no external tool (h5ls, ncdump) is needed
        # deferred: the container formats' modules (HDF5, NetCDF-3, MATLAB, Zarr), for a container's tree only
        from tfrecord_etl.transforms.sources.hdf5tree import hdf5_tree, matlab_tree, netcdf3_tree, render_tree
        from tfrecord_etl.transforms.sources.zarrtree import zarr_tree

        trees = {"hdf5": hdf5_tree, "netcdf3": netcdf3_tree, "matlab": matlab_tree, "zarr": zarr_tree}
        tree = trees[kind](args.output_dir)
        print(json.dumps(tree, indent=1) if args.json else render_tree(tree))
        return 0
    summary = summarize(args.output_dir, args.tf_read, *common.record_limits(args))
    print(json.dumps(summary, indent=1) if args.json else render(summary))
    return 0
