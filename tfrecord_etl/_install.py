"""How to install tfrecord-etl or one of its extras, for the messages that say what is missing.

The project is not on a package index: it installs from a clone of its repository (``pip install '.[beam]'``) or
from the wheel built there (``pip wheel --no-deps -w dist .`` writes :data:`WHEEL`; ``pip install
'dist/WHEEL[beam]'`` then installs it with its extra anywhere). The extras are setup.py's ``extras_require``:
``beam`` (the pipelines), ``s3``, ``gcs``, ``zarr``, ``tfds``, ``tfx``, ``dask``, ``all``, ...
"""

from __future__ import annotations

from tfrecord_etl import __version__

# the wheel's file name as pip and build write it (PEP 427: the distribution name with "_", pure Python 3)
WHEEL = f"tfrecord_etl-{__version__}-py3-none-any.whl"


def pip_install(extra: str) -> str:
    """The pip command lines that install the extra ``extra`` (``"beam"``, ``"s3"``, ...): from a clone, or from
    the built wheel, e.g. ``pip install '.[beam]' in a clone of tfrecord-etl, or pip install
    'dist/tfrecord_etl-0.1.0-py3-none-any.whl[beam]'``."""
    return f"pip install '.[{extra}]' in a clone of tfrecord-etl, or pip install 'dist/{WHEEL}[{extra}]'"
