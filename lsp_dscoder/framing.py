"""LSP base-protocol framing (`Content-Length: N\\r\\n\\r\\n` + N bytes of JSON) that survives bad input.

`Framer.feed(bytes)` returns the complete message bodies found so far. A badly framed message (a
Content-Length that is missing, negative, not a number, over the limit, too large or too small for its
body; garbage or a bare body between messages) is skipped, and reading resumes at the next valid header:
the server never sits deaf. Header names are matched case-insensitively (`content-length` is common).

Resynchronising relies on one property of JSON: a raw line break cannot occur inside a string, and
`Content-Length` cannot occur outside one. So `Content-Length: <digits>` followed by a raw line break
inside what was announced as a body proves the announced length wrong, and the header starts a message.
"""

from __future__ import annotations

import re
from collections.abc import Callable

HEADER_LINE_LIMIT = 64 * 1024
BODY_LIMIT = 1 << 30  # far above any document an editor sends; a bigger length is a framing error

_HEADER = re.compile(rb"([!#-'*+.0-9A-Z^-z|~-]+)[ \t]*:[ \t]*(.*?)[ \t]*")
_HEADER_START = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
_HEADER_IN_BODY = re.compile(rb"content-length[ \t]*:[ \t]*[0-9]+[ \t]*\r?\n", re.IGNORECASE)
_OVERLAP = 64  # bytes rescanned for a header that straddles two reads
_HEADER_SPAN = 256  # a Content-Length line inside a body is looked for this far before its line break


def framed(body: bytes) -> bytes:
    """`body` (JSON) as one message on the wire: its header, then it."""
    return b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


class HeaderTooLong(Exception):
    """A header line longer than the limit (only raised when the framer is told to give up on one)."""


class Framer:
    """Splits a byte stream into message bodies. `skipped(reason)` is called once per stretch of bad
    input (the first problem after a good message), so a burst of garbage logs one line."""

    def __init__(
        self,
        skipped: Callable[[str], None],
        *,
        overlong_is_fatal: bool = False,
        line_limit: int = HEADER_LINE_LIMIT,
        body_limit: int = BODY_LIMIT,
    ) -> None:
        self._skipped = skipped
        self._overlong_is_fatal = overlong_is_fatal
        self._line_limit = line_limit
        self._body_limit = body_limit
        self._buf = bytearray()
        self._in_bad_stretch = False
        self._reset_headers()
        self._length: int | None = None  # set once a header block is complete: reading its body
        self._scanned = 0  # how far the pending body was searched for a header

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete message."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        bodies: list[bytes] = []
        while True:
            if self._length is None:
                if not self._canonical_header() and not self._header_line():
                    return bodies
            else:
                body = self._body(self._length)
                if body is None:
                    return bodies
                if body:
                    bodies.append(body)

    def _reset_headers(self) -> None:
        self._content_length: int | None = None
        self._headers_seen = False
        self._bad: str | None = None  # why the current header block cannot be trusted

    def _skip(self, reason: str) -> None:
        if not self._in_bad_stretch:
            self._in_bad_stretch = True
            self._skipped(reason)

    def _canonical_header(self) -> bool:
        """The header block every client sends, `Content-Length: N\\r\\n\\r\\n`, read in one step (the
        line-by-line parser costs more than the keystroke's JSON); False for anything else."""
        buf = self._buf
        if self._headers_seen or self._bad is not None or not buf.startswith(b"Content-Length: "):
            return False
        end = buf.find(b"\r\n\r\n", 16, 16 + 12 + 4)
        digits = bytes(buf[16:end])
        if end < 0 or not digits.isdigit() or not 0 < int(digits) <= self._body_limit:
            return False
        del buf[: end + 4]
        self._length, self._scanned = int(digits), 0
        return True

    def _header_line(self) -> bool:
        """Consume one header line; False when more bytes are needed."""
        buf = self._buf
        newline = buf.find(b"\n", 0, self._line_limit + 1)
        if newline < 0:
            if len(buf) > self._line_limit:
                self._overlong()
                return True
            return False
        line = bytes(buf[:newline]).rstrip(b"\r")
        del buf[: newline + 1]
        if not line.strip():  # a blank line ends the header block
            if self._bad is not None:
                self._skip(self._bad)
            elif self._content_length is not None:
                self._length, self._scanned = self._content_length, 0
            elif self._headers_seen:
                self._skip("a message without a Content-Length header")
            self._reset_headers()
            return True
        starts = [m.start() for m in _HEADER_START.finditer(line)]
        if starts and starts[-1] > 0:  # a bare body or garbage glued to the next message's header
            self._reset_headers()
            buf[0:0] = line[starts[-1] :] + b"\r\n"
            self._skip("bytes that are not a message before a header")
            return True
        match = _HEADER.fullmatch(line)
        if match is None:
            self._reset_headers()
            self._skip("bytes that are not a header")
            return True
        self._headers_seen = True
        if match[1].lower() == b"content-length":
            self._content_length_value(match[2])
        return True

    def _content_length_value(self, value: bytes) -> None:
        shown = value[:40].decode("latin-1")
        if not value.isdigit():
            self._bad = f"Content-Length {shown!r} is not a number"
        elif len(value) > 12 or not 0 < int(value) <= self._body_limit:
            self._bad = f"Content-Length {shown} is out of range (1 to {self._body_limit})"
        else:
            self._content_length = int(value)

    def _overlong(self) -> None:
        if self._overlong_is_fatal:
            raise HeaderTooLong(f"a header line longer than {self._line_limit // 1024} KiB")
        self._skip(f"a header line longer than {self._line_limit // 1024} KiB")
        starts = list(_HEADER_START.finditer(self._buf))
        keep = starts[-1].start() if starts else len(self._buf) - _OVERLAP
        del self._buf[:keep]
        self._reset_headers()

    def _body(self, length: int) -> bytes | None:
        """The body once complete (b"" when the announced length proved wrong); None for more bytes."""
        buf = self._buf
        end = min(len(buf), length + _OVERLAP)  # a header that starts inside the body ends by here
        start = max(0, self._scanned - _OVERLAP)
        # A header ends with a raw line break, which JSON never holds: the first one (a memchr) is at
        # the earliest the end of a header, and the case-insensitive pattern steps through every byte,
        # so it only looks from a header line's length before that line break.
        newline = buf.find(b"\n", start, end)
        found = None if newline < 0 else _HEADER_IN_BODY.search(buf, max(start, newline - _HEADER_SPAN), end)
        self._scanned = end
        if found is not None and found.start() < length:
            self._skip(f"Content-Length {length} does not match its message")
            del buf[: found.start()]
            self._length = None
            return b""
        if len(buf) < length:
            return None
        body = bytes(buf[:length])
        del buf[:length]
        self._length = None
        self._in_bad_stretch = False
        return body
