"""A reader of protobuf's text format (``google.protobuf.text_format``'s grammar) without protobuf: what the
reader-only install reads ``schema.pbtxt`` with (:mod:`transforms.collections.schemacheck`). It gives the fields as written,
without a message descriptor: checking names and types is the caller's.

Grammar (protobuf's "Text Format Language Specification"): a message is a sequence of fields ``name: value`` or
``name { ... }`` / ``name < ... >`` (the colon optional before a message), separated by nothing, ``,`` or ``;``;
``name: [a, b]`` lists values; strings are single- or double-quoted with C escapes (octal, ``\\x``, ``\\u``,
``\\U``, the simple ones) and adjacent literals concatenate; ``#`` starts a comment. Extensions (``[ext.name]``)
and ``Any`` expansions are not read (a schema.pbtxt of ours has none): they are syntax errors here.
"""

from __future__ import annotations

import re

MAX_DEPTH = 32  # nesting of messages (a schema.pbtxt of ours nests 3 deep)

_TOKEN = re.compile(
    r"""[ \t\r\n\f\v]+|\#[^\n]*|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'"""
    r"""|[-+]?[0-9.][0-9A-Za-z.+-]*|-?[A-Za-z_][A-Za-z0-9_]*|[{}<>\[\]:,;]"""
)
_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)
_SIMPLE = {
    b"n": b"\n",
    b"r": b"\r",
    b"t": b"\t",
    b'"': b'"',
    b"'": b"'",
    b"\\": b"\\",
    b"a": b"\a",
    b"b": b"\b",
    b"f": b"\f",
    b"v": b"\v",
    b"?": b"?",
}


class TextFormatError(ValueError):
    """Not protobuf text format (the message names the line and what was found)."""


def _unescape(body: str) -> str:
    """A text-format string literal's body (C escapes: protobuf writes non-ASCII UTF-8 as octal) -> str."""

    def one(m):
        octal, hexa, u4, u8, char = m.groups()
        if octal or hexa:
            return bytes([int(octal, 8) if octal else int(hexa, 16)])
        if u4 or u8:
            return chr(int(u4 or u8, 16)).encode("utf-8", "surrogatepass")
        if char in _SIMPLE:
            return _SIMPLE[char]
        raise TextFormatError(f"invalid escape \\{char.decode('latin-1')}")

    try:
        return _ESCAPE.sub(one, body.encode("utf-8", "surrogatepass")).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextFormatError(f"a string that is not UTF-8 ({e.reason})") from None


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """``(kind, token, offset)``: kind ``string``, ``number``, ``ident`` or ``punct``; spaces and comments dropped."""
    out, pos = [], 0
    for m in _TOKEN.finditer(text):
        if m.start() != pos:
            break
        pos = m.end()
        token = m.group()
        first = token[0]
        if first in " \t\r\n\f\v#":
            continue
        kind = (
            "string"
            if first in "\"'"
            else "ident"
            if first.isalpha() or first == "_"
            else "number"
            if first in "0123456789.+-"
            else "punct"
        )
        out.append((kind, token, m.start()))
    if pos != len(text):
        raise TextFormatError(f"line {text.count(chr(10), 0, pos) + 1}: unexpected {text[pos : pos + 10]!r}")
    return out


class _Parser:
    """The recursive-descent parser of :func:`parse_text` over the tokens of ``text``."""

    def __init__(self, text: str):
        self.text, self.tokens, self.pos = text, list(_tokens(text)), 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ("end", "", len(self.text))

    def line(self, tok) -> int:
        return self.text.count("\n", 0, tok[2]) + 1

    def take(self, kind=None, value=None):
        tok = self.peek()
        if (kind and tok[0] != kind) or (value and tok[1] != value):
            want = value or kind
            raise TextFormatError(f"line {self.line(tok)}: expected {want}, found {tok[1] or 'the end'!r}")
        self.pos += 1
        return tok

    def scalar(self):
        tok = self.peek()
        if tok[0] == "string":
            parts = []
            while self.peek()[0] == "string":  # adjacent literals concatenate
                parts.append(_unescape(self.take()[1][1:-1]))
            return "".join(parts)
        if tok[0] in ("number", "ident"):
            return ("id", self.take()[1])
        raise TextFormatError(f"line {self.line(tok)}: expected a value, found {tok[1] or 'the end'!r}")

    def message(self, close: str, depth: int) -> list:
        if depth > MAX_DEPTH:
            raise TextFormatError(f"line {self.line(self.peek())}: messages nested deeper than {MAX_DEPTH}")
        fields = []
        while self.peek()[1] != close:
            if self.peek()[0] == "end":
                raise TextFormatError(f"line {self.line(self.peek())}: expected {close!r}, found the end")
            name = self.take("ident")[1]
            colon = self.peek()[1] == ":"
            if colon:
                self.take()
            fields += [(name, v) for v in self.values(colon, depth)]
            if self.peek()[1] in (",", ";"):
                self.take()
        return fields

    def values(self, colon: bool, depth: int) -> list:
        """The values of one field: one, or the elements of ``[a, b]``."""
        if self.peek()[1] != "[":
            return [self.value(colon, depth)]
        self.take()
        values = []
        while self.peek()[1] != "]":
            values.append(self.value(colon, depth))
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[1] != "]":
                raise TextFormatError(
                    f"line {self.line(self.peek())}: expected ',' or ']', found {self.peek()[1] or 'the end'!r}"
                )
        self.take()
        return values

    def value(self, colon: bool, depth: int):
        if self.peek()[1] in ("{", "<"):
            close = "}" if self.take()[1] == "{" else ">"
            inner = self.message(close, depth + 1)
            self.take(value=close)
            return inner
        if not colon:
            raise TextFormatError(
                f"line {self.line(self.peek())}: expected ':' or '{{', found {self.peek()[1] or 'the end'!r}"
            )
        return self.scalar()


def parse_text(text: str) -> list[tuple[str, object]]:
    """A message in protobuf's text format as ``[(field name, value), ...]`` in file order: a value is a ``str``
    (a string literal, unescaped), ``("id", token)`` (an enum name, number or bool as written) or a nested message
    (a list of the same form); ``name: [a, b]`` gives one pair per element. Field names are not checked here.

    Raises:
      ValueError: not text format (the line and what was found), or messages nested deeper than
        :data:`MAX_DEPTH`.
    """
    return _Parser(text).message("", 0)
