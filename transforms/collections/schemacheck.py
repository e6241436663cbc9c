"""Does an output's ``schema.pbtxt`` agree with its ``metadata.json``? Checked by every reader when it opens an
output, by augment when it plans, and reported by ``verify``.

The two files are written together from one list of features (:func:`metadata.write`): ``metadata.json`` is what
our readers decode with, ``schema.pbtxt`` what TFX tools (TFXIO, TFDV, Transform) and ``tf.io.parse_example`` read.
An edit of one of them after the run (a dtype changed from ``<f8`` to ``<i8`` in ``metadata.json``, a feature
renamed or a dtype tag changed in ``schema.pbtxt``, either file replaced) would make one reader decode garbage
where another reads the values: every reader refuses such an output instead, naming both files.

What is compared, per Example feature (``schemafile.example_features``: a feature and its ``/shape`` and ``/dtype``
companions), in order: the name, ``type`` (``BYTES``/``INT``/``FLOAT``), ``shape`` (dense dimensions) or
``value_count``, ``presence``, ``bool_domain`` and our ``annotation`` tags (``tfrecord_etl.encoding:``,
``tfrecord_etl.dtype:``, ``tfrecord_etl.shape:``), against what ``metadata.json``'s features make
(:func:`expected_features`, from the same code that writes the schema, :func:`schemafile.schema_types`). Annotation
comments, other tags and other Schema fields (domains a user added for TFDV, environments) are not compared.
The tags pin every field of a feature of ``metadata.json`` (name, dtype, shape, encoding): a dtype edited within
one schema type (``<f4`` to ``<f2``, ``|S5`` to ``|S2``, ``<i8`` to ``|u1``) differs in ``tfrecord_etl.dtype``.
Native list features (``list``, ``varlen``) carry the tags since a later version than opaque bytes features: in an
output written before (a ``list`` or ``varlen`` feature without any tag in ``schema.pbtxt``) they are not compared
for that feature (its other fields are), so such outputs read as before.

How, without TensorFlow: the reader-only install (``pip install .``: NumPy and google-crc32c) has
neither protobuf nor tensorflow_metadata, so the schema is read by :func:`parse_text`, a parser of protobuf's text
format (the grammar of ``google.protobuf.text_format``: fields, nested messages in ``{}`` or ``<>``, lists in
``[]``, C-escaped strings, comments) that knows the field names of TFMD's ``Schema`` and ``Feature`` messages and
refuses any other name there (``garbage {{{`` or ``garbage { }`` is not a Schema; the grammar is in
:mod:`transforms.textproto`). ``verify`` also parses it with
``text_format.Parse`` into ``schema_pb2.Schema`` when tensorflow_metadata is installed (the full install), which
checks every nested field and enum too. Why not a digest of ``schema.pbtxt`` recorded in ``metadata.json``: it
would catch an edit of the schema, not one of ``metadata.json``'s own features (the dtype edit above), and outputs
written before it would have none; the comparison catches both, for every output already written.

Cost: one read of ``schema.pbtxt`` per output opened (about 200 bytes per feature). The first time a pair of
files is seen in the process, the text the writer would make from ``metadata.json`` (:func:`expected_text`, no
protobuf) is compared with it; only a text that differs (an edit, control characters in a name, another protobuf's
formatting) is parsed. The result is remembered by the SHA-256 of both files, so ``reader.get`` in a loop or a
collection read again compares nothing. Measured on a loaded 2-core machine, against ``metadata.load`` alone in the
same run: 3.6x (100 features) and 4.6x (1,000) the first time, 1.3x after.
"""

from __future__ import annotations

import hashlib

from tfrecord_etl.transforms.collections.schematext import (  # noqa: F401 - schematext's names, used here and by others
    FEATURE_FIELDS,
    SCHEMA_FIELDS,
    Disagreement,
    disagreements,
    expected_features,
    expected_text,
    proto_available,
    proto_error,
)
from tfrecord_etl.transforms.errors import SchemaError
from tfrecord_etl.transforms.output import metadata, outdir
from tfrecord_etl.transforms.storage import fileio

SCHEMA_MAX_BYTES = 64 << 20  # a schema.pbtxt larger than this is refused before it is read
HINT = (
    "one of them was edited, replaced or damaged after the output was written: check it with tfrecord-etl "
    "verify DIR (with --source to compare the values with the input) and convert it again"
)

