"""The output and its commit: the output directory and which files are ours (``outdir``), its lock (``runlock``),
the temporary-then-rename commit of every file (``sink``), TFRecord framing (``tfrecord``), ``metadata.json`` and
``schema.pbtxt`` (``metadata``), TFDS's files (``tfds_info``)."""
