"""Collections of spans and the plans of a conversion's files: a collection directory and its ``collection.json``
(``collection``), a collection's schema checks (``schemacheck``), span placeholders (``spans``), the files an input
pattern names (``matching``), named splits (``splits``; public as ``tfrecord_etl.transforms.collections.splits``) and shard
planning (``sharding``)."""
