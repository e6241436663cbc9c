"""tfrecord-etl: NumPy arrays (HDF5, netCDF, .npz, .npy, MATLAB, Zarr, raw, ...) -> sharded TFRecord files of
``tf.train.Example`` on Apache Beam.

``tfrecord_etl`` is the project's one import name. ``pip install .`` in a clone installs the reader (NumPy and
google-crc32c: ``reader``, ``verify``, ``inspect``), ``pip install '.[beam]'`` the pipelines too.
It holds the subpackages ``tfrecord_etl.transforms`` (PTransforms, DoFns, the codec, the sources, the reader) and
``tfrecord_etl.pipelines`` (the commands), which live in the repository's top-level ``transforms/`` and
``pipelines/`` folders: setup.py's ``package_dir`` maps them (an install, editable or not, knows the mapping; a
second checkout on one venv uses ``configs/devlinks.sh``, see docs/development.md). Every module has this one name:
Beam pickles DoFns by module name, so the launcher and the workers (which install the package, e.g. through
``--setup_file``) must agree, and other distributions on PyPI install top-level ``transforms`` and ``pipelines``
packages of their own.

The public surface is :data:`__all__`; the names load on first use (PEP 562), so ``import tfrecord_etl`` does not
import Beam or TensorFlow::

    import apache_beam as beam
    import tfrecord_etl as te

    with beam.Pipeline() as p:
        p | te.ConvertToTFRecord("data/*.h5", "out/", num_shards=8)
    for example in te.iter_numpy("out/"):
        ...
"""

from __future__ import annotations

import importlib
import importlib.util
import os

__version__ = "0.1.0"


def _check_checkout() -> None:
    """Imported from a checkout (the repo's ``transforms/`` folder beside this package's folder, no
    ``configs/devlinks.sh`` links in it), ``tfrecord_etl.transforms`` must still be that checkout's folder: a venv's
    editable install made from another checkout maps the name there, and the code would silently be a mix of two
    checkouts'. Raises ImportError naming both folders and the fix. Installed copies return at the first check."""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = os.path.join(os.path.dirname(here), "transforms")
    if os.path.isdir(os.path.join(here, "transforms")) or not os.path.isfile(os.path.join(mine, "__init__.py")):
        return
    spec = importlib.util.find_spec("tfrecord_etl.transforms")  # where the import system would load it from
    found = os.path.realpath(list(spec.submodule_search_locations)[0]) if spec else None
    if found != os.path.realpath(mine):
        raise ImportError(
            f"tfrecord_etl is imported from the checkout {os.path.dirname(here)}, but "
            f"tfrecord_etl.transforms would be {found or 'missing'} (this venv's install of "
            f"tfrecord-etl is another copy). Hint: run configs/devlinks.sh once in that checkout "
            f"(docs/development.md, 'Several checkouts, one venv'), or start Python outside it",
            name="tfrecord_etl",
        )


_check_checkout()

# public name -> the module that defines it (a module itself when the name is the module's last part)
_PUBLIC = {
    "ConvertToTFRecord": "tfrecord_etl.transforms.convert",
    "AugmentTFRecord": "tfrecord_etl.transforms.augment",
    "ConvertConfig": "tfrecord_etl.transforms.config",
    "AugmentConfig": "tfrecord_etl.transforms.augment",
    "plan_convert": "tfrecord_etl.transforms.planning",
    "ReadFromArrays": "tfrecord_etl.transforms.beam.read",
    "ReadFromHdf5": "tfrecord_etl.transforms.beam.read",
    "ReadFromNpz": "tfrecord_etl.transforms.beam.read",
    "ReadFromNpy": "tfrecord_etl.transforms.beam.read",
    "ReadFromRaw": "tfrecord_etl.transforms.beam.read",
    "EncodeExamples": "tfrecord_etl.transforms.beam.encode",
    "reader": "tfrecord_etl.transforms.reader",
    "iter_numpy": "tfrecord_etl.transforms.reader",
    "iter_numpy_merged": "tfrecord_etl.transforms.reader",
    "to_tf_dataset": "tfrecord_etl.transforms.reader",
    "to_tf_dataset_merged": "tfrecord_etl.transforms.reader",
    "tf_feature_spec": "tfrecord_etl.transforms.reader",
    "open_sidecar": "tfrecord_etl.transforms.reader",
    "FeatureSpec": "tfrecord_etl.transforms.codec",
    "ENCODINGS": "tfrecord_etl.transforms.codec",
    "SOURCES": "tfrecord_etl.transforms.sources",
    "EtlError": "tfrecord_etl.transforms.errors",
    "ConfigError": "tfrecord_etl.transforms.errors",
    "SourceError": "tfrecord_etl.transforms.errors",
    "SchemaError": "tfrecord_etl.transforms.errors",
    "RecordError": "tfrecord_etl.transforms.errors",
    "IncompleteOutputError": "tfrecord_etl.transforms.errors",
    "OutputError": "tfrecord_etl.transforms.errors",
}
_RENAMED = {"SOURCES": "REGISTRY"}  # public name -> the defining module's name

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tfrecord_etl' has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    value = module if module.__name__.rpartition(".")[2] == name else getattr(module, _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
