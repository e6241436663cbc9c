"""``python -m tfrecord_etl COMMAND [flags]``: the ``tfrecord-etl`` console command."""

from tfrecord_etl.pipelines.cli import main

raise SystemExit(main())
