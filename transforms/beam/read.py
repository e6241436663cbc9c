"""Reading: row ranges of the array files read into batches ``(RowRange, {name: array (rows, *shape)})``."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from tfrecord_etl.transforms import sources
from tfrecord_etl.transforms.beam.metrics import NAMESPACE
from tfrecord_etl.transforms.output.runlock import CarriesRun
from tfrecord_etl.transforms.planning import InputPlan, plan_inputs
from tfrecord_etl.transforms.sources import RowRange, Source, SourceOptions
from tfrecord_etl.transforms.sources.options_numpy import NumpyOptions
from tfrecord_etl.transforms.sources.options_raw import RawOptions


class ReadRowRangesFn(CarriesRun, beam.DoFn):
    """Reads one RowRange into a batch of columns: ``(RowRange, {name: array (rows, *shape)})``."""

    def __init__(self, source: Source):
        self._source = source
        self._rows = Metrics.counter(NAMESPACE, "rows_read")
        self._bytes = Metrics.counter(NAMESPACE, "bytes_read")

    def process(self, rr: RowRange):
        columns = self._source.read_pinned(rr)
        self._rows.inc(rr.num_rows)
        self._bytes.inc(sum(v.nbytes for v in columns.values() if isinstance(v, np.ndarray)))
        yield rr, columns

    def finish_bundle(self):
        self._source.close()  # files stay open between the ranges of a bundle, not after it


class ReadFromArrays(beam.PTransform):
    """Reads the array files matching a pattern (any registered source) as batches ``(RowRange, columns)``.

    Row ranges are planned at construction (see :func:`plan_inputs`) and spread across workers with
    a Reshuffle, so one big file is read by many workers, each holding one range at a time.
    """

    def __init__(self, pattern: str, options: SourceOptions = SourceOptions(), plan: InputPlan | None = None):
        super().__init__()
        self.plan = plan or plan_inputs(pattern, options)

    def expand(self, pbegin):
        return (
            pbegin
            | "CreateRowRanges" >> beam.Create(list(self.plan.ranges), reshuffle=True)
            | "ReadRowRanges" >> beam.ParDo(ReadRowRangesFn(self.plan.source))
        )


class ReadFromHdf5(ReadFromArrays):
    """ReadFromArrays for HDF5 files (``datasets``: dataset paths, default all)."""

    def __init__(self, pattern: str, datasets=None, target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        super().__init__(
            pattern, SourceOptions("hdf5", tuple(datasets) if datasets else None, target_range_bytes=target_range_bytes)
        )


class ReadFromNpz(ReadFromArrays):
    """ReadFromArrays for .npz archives (``mode``: ``rows`` or ``arrays``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        numpy = NumpyOptions.model_construct(npz_mode=mode)  # unchecked, as before: an unknown mode reads rows
        super().__init__(pattern, SourceOptions("npz", target_range_bytes=target_range_bytes, formats=(numpy,)))


class ReadFromNpy(ReadFromArrays):
    """ReadFromArrays for .npy files (``mode``: ``rows`` or ``files``)."""

    def __init__(self, pattern: str, mode="rows", target_range_bytes=sources.DEFAULT_RANGE_BYTES):
        numpy = NumpyOptions.model_construct(npy_mode=mode)  # unchecked, as before: an unknown mode reads rows
        super().__init__(pattern, SourceOptions("npy", target_range_bytes=target_range_bytes, formats=(numpy,)))


class ReadFromRaw(ReadFromArrays):
    """ReadFromArrays for raw binary files of fixed-size rows (``dtype``, ``shape`` with -1 first for rows from the
    file size, ``offset`` bytes of header, ``order`` C or F, ``count`` rows after the offset (None: to the end of
    the file); any of them may come from a sidecar instead)."""

    def __init__(
        self,
        pattern: str,
        dtype=None,
        shape=None,
        offset=0,
        order="C",
        count=None,
        target_range_bytes=sources.DEFAULT_RANGE_BYTES,
    ):
        # unchecked, as before: the source checks the layout (check_layout) when it plans
        layout = RawOptions.model_construct(dtype=dtype, shape=shape, offset=offset, order=order, count=count)
        super().__init__(pattern, SourceOptions("raw", target_range_bytes=target_range_bytes, formats=(layout,)))
