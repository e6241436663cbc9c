"""The ``zlib`` encoding: the ``tensor`` bytes of a row as one zlib stream (RFC 1950), in one ``bytes_list``
value, compressed and decompressed through the compression backend (``transforms.compression``: ISA-L when
installed, else zlib-ng, else zlib; ``TFRECORD_ETL_COMPRESSION_BACKEND`` forces one) at its default level. What
TFDS's ``Tensor(..., encoding=Encoding.ZLIB)`` decodes (``zlib.decompress``) for the same dtype and shape on a
little-endian machine; with the ``zlib`` backend the values are byte-identical to TFDS's own encoder's
(``zlib.compress(array.tobytes())``, level 6). Pays for sparse or repetitive arrays; decoded inside tf.data with
``tf.io.decode_compressed(..., 'ZLIB')``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfrecord_etl.transforms import compression
from tfrecord_etl.transforms.codec.arrow import pa
from tfrecord_etl.transforms.codec.encodings.base import bytes_lists, le_bytes
from tfrecord_etl.transforms.codec.encodings.tensor import TensorEncoding
from tfrecord_etl.transforms.codec.spec import FeatureSpec, to_little_endian
from tfrecord_etl.transforms.errors import RecordError


class ZlibEncoding(TensorEncoding):
    """Row -> ``Feature{bytes_list: [zlib stream of row.astype(little-endian).tobytes()]}``."""

    name = "zlib"
    tfds_encoding = "zlib"  # tfds.features.Encoding.ZLIB, byte-identical
    varying_dtype = False

    def fixed_layout(self, spec: FeatureSpec) -> bool:
        return False  # compressed rows differ in length

    def fixed_column(self, spec: FeatureSpec, arr: np.ndarray) -> pa.Array:
        backend = compression.get()
        compress, level = backend.zlib.compress, backend.default_level
        return bytes_lists([[compress(row, level)] for row in le_bytes(arr)])

    def rows_column(self, spec: FeatureSpec, rows: Sequence[np.ndarray]) -> pa.Array:
        backend = compression.get()
        compress, level = backend.zlib.compress, backend.default_level
        return bytes_lists([[compress(to_little_endian(r).tobytes(), level)] for r in rows])

    def payload_bytes(self, count: int, dt: np.dtype) -> int | None:
        return None  # the compressed length is not known up front

    def payload(self, spec: FeatureSpec, raw: bytes, count: int, dt: np.dtype, shape: tuple) -> bytes:
        """Decompresses at most the expected ``count * itemsize`` bytes (a zlib bomb stops there) and checks
        the stream ends exactly there. Raises RecordError naming the feature."""
        want = count * dt.itemsize
        backend = compression.get()
        d = backend.zlib.decompressobj()
        try:
            out = d.decompress(raw, want or 1)  # max_length 0 would mean no limit
            extra = d.decompress(d.unconsumed_tail, 1) if not d.eof else b""  # never more than one byte past
        except backend.errors() as e:
            raise RecordError(
                f"Feature '{spec.name}' holds a value that is not a zlib stream: {e}", feature=spec.name
            ) from None
        if len(out) != want or extra or not d.eof or d.unused_data:
            got = f"{len(out)}{'+' if extra else ''} bytes" if d.eof or extra else "a truncated stream"
            raise RecordError(
                f"Feature '{spec.name}' decompresses to {got}, expected {want} for {spec.dtype} {tuple(shape)}",
                feature=spec.name,
            )
        return out

    def tf_payload(self, tf, spec: FeatureSpec, raw):
        return tf.io.decode_compressed(raw, compression_type="ZLIB")
