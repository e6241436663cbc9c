"""Input patterns with TFX ExampleGen's span placeholders, and the files of one span.

    raw/span-{SPAN}/*.npz            {SPAN}: an integer (any digits); {SPAN:3}: exactly 3 digits (007)
    raw/{YYYY}-{MM}-{DD}/*.h5        a date: span number = days since 1970-01-01 (2025-11-24 -> 20416)
    raw/span-{SPAN}/v{VERSION}/*.h5  {VERSION} (or {VERSION:N}): optional, with a span or date placeholder

The meaning is TFX's (``tfx/components/example_gen/utils.py``: ``verify_split_pattern_specs``,
``_create_matching_glob_and_regex``, ``date_to_span_number``): the placeholders become globs (``*``, or ``?``
repeated for a width) to list the files, and a regex with a named group per placeholder reads each matched
path's span (and version) back; ``--span latest`` (the default) is the largest span found, and the version of a
span defaults to its largest. Listing goes through ``matching.match_inputs`` (local walk, gs://, s3://).
"""

from __future__ import annotations

import dataclasses
import datetime
import re

from tfrecord_etl.transforms.collections import matching
from tfrecord_etl.transforms.errors import ConfigError, SourceError, printable

EPOCH = datetime.date(1970, 1, 1)  # TFX's UNIX_EPOCH_DATE: span number 0
_SPAN = re.compile(r"\{SPAN(?::(?P<width>[^}]*))?\}")
_VERSION = re.compile(r"\{VERSION(?::(?P<width>[^}]*))?\}")
_DATES = ("{YYYY}", "{MM}", "{DD}")
_DATE_GROUPS = (("year", 4), ("month", 2), ("day", 2))
_ANY = re.compile(r"\{[A-Z][A-Z0-9_]*(?::[^}]*)?\}")  # what looks like a placeholder: {NAME} or {NAME:...}
_SHOWN = 10  # spans named in an error


def date_to_span(year: int, month: int, day: int) -> int:
    """The span number of a date: days since 1970-01-01 (TFX's ``date_to_span_number``).

    Raises:
      ValueError: not a calendar date.
    """
    return (datetime.date(year, month, day) - EPOCH).days


def span_to_date(span: int) -> datetime.date:
    """The date of span number ``span`` (TFX's ``span_number_to_date``)."""
    return EPOCH + datetime.timedelta(days=span)


def has_placeholders(pattern: str) -> bool:
    """True when ``pattern`` holds ``{SPAN}``, ``{SPAN:N}``, a date placeholder or ``{VERSION}``."""
    return bool(_SPAN.search(pattern) or _VERSION.search(pattern) or any(d in pattern for d in _DATES))


def _width(match: re.Match, pattern: str) -> int | None:
    text = match.group("width")
    if text is None:
        return None
    if not text.isdigit() or int(text) <= 0:
        raise ConfigError(
            f"The width in {match.group(0)} is not a positive integer",
            file=pattern,
            hint="write {SPAN} (any number of digits) or {SPAN:N} (exactly N digits, zero-padded)",
        )
    return int(text)


@dataclasses.dataclass(frozen=True)
class SpanPattern:
    """A checked input pattern with placeholders (:func:`parse`).

    Attributes:
      pattern: as given. kind: ``"span"`` ({SPAN}) or ``"date"`` ({YYYY}{MM}{DD}). has_version: holds {VERSION}.
      glob: the pattern with each placeholder a glob (what is listed). regex: a compiled regex of the whole path
        with the groups ``span`` or ``year``/``month``/``day``, and ``version``.
    """

    pattern: str
    kind: str
    has_version: bool
    glob: str
    regex: re.Pattern

    def span_of(self, path: str) -> tuple[int, int | None, str] | None:
        """``(span, version or None, the span's text in the path)`` of a listed path; None when the path does not
        have the placeholders' form (e.g. ``{SPAN}`` matched letters).

        Raises:
          ConfigError: a date placeholder matched digits that are no calendar date (naming the path).
        """
        m = self.regex.fullmatch(path)
        if m is None:
            return None
        version = int(m.group("version")) if self.has_version else None
        if self.kind == "span":
            return int(m.group("span")), version, m.group("span")
        y, mo, d = (int(m.group(g)) for g, _ in _DATE_GROUPS)
        try:
            return date_to_span(y, mo, d), version, f"{y:04d}-{mo:02d}-{d:02d}"
        except ValueError:
            raise ConfigError(
                f"The date placeholders match {m.group('year')}-{m.group('month')}-{m.group('day')},"
                f" which is no calendar date",
                file=path,
                hint="rename the directory or narrow the pattern",
            ) from None


def _glob_regex(pattern: str) -> str:
    """The regex of Beam's glob ``pattern`` (``FileSystem.translate_pattern``) without its end anchor."""
    from apache_beam.io.filesystem import FileSystem

    return FileSystem.translate_pattern(pattern).removeprefix("(?ms)").removesuffix("\\Z")


