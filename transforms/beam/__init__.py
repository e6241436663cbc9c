"""The Beam transforms: the DoFns and PTransforms that wire the sources, the codec and the shard writers into Beam.

One module per step of a row range's walk: ``read`` (``ReadFromArrays`` and its per-format variants ->
``(RowRange, columns)`` batches), ``encode`` (``EncodeSettings``; a range's columns -> serialized Examples:
``encode_range``, ``encode_splits``, ``read_and_encode``, ``EncodeExamples``, ``ReadAndEncodeFn``,
``KeyShuffledRecordsFn``), ``write`` (``ShardOutput``; ``WriteShardFn``, the planned writer: one shard plan read,
encoded and written per element, committed through ``transforms.output.sink``; ``WriteToShards``, Beam's
``WriteToTFRecord``; ``WriteShuffledShardFn``; ``count_shard``), ``commit`` (``OutputCommit``, ``WriteMetadataFn``:
the count check and ``metadata.json``, the commit point; ``FinalizeOutput``); below them ``metrics`` (the counters'
namespace, ``ShardClock``) and ``deadletters`` (what a range that fails becomes). Planning lives in
``transforms.planning``; ``transforms.convert`` composes these into ``ConvertToTFRecord``.
"""
