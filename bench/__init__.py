"""Throughput benchmark of tfrecord-etl: ``.venv/bin/python -m bench.run``.

Not part of the test suite (``tests/test_bench.py`` only smoke-tests it at a tiny scale).

Every contender runs as a whole separate process (interpreter start-up, imports, pipeline
construction, reading, encoding, writing and finalizing included), started through
:mod:`bench.measure`, which records the wall time and the peak resident set size of every process of
the tree (Beam's ``multi_processing`` mode spawns worker processes). Units used throughout:

* ``examples/s``: source rows converted (or records augmented) per second of wall time;
* ``MB/s``: raw array bytes of those rows (the bytes NumPy holds, ``rows x bytes per row``) per second,
  with 1 MB = 10**6 bytes;
* peak RSS: in MB (10**6 bytes), the largest peak of any single process, and the peak of the sum over
  the process tree.

Modules:

* :mod:`bench.run`: the driver (data generation, contenders, report, targets);
* :mod:`bench.datagen`: deterministic HDF5 inputs, written in chunks;
* :mod:`bench.measure`: runs one command and measures it (wall time, CPU, peak RSS of the tree);
* :mod:`bench.seed_loop`: the hand-written per-row loop (one tf.train.Example per row, tf.io.TFRecordWriter);
* :mod:`bench.plain_beam`: a plain Beam pipeline, one serialized Example per element into WriteToTFRecord;
* :mod:`bench.raw_copy`: the limit: the same array bytes (or record bytes) copied to a file;
* :mod:`bench.seed_augment`: the hand-written parse/modify/serialize loop that adds one field;
* :mod:`bench.report`: results.json, results.md, results.png and the issue's targets.
"""