def _check_placeholders(pattern: str, spans: list, versions: list, dates: list[str]) -> None:
    """The refusals of :func:`parse` (ConfigError), given the pattern's span, version and date placeholders."""
    known = {m.group(0) for m in spans + versions} | set(dates)
    unknown = [m.group(0) for m in _ANY.finditer(pattern) if m.group(0) not in known]
    if unknown:
        raise ConfigError(
            f"Unknown placeholder {printable(unknown[0])} in the input pattern",
            file=pattern,
            hint="the placeholders are {SPAN}, {SPAN:N}, {VERSION}, {VERSION:N}, {YYYY}, {MM}, {DD}",
        )
    if spans and dates:
        raise ConfigError(
            "The input pattern holds both {SPAN} and date placeholders: a span is either a number or a date",
            file=pattern,
            hint="keep {SPAN} or {YYYY}{MM}{DD}, not both",
        )
    if len(spans) > 1 or len(versions) > 1:
        raise ConfigError(
            f"Only one {'{SPAN}' if len(spans) > 1 else '{VERSION}'} is allowed in the input pattern", file=pattern
        )
    if dates and not all(pattern.count(d) == 1 for d in _DATES):
        raise ConfigError(
            "A date needs each of {YYYY}, {MM} and {DD} exactly once in the input pattern",
            file=pattern,
            hint="e.g. raw/{YYYY}-{MM}-{DD}/*.h5",
        )
    if versions and not (spans or dates):
        raise ConfigError(
            "{VERSION} needs a span placeholder ({SPAN} or {YYYY}{MM}{DD}) in the input pattern",
            file=pattern,
            hint="a version is a version of a span: add {SPAN} or a date",
        )
    if not (spans or dates):
        raise ConfigError(
            "The input pattern has no span placeholder",
            file=pattern,
            hint="add {SPAN} or {YYYY}{MM}{DD}, or convert it as one output (no --span/--version)",
        )


def parse(pattern: str) -> SpanPattern:
    """Checks an input pattern with placeholders as TFX does and builds its glob and regex.

    Raises:
      ConfigError: {SPAN} together with date placeholders, a placeholder given twice, a date without all of
        {YYYY} {MM} {DD}, {VERSION} without a span or date placeholder, an unknown placeholder ({DAY}, {span}),
        a width that is not a positive integer.
    """
    spans, versions = list(_SPAN.finditer(pattern)), list(_VERSION.finditer(pattern))
    dates = [d for d in _DATES if d in pattern]
    _check_placeholders(pattern, spans, versions, dates)
    # split the pattern at its placeholders: the literal parts keep their glob meaning, each placeholder a group
    tokens = re.compile(r"\{SPAN(?::[^}]*)?\}|\{VERSION(?::[^}]*)?\}|" + "|".join(re.escape(d) for d in _DATES))
    glob, regex, pos = "", "", 0  # Beam's translation of each literal part, then one group per placeholder
    for m in tokens.finditer(pattern):
        literal = pattern[pos : m.start()]
        glob += literal
        regex += _glob_regex(literal) if literal else ""
        text = m.group(0)
        if text.startswith(("{SPAN", "{VERSION")):
            name = "span" if text.startswith("{SPAN") else "version"
            width = _width(_SPAN.fullmatch(text) or _VERSION.fullmatch(text), pattern)
            glob += "*" if width is None else "?" * width
            regex += f"(?P<{name}>[0-9]+)" if width is None else f"(?P<{name}>[0-9]{{{width}}})"
        else:
            name, width = _DATE_GROUPS[_DATES.index(text)]
            glob += "?" * width
            regex += f"(?P<{name}>[0-9]{{{width}}})"
        pos = m.end()
    glob += pattern[pos:]
    regex += _glob_regex(pattern[pos:]) if pattern[pos:] else ""
    return SpanPattern(pattern, "span" if spans else "date", bool(versions), glob, re.compile(regex, re.S | re.M))


SpanFlag = int | str | None

_DATE_FLAG = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")


def parse_span_flag(text: SpanFlag) -> tuple[int | None, bool]:
    """``--span``'s value as ``(span number or None for latest, given as a date)``: ``N``, ``latest`` (or None),
    ``YYYY-MM-DD`` (days since 1970-01-01).

    Raises:
      ConfigError: anything else, or a date that is not one.
    """
    if text is None or (isinstance(text, str) and text.strip() in ("", "latest")):
        return None, False
    if isinstance(text, int):
        return text, False
    text = text.strip()
    m = _DATE_FLAG.match(text)
    if m:
        try:
            return date_to_span(*(int(g) for g in m.groups())), True
        except ValueError:
            raise ConfigError(f"--span {text}: not a calendar date", hint="YYYY-MM-DD, e.g. 2025-11-24") from None
    if text.isdigit():
        return int(text), False
    raise ConfigError(
        f"Cannot read --span {printable(text)!r}",
        hint="a span number (7), latest, or a date (YYYY-MM-DD) for a date pattern",
    )


