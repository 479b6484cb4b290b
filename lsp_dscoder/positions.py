"""LSP positions <-> string offsets, in the position encoding the client negotiated.

Python strings index code points; LSP counts UTF-16 code units unless the client asked for utf-8 or
utf-32. Lines end at "\\n", "\\r\\n" or "\\r" (the LSP definition, not `str.splitlines`, which also breaks at
"\\x0b", "\\x0c", "\\x85", U+2028 ...).

`LineIndex` holds the offsets where lines start, so that a position costs a look-up plus a scan of the
part of its own line before it, never a scan of the document; `Scan` counts the characters looked at, so
tests can assert that per-keystroke work is bounded by the edit rather than the document.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lsp_dscoder.errors import PositionError

LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

Starts = npt.NDArray[np.int64]


class Encoding(enum.Enum):
    UTF8 = "utf-8"
    UTF16 = "utf-16"
    UTF32 = "utf-32"

    @classmethod
    def parse(cls, value: object) -> Encoding:
        """The encoding pygls negotiated (a PositionEncodingKind or its string); UTF-16 if unknown."""
        text = str(getattr(value, "value", value))
        return next((e for e in cls if e.value == text), cls.UTF16)


@dataclass
class Scan:
    """Characters examined one by one (regex, encoding, comparisons); memory copies are not counted."""

    chars: int = 0


def sanitize(text: str) -> str:
    """Replace lone surrogates (invalid UTF-16 that JSON can still carry) with U+FFFD.

    One code point stays one code point with as many UTF-8/16 units, so offsets and positions are unchanged;
    the tokenizer can then encode it.
    """
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


def lf(text: str) -> str:
    """`text` with every LSP line break (\r\n, \r) as \n: what the model reads for the text around the
    edit (a CRLF document otherwise reaches it with line ends it rarely saw in training, and suggests
    worse). Offsets stay the document's; only what is tokenised is normalised."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def units(text: str, encoding: Encoding) -> int:
    """Length of `text` in the encoding's code units."""
    if encoding is Encoding.UTF32 or text.isascii():  # isascii() is O(1) on CPython strings
        return len(text)
    if encoding is Encoding.UTF16:
        return len(text.encode("utf-16-le", "surrogatepass")) // 2
    return len(text.encode("utf-8", "surrogatepass"))


def break_starts(text: str, lo: int, hi: int, scan: Scan) -> list[int]:
    """Offsets in [lo, hi] where a line starts, judged from text[lo - 1 : hi + 1] (a start's own
    character and the one before it decide: after "\\n", or after "\\r" not followed by "\\n")."""
    first, last = max(lo - 1, 0), min(hi + 1, len(text))
    scan.chars += last - first
    found = [m.end() for m in LINE_BREAK.finditer(text, first, last)]
    # A "\r" at the window's end whose "\n" is cut off matches alone, but its end (hi + 1) is filtered.
    starts = [p for p in found if lo <= p <= hi]
    return [0, *starts] if lo == 0 else starts


