"""PTransforms and DoFns that wire the sources, the codec and the shard writers into Beam.

The convert pipeline reads as::

    ReadFromArrays -> EncodeExamples -> WriteToTFRecord -> CountShardRecords -> WriteMetadata

Planning (matching files, indexing rows and features, splitting row ranges) happens when the
transform is built, in the launcher, like Beam's file sources estimate sizes: a bad input fails
before any output exists, and the shard count and feature specs are known up front.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics import Metrics

from transforms import fileio, metadata, sources, tfrecord
from transforms.codec import FeatureSpec, check_spec, encode_batch
from transforms.errors import RecordError, SchemaError
from transforms.sources import FileIndex, RowRange, Source, SourceOptions

log = logging.getLogger(__name__)
NAMESPACE = "tfrecord_etl"
PROVENANCE = (FeatureSpec("_source/file", "bytes", (), "list"), FeatureSpec("_source/row", "<i8", (), "list"))


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """Everything known of the inputs before the pipeline runs."""

    source: Source
    indexes: tuple[FileIndex, ...]
    specs: tuple[FeatureSpec, ...]
    ranges: tuple[RowRange, ...]

    @property
    def num_rows(self) -> int:
        return sum(i.num_rows for i in self.indexes)

    @property
    def num_bytes(self) -> int:
        return sum(sum(i.sizes) if i.sizes else i.num_rows * i.row_bytes for i in self.indexes)


def plan_inputs(pattern: str, options: SourceOptions) -> InputPlan:
    """Matches ``pattern``, indexes every file and plans row ranges of ``options.target_range_bytes``.

    Raises:
      SourceError, SchemaError: unmatched pattern, unreadable file, unsupported dtype, features that
        differ between files (naming the file and dataset/member).
    """
    files = fileio.match(pattern)
    fmt = sources.format_of(files[0][0], options)
    source = sources.make_source(fmt, options)
    indexes = [source.index(path) for path, _ in files]
    specs = sources.merge_specs(indexes, loose=source.loose)
    if sources.files_mode(source):  # all files together are one sequence of rows
        indexes = [FileIndex(pattern, len(indexes), specs, max(i.row_bytes for i in indexes), 1,
                             tuple(i.path for i in indexes), tuple(i.sizes[0] for i in indexes), item_files=True)]
    ranges = [r for i in indexes for r in sources.plan_row_ranges(i, options.target_range_bytes)]
    return InputPlan(source, tuple(indexes), specs, tuple(ranges))


def choose_encodings(specs: Sequence[FeatureSpec], default: str, per_feature: dict, allow_lossy=(),
                     where: str | None = None) -> tuple:
    """Sets each feature's encoding (per-feature choice, else ``default``; variable-length strings are
    always ``list``, varying dtypes always ``tensor``) and checks it.

    Raises:
      SchemaError: an encoding that cannot carry the feature (naming ``where``, the input pattern).
      ConfigError: ``per_feature`` names a feature that does not exist.
    """
    unknown = set(per_feature) - {s.name for s in specs}
    if unknown:
        from transforms.errors import ConfigError
        raise ConfigError(f"feature_encodings names unknown features {sorted(unknown)}",
                          hint=f"features are {[s.name for s in specs]}")
    out = []
    for s in specs:
        enc = per_feature.get(s.name)
        if enc is None:
            enc = "list" if s.dtype == "bytes" else ("tensor" if s.dtype is None else default)
        spec = dataclasses.replace(s, encoding=enc)
        try:
            check_spec(spec, allow_lossy)
        except SchemaError as e:
            raise e.with_context(file=where) from None
        out.append(spec)
    return tuple(out)


class ReadRowRangesFn(beam.DoFn):
    """Reads one RowRange into a batch of columns: ``(RowRange, {name: array (rows, *shape)})``."""

    def __init__(self, source: Source):
        self._source = source
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_read")

    def process(self, rr: RowRange):
        columns = self._source.read(rr)
        self._rows.inc(rr.num_rows)
        self._bytes.inc(sum(v.nbytes for v in columns.values() if isinstance(v, np.ndarray)))
        yield rr, columns


class ReadFromArrays(beam.PTransform):
    """Reads HDF5 / .npz / .npy files matching a pattern as batches ``(RowRange, columns)``.

    Row ranges are planned at construction (see :func:`plan_inputs`) and spread across workers with
    a Reshuffle, so one big file is read by many workers, each holding one range at a time.
    """

    def __init__(self, pattern: str, options: SourceOptions = SourceOptions(), plan: InputPlan | None = None):
        super().__init__()
        self.plan = plan or plan_inputs(pattern, options)

    def expand(self, pbegin):
        return (pbegin
                | "CreateRowRanges" >> beam.Create(list(self.plan.ranges))
                | "SpreadRowRanges" >> beam.Reshuffle()
                | "ReadRowRanges" >> beam.ParDo(ReadRowRangesFn(self.plan.source)))


class ReadFromHdf5(ReadFromArrays):
    """ReadFromArrays for HDF5 files (``datasets``: dataset paths, default all)."""

    def __init__(self, pattern: str, datasets=None, target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("hdf5", tuple(datasets) if datasets else None,
                                                target_range_bytes=target_range_bytes))


class ReadFromNpz(ReadFromArrays):
    """ReadFromArrays for .npz archives (``mode``: ``rows`` or ``arrays``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("npz", npz_mode=mode, target_range_bytes=target_range_bytes))


