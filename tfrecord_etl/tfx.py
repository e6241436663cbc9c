"""``tfrecord_etl.tfx``: the TFX ExampleGen for arrays (``ArraysExampleGen``, its ``Executor``, ``read_split``,
``infer_schema``); defined in ``tfrecord_etl.transforms.tfx.examplegen``. Needs TFX: ``pip install
'.[tfx]'`` in a clone of tfrecord-etl."""

from tfrecord_etl.transforms.tfx.examplegen import *  # noqa: F403
from tfrecord_etl.transforms.tfx.examplegen import __all__  # noqa: F401
