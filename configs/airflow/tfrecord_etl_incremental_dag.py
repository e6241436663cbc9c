"""Airflow DAG ``tfrecord_etl_incremental``: the files that arrived since the last run become the next span.

The ``input`` param is a pattern without placeholders over one growing directory, e.g. ``incoming/*.h5``. Each
run converts the matching files that no committed span holds yet (``--incremental``: the collection's ledger of
path, size and mtime, or ETag/generation on gs:// and s3://) into span max+1 of the collection ``output_dir``,
augments the spans that ``augmented_dir`` does not have yet (``--spans new``) and verifies the newest span
(``--spans latest``). With nothing new, convert says so and writes nothing. A file changed after it was
converted fails the run, naming it (``convert_options`` ``{"reconvert_changed": true}`` re-converts its span).

- ``TFRECORD_ETL_INCREMENTAL_SCHEDULE``: a cron expression or preset (default ``@hourly``);
- ``catchup=False``: a run takes every new file, so missed intervals need no run of their own;
- ``TFRECORD_ETL_MAX_ACTIVE_RUNS`` (default 1) and the retries as in ``tfrecord_etl_tasks.py``.
"""

from __future__ import annotations

import os

import tfrecord_etl_tasks as tasks

SCHEDULE = os.environ.get("TFRECORD_ETL_INCREMENTAL_SCHEDULE", "@hourly")

with tasks.etl_dag(
    "tfrecord_etl_incremental",
    "New arrays in a growing directory -> the next span of a TFRecord collection -> new fields -> verified",
    schedule=SCHEDULE,
    catchup=False,
    dag_params=tasks.params(
        "input file pattern over one growing directory (no placeholders)",
        "incoming/*.h5",
        "out/incremental",
        "out/incremental-augmented",
    ),
) as dag:
    tasks.convert_augment_verify(
        convert_flags="incremental=True", augment_flags="spans='new'", verify_flags="spans='latest'"
    )
