"""What PyTorch readers of an output directory need: Python scalars for scalar strings (the form
``torch.utils.data.default_collate`` batches), a ``collate_fn`` for features whose shape varies between examples,
and the ``description`` dict of the ``tfrecord`` package (``tfrecord.torch.TFRecordDataset``).

No import of PyTorch, TensorFlow or Beam here: :func:`collate_varlen` takes the tensor constructor as an argument
(``torch.as_tensor``), so the same code serves NumPy, Grain and JAX users.

Why Python scalars: PyTorch's ``default_collate`` (``torch/utils/data/_utils/collate.py``) turns NumPy arrays into
tensors and refuses arrays of dtype ``S``, ``a``, ``U`` and ``O`` (``default_collate: batch must contain tensors,
numpy arrays, numbers, dicts or lists; found |S4``), while it collates Python ``bytes`` and ``str`` values into a
list of them. A scalar string feature therefore reaches a map-style dataset's user as ``bytes`` (``|S``, ``bytes``
features) or ``str`` (``<U`` features); strings with a shape stay NumPy arrays (collate them with
:func:`collate_varlen`, which keeps them as lists of arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tfrecord_etl.transforms.collections import schemacheck
from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.output import schemafile

_TFRECORD_KINDS = {"bytes": "byte", "int64": "int", "float": "float"}  # the tfrecord package's names of the lists


def python_scalars(example: dict[str, np.ndarray]) -> dict:
    """``example`` with each 0-d string array (dtype ``S``, ``U``, or object holding ``bytes``/``str``) replaced by
    its Python value: ``bytes`` for ``S`` and ``bytes`` features, ``str`` for ``U`` ones. Other values are kept as
    they are (numeric and bool arrays of any shape, strings with a shape). A fixed-width ``S`` value loses its
    trailing NUL bytes, as NumPy's own ``.item()`` and comparisons do (``np.array(b"ab", "S4") == b"ab"``)."""
    out = {}
    for name, value in example.items():
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "SUO":
            item = value.item()
            out[name] = item if isinstance(item, (bytes, str)) else value
        else:
            out[name] = value
    return out


def torch_description(output_dir: str, features: Sequence[str] | None = None) -> dict[str, str]:
    """The ``description`` dict of the ``tfrecord`` package (``tfrecord.torch.TFRecordDataset(data_path,
    index_path, description)``, ``tfrecord.reader.tfrecord_loader``) for an output directory: every Example
    feature that carries the selected features (``features``: names, default all), companions included
    (``<name>/shape`` of a feature whose shape varies, ``<name>/dtype`` of one whose dtype varies), mapped to
    ``"byte"`` (``bytes_list``), ``"int"`` (``int64_list``) or ``"float"`` (``float_list``), as
    ``schemafile.example_features`` lists them. No TensorFlow import (the package cannot share a process with
    TensorFlow: both register ``tensorflow.Example``).

    What the package yields, and how to get the original values back (the feature's ``dtype``, ``shape`` and
    ``encoding`` are in ``metadata.json``):

    - ``tensor``: one ``bytes`` value, the array's little-endian bytes: ``np.frombuffer(x, dtype).reshape(shape)``.
    - ``zlib``: ``np.frombuffer(zlib.decompress(x), dtype).reshape(shape)``.
    - ``packbits`` (each row of the last axis packed to whole bytes): ``np.unpackbits(np.frombuffer(x, np.uint8)
      .reshape(*shape[:-1], -1), axis=-1, count=shape[-1]).astype(bool)`` (a 0-d feature: ``shape`` ``(1,)``).
    - ``list``: an ``int64`` array (integers, bools as 0/1: ``.astype(dtype)``), a ``float32`` array (float16 and
      float32 values), or, for strings, one ``bytes`` value (scalar) or a NumPy array of ``bytes`` (decode ``U``
      features with ``.decode("utf-8")``). A fixed shape arrives flattened: ``.reshape(shape)``.
    - a varying shape: the values of ``<name>`` (as above) and the shape in ``<name>/shape`` (``int64``).

    The package reads uncompressed and gzip shards (``compression_type="gzip"``), not zlib ones.

    Raises:
      IncompleteOutputError: no metadata.json. SchemaError: an unknown name in ``features``.
    """
    meta = schemacheck.load_output(output_dir)[0]  # schema.pbtxt agrees with metadata.json
    specs = meta["features"]
    if features is not None:
        by_name = {s.name: s for s in specs}
        missing = [f for f in features if f not in by_name]
        if missing:
            raise SchemaError(f"No such features {missing}", file=output_dir, hint=f"features are {sorted(by_name)}")
        specs = [by_name[f] for f in features]
    return {name: _TFRECORD_KINDS[kind] for spec in specs for name, kind, _ in schemafile.example_features(spec)}


def collate_varlen(batch: Sequence[dict], to_tensor: Callable | None = None) -> dict:
    """A ``collate_fn`` for examples whose features' shapes vary (``reader.RandomAccess`` of an output with
    ``null`` dimensions): per feature, the values of ``batch`` (a list of ``{name: value}``) become

    - one array of shape ``(len(batch), *shape)`` (``np.stack``) when every value has the same shape and a
      numeric or bool dtype;
    - a list of arrays, one per example, when the shapes differ (pad them, or ``torch.nested.nested_tensor``);
    - a list of values for strings (``bytes``/``str``, and string arrays).

    ``to_tensor`` (e.g. ``torch.as_tensor``) is applied to each numeric array, stacked or not; None keeps NumPy.
    Use: ``DataLoader(ra, batch_size=64, collate_fn=functools.partial(reader.collate_varlen,
    to_tensor=torch.as_tensor))``. Fixed-shape outputs need none of this: ``default_collate`` batches them.

    Raises:
      ValueError: an empty batch, or examples with different feature names.
    """
    if not batch:
        raise ValueError("collate_varlen: empty batch")
    names = list(batch[0])
    if any(list(example) != names for example in batch):
        raise ValueError(f"collate_varlen: examples with different features (first: {names})")
    convert = to_tensor or (lambda a: a)
    out: dict = {}
    for name in names:
        values = [example[name] for example in batch]
        if any(isinstance(v, (bytes, str)) or np.asarray(v).dtype.kind in "SUOV" for v in values):
            out[name] = values
        elif len({np.shape(v) for v in values}) == 1:
            out[name] = convert(np.stack([np.asarray(v) for v in values]))
        else:
            out[name] = [convert(np.asarray(v)) for v in values]
    return out
