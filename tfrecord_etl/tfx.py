"""``tfrecord_etl.tfx``: the TFX ExampleGen for arrays (``ArraysExampleGen``, its ``Executor``, ``read_split``,
``infer_schema``); defined in ``tfrecord_etl.transforms.tfx_examplegen``. Needs TFX: ``pip install
'.[tfx]'`` in a clone of tfrecord-etl."""

from tfrecord_etl.transforms.tfx_examplegen import *  # noqa: F403
from tfrecord_etl.transforms.tfx_examplegen import __all__  # noqa: F401
