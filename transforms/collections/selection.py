"""Which spans of a collection a read or a run takes: ``--spans`` / ``spans=`` (an int, a list or range, ``latest``,
``latest:N``, ``A-B``), each span at its latest version, and the check that the spans taken share one schema.
Pure functions over the ``collection.json`` document; :mod:`collection` loads and commits it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from tfrecord_etl.transforms.errors import ConfigError, SchemaError

SpanSelector = None | int | str | Sequence[int] | range


def latest_versions(coll: dict) -> list[dict]:
    """The committed spans in span order, each at its latest version (TFX: a span's newest version wins)."""
    best: dict[int, dict] = {}
    for s in coll["spans"]:
        cur = best.get(s["span"])
        if cur is None or (s["version"] or -1) > (cur["version"] or -1):
            best[s["span"]] = s
    return [best[k] for k in sorted(best)]


LATEST = re.compile(r"^latest(?::(\d+))?$")
RANGE = re.compile(r"^(\d+)-(\d+)$")


def parse_spans(text: str) -> SpanSelector:
    """A ``--spans`` flag's value as a selector for :func:`select`: ``7``, ``3,5,9``, ``3-9`` (inclusive),
    ``latest``, ``latest:30`` (the newest 30 committed spans), ``all``.

    Raises:
      ConfigError: anything else.
    """
    text = text.strip()
    if text in ("", "all"):
        return None
    if LATEST.match(text):
        return text
    m = RANGE.match(text)
    if m:
        return range(int(m.group(1)), int(m.group(2)) + 1)
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"Cannot read --spans {text!r}", hint="one span (7), a list (3,5,9), a range (3-9), latest, latest:N or all"
        ) from None
    return values[0] if len(values) == 1 else values


def select(coll: dict, spans: SpanSelector = None, where: str = "") -> list[dict]:
    """The span entries ``spans`` names, in span order, each at its latest version.

    ``spans``: None (every span), an int, a list or range of ints, ``"latest"``, ``"latest:N"`` (the newest N
    committed spans; fewer when there are fewer), or a ``--spans`` string (:func:`parse_spans`).

    Raises:
      ConfigError: a span that is not committed (names it and the committed ones), an empty selection.
    """
    if isinstance(spans, str) and not LATEST.match(spans.strip()):
        spans = parse_spans(spans)
    entries = latest_versions(coll)
    if spans is None:
        chosen = entries
    elif isinstance(spans, str):
        n = LATEST.match(spans.strip()).group(1)
        chosen = entries[-int(n) :] if n is not None else entries[-1:]
        if n is not None and int(n) == 0:
            chosen = []
    else:
        wanted = [spans] if isinstance(spans, int) else list(spans)
        by_span = {s["span"]: s for s in entries}
        missing = [w for w in wanted if w not in by_span]
        if missing:
            have = [s["span"] for s in entries]
            shown = (", ".join(map(str, have[:10])) + (f" ... {have[-1]}" if len(have) > 10 else "")) or "none"
            raise ConfigError(
                f"Span {missing[0]} is not in the collection"
                if len(missing) == 1
                else f"Spans {missing[:10]} are not in the collection",
                file=where or None,
                hint=f"committed spans: {shown}",
            )
        chosen = [by_span[w] for w in sorted(set(wanted))]
    if not chosen:
        raise ConfigError(
            "No spans selected",
            file=where or None,
            hint="the collection has no committed span" if not entries else "select at least one",
        )
    return chosen


def same_schema(a: dict, b: dict) -> bool:
    """True when the spans of the ``collection.json`` entries ``a`` and ``b`` have the same schema: the same
    fingerprint (``schema``), or, when one of them was written before native list features carried their
    annotation in ``schema.pbtxt`` (it has no ``schema_untagged``), its fingerprint equal to the other's
    ``schema_untagged`` (the fingerprint of the schema without those annotations, as that version wrote it)."""
    if a["schema"] == b["schema"]:
        return True
    return ("schema_untagged" not in a and a["schema"] == b.get("schema_untagged")) or (
        "schema_untagged" not in b and b["schema"] == a.get("schema_untagged")
    )


def check_same_schema(entries: Iterable[dict], where: str = "") -> None:
    """Refuses spans whose schemas differ (a collection that recorded a schema change, read across it).

    Raises:
      SchemaError: names the first two spans whose schemas differ.
    """
    first = None
    for s in entries:
        if first is None:
            first = s
        elif not same_schema(s, first):
            raise SchemaError(
                f"Spans {first['span']} and {s['span']} have different schemas (the collection "
                f"recorded a schema change)",
                file=where or None,
                hint="read the spans on either side of the change separately (spans=...)",
            )
