"""FIM prompts laid out so that typing only appends tokens (DESIGN.md, "Prompt layout that survives typing").

    <bos> FIM_BEGIN {context}{text before the anchor} FIM_HOLE {text after the cursor} FIM_END {middle}

Everything up to <｜fim▁end｜> is the *head*: built when the edit anchor moves and reused unchanged while
the user types near the anchor, so the engine's prefix match covers it. The *middle* (anchor to cursor)
is re-tokenised from the last safe boundary; tokens the model generated (or that the last prompt held)
are reused up to that boundary, so accepting a suggestion costs no prefill.

Token healing: the middle's last token (`self.va`: the `va`) is left out of the prompt and passed as
the request's `heal_text`, so that the model chooses the token it belongs to (`value`) rather than
continuing from a token the cursor happened to cut (`v`, `a`). Only the last token: healing more costs
decode steps the user never sees. A line holding only indentation is healed whole, from the line start,
so the prompt is the same whether the request came before or after the editor indented the new line.

Work is bounded by the budgets, not the document: every search and tokenisation looks at most
`_MAX_CHARS_PER_TOKEN` characters per budgeted token around the cursor (a 5 MB line costs what a short
one does).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from lsp_dscoder.tokens import Piece, cut_known, pieces_of, safe_boundary

_C_LIKE = {"c", "cpp", "csharp", "cuda-cpp", "go", "java", "javascript", "javascriptreact", "typescript"}
_C_LIKE |= {"typescriptreact", "rust", "kotlin", "scala", "swift", "dart", "php", "objective-c", "zig"}
_DASHES = {"lua", "sql", "haskell", "elm", "ada"}
_CONTEXT_CACHE_SIZE = 64
_MAX_CHARS_PER_TOKEN = 8  # a window this wide holds enough tokens for the budget in practice
_FIM_MARKERS = 4  # <bos> FIM_BEGIN FIM_HOLE FIM_END
_MAX_HEAL_CHARS = 32


class FimTokenizer(Protocol):
    bos_id: int
    fim_begin_id: int
    fim_hole_id: int
    fim_end_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Budgets:
    """Token budgets of the prompt's parts and how the anchor and truncation points move: the one
    definition (the server's settings carry the same fields, read with `Budgets.of`)."""

    context_tokens: int = 1024  # other open documents
    prefix_tokens: int = 1536  # text before the edit anchor
    suffix_tokens: int = 512  # text after the cursor
    middle_tokens: int = 256  # text from the anchor to the cursor; past this the anchor moves
    anchor_lines: int = 4  # typing this many lines below the anchor keeps it
    truncation_step_tokens: int = 256  # room a fresh prefix cut leaves to grow into

    @classmethod
    def of(cls, source: Any) -> Budgets:
        """The budgets held by `source` (the server's `Settings`), field by field of this class."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls)})

    def room(self, max_context: int, max_tokens: int) -> int:
        """Tokens left for context, prefix and suffix once the middle, the FIM markers and
        `max_tokens` generated tokens have theirs."""
        return max_context - max_tokens - self.middle_tokens - _FIM_MARKERS

    def fit(self, max_context: int, max_tokens: int) -> Budgets:
        """Shrink context, prefix and suffix proportionally so that a full prompt plus `max_tokens`
        generated tokens fits in `max_context`."""
        room = self.room(max_context, max_tokens)
        parts = self.context_tokens + self.prefix_tokens + self.suffix_tokens
        if parts <= room:
            return self
        if room <= 0:
            raise ValueError(
                f"max_context {max_context} leaves no room for a prompt after max_tokens {max_tokens} "
                f"and middle_tokens {self.middle_tokens}"
            )
        scale = room / parts
        return replace(
            self,
            context_tokens=int(self.context_tokens * scale),
            prefix_tokens=int(self.prefix_tokens * scale),
            suffix_tokens=int(self.suffix_tokens * scale),
        )


@dataclass(frozen=True)
class ContextFile:
    """Another open document. `key` (uri, version) identifies its text for the tokenisation cache."""

    path: str
    text: str
    language_id: str | None
    key: tuple[str, int | None]


@dataclass(frozen=True)
class Head:
    """The prompt up to and including <｜fim▁end｜>, valid while the text before `anchor` and the text
    after the cursor stay as they were."""

    ids: tuple[int, ...]
    anchor: int  # offset where the middle starts (a line start unless that line is huge)
    before: str  # text[prefix_start:anchor] when built: what the prefix tokens spell
    after: str  # the start of the text after the cursor when built (a window the suffix fits in)
    after_length: int  # len(text) - cursor when built
    prefix_start: int  # offset where the prefix starts
    context_tokens: int
    prefix_tokens: int
    suffix_tokens: int


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]
    head: Head
    head_reused: bool
    middle: str
    middle_pieces: tuple[Piece, ...]  # the tokens of the middle in `ids` (all of it but `heal_text`)
    known_reused: int  # middle tokens taken from the known pieces rather than re-tokenised
    heal_text: str = ""  # the end of the middle, left for the model to spell (token healing)


def heal_start(middle: str) -> int:
    """The last safe boundary of `middle` within its last `_MAX_HEAL_CHARS` characters (len(middle)
    when there is none): tokens before it are the whole middle's, so healing can start there."""
    for at in range(len(middle) - 1, max(-1, len(middle) - _MAX_HEAL_CHARS - 1), -1):
        if safe_boundary(middle, at):
            return at
    return len(middle)


def comment_prefix(language_id: str | None) -> str:
    if language_id in _C_LIKE:
        return "//"
    if language_id in _DASHES:
        return "--"
    return "#"


def _line_start(text: str, offset: int, low: int = 0) -> int | None:
    """Start of the line holding `offset`, looked for in text[low:offset]; None if it starts earlier."""
    start = max(text.rfind("\n", low, offset), text.rfind("\r", low, offset)) + 1
    return start if start > 0 or low == 0 else None


@dataclass(frozen=True)
class _Heal:
    cut: int  # the middle up to here is tokenised (with known pieces reused) ...
    tail_ids: tuple[int, ...]  # ... then these tokens of the text after `cut` ...
    text: str  # ... and the rest is left to the model


class PromptBuilder:
    """Builds prompts for one tokenizer and one set of budgets; caches tokenised context files."""

    def __init__(self, tokenizer: FimTokenizer, budgets: Budgets, heal: bool = True) -> None:
        self.tokenizer = tokenizer
        self.budgets = budgets
        self.heal = heal
        self._context_cache: OrderedDict[tuple, tuple[int, ...]] = OrderedDict()

    def build(
        self,
        text: str,
        cursor: int,
        context: Callable[[], Sequence[ContextFile]] = tuple,
        language_id: str | None = None,
        head: Head | None = None,
        known: Sequence[Piece] = (),
    ) -> Prompt:
        """The prompt for a cursor at `cursor` (an offset into `text`). Pass the previous prompt's `head`
        and the pieces the engine's slot holds after it (`known`) to keep the prompt append-only.
        `context` is called only when the head has to be rebuilt."""
        if head is not None and self._head_valid(head, text, cursor):
            middle = text[head.anchor : cursor]
            heal = self._heal(middle)
            pieces, taken = cut_known(self.tokenizer, middle[: heal.cut], known)
            pieces += self._tail(middle, heal)
            if len(pieces) <= self.budgets.middle_tokens:
                ids = head.ids + tuple(p.token_id for p in pieces)
                return Prompt(ids, head, True, middle, pieces, taken, heal.text)
        anchor = _line_start(text, cursor, max(0, cursor - self._chars(self.budgets.middle_tokens)))
        middle = "" if anchor is None else text[anchor:cursor]
        heal = self._heal(middle)
        # `cut` is a safe boundary: the tokens of the two parts are the whole middle's
        ids = self.tokenizer.encode(middle[: heal.cut]) + list(heal.tail_ids)
        if anchor is None or len(ids) + bool(heal.text) > self.budgets.middle_tokens:
            # A single huge line: anchor at the cursor, the line's start becomes prefix text.
            anchor, middle, ids, heal = cursor, "", [], _Heal(0, (), "")
        new_head = self._head(text, anchor, cursor, context(), language_id, head)
        pieces = pieces_of(self.tokenizer, middle[: heal.cut], ids[: len(ids) - len(heal.tail_ids)])
        pieces += self._tail(middle, heal)
        return Prompt(new_head.ids + tuple(ids), new_head, False, middle, pieces, 0, heal.text)

    def _heal(self, middle: str) -> _Heal:
        """What of the middle is left to the model: its last word (with the one space before it that
        the pre-tokenizer joins to it), when that is short ASCII text on one line; a line of
        indentation alone, whole, from the line start."""
        whole = _Heal(len(middle), (), "")
        if not self.heal or not middle:
            return whole
        line = max(middle.rfind("\n"), middle.rfind("\r")) + 1
        if line < len(middle) and not middle[line:].strip(" \t"):
            return _Heal(line, (), middle[line:])
        cut = heal_start(middle)
        tail = middle[cut:]
        space = len(tail) - len(tail.lstrip())  # "    chunks": heal " chunks", not the indentation too
        keep = space if space and tail[space - 1] in "\r\n" else max(0, space - 1)
        rest = tail[keep:]
        if not rest or not rest.isascii() or "\n" in rest or "\r" in rest:
            return whole
        # A whitespace run followed by a word is split before the word's space by the pre-tokenizer,
        # so these tokens are the whole tail's.
        return _Heal(cut, tuple(self.tokenizer.encode(tail[:keep])) if keep else (), rest)

    def _tail(self, middle: str, heal: _Heal) -> tuple[Piece, ...]:
        end = len(middle) - len(heal.text)
        return pieces_of(self.tokenizer, middle[heal.cut : end], heal.tail_ids)

    def _chars(self, tokens: int) -> int:
        """Characters searched or tokenised for a budget of `tokens`."""
        return tokens * _MAX_CHARS_PER_TOKEN

    def _head_valid(self, head: Head, text: str, cursor: int) -> bool:
        return (
            head.anchor <= cursor <= head.anchor + self._chars(self.budgets.middle_tokens)
            and len(text) - cursor == head.after_length
            and text.startswith(head.before, head.prefix_start)
            and text.startswith(head.after, cursor)
            and text.count("\n", head.anchor, cursor) <= self.budgets.anchor_lines
        )

    def _head(
        self,
        text: str,
        anchor: int,
        cursor: int,
        context: Sequence[ContextFile],
        language_id: str | None,
        previous: Head | None,
    ) -> Head:
        tok = self.tokenizer
        context_ids = self._context_ids(context, language_id)
        start = self._prefix_start(text, anchor, previous)
        prefix_ids = tok.encode(text[start:anchor]) if start < anchor else []
        suffix_ids = self._suffix_ids(text, cursor)
        ids = (
            tok.bos_id,
            tok.fim_begin_id,
            *context_ids,
            *prefix_ids,
            tok.fim_hole_id,
            *suffix_ids,
            tok.fim_end_id,
        )
        return Head(
            ids,
            anchor,
            text[start:anchor],
            text[cursor : cursor + self._chars(self.budgets.suffix_tokens) + 1],
            len(text) - cursor,
            start,
            len(context_ids),
            len(prefix_ids),
            len(suffix_ids),
        )

    def _prefix_start(self, text: str, anchor: int, previous: Head | None) -> int:
        """Where the prefix starts. The previous head's start is kept while the text it spelled is
        unchanged and the prefix still fits, so the cached tokens stay valid as the anchor moves down.
        A fresh cut takes whole lines back from the anchor up to `budget - step` tokens, leaving `step`
        tokens of room: the cut then moves in coarse steps, not with every line."""
        budget = self.budgets.prefix_tokens
        low = max(0, anchor - self._chars(budget))
        if previous is not None and low <= previous.prefix_start <= anchor:
            start = previous.prefix_start
            same = text.startswith(previous.before, start) and start + len(previous.before) <= anchor
            if same and len(self.tokenizer.encode(text[start:anchor])) <= budget:
                return start
        target = budget - min(self.budgets.truncation_step_tokens, budget // 2)
        pos, used = anchor, 0
        while pos > 0:
            start_or_none = _line_start(text, pos - 1, low)
            if start_or_none is None:
                break
            cost = len(self.tokenizer.encode(text[start_or_none:pos]))
            if used + cost > target:
                break
            used, pos = used + cost, start_or_none
        if pos == anchor and anchor > 0:
            return self._partial_line_start(text, anchor, target)
        return pos

    def _partial_line_start(self, text: str, anchor: int, budget: int) -> int:
        """The line before the anchor alone is over budget (minified code): keep the tail of it that
        fits, cut at a token boundary."""
        low = max(0, anchor - self._chars(budget))
        window = _line_start(text, anchor - 1, low)
        window = low if window is None else window
        ids = self.tokenizer.encode(text[window:anchor])
        if len(ids) <= budget:
            return window
        dropped = self.tokenizer.decode(ids[: len(ids) - budget])
        return window + len(dropped) if text.startswith(dropped, window) else anchor

    def _suffix_ids(self, text: str, cursor: int) -> list[int]:
        """Whole lines after the cursor within the budget (the cursor line's rest first)."""
        return self._leading_lines(text, cursor, self.budgets.suffix_tokens)

    def _leading_lines(self, text: str, start: int, budget: int) -> list[int]:
        """Tokens of the most whole lines from `start` that fit `budget`, tokenised together (lines
        tokenised one by one would split "\n" from the next line's indentation)."""
        ends, pos, estimate = [], start, 0
        limit = start + self._chars(budget)  # lines ending past this cannot fit
        while pos < len(text):
            nxt = text.find("\n", pos, limit)
            if nxt < 0 and limit < len(text):
                break
            end = len(text) if nxt < 0 else nxt + 1
            estimate += len(self.tokenizer.encode(text[pos:end]))
            if estimate > budget:
                break
            ends.append(end)
            pos = end
        while ends:
            ids = self.tokenizer.encode(text[start : ends.pop()])
            if len(ids) <= budget:
                return ids
        return []

    def _context_ids(self, files: Sequence[ContextFile], language_id: str | None) -> list[int]:
        """Other documents with path headers, in path order (stable across keystrokes), each cut at a
        line end so that the total stays within the context budget."""
        budget = self.budgets.context_tokens
        ids: list[int] = []
        for f in sorted(files, key=lambda f: f.path):
            room = budget - len(ids)
            if room <= 0:
                break
            key = (f.key, room, language_id)
            block = self._context_cache.get(key)
            if block is None:
                block = self._context_block(f, room, language_id)
                self._context_cache[key] = block
                if len(self._context_cache) > _CONTEXT_CACHE_SIZE:
                    self._context_cache.popitem(last=False)
            else:
                self._context_cache.move_to_end(key)
            ids += block
        return ids

    def _context_block(self, f: ContextFile, room: int, language_id: str | None) -> tuple[int, ...]:
        header = f"{comment_prefix(language_id or f.language_id)} {f.path}\n"
        limit = self._chars(room)
        body = f.text if len(f.text) <= limit else f.text[: f.text.rfind("\n", 0, limit) + 1]
        body = body if body.endswith("\n") or not body else body + "\n"
        ids = self._leading_lines(header + body, 0, room)
        return tuple(ids) if len(ids) > len(self.tokenizer.encode(header)) else ()
