"""Airflow DAG ``tfrecord_etl_daily``: every data interval (a day by default), its files become one span.

The ``input`` param is a pattern with TFX's date placeholders, e.g. ``raw/{YYYY}-{MM}-{DD}/*.h5``; the run of the
interval starting on day D converts the files of D (``--span D``: span number = days since 1970-01-01) into the
collection ``output_dir`` (``output_dir/span-N/`` and ``collection.json``), augments that span into the
collection ``augmented_dir`` (``--spans N``) and verifies it. A run starts when its interval is over (the files
of D are complete at midnight after D): the timetable is ``CronDataIntervalTimetable``, whatever Airflow's
``create_cron_data_intervals`` setting, in UTC.

- ``TFRECORD_ETL_SCHEDULE``: a cron expression or preset (default ``@daily``; the pattern must name the same
  period: ``@hourly`` needs a span per hour, which the date placeholders do not have);
- ``catchup=True``: when the DAG is switched on, every interval since ``TFRECORD_ETL_START_DATE`` is run, oldest
  first, ``TFRECORD_ETL_MAX_ACTIVE_RUNS`` (default 1) at a time; ``airflow backfill create --dag-id
  tfrecord_etl_daily --from-date 2026-11-01 --to-date 2026-11-07`` runs a range again (a re-run of a day
  rewrites byte-identical shards of that span only);
- retries: ``TFRECORD_ETL_RETRIES`` (default 2) after ``TFRECORD_ETL_RETRY_DELAY_S`` (default 300).

A day without files fails its convert task (nothing matches the pattern for that span), so a missing delivery is
seen; the other days are not affected. The settings and what needs installing: ``tfrecord_etl_tasks.py``.
"""

from __future__ import annotations

import os

import tfrecord_etl_tasks as tasks
from airflow.sdk import CronDataIntervalTimetable

SCHEDULE = os.environ.get("TFRECORD_ETL_SCHEDULE", "@daily")

with tasks.etl_dag(
    "tfrecord_etl_daily",
    "Each day's arrays -> one span of a TFRecord collection -> new fields -> verified",
    schedule=CronDataIntervalTimetable(SCHEDULE, timezone="UTC"),
    catchup=True,
    dag_params=tasks.params(
        "input file pattern with {YYYY} {MM} {DD} (TFX's placeholders)",
        "raw/{YYYY}-{MM}-{DD}/*.h5",
        "out/daily",
        "out/daily-augmented",
    ),
) as dag:
    tasks.convert_augment_verify(
        convert_flags="span=data_interval_start | ds",
        augment_flags="spans=span_number(data_interval_start | ds)",
        verify_flags="spans=span_number(data_interval_start | ds)",
    )
