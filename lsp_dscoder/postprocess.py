"""Stop rules: which part of the generated text becomes the suggestion, decided as tokens stream in.

The first line continues the cursor's line and is shown as it arrives. Later lines are judged when
complete; generation stops before a line that leaves the indentation scope, repeats the suffix's next
line, or is blank after a finished block. A later line is shown while it grows as soon as no rule can
reject it any more (its indentation is known and it cannot become the suffix's next line): only text
that is still ambiguous is held back. With text to the right of the cursor the suggestion is a single
line, and closing brackets/quotes that the line's rest already has are dropped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lsp_dscoder.positions import lf

CLOSERS = frozenset(")]}\"'`")
_OPEN = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}


class StopRule(enum.Enum):
    NONE = "none"
    LINE_END = "line_end"  # single-line suggestion reached its newline
    SCOPE_END = "scope_end"  # a line indented less than the cursor's line
    REPEATS_SUFFIX = "repeats_suffix"  # a line equal to the next non-blank line after the cursor
    BLANK_AFTER_BLOCK = "blank_after_block"  # a blank line once brackets are balanced


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


@dataclass(frozen=True)
class CursorContext:
    line_prefix: str  # the cursor line up to the cursor
    line_suffix: str  # the cursor line after the cursor
    next_line: str  # the first non-blank line after the cursor's line ('' if none)

    @classmethod
    def at(cls, text: str, cursor: int) -> CursorContext:
        start = text.rfind("\n", 0, cursor) + 1
        end = text.find("\n", cursor)
        end = len(text) if end < 0 else end
        following = (line for line in text[end + 1 : end + 4096].split("\n") if line.strip())
        return cls(text[start:cursor], text[cursor:end].rstrip("\r"), next(following, "").rstrip("\r"))

    @property
    def single_line(self) -> bool:
        """Text to the right of the cursor means the suggestion must end on this line."""
        return bool(self.line_suffix.strip())


class Shaper:
    """Feed generated text; read `text` (the suggestion so far, only ever extended) and `stopped`."""

    def __init__(self, ctx: CursorContext) -> None:
        self.ctx = ctx
        self.base_indent = _indent(ctx.line_prefix) if ctx.line_prefix.strip() else len(ctx.line_prefix)
        self._raw = ""
        self._accepted_lines: list[str] = []  # judged lines after the first
        self._first_done = False
        self._open = ""  # the unfinished line after the judged ones, shown because no rule can reject it
        self._finished = False
        self._balance = 0
        self.rule = StopRule.NONE
        self.text = ""

    @property
    def stopped(self) -> bool:
        return self.rule is not StopRule.NONE

    def feed(self, piece: str) -> None:
        if self.stopped or not piece:
            return
        self._raw += piece
        lines = self._lines()
        if not self._first_done and len(lines) > 1:
            self._first_done = True
            self._balance += self._bracket_delta(lines[0])
            if self.ctx.single_line:
                self.rule = StopRule.LINE_END
        for line in lines[1 + len(self._accepted_lines) : -1]:
            if not self._judge(line):
                break
        self._open = ""
        if not self.stopped and len(lines) == 2 + len(self._accepted_lines) and self._settled(lines[-1]):
            self._open = lines[-1]
        self.text = self._render(lines[0])

    def _settled(self, line: str) -> bool:
        """Whether an unfinished line will be accepted whatever ends it: it has text (so it is not
        blank and its indentation is final) and it cannot grow into the suffix's next line."""
        stripped = line.strip()
        return (
            bool(stripped)
            and _indent(line) >= self.base_indent
            and not self.ctx.next_line.strip().startswith(stripped)
        )

    def finish(self) -> str:
        """Generation ended: judge the unterminated last line and release withheld text."""
        lines = self._lines(whole=True)
        if not self.stopped and len(lines) > 1 + len(self._accepted_lines) and lines[-1].strip():
            self._judge(lines[-1])
        self._finished, self._open = True, ""
        self.text = self._render(lines[0])
        return self.text

    @property
    def done(self) -> bool:
        """No more text will be added: a stop rule fired or generation ended."""
        return self.stopped or self._finished

    def first_line_ready(self, skip: int = 0) -> str | None:
        """The suggestion from `skip` to the end of its first non-blank line once that line is complete;
        None while it may still grow."""
        if not (self._first_done or self.done):
            return None
        rest = self.text[skip:]
        start = 0
        while (end := rest.find("\n", start)) >= 0:
            if rest[start:end].strip():
                return rest[:end]
            start = end + 1
        complete = not self._open or self.done  # the last line shown may still be growing
        return rest if (rest[start:].strip() and complete) or self.done else None

    def _judge(self, line: str) -> bool:
        """Accept a complete line after the first, or set the rule that stops before it."""
        stripped = line.strip()
        if stripped and _indent(line) < self.base_indent:
            self.rule = StopRule.SCOPE_END
        elif stripped and stripped == self.ctx.next_line.strip():
            self.rule = StopRule.REPEATS_SUFFIX
        elif not stripped and self._balance <= 0 and self._has_content():
            self.rule = StopRule.BLANK_AFTER_BLOCK
        else:
            self._accepted_lines.append(line)
            self._balance += self._bracket_delta(line)
            return True
        return False

    def _lines(self, whole: bool = False) -> list[str]:
        """The generated text's lines. Every line break of LSP (\r\n, \r, \n) ends a line, and the
        suggestion has "\n" (editors insert it with the document's own line ends); a trailing "\r" waits
        for what follows it unless generation has ended."""
        raw = self._raw if whole or not self._raw.endswith("\r") else self._raw[:-1]
        return lf(raw).split("\n")

    def _has_content(self) -> bool:
        first = self._lines()[0]
        return bool(first.strip()) or any(line.strip() for line in self._accepted_lines)

    @staticmethod
    def _bracket_delta(line: str) -> int:
        return sum(_OPEN.get(c, 0) for c in line)

    def _render(self, first: str) -> str:
        if self.ctx.single_line:
            first = first[: len(first) - self._closers_to_drop(first)]
        lines = [first, *self._accepted_lines, *([self._open] if self._open else [])]
        # Trailing blank lines are shown only once a line with text follows, so `text` only grows.
        while len(lines) > 1 and not lines[-1].strip():
            lines.pop()
        return "\n".join(lines)

    def _closers_to_drop(self, first: str) -> int:
        """Length of the tail of `first` made of closers that the rest of the line starts with."""
        rest = self.ctx.line_suffix.lstrip(" ")
        n = 0
        while n < len(first) and first[len(first) - n - 1] in CLOSERS:
            n += 1
        while n and not rest.startswith(first[len(first) - n :]):
            n -= 1
        return n
