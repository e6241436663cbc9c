"""The public Beam transforms, by the import path the docs have always given (``tfrecord_etl.transforms.beam_io``).

The implementation lives in ``transforms/beam/``, one module per step of a row range's walk (``read``, ``encode``,
``write``, ``commit``); this module only names the public PTransforms from there, so code written against this
path keeps working. The same names are on the package itself (``tfrecord_etl.ReadFromArrays``, ...).
"""

from __future__ import annotations

from tfrecord_etl.transforms.beam.encode import EncodeExamples
from tfrecord_etl.transforms.beam.read import ReadFromArrays, ReadFromHdf5, ReadFromNpy, ReadFromNpz, ReadFromRaw

__all__ = ["EncodeExamples", "ReadFromArrays", "ReadFromHdf5", "ReadFromNpy", "ReadFromNpz", "ReadFromRaw"]
