"""The ``tf.data`` pipeline of :func:`transforms.reading.reader.to_tf_dataset`: checked shards, batched parsing.

    shards (this worker's, optionally shuffled)                 each checked first: size, CRC32C (once per version)
      -> TFRecordDataset per shard, its record count asserted   shard order (deterministic=False: 2 at once);
         [-> prefetch]                                          large records read ahead by a thread of their own
      -> batch(B) -> map(tf.io.parse_example + batch decode)    one parse and one decode_raw per batch
      [-> unbatch]                                              batch_size=None: parsed in batches all the same
      -> prefetch(AUTOTUNE)

The pattern of TensorFlow's input-pipeline guide (``tensorflow.org/guide/data_performance``: vectorized mapping,
parallel interleave, prefetch) and of TFDS's ``as_dataset`` (``read_config``: ``shuffle_files``,
``shuffle_seed``, ``input_context``: each worker a disjoint set of files; ``tfds/core/reader.py``). A
``tf.io.parse_example`` over a batch of 256 serialized Examples costs about what one ``parse_single_example``
costs, so parsing after batching (and ``tf.io.decode_raw`` over the batch's ``[256]`` string tensor) is what
makes the difference with a map over single records.

Features whose shape varies between examples cannot be parsed as one dense batch: with ``batch_size=None`` a
selection holding one is parsed one example at a time, as before (still with the shard checks and parallel
reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfrecord_etl.transforms.codec import FeatureSpec, encoding_of
from tfrecord_etl.transforms.errors import ConfigError, SchemaError
from tfrecord_etl.transforms.output import metadata, schemafile, tfrecord
from tfrecord_etl.transforms.reading import collection_reader
from tfrecord_etl.transforms.reading.shardcheck import check_shard
from tfrecord_etl.transforms.storage import fileio

TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}
#: examples parsed together when the dataset is not batched (batch_size=None): parsed and decoded as one batch,
#: then unbatched
PARSE_BATCH = 256
#: shards read at the same time with deterministic=False (tf.data's interleave cycle)
PARALLEL_READS = 2
#: bytes TFRecordDataset reads from a shard at a time
READ_BUFFER = 4 << 20
#: records of at least this many bytes (on average over the shards read) are read ahead by a thread of their own
LARGE_RECORD = 4096
#: bytes of records read ahead per shard being read (records of LARGE_RECORD bytes or more)
READ_AHEAD = 16 << 20


def parse_spec(tf, specs: Sequence[FeatureSpec]) -> dict:
    """The ``tf.io.parse_example`` features of ``specs`` as written (``schemafile.example_features``):
    ``FixedLenFeature`` for a fixed shape, else ``VarLenFeature``; ``tf``: the TensorFlow module."""
    out = {}
    for spec in specs:
        for name, kind, shape in schemafile.example_features(spec):
            dtype = {"bytes": tf.string, "int64": tf.int64, "float": tf.float32}[kind]
            out[name] = tf.io.FixedLenFeature(shape, dtype) if shape is not None else tf.io.VarLenFeature(dtype)
    return out


def refuse_varying_dtypes(
    specs: Sequence[FeatureSpec],
    where: str | None = None,
    numpy_reader: str | Sequence[str] = ("iter_numpy", "RandomAccess"),
) -> None:
    """Refuses features whose dtype varies between examples (``dtype`` None: npz ``arrays`` / npy ``files`` modes
    over arrays of several dtypes): a ``tf.data`` element spec holds one dtype per feature (tf.data's
    ``Dataset.element_spec``), so no dataset can yield each example's own dtype. ``numpy_reader``: the reader (or
    readers) of ``reader`` named in the hint, which decode them (each example's own dtype and shape).

    Raises:
      SchemaError: naming the features, the readers that read them and ``features=[...]`` to leave them out.
    """
    readers = (numpy_reader,) if isinstance(numpy_reader, str) else tuple(numpy_reader)
    varying = [s.name for s in specs if s.dtype is None]
    if varying:
        others = [s.name for s in specs if s.dtype is not None]
        raise SchemaError(
            f"The dtype of {varying} varies between examples: a tf.data dataset holds one dtype per "
            "feature, so it cannot yield them with their own dtypes",
            file=where,
            feature=varying[0],
            hint=f"read them with {' or '.join(f'reader.{r}' for r in readers)} (each example's own dtype and "
            "shape), or "
            f"leave them out with features={others!r}",
        )


def decode_tf(tf, parsed: dict, specs: Sequence[FeatureSpec]) -> dict:
    """Parsed (encoded) features of one example -> tensors with the original dtypes and shapes.

    Raises:
      SchemaError: a feature whose dtype varies between examples (``dtype`` None), see
        :func:`refuse_varying_dtypes`; its encoded form is ``tf_feature_spec``'s.
    """
    refuse_varying_dtypes(specs)
    out = {}
    for spec in specs:
        encoding = encoding_of(spec)
        if spec.is_fixed:
            shape = tf.constant(list(spec.shape), tf.int32)
        elif encoding.shape_companion(spec):
            shape = tf.cast(tf.sparse.to_dense(parsed[f"{spec.name}/shape"]), tf.int32)
        else:  # varlen (tf.io.VarLenFeature): a 1-D tensor of the record's values, empty when it has none
            shape = tf.shape(parsed[spec.name].values)
        out[spec.name] = encoding.to_tf(tf, spec, parsed[spec.name], shape)
    return out


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard to read: its path, compression, record count and metadata.json entry."""

    path: str
    compression: str
    records: int
    entry: dict


def shards_of(parts: Sequence[collection_reader.Part]) -> list[Shard]:
    """Every shard of ``parts``, in order (span order, then shard order)."""
    return [
        Shard(path, part.meta["compression"], int(entry["records"]), entry)
        for part in parts
        for entry, path in zip(part.meta["shards"], metadata.shard_paths(part.dir, part.meta))
    ]


def worker_shards(
    shards: list[Shard],
    input_context=None,
    num_workers: int | None = None,
    worker_index: int | None = None,
    where: str | None = None,
) -> list[Shard]:
    """The shards worker ``worker_index`` of ``num_workers`` reads: every ``num_workers``-th shard, starting at its
    index (``tf.data.Dataset.shard`` over the file list, as TFDS's ``as_dataset`` does with an input context), so
    the workers read disjoint sets of shards that together are all of them. ``input_context``: a
    ``tf.distribute.InputContext`` (its ``num_input_pipelines`` and ``input_pipeline_id``).

    Raises:
      ConfigError: both forms given, one of ``num_workers``/``worker_index`` without the other, an index outside
        ``[0, num_workers)``, or fewer shards than workers (a worker would read nothing: convert with more
        ``--num_shards``, or shard the examples yourself with ``ds.shard``).
    """
    if input_context is not None:
        if num_workers is not None or worker_index is not None:
            raise ConfigError("Pass either input_context or num_workers/worker_index, not both", file=where)
        num_workers, worker_index = input_context.num_input_pipelines, input_context.input_pipeline_id
    if num_workers is None and worker_index is None:
        return shards
    if (
        num_workers is None
        or worker_index is None
        or not isinstance(num_workers, int)
        or not isinstance(worker_index, int)
        or num_workers < 1
        or not 0 <= worker_index < num_workers
    ):
        raise ConfigError(
            f"num_workers={num_workers!r}, worker_index={worker_index!r}: need both, with "
            "0 <= worker_index < num_workers",
            file=where,
        )
    if len(shards) < num_workers:
        raise ConfigError(
            f"Cannot give each of {num_workers} workers its own shards: the output has {len(shards)}",
            file=where,
            hint="convert with --num_shards at least the number of workers, or read every shard on "
            "each worker and split the examples with ds.shard(num_workers, worker_index)",
        )
    return shards[worker_index::num_workers]


def check_shards(shards: Sequence[Shard], check_checksums: bool = True) -> None:
    """Each shard is the one metadata.json lists, before any record is read: its size (one stat), and with
    ``check_checksums`` its CRC32C, read once per process and file version (``shardcheck.check_shard``: a shard that
    matched is not read again until it is renamed, rewritten or replaced). A matching CRC32C also vouches for the
    record count and the order of the records (the bytes are those written).

    Raises:
      RecordError: naming the shard and what differs.
    """
    for shard in shards:
        check_shard(shard.entry, shard.path, None, check_checksums)


def decode_batch(tf, parsed: dict, specs: Sequence[FeatureSpec]) -> dict:
    """Parsed (encoded) features of a batch of examples (``tf.io.parse_example``) -> ``{name: [batch, *shape]}``
    tensors with the original dtypes, each feature decoded in one step for the whole batch
    (``Encoding.to_tf_batch``). Every spec must have a fixed shape."""
    return {spec.name: encoding_of(spec).to_tf_batch(tf, spec, parsed[spec.name]) for spec in specs}


def read_ahead(shards: Sequence[Shard]) -> int:
    """Records to read ahead of the batching, per shard being read: 0 (none) for records under
    :data:`LARGE_RECORD` bytes on average, else :data:`READ_AHEAD` bytes' worth.

    Why: with large records, reading (a copy of each record and its CRC) is most of the work, and done in the
    thread that batches, it is one thread for both in shard order; a ``prefetch`` on each shard's records gives
    reading a thread of its own, still in shard order (measured on 20,000 records of 12.8 kB on a loaded 2-core
    machine: 1.57x the hand-written two-reader pipeline, against 1.07x without). Small records lose by it (a
    hand-over per record: 2.54x became 1.26x), so they are not read ahead."""
    total = sum(int(s.entry.get("bytes") or 0) for s in shards)
    count = sum(s.records for s in shards)
    if not count or total // count < LARGE_RECORD:
        return 0
    return max(16, READ_AHEAD // (total // count))


def records(
    tf,
    shards: Sequence[Shard],
    shuffle_files: bool = False,
    seed: int | None = None,
    deterministic: bool = True,
    parallel_reads: int = PARALLEL_READS,
):
    """A dataset of the serialized records of ``shards``: with ``deterministic``, shard after shard (in the order
    given, or shuffled with ``seed``, again each epoch); else ``parallel_reads`` shards read at once by tf.data's
    parallel interleave, records taken from whichever is ready. Large records are read ahead by a thread of their
    own (:func:`read_ahead`). Each shard's record count is asserted against
    metadata.json as it is read (``tf.data.experimental.assert_cardinality``: a ``FailedPreconditionError`` if
    the file changed after the checks).

    Why not a parallel interleave in shard order (``block_length`` = a shard's records): tf.data's interleave
    buffers up to ``block_length`` elements per open shard, i.e. the whole next shard in memory."""
    files = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant([s.path for s in shards], tf.string),
            tf.constant([TF_COMPRESSION[s.compression] for s in shards], tf.string),
            tf.constant([s.records for s in shards], tf.int64),
        )
    )
    if shuffle_files and len(shards) > 1:  # a shuffle buffer must hold at least one element
        files = files.shuffle(len(shards), seed=seed, reshuffle_each_iteration=True)

    ahead = read_ahead(shards)
    remote = any(not fileio.is_local(s.path) for s in shards)

    def read(path, compression, count):
        if remote:  # TensorFlow has no s3:// file system (it left with tensorflow-io) and its gs:// one knows
            # neither Beam's options nor an emulator: the store's client reads the shard, as for iter_numpy
            ds = tf.data.Dataset.from_generator(
                _stream_records, args=(path, compression), output_signature=tf.TensorSpec((), tf.string)
            )
        else:
            ds = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=READ_BUFFER)
        ds = ds.apply(tf.data.experimental.assert_cardinality(count))
        return ds.prefetch(ahead) if ahead else ds

    if deterministic or len(shards) < 2 or parallel_reads < 2:
        return files.flat_map(read)
    return files.interleave(
        read,
        cycle_length=min(parallel_reads, len(shards)),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )


