"""Reusable PTransforms, DoFns, the example codec, the sources and the reader of tfrecord-etl."""
