"""Peer contender "TFDS": a ``GeneratorBasedBuilder`` over the HDF5 rows, shuffling off; run in its own venv.

    bench/.venv-peers-tfds/bin/python -m bench.peer_tfds --input data.h5 --output_dir out/

Runs in the environment ``bench.peers`` builds (``tensorflow-datasets`` and TensorFlow), never in the project's.
The builder is what a TFDS user writes for arrays in an HDF5 file: ``_info`` declares one feature per dataset
(``uint8`` arrays as ``tfds.features.Tensor(..., encoding=BYTES)``, one ``bytes`` value, the benchmark's form of
images; other arrays as plain ``Tensor`` features: a ``float_list``/``int64_list``), ``disable_shuffling=True``
(records in generation order, as every other contender writes them), and ``_generate_examples`` yields one dict
of NumPy values per row, reading about 16 MB of rows at a time with h5py. ``download_and_prepare`` writes
``out/peer_h5/1.0.0/peer_h5-train.tfrecord-*`` with TFDS's own example serializer and shard writer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def make_builder(path: str):
    """The ``GeneratorBasedBuilder`` class for the HDF5 file ``path``."""
    import h5py
    import numpy as np
    import tensorflow_datasets as tfds

    from bench.common import iter_h5_chunks, seed_form

    with h5py.File(path, "r") as f:
        layout = {k: (f[k].dtype, f[k].shape[1:]) for k in sorted(f.keys()) if isinstance(f[k], h5py.Dataset)}

    def feature(dtype, shape):
        if seed_form(dtype) == "bytes":
            return tfds.features.Tensor(shape=shape, dtype=np.dtype(dtype), encoding=tfds.features.Encoding.BYTES)
        return tfds.features.Tensor(shape=shape, dtype=np.dtype(dtype))

    class PeerH5(tfds.core.GeneratorBasedBuilder):
        """The HDF5 rows as a TFDS dataset (one ``train`` split)."""

        name = "peer_h5"
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                disable_shuffling=True,
                features=tfds.features.FeaturesDict({k: feature(dt, sh) for k, (dt, sh) in layout.items()}),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            i = 0
            for columns in iter_h5_chunks(path):
                rows = len(next(iter(columns.values())))
                for r in range(rows):
                    yield i, {k: col[r] for k, col in columns.items()}
                    i += 1

    return PeerH5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.peer_tfds", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--input", required=True, help="HDF5 file")
    ap.add_argument("--output_dir", required=True, help="TFDS data_dir")
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow_datasets as tfds

    started = time.perf_counter()
    builder = make_builder(os.path.abspath(args.input))(data_dir=os.path.abspath(args.output_dir))
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS)
    )
    n = builder.info.splits["train"].num_examples
    seconds = time.perf_counter() - started
    print(f"peer_tfds: {n} examples in {seconds:.3f} s (after imports)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