def _stream_records(path: bytes, compression: bytes):
    """The records of the remote shard ``path`` (s3://, gs://), read through :func:`fileio.open_read` (bounded
    ranged GETs with the store's client) and :func:`tfrecord.iter_records` (every frame's CRCs checked);
    ``compression`` is TensorFlow's name (``""``, ``GZIP``, ``ZLIB``). Arguments come as bytes from
    ``from_generator``."""
    name = path.decode()
    ours = {v: k for k, v in TF_COMPRESSION.items()}[compression.decode()]
    raw = fileio.open_read(name)
    try:
        stream = tfrecord.open_decompressed(raw, ours)
        for _, _, record in tfrecord.iter_records(stream, name):
            yield record
    finally:
        raw.close()


def dataset(tf, serialized, specs: Sequence[FeatureSpec], batch_size: int | None, deterministic: bool = True):
    """``serialized`` (a dataset of serialized Examples) -> ``{name: tensor}`` elements, batched by
    ``batch_size`` (None: one example per element), parsed and decoded a batch at a time when every feature has
    a fixed shape, else one example at a time (``reader.decode_tf``)."""
    parsing = parse_spec(tf, specs)
    if all(s.is_fixed for s in specs):

        @tf.autograph.experimental.do_not_convert  # plain ops, no Python control flow on tensors: no tracing rewrite
        def parse(batch):
            return decode_batch(tf, tf.io.parse_example(batch, parsing), specs)

        ds = serialized.batch(batch_size or PARSE_BATCH).map(
            parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic
        )
        if not batch_size:
            ds = ds.unbatch()
    else:  # a feature whose shape varies: no dense batch to parse into (batch_size is refused for it)
        ds = serialized.map(
            lambda r: decode_tf(tf, tf.io.parse_single_example(r, parsing), specs),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
        if batch_size:
            ds = ds.batch(batch_size)
    return ds.prefetch(tf.data.AUTOTUNE)


def to_tf_dataset(
    output_dir: str,
    batch_size: int | None = None,
    features: Sequence[str] | None = None,
    split: str | None = None,
    spans=None,
    *,
    shuffle_files: bool = False,
    seed: int | None = None,
    deterministic: bool = True,
    input_context=None,
    num_workers: int | None = None,
    worker_index: int | None = None,
    check_checksums: bool = True,
    trust_spans: bool = False,
):
    """See :func:`transforms.reading.reader.to_tf_dataset` (the public entry point)."""
    import tensorflow as tf

    specs, parts = collection_reader.parts(output_dir, spans, split, features, trust_spans)
    refuse_varying_dtypes(specs, output_dir)
    varying = [s.name for s in specs if not s.is_fixed]
    if batch_size and varying:
        raise SchemaError(
            f"Cannot batch: the shape of {varying} varies between examples (tf.data batches fixed shapes only)",
            file=output_dir,
            hint="read batches with reader.iter_numpy(batch_size=N) or reader.RandomAccess (each example's array "
            "in an object array), pass batch_size=None (and batch them yourself, e.g. with ds.ragged_batch), or "
            "select fixed features with features=[...]",
        )
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 0):
        raise ConfigError(
            f"batch_size={batch_size!r}: need a positive int, or None for one example per element", file=output_dir
        )
    shards = worker_shards(shards_of(parts), input_context, num_workers, worker_index, output_dir)
    check_shards(shards, check_checksums)
    serialized = records(tf, shards, shuffle_files, seed, deterministic)
    return dataset(tf, serialized, specs, batch_size, deterministic)