class ReadFromNpy(ReadFromArrays):
    """ReadFromArrays for .npy files (``mode``: ``rows`` or ``files``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(pattern, SourceOptions("npy", npy_mode=mode, target_range_bytes=target_range_bytes))


def add_provenance(rr: RowRange, columns: dict) -> dict:
    """Adds ``_source/file`` (bytes) and ``_source/row`` (int64) columns for the rows of ``rr``."""
    out = dict(columns)
    if rr.item_files:  # files mode: one file per row
        out["_source/file"] = [p.encode() for p in rr.items]
    else:
        out["_source/file"] = [rr.path.encode()] * rr.num_rows
    out["_source/row"] = np.arange(rr.start, rr.stop, dtype=np.int64)
    return out


class EncodeExamplesFn(beam.DoFn):
    """Encodes a batch of columns into serialized Examples, one vectorized call per batch.

    With ``batched`` it yields one list of records per batch, else one record per element.
    """

    def __init__(self, specs: Sequence[FeatureSpec], allow_lossy=(), provenance=False, batched=False):
        self._specs, self._lossy, self._prov, self._batched = tuple(specs), tuple(allow_lossy), provenance, batched
        self._examples = Metrics.counter(NAMESPACE, "examples_encoded")

    def process(self, element):
        rr, columns = element
        if self._prov:
            columns = add_provenance(rr, columns)
        try:
            records = encode_batch(columns, self._specs, rr.num_rows, self._lossy)
        except RecordError as e:
            raise RecordError(f"Cannot encode {rr.describe()}: {e}", file=rr.path,
                              rows=f"{rr.start}-{rr.stop - 1}") from None
        self._examples.inc(len(records))
        if self._batched:
            yield records
        else:
            yield from records


class EncodeExamples(beam.PTransform):
    """``(RowRange, columns)`` batches -> serialized ``tf.train.Example`` records (bytes)."""

    def __init__(self, specs, allow_lossy=(), provenance=False):
        super().__init__()
        self._fn = EncodeExamplesFn(specs, allow_lossy, provenance)

    def expand(self, batches):
        return batches | "EncodeBatches" >> beam.ParDo(self._fn)


_BEAM_COMPRESSION = {"none": CompressionTypes.UNCOMPRESSED, "gzip": CompressionTypes.GZIP,
                     "zlib": CompressionTypes.DEFLATE}  # Beam's DEFLATE is a zlib stream with header: TF's ZLIB


def shard_suffix(compression: str) -> str:
    return ".tfrecord" + tfrecord.SUFFIXES[compression]


class WriteToShards(beam.PTransform):
    """Writes records with Beam's ``WriteToTFRecord`` as ``<prefix>-SSSSS-of-NNNNN.tfrecord[.gz]``.

    Returns the PCollection of final shard paths.
    """

    def __init__(self, output_dir: str, prefix: str, num_shards: int, compression: str):
        super().__init__()
        self._prefix = fileio.join(output_dir, prefix)
        self._num_shards, self._compression = num_shards, compression

    def expand(self, records):
        return records | "WriteToTFRecord" >> beam.io.WriteToTFRecord(
            self._prefix, file_name_suffix=shard_suffix(self._compression), num_shards=self._num_shards,
            shard_name_template="-SSSSS-of-NNNNN", compression_type=_BEAM_COMPRESSION[self._compression])


def count_shard(path: str, compression: str) -> dict:
    """``{"file", "records", "bytes"}`` of one written shard, by walking its frames (CRCs checked)."""
    with fileio.open_read(path) as raw:
        stream = tfrecord.open_decompressed(raw, compression)
        n = sum(1 for _ in tfrecord.iter_records(stream, path))
    size = fileio.FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    return {"file": fileio.basename(path), "records": n, "bytes": size}


class WriteMetadataFn(beam.DoFn):
    """Checks rows in = records out and writes ``metadata.json`` last (the commit point)."""

    def __init__(self, output_dir, specs, compression, expected_rows, sources_info, writer, options):
        self._args = (output_dir, tuple(specs), compression, expected_rows, sources_info, writer, options)

    def process(self, shards):
        output_dir, specs, compression, expected, sources_info, writer, options = self._args
        shards = sorted(shards, key=lambda s: s["file"])
        written = sum(s["records"] for s in shards)
        if written != expected:
            raise RecordError(f"Rows read ({expected}) != examples written ({written}): records were lost or "
                              "duplicated", file=output_dir, hint="re-run; report it if it happens again")
        metadata.write(output_dir, metadata.build(specs, shards, compression, sources_info, writer, options), specs)
        yield output_dir


class FinalizeOutput(beam.PTransform):
    """Shard paths -> per-shard record counts -> ``metadata.json`` (written after every shard is final)."""

    def __init__(self, output_dir, specs, compression, expected_rows, sources_info, writer, options):
        super().__init__()
        self._compression = compression
        self._fn = WriteMetadataFn(output_dir, specs, compression, expected_rows, sources_info, writer, options)

    def expand(self, shard_paths):
        compression = self._compression
        return (shard_paths
                | "CountShardRecords" >> beam.Map(count_shard, compression)
                | "CollectShards" >> beam.combiners.ToList()
                | "WriteMetadata" >> beam.ParDo(self._fn))
