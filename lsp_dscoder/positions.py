"""LSP positions <-> string offsets, in the position encoding the client negotiated.

Python strings index code points; LSP counts UTF-16 code units unless the client asked for utf-8 or
utf-32. Lines end at "\\n", "\\r\\n" or "\\r" (the LSP definition, not `str.splitlines`).
"""

from __future__ import annotations

import enum
import re

from lsp_dscoder.errors import PositionError

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class Encoding(enum.Enum):
    UTF8 = "utf-8"
    UTF16 = "utf-16"
    UTF32 = "utf-32"

    @classmethod
    def parse(cls, value: object) -> Encoding:
        """The encoding pygls negotiated (a PositionEncodingKind or its string); UTF-16 if unknown."""
        text = str(getattr(value, "value", value))
        return next((e for e in cls if e.value == text), cls.UTF16)


def sanitize(text: str) -> str:
    """Replace lone surrogates (invalid UTF-16 that JSON can still carry) with U+FFFD.

    One code point stays one code point, so offsets are unchanged; the tokenizer can then encode it.
    """
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


def _units(char: str, encoding: Encoding) -> int:
    code = ord(char)
    if encoding is Encoding.UTF16:
        return 2 if code > 0xFFFF else 1
    if encoding is Encoding.UTF8:
        return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4
    return 1


def line_start(text: str, line: int) -> int:
    """Offset of the first character of `line`; PositionError if the document has fewer lines."""
    if line < 0:
        raise PositionError(f"negative line {line}")
    if line == 0:
        return 0
    for count, match in enumerate(_LINE_BREAK.finditer(text), start=1):
        if count == line:
            return match.end()
    lines = len(_LINE_BREAK.findall(text)) + 1
    raise PositionError(f"line {line} is past the end of the document ({lines} lines)")


def line_end(text: str, start: int) -> int:
    """Offset of the line break (or end of text) of the line starting at `start`."""
    match = _LINE_BREAK.search(text, start)
    return match.start() if match else len(text)


def offset_at(text: str, line: int, character: int, encoding: Encoding) -> int:
    """Offset of an LSP position. A character past the line's end means the line's end (LSP spec); a
    position inside a surrogate pair (or UTF-8 sequence) rounds down to the character's start."""
    if character < 0:
        raise PositionError(f"negative character {character}")
    start = line_start(text, line)
    end = line_end(text, start)
    if encoding is Encoding.UTF32:
        return min(start + character, end)
    units = 0
    for offset in range(start, end):
        units += _units(text[offset], encoding)
        if units > character:
            return offset
    return end


def position_at(text: str, offset: int, encoding: Encoding) -> tuple[int, int]:
    """(line, character) of a string offset, in the client's units."""
    line = 0
    start = 0
    for match in _LINE_BREAK.finditer(text, 0, offset):
        if match.end() > offset:
            break
        line += 1
        start = match.end()
    segment = text[start:offset]
    if encoding is Encoding.UTF32:
        return line, len(segment)
    return line, sum(_units(c, encoding) for c in segment)
