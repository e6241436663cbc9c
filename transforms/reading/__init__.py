"""Reading an output back: the reader's implementation (``reader``; public as ``tfrecord_etl.transforms.reading.reader``),
NumPy batches (``numpy_reader``), positional reads (``random_access``), tf.data (``tfdata``), PyTorch (``torch_io``),
the spans of a collection a read covers (``collection_reader``) and a shard's identity check (``shardcheck``)."""
