"""What the files of a collection (``--format files``) are, decided at planning: images Pillow identifies from their
header, or other files (kept as bytes and a name). Only each file's header is read (Pillow's ``Image.open`` reads
what identification needs, no pixel data); remote files by a bounded pool of threads."""

from __future__ import annotations

import concurrent.futures
import io
from collections.abc import Sequence

from tfrecord_etl.transforms.storage import fileio

SNIFF_THREADS = 16  # remote files identified at once (one ranged read each)


def image_kind(path: str) -> str | None:
    """The Pillow format name of ``path`` (``"PNG"``, ``"JPEG"``, ...), or None when Pillow cannot identify it (an
    empty file, a file of another kind, an unreadable one: the read names the latter's error)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with fileio.open_read(path) as f:
            stream = f if hasattr(f, "seekable") and f.seekable() else io.BytesIO(f.read())
            with Image.open(stream) as im:
                return im.format or "image"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError):
        return None


def image_kinds(paths: Sequence[str]) -> list[str | None]:
    """:func:`image_kind` of every path, in order (remote paths concurrently)."""
    if len(paths) < 2 or all(fileio.is_local(p) for p in paths):
        return [image_kind(p) for p in paths]
    with concurrent.futures.ThreadPoolExecutor(min(SNIFF_THREADS, len(paths)), "files-sniff") as pool:
        return list(pool.map(image_kind, paths))
