"""The commit protocol of every file the project writes into an output or dead-letter directory, written once.

A file is written under a temporary name of its own beside its final name (``.tmp-<32 hex>-<8 hex key of the
final name>``, the name :mod:`transforms.output.outdir` recognizes as ours), and renamed to the final name only when it
is complete; on any failure (an exception, a count that does not match) the temporary is deleted and the error goes on. A
retried or duplicated attempt (Beam retries bundles; a runner may run one twice) writes its own temporary; the
last rename wins, and since the bytes are the same exactly one complete final file exists. Temporaries of killed
attempts are removed by exact name when the run commits (``outdir.remove_temporaries``).

The models are TFDS's ``incomplete_file`` context manager (``tensorflow_datasets/core/utils/py_utils.py``) and
Beam's ``FileBasedSink`` (``open_writer`` under a temp name, ``finalize_write`` renames).

Users: convert's planned shard writer (``beam.write.WriteShardFn``), augment's shard writer
(``augment.beam.AugmentShardFn``), dead letters, ``schema.pbtxt`` + ``metadata.json``, augment's
``manifest.json`` and the run marker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import Iterator
from typing import BinaryIO

from tfrecord_etl.transforms.output import tfrecord
from tfrecord_etl.transforms.output.runlock import check_commit, failpoint
from tfrecord_etl.transforms.storage import fileio, objectcreate

log = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"  # every temporary this project writes: .tmp-<32 hex of the attempt>-<name_key>


def name_key(name: str) -> str:
    """The 8 hex digits that tie a temporary to the final ``name`` it becomes (SHA-1 of the name): temporaries
    are ``.tmp-<32 hex>-<name_key>``, so their names hold no shard pattern."""
    return hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def temp_path(final: str) -> str:
    """A fresh temporary path beside ``final``: ``<dir>/.tmp-<32 hex>-<name_key(name)>``, a name that no
    shard pattern (``*.tfrecord*``, ``*-of-*``, ``*.gz``) matches, so a reader globbing the directory during a run
    never meets a half-written file."""
    return fileio.join(fileio.dirname(final), f"{TEMP_PREFIX}{uuid.uuid4().hex}-{name_key(fileio.basename(final))}")


@contextlib.contextmanager
def committed_file(final: str, fresh: bool = False) -> Iterator[BinaryIO]:
    """Yields a binary stream writing a temporary file beside ``final``; when the block ends without an error
    the stream is closed and the file renamed to ``final`` (replacing an earlier attempt's copy), unless the run
    no longer owns the output directory (``outdir.check_commit``: its launcher is gone or a newer run took the
    lock over). On any error, inside the block or in the close/rename, the temporary is deleted and the error
    re-raised.

    ``fresh``: ``final`` is a name no earlier output of the directory has (a shard or index of this run's
    generation, ``outdir.prepare``), so on s3:// and gs:// the object is created under it at once, with nothing
    visible before it is complete and only where no object has the name (:mod:`storage.objectcreate`: the store
    writes the bytes once, where a rename is a copy); another attempt's identical object is kept. Local files take
    the temporary and rename whatever ``fresh`` says.
    """
    direct = objectcreate.open_create(final) if fresh else None
    if direct is not None:
        try:
            yield direct
            direct.finish(lambda: check_commit(final))
        except BaseException:
            direct.abort()
            raise
        return
    temp = temp_path(final)
    try:
        with fileio.open_write(temp) as raw:
            yield raw
        check_commit(final)
        fileio.rename(temp, final)
    except BaseException:
        try:
            fileio.delete([temp])
        except Exception:  # noqa: BLE001 - keep the original error; the run's commit removes it by name
            log.warning("Cannot delete temporary file %s", temp)
        raise


def write_file(final: str, data: bytes, fresh: bool = False) -> str:
    """Writes ``data`` to ``final`` through :func:`committed_file` (``fresh``: its); returns ``final``."""
    with committed_file(final, fresh) as f:
        f.write(data)
    return final


def write_json(final: str, obj, **dumps) -> str:
    """Writes ``obj`` as JSON (``indent=1`` unless given) to ``final`` through :func:`committed_file`."""
    dumps.setdefault("indent", 1)
    return write_file(final, json.dumps(obj, **dumps).encode())


def write_json_lines(final: str, rows) -> str:
    """Writes ``rows`` as JSON lines (keys sorted) to ``final`` through :func:`committed_file`."""
    return write_file(final, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())


@contextlib.contextmanager
def shard_writer(
    final: str, compression: str, index: bool = False, codec: dict | None = None
) -> Iterator[tfrecord.ShardWriter]:
    """Yields a :class:`tfrecord.ShardWriter` (framing, CRCs, ``compression`` through the backend ``codec``
    names, ``compression.settings``' ``{"name", "level"}``; None: the default backend) on a temporary file that becomes
    the TFRecord shard ``final`` when the block ends without an error. The caller checks its counts inside the
    block (``writer.records`` against what was planned) and raises to abandon the shard. With ``index``, the
    shard's ``tfrecord2idx`` index (``tfrecord.index_name``) is committed just before the shard itself. After the
    block, ``writer.bytes_out`` and ``writer.crc32c`` are the committed file's size and CRC32C (computed as it was
    written), what its ``metadata.json`` entry records."""
    with committed_file(final, fresh=True) as raw:
        writer = tfrecord.ShardWriter(
            raw, compression, index=index, level=(codec or {}).get("level"), backend=(codec or {}).get("name")
        )
        failpoint("shard-opened")
        yield writer
        writer.close()
        if index:
            write_index(final, writer.index_text())
    failpoint("shard-committed")


def write_index(shard_path: str, text: bytes) -> str:
    """Commits ``text`` as the index file of the shard at ``shard_path`` (beside it); returns the index path."""
    index = fileio.join(fileio.dirname(shard_path), tfrecord.index_name(fileio.basename(shard_path)))
    return write_file(index, text, fresh=True)