_AGREED: set[tuple[str, str]] = set()  # (SHA-256 of metadata.json, of schema.pbtxt) pairs that agree
_AGREED_MAX = 4096


def read_schema(output_dir: str) -> bytes:
    """The bytes of ``output_dir``'s ``schema.pbtxt``.

    Raises:
      SchemaError: it is missing, not a regular file, or larger than :data:`SCHEMA_MAX_BYTES`.
    """
    path = fileio.join(output_dir, metadata.SCHEMA_FILE)
    if not fileio.exists(path):
        raise SchemaError(
            "schema.pbtxt is missing beside metadata.json: the output is damaged (both are written with it)",
            file=path,
            hint="convert it again",
        )
    size = fileio.size(path)
    if size > SCHEMA_MAX_BYTES:
        raise SchemaError(
            f"schema.pbtxt is {size:,} bytes, over {SCHEMA_MAX_BYTES:,}: not the schema of this output",
            file=path,
            hint=HINT.replace("DIR", output_dir),
        )
    return fileio.read_bytes(path)


def check(output_dir: str, meta: dict, meta_digest: str) -> None:
    """Refuses an output whose ``schema.pbtxt`` does not agree with its ``metadata.json`` (``meta``, parsed, and
    ``meta_digest``, the SHA-256 of its bytes: :func:`metadata.load_with_digest`). A pair that agreed once in this
    process is not parsed again.

    Raises:
      SchemaError: naming ``schema.pbtxt`` and ``metadata.json``, the first feature and what differs (both
        values), how many more differ, and what to do.
    """
    data = read_schema(output_dir)
    key = (meta_digest, hashlib.sha256(data).hexdigest())
    if key in _AGREED:
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    fast = text is not None and text == expected_text(meta["features"])
    found = (
        []
        if fast
        else disagreements(text, meta["features"])
        if text is not None
        else [Disagreement(None, "is not a TensorFlow Metadata Schema in text format: not UTF-8 text", "", "")]
    )
    if found and pending(output_dir, meta):
        return  # schema.pbtxt is a replacing run's, written before its metadata.json: metadata.json is the output
    if found:
        first = found[0]
        more = f" ({len(found) - 1} more difference{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
        raise SchemaError(
            f"schema.pbtxt and metadata.json disagree: {first.message()}{more}",
            file=fileio.join(output_dir, metadata.SCHEMA_FILE),
            feature=first.feature,
            hint=HINT.replace("DIR", output_dir),
        )
    if len(_AGREED) >= _AGREED_MAX:
        _AGREED.clear()
    _AGREED.add(key)


def pending(output_dir: str, meta: dict) -> bool:
    """True when a run replacing the output in ``output_dir`` has not committed (it is running, failed or was
    killed): its run marker (``outdir.MARKER_FILE``) lists no shards yet, or shards that ``meta`` (the committed
    ``metadata.json``) does not list. Such a run writes its ``schema.pbtxt`` just before its ``metadata.json``
    (:func:`metadata.write`), so until it commits, or until the next run cleans up after it, ``schema.pbtxt`` may be
    the new output's while ``metadata.json``, the commit point, is still the old one's: the old output is what the
    directory holds and is read (the crash-safety promise: the old output or the new one)."""
    try:
        marker = outdir.read_json(fileio.join(output_dir, outdir.MARKER_FILE))
    except Exception:  # noqa: BLE001 - an unreadable marker is not a run of ours
        return False
    if not isinstance(marker, dict) or marker.get("format") != outdir.MARKER_FORMAT:
        return False
    if metadata.SCHEMA_FILE not in (marker.get("files") or ()):
        return False
    shards = marker.get("shards")
    if not isinstance(shards, list) or not shards:
        return True
    listed = {(s.get("file"), s.get("crc32c")) for s in meta["shards"]}
    return any(not isinstance(s, dict) or (s.get("file"), s.get("crc32c")) not in listed for s in shards)


def load_output(output_dir: str) -> tuple[dict, str]:
    """``(metadata, digest of its bytes)`` of a complete output directory whose ``schema.pbtxt`` agrees with its
    ``metadata.json`` (:func:`metadata.load_with_digest`, then :func:`check`): what every reader opens an output
    with.

    Raises:
      IncompleteOutputError: no ``metadata.json``. SchemaError: an invalid one, or a disagreement (:func:`check`).
    """
    meta, digest = metadata.load_with_digest(output_dir)
    check(output_dir, meta, digest)
    return meta, digest