class LineIndex:
    """Line start offsets of a text, updated by edits in time proportional to the edit's text.

    Typing on a line moves the start of every line below it: that move is kept pending (`_from`,
    `_shift`: lines from `_from` on start `_shift` characters later than `_raw` says) and merged with the
    next edit on the same line, so a keystroke costs no pass over the line starts; an edit that adds or
    removes a line break, or falls on another line, applies it."""

    def __init__(self, text: str, scan: Scan) -> None:
        self._raw: Starts = np.asarray(break_starts(text, 0, len(text), scan), dtype=np.int64)
        self._from = len(self._raw)
        self._shift = 0

    @property
    def starts(self) -> Starts:
        """The line start offsets (a new array when a move is pending)."""
        if self._shift == 0:
            return self._raw
        return np.concatenate((self._raw[: self._from], self._raw[self._from :] + self._shift))

    @property
    def line_count(self) -> int:
        return len(self._raw)

    def replaced(self, text: str, start: int, end: int, length: int, scan: Scan) -> LineIndex:
        """The index of `text`, which is the indexed text with [start, end) replaced by `length` characters
        (a new object: a failed multi-change edit leaves the old index untouched)."""
        line = self._line_of(start)
        delta = length - (end - start)
        fresh = break_starts(text, start, start + length, scan)
        # Within one line (no break removed or added, and the line's own start not moved): only the
        # lines below move.
        same_line = (
            not fresh
            and start > self.line_start(line)
            and (line + 1 >= len(self._raw) or end < self.line_start(line + 1))
        )
        new = LineIndex.__new__(LineIndex)
        if same_line and (self._shift == 0 or self._from == line + 1):
            new._raw, new._from, new._shift = self._raw, line + 1, self._shift + delta
            return new
        starts = self.starts
        keep = int(np.searchsorted(starts, start, "left"))
        tail = int(np.searchsorted(starts, end, "right"))
        shifted = starts[tail:] + delta
        new._raw = np.concatenate((starts[:keep], np.asarray(fresh, dtype=np.int64), shifted))
        new._from, new._shift = len(new._raw), 0
        return new

    def _line_of(self, offset: int) -> int:
        """The line holding `offset` (the last line starting at or before it)."""
        raw, at = self._raw, self._from
        if self._shift == 0:
            return int(np.searchsorted(raw, offset, "right")) - 1
        below = int(np.searchsorted(raw[:at], offset, "right"))
        if below < at:
            return below - 1
        return at + int(np.searchsorted(raw[at:], offset - self._shift, "right")) - 1

    def line_start(self, line: int) -> int:
        if line < 0:
            raise PositionError(f"negative line {line}")
        if line >= len(self._raw):
            raise PositionError(f"line {line} is past the end of the document ({len(self._raw)} lines)")
        return int(self._raw[line]) + (self._shift if line >= self._from else 0)

    def line_end(self, text: str, line: int) -> int:
        """Offset of the line's break (or the end of the text)."""
        if line + 1 >= len(self._raw):
            return len(text)
        nxt = self.line_start(line + 1)
        return nxt - 2 if text[nxt - 2 : nxt] == "\r\n" else nxt - 1

    def locate(self, text: str, line: int, character: int, encoding: Encoding, scan: Scan) -> tuple[int, int]:
        """(offset, character) of an LSP position. A character past the line's end means the line's end
        (LSP spec); a position inside a surrogate pair (or UTF-8 sequence) rounds down to the character's
        start. The returned character is where the offset is (the request's own in the usual case)."""
        if character < 0:
            raise PositionError(f"negative character {character}")
        start = self.line_start(line)
        end = self.line_end(text, line)
        if encoding is Encoding.UTF32:
            offset = min(start + character, end)
            return offset, offset - start
        offset, used = start, 0
        while offset < end and used < character:
            step = min(character - used, end - offset)  # each character is at least one unit
            while True:
                chunk = text[offset : offset + step]
                scan.chars += 0 if chunk.isascii() else step  # ASCII: a copy, no character looked at
                size = units(chunk, encoding)
                if used + size <= character:
                    offset, used = offset + step, used + size
                    break
                if step == 1:
                    return offset, used  # inside this character
                step //= 2
        return offset, used

    def position_at(self, text: str, offset: int, encoding: Encoding, scan: Scan) -> tuple[int, int]:
        """(line, character) of a string offset, in the client's units."""
        line = self._line_of(offset)
        start = self.line_start(line)
        before = text[start:offset]
        scan.chars += 0 if before.isascii() else len(before)
        return line, units(before, encoding)


def offset_at(text: str, line: int, character: int, encoding: Encoding) -> int:
    """Offset of an LSP position in a text that has no index yet (indexes the whole text)."""
    scan = Scan()
    return LineIndex(text, scan).locate(text, line, character, encoding, scan)[0]


def position_at(text: str, offset: int, encoding: Encoding) -> tuple[int, int]:
    """(line, character) of an offset in a text that has no index yet (indexes the whole text)."""
    scan = Scan()
    return LineIndex(text, scan).position_at(text, offset, encoding, scan)