@dataclasses.dataclass(frozen=True)
class SpanFiles:
    """The files of one span and version (:func:`resolve`).

    Attributes:
      span, version: the numbers (version None without {VERSION}). date: ``YYYY-MM-DD`` for a date pattern, else
        None. files: ``(path, size in bytes)`` sorted by path. pattern: the input pattern with the span's (and
        version's) text in place of the placeholders. spans: every span number the pattern matched, sorted.
    """

    span: int
    version: int | None
    date: str | None
    files: tuple[tuple[str, int], ...]
    pattern: str
    spans: tuple[int, ...]


def _listing(spans) -> str:
    spans = sorted(spans)
    return (", ".join(map(str, spans[:_SHOWN])) + (f" ... {spans[-1]}" if len(spans) > _SHOWN else "")) or "none"


def _matched(sp: SpanPattern, pattern: str, follow_symlinks: bool) -> tuple[dict, dict]:
    """The files ``sp``'s glob matches, by ``(span, version)``, and each span's text as matched; the errors of
    :func:`resolve` when nothing matches, or nothing has the placeholders' form."""
    try:
        listed = matching.match_inputs(sp.glob, follow_symlinks)
    except SourceError as e:
        if e.message != matching.NO_MATCH:  # a file matched twice, a link outside the base, ...: said as it is
            raise
        raise SourceError(
            "No input file matches the pattern (with its placeholders as globs)",
            file=pattern,
            hint=f"listed {sp.glob}; " + (e.hint or ""),
        ) from None
    found: dict[tuple[int, int | None], list[tuple[str, int]]] = {}
    texts: dict[tuple[int, int | None], str] = {}
    for path, size in listed:
        got = sp.span_of(path)
        if got is None:
            continue  # the glob is wider than the placeholders' form (e.g. {SPAN} over letters)
        found.setdefault(got[:2], []).append((path, size))
        texts[got[:2]] = got[2]
    if not found:
        raise ConfigError(
            "No matched file has the form of the pattern's placeholders (digits where {SPAN}, a date "
            "or {VERSION} stand)",
            file=pattern,
            hint=f"listed {len(listed):,} file(s) with {sp.glob}, e.g. {printable(listed[0][0])}",
        )
    return found, texts


def _concrete(sp: SpanPattern, token: str, chosen: int | None, files: tuple) -> str:
    """``sp``'s pattern with its placeholders replaced by the span ``token`` and the version of ``files``."""
    concrete = sp.pattern
    if sp.kind == "span":
        concrete = _SPAN.sub(token, concrete)
    else:
        for d, part in zip(_DATES, token.split("-")):
            concrete = concrete.replace(d, part)
    if chosen is not None:
        m = sp.regex.fullmatch(files[0][0])
        concrete = _VERSION.sub(m.group("version"), concrete)
    return concrete


def resolve(
    pattern: str, span: SpanFlag = None, version: int | None = None, follow_symlinks: bool = False
) -> SpanFiles:
    """The files of span ``span`` (``--span``: a number, ``latest``/None = the largest matched, or a date
    ``YYYY-MM-DD`` for a date pattern) at version ``version`` (None: the span's largest) of ``pattern``.

    Raises:
      ConfigError: a bad pattern (:func:`parse`); a date given for a {SPAN} pattern; a version without
        {VERSION}; no file of that span or version (naming the spans / versions found); a matched path whose
        {SPAN} is no number.
      SourceError: nothing matches the pattern at all (``matching.match_inputs``).
    """
    sp = parse(pattern)
    wanted, as_date = parse_span_flag(span)
    if as_date and sp.kind != "date":
        raise ConfigError(
            f"--span {span} is a date, but the input pattern has {{SPAN}}, not {{YYYY}}{{MM}}{{DD}}",
            file=pattern,
            hint="give the span number, or put the date placeholders in --input",
        )
    if version is not None and not sp.has_version:
        raise ConfigError(
            f"--version {version}: the input pattern has no {{VERSION}}",
            file=pattern,
            hint="add {VERSION} to --input, or leave --version out",
        )
    found, texts = _matched(sp, pattern, follow_symlinks)
    spans = sorted({s for s, _ in found})
    target = spans[-1] if wanted is None else wanted
    versions = sorted(v for s, v in found if s == target and v is not None)
    if not any(s == target for s, _ in found):
        shown = f"{target} ({span_to_date(target)})" if sp.kind == "date" else str(target)
        raise ConfigError(
            f"No input file of span {shown} matches the pattern", file=pattern, hint=f"spans found: {_listing(spans)}"
        )
    if sp.has_version:
        chosen = versions[-1] if version is None else version
        if chosen not in versions:
            raise ConfigError(
                f"No input file of span {target} version {version} matches the pattern",
                file=pattern,
                hint=f"versions of span {target}: {_listing(versions)}",
            )
    else:
        chosen = None
    files = tuple(sorted(found[(target, chosen)]))
    concrete = _concrete(sp, texts[(target, chosen)], chosen, files)
    return SpanFiles(
        target, chosen, str(span_to_date(target)) if sp.kind == "date" else None, files, concrete, tuple(spans)
    )
