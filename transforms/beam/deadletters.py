"""Dead letters: the JSON-able record of a row range that could not be read or encoded, what ``metadata.json``
keeps of it, and the ``.jsonl`` files they are written to."""

from __future__ import annotations

from tfrecord_etl.transforms.output import sink
from tfrecord_etl.transforms.sources import RowRange
from tfrecord_etl.transforms.storage import fileio

DEAD_LETTERS = "dead_letters"


def dead_letter(rr: RowRange, error: BaseException) -> dict:
    """The JSON-able record of a row range that could not be read or encoded."""
    ctx = getattr(error, "context", {})
    return {
        "file": rr.path,
        "datasets": list(rr.items) if not rr.item_files else [],
        "files": list(rr.items) if rr.item_files else [],
        "start": rr.start,
        "stop": rr.stop,
        "rows": rr.num_rows,
        "error": type(error).__name__,
        "message": getattr(error, "message", str(error)),
        "context": {k: str(v) for k, v in ctx.items()},
    }


def dead_range(letter: dict) -> dict:
    """What ``metadata.json`` keeps of one dead letter (its ``dead_letters`` list): the rows that have no record,
    ``{"file", "start", "stop", "rows", "error"[, "files"]}`` (rows ``[start, stop)`` of the input ``file``, its
    index path; ``files``: the files of those rows in files / npy files modes). verify --source expects exactly
    these rows to be absent."""
    out = {k: letter[k] for k in ("file", "start", "stop", "rows", "error")}
    if letter.get("files"):
        out["files"] = list(letter["files"])
    return out


def write_dead_letters(dead_letter_dir: str, name: str, letters: list[dict]) -> str:
    """Writes ``letters`` as JSON lines to ``dead_letter_dir/name.jsonl`` (through ``sink``); returns its path."""
    return sink.write_json_lines(fileio.join(dead_letter_dir, f"{name}.jsonl"), letters)
