"""The exception family of tfrecord-etl.

Every error a user can cause is one of these, with the context (file, dataset, member, row range,
record index, byte offset) as attributes and in the message, plus a hint of what to do.
"""

from __future__ import annotations


def printable(text) -> str:
    """``text`` safe to print on one terminal line: every non-printable character (ANSI escapes, newlines,
    other control and format characters, lone surrogates) is written as its Python escape (``\\x1b``,
    ``\\n``, ``\\u202e``, ``\\ud800``); printable text is returned unchanged."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class EtlError(Exception):
    """Base class. ``context`` holds where it happened (file, dataset, rows, record, offset, feature)."""

    def __init__(self, message: str, *, hint: str | None = None, **context):
        message = printable(message)  # names in messages (features, datasets, files) never print raw escapes
        hint = None if hint is None else printable(hint)
        self.message = message
        self.context = {k: v for k, v in context.items() if v is not None}
        self.hint = hint
        where = ", ".join(f"{k}={v!r}" for k, v in self.context.items())
        text = message
        if where:
            text += f" [{where}]"
        if hint:
            text += f" Hint: {hint}"
        super().__init__(text)

    def with_context(self, **context) -> EtlError:
        """The same error with more context (existing keys win), e.g. the file of a planning error."""
        return type(self)(self.message, hint=self.hint, **{**context, **self.context})

    def __reduce__(self):  # keep the class and context when Beam pickles the error across workers
        return (_rebuild, (type(self), self.args[0], self.context, self.hint))


def _rebuild(cls, text, context, hint):
    err = cls.__new__(cls)
    Exception.__init__(err, text)
    err.message, err.context, err.hint = text, context, hint
    return err


class ConfigError(EtlError):
    """Invalid configuration: unknown key, wrong type, missing input, existing output directory."""


class SourceError(EtlError):
    """An input file cannot be matched, opened or read (names the file, dataset/member and row range)."""


class InputChangedError(SourceError):
    """An input file changed between the run's planning and its read (size, modification time or checksum), or a
    worker does not find it (not on storage every worker reaches, or deleted since): the run stops, never
    dead-letters it, and nothing is committed; running again reads the new version."""


class UnreadFormatError(SourceError):
    """An input file of a format tfrecord-etl recognises but does not read (a WAV file, an IDL SAVE file...: the
    table ``UNREAD`` of ``sources/signatures.py``); the hint says how to turn it into arrays it reads."""


class SchemaError(EtlError):
    """Dtypes, shapes or feature names that cannot be encoded as asked (unsupported dtype, lossy cast, ...)."""


class RecordError(EtlError):
    """A TFRecord frame or a serialized tf.train.Example is malformed (names file, record index, byte offset)."""


class IncompleteOutputError(EtlError):
    """An output directory has no committed metadata: a run is still going, crashed, or it is not ours."""


class OutputError(EtlError):
    """The output could not be written or committed: the run no longer owns the output directory (its launcher
    is gone, a newer run took the lock over), it was interrupted, or one of its worker processes died."""
