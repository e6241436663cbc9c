"""TFX: the ExampleGen for arrays (``examplegen``; public as ``tfrecord_etl.tfx``) and the writer of its examples
artifact (``write``)."""
