"""Read an output directory of tfrecord-etl back: as NumPy (no TensorFlow import) or as tf.data.

    from tfrecord_etl.transforms.reading import reader
    for example in reader.iter_numpy("out/"):            # dicts of numpy arrays, in shard order
        ...
    ds = reader.to_tf_dataset("out/", batch_size=256)    # dicts of tensors, original dtypes and shapes
                                                            # (a feature whose dtype varies: iter_numpy only)
    example = reader.get("out/", 12345)                     # one example by index (seek + read, --index)
    spec = reader.tf_feature_spec("out/")                   # for tf.io.parse_example
    ds = reader.to_tf_dataset("coll/", spans="latest:30")   # a collection: its newest 30 spans, in span order

Every function refuses an output directory without ``metadata.json`` (IncompleteOutputError). Every function also
reads a collection directory (``collection.json`` + ``span-N/``): ``spans=`` selects spans (None = all, an int, a
list or range, ``"latest"``, ``"latest:N"``), read in span order, each at its latest version, their features checked
to agree first (:mod:`transforms.reading.collection_reader`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tfrecord_etl.transforms.errors import ConfigError
from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.output.outdir import MANIFEST_FILE, SIDECAR_FORMAT  # noqa: F401 - re-exported
from tfrecord_etl.transforms.reading import collection_reader, numpy_reader, tfdata
from tfrecord_etl.transforms.reading.collection_reader import select_features  # noqa: F401 - re-exported
from tfrecord_etl.transforms.reading.random_access import RandomAccess  # re-exported
from tfrecord_etl.transforms.reading.shardcheck import CRC_CHUNK, check_shard, file_crc32c  # noqa: F401 - re-exported (reader.check_shard is documented)
from tfrecord_etl.transforms.reading.tfdata import decode_tf, parse_spec, refuse_varying_dtypes  # noqa: F401 - re-exported
from tfrecord_etl.transforms.reading.torch_io import collate_varlen, python_scalars, torch_description  # noqa: F401
from tfrecord_etl.transforms.storage import fileio

TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}


def iter_records(
    path: str, compression: str | None = None, max_record_bytes: int | None = None
) -> Iterator[tuple[int, int, bytes]]:
    """``(record index, byte offset, serialized record)`` of one TFRecord file, streamed, CRCs checked.

    ``compression``: ``none``, ``gzip`` or ``zlib``; None guesses from the suffix, then the first bytes.
    ``max_record_bytes``: limit on a record's length header, checked before the record is read (default
    ``tfrecord.record_limit()``, 1024 MB).

    Raises:
      RecordError: a corrupt frame or a record over the limit.
      SourceError: not a regular file (a FIFO or device is never opened).
    """
    tfrecord.check_regular(path)
    if compression is None:
        compression = file_compression(path)
    with fileio.open_read(path) as raw:
        yield from tfrecord.iter_records(
            tfrecord.open_decompressed(raw, compression), path, max_record_bytes=max_record_bytes
        )


def file_compression(path: str) -> str:
    """The compression of a TFRecord file: from its suffix (``.gz``, ``.deflate``/``.zlib``/``.zz``), else its
    first bytes (``tfrecord.detect_compression``)."""
    compression = tfrecord.compression_from_path(path)
    if compression == "none":
        with fileio.open_read(path) as raw:
            compression = tfrecord.detect_compression(raw.read(12))
    return compression


def iter_numpy(
    output_dir: str,
    features: Sequence[str] | None = None,
    max_record_bytes: int | None = None,
    max_features: int | None = None,
    split: str | None = None,
    spans=None,
    batch_size: int | None = None,
    check_checksums: bool = True,
    trust_spans: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """Yields one ``{name: np.ndarray}`` per example, or with ``batch_size`` one ``{name: array of batch_size
    rows}`` per batch (the last one holds the rest; batches run across shards and spans), in shard order, without
    importing TensorFlow. ``split``: only that split's shards (``--splits`` / ``--split`` outputs); default every
    shard. ``output_dir`` may be a collection directory: ``spans`` selects its spans, read in span order (see the
    module); ``trust_spans`` reads a span whose ``metadata.json`` is not the one ``collection.json`` lists (see
    :func:`collection_reader.check_span`).

    Arrays have the recorded dtype and shape (values exact, dtype and shape kept, byte order normalised to
    little-endian: a ``>f8`` source reads as ``<f8``); ``bytes`` features are object arrays. In a batch, a
    fixed feature is one ``(rows, *shape)`` array; a feature whose shape or dtype varies between examples is a 1-D
    object array holding each row's array. Records are decoded a block at a time with NumPy
    (:mod:`transforms.reading.numpy_reader`), with values equal to the per-record decoder's.

    ``max_record_bytes`` / ``max_features``: limits on one record's size and feature count (defaults
    ``tfrecord.record_limit()`` and ``codec.MAX_FEATURES``).

    Each shard is checked: its size against metadata.json before it is read, its record count at its end, and with
    ``check_checksums`` (default) its CRC32C: a local shard's before its first row (once per process and file
    version, :func:`check_shard`), and the bytes as read, at its end. ``check_checksums=False`` skips the CRC32C of
    the shard (every record's own CRCs are still checked).

    Raises:
      IncompleteOutputError: no metadata.json; a span not the one collection.json lists (unless ``trust_spans``).
      RecordError: a corrupt record (file, index, offset), a record over a limit, a shard whose size, record count
        or CRC32C differs from the metadata (naming the shard).
      ConfigError: ``batch_size`` not a positive integer; ``spans`` (see :func:`collection_reader.parts`).
      SchemaError: ``schema.pbtxt`` disagrees with ``metadata.json``; ``spans`` (see :func:`collection_reader.parts`).
    """
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1
    ):
        raise ConfigError(f"batch_size={batch_size!r}: expected a positive integer, or None for one example at a time")
    specs, shards = numpy_reader.shards_of(output_dir, features, split, spans, trust_spans)
    pieces = numpy_reader.iter_pieces(specs, shards, max_record_bytes, max_features, check_checksums, batch_size or 1)
    if batch_size:
        yield from numpy_reader.batches(pieces, int(batch_size))
    else:
        yield from numpy_reader.rows(specs, pieces)


def tf_feature_spec(
    output_dir: str, features: Sequence[str] | None = None, spans=None, trust_spans: bool = False
) -> dict:
    """TensorFlow's feature spec (the ``tf.io.parse_example`` dict) of the output's Example features, in their
    encoded form. Not to be confused with ``codec.FeatureSpec``, this project's record of one feature (name, dtype,
    shape, encoding) as kept in the metadata.

    ``tensor`` features parse as ``FixedLenFeature([], tf.string)``; fixed ``list`` features as
    ``FixedLenFeature(shape, tf.int64 | tf.float32 | tf.string)``; variable-length ones as
    ``VarLenFeature``, with their ``<name>/shape`` (and ``<name>/dtype``) companions.
    Use :func:`to_tf_dataset` to get the original dtypes and shapes. A collection directory: the features of the
    spans ``spans`` selects, checked to agree.
    """
    import tensorflow as tf

    return parse_spec(tf, collection_reader.parts(output_dir, spans, None, features, trust_spans)[0])


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
    """A ``tf.data.Dataset`` of ``{name: tensor}`` with the original dtypes and shapes (values exact, dtype and
    shape kept, byte order normalised to little-endian), in shard order
    (``split``: only that split's shards). A collection directory: the shards of the spans ``spans`` selects, in
    span order. ``S``/``U``/``V`` features become ``tf.string`` (str as UTF-8), datetimes ``tf.int64``.

    Args:
      batch_size: examples per element (``[batch, *shape]`` tensors, the last batch may be smaller); every
        selected feature must then have a fixed shape. None: one example per element.
      shuffle_files: read the shards in a random order, another each epoch (``seed``: the same orders every run).
        The records of a shard stay in order: shuffle examples with ``ds.shuffle(buffer)`` as well.
      deterministic: False reads 2 shards at once and takes records from whichever is ready (faster when one
        stalls, e.g. on an object store, or for gzip shards); the order then varies from run to run.
      input_context: a ``tf.distribute.InputContext`` (``strategy.distribute_datasets_from_function``): this
        worker reads every ``num_input_pipelines``-th shard from ``input_pipeline_id``, so the workers read
        disjoint sets of shards that together are the whole output. Or ``num_workers`` / ``worker_index``.
      check_checksums: before reading, each shard's CRC32C is checked against metadata.json (once per process
        and file version; its size always). False: size only (plus each shard's record count while reading).

    How (:mod:`transforms.reading.tfdata`): shards read one after the other (2 at a time with ``deterministic=False``;
    records of 4 kB or more read ahead by a thread of their own, in order), records batched before parsing (one
    ``tf.io.parse_example`` and one ``decode_raw`` per batch; with ``batch_size=None``, batches of 256 unbatched
    after decoding), prefetch.

    Raises:
      IncompleteOutputError: no metadata.json (``trust_spans``: see :func:`iter_numpy`). SchemaError:
        ``schema.pbtxt`` disagrees with ``metadata.json``; a feature whose dtype varies between examples
        (npz ``arrays`` mode over members of several dtypes: read it with :func:`iter_numpy` or
        :class:`RandomAccess`, or leave it out with ``features``); ``batch_size`` with features whose shape varies
        between examples (tf.data could not stack them: read batches with ``iter_numpy(batch_size=N)`` or
        :class:`RandomAccess`, batch those yourself, e.g. with ``ds.ragged_batch``, or pass ``features``).
      RecordError: a shard whose size or CRC32C is not the one metadata.json lists (naming the shard). While
        iterating, a shard whose record count differs from the metadata's (changed after the checks) fails with
        ``tf.errors.FailedPreconditionError``.
      ConfigError: worker options that do not fit (more workers than shards, an index out of range).
    """
    options: dict[str, Any] = {"shuffle_files": shuffle_files, "seed": seed, "deterministic": deterministic}
    options.update(input_context=input_context, num_workers=num_workers, worker_index=worker_index)
    options.update(check_checksums=check_checksums, trust_spans=trust_spans)
    return tfdata.to_tf_dataset(output_dir, batch_size, features, split, spans, **options)


def get(
    output_dir: str,
    i: int,
    features: Sequence[str] | None = None,
    split: str | None = None,
    check_checksums: bool = True,
    spans=None,
    trust_spans: bool = False,
) -> dict[str, np.ndarray]:
    """Example ``i`` (global index, in shard order; of ``split`` when given; across the ``spans`` of a collection)
    of an output directory as ``{name: np.ndarray}``: one seek and one read (see :class:`RandomAccess`; keep one
    of those for many reads, it caches the offsets), after the shard's identity check (:func:`check_shard`).
    ``i``: an ``int`` or a NumPy integer, negative from the end; TypeError for anything else (a float is never
    truncated), IndexError outside ``[-len, len)``, as ``RandomAccess.__getitem__``."""
    return RandomAccess(
        output_dir, features, split=split, check_checksums=check_checksums, spans=spans, trust_spans=trust_spans
    )[i]
