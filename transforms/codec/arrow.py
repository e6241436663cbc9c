"""``pa``: pyarrow, imported on its first use.

The encoders build Arrow columns (the batch encoder hands them to tfx-bsl's C++ ``RecordBatchToExamplesEncoder``)
and the batch decoders read them; decoding one record (the reader: ``iter_numpy``, ``RandomAccess``, verify's
checks) uses NumPy only. So the codec's modules write ``pa.array(...)`` as usual, and reading an output needs no
pyarrow installed (the reader's install is NumPy and google-crc32c).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tfrecord_etl._install import pip_install


class _LazyPyarrow:
    """Stands for the ``pyarrow`` module: the first attribute read imports it and keeps each name read.

    Raises (on that first read):
      ImportError: pyarrow is not installed, saying what to install.
    """

    def __getattr__(self, name: str):
        try:
            module = importlib.import_module("pyarrow")
        except ImportError:
            raise ImportError(
                f"Encoding needs pyarrow: {pip_install('beam')} (reading needs only NumPy and google-crc32c)"
            ) from None
        value = getattr(module, name)
        self.__dict__[name] = value  # later reads of this name skip __getattr__
        return value


if TYPE_CHECKING:  # to a type checker, the module itself
    import pyarrow as pa
else:
    pa = _LazyPyarrow()
