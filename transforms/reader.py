"""The reader's public API: read an output directory (or a collection of spans) of tfrecord-etl back, as NumPy
(no TensorFlow import), tf.data, PyTorch or by position.

    from tfrecord_etl.transforms import reader
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
to agree first.

This module is the documented import path; the implementation lives in the reading layer,
``tfrecord_etl.transforms.reading`` (``reading.reader``, ``reading.sidecar`` and the modules they draw on).
"""

from tfrecord_etl.transforms.reading.reader import (
    CRC_CHUNK,
    MANIFEST_FILE,
    SIDECAR_FORMAT,
    RandomAccess,
    check_shard,
    collate_varlen,
    decode_tf,
    file_compression,
    file_crc32c,
    get,
    iter_numpy,
    iter_records,
    parse_spec,
    python_scalars,
    refuse_varying_dtypes,
    select_features,
    tf_feature_spec,
    to_tf_dataset,
    torch_description,
)
from tfrecord_etl.transforms.reading.sidecar import (
    SidecarCollection,
    SidecarPair,
    iter_numpy_merged,
    load_manifest,
    open_sidecar,
    to_tf_dataset_merged,
)

__all__ = [
    "CRC_CHUNK",
    "MANIFEST_FILE",
    "SIDECAR_FORMAT",
    "RandomAccess",
    "SidecarCollection",
    "SidecarPair",
    "check_shard",
    "collate_varlen",
    "decode_tf",
    "file_compression",
    "file_crc32c",
    "get",
    "iter_numpy",
    "iter_numpy_merged",
    "iter_records",
    "load_manifest",
    "open_sidecar",
    "parse_spec",
    "python_scalars",
    "refuse_varying_dtypes",
    "select_features",
    "tf_feature_spec",
    "to_tf_dataset",
    "to_tf_dataset_merged",
    "torch_description",
]
