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
`MAX_CHARS_PER_TOKEN` characters per budgeted token around the cursor (a 5 MB line costs what a short
one does).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lsp_dscoder.positions import lf
from lsp_dscoder.prompt_parts import MAX_CHARS_PER_TOKEN, ContextCache, leading_lines
from lsp_dscoder.prompt_parts import Budgets as Budgets
from lsp_dscoder.prompt_parts import ContextFile as ContextFile
from lsp_dscoder.prompt_parts import FimTokenizer as FimTokenizer
from lsp_dscoder.tokens import Piece, cut_known, pieces_of, safe_boundary

_MAX_HEAL_CHARS = 32


@dataclass(frozen=True)
class Head:
    """The prompt up to and including <｜fim▁end｜>, valid while the text before `anchor` and the text
    after the cursor stay as they were."""

    ids: array[int]  # array('q'): extended per keystroke by a copy of raw int64s, no int objects touched
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
    ids: array[int]  # head.ids, then the middle's
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
        self._context = ContextCache(tokenizer)

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
        if head is not None and (prompt := self.extend(text, cursor, head, known)) is not None:
            return prompt
        anchor = _line_start(text, cursor, max(0, cursor - self._chars(self.budgets.middle_tokens)))
        middle = "" if anchor is None else text[anchor:cursor]
        heal = self._heal(middle)
        # `cut` is a safe boundary: the tokens of the two parts are the whole middle's
        middle_ids = self.tokenizer.encode(middle[: heal.cut]) + list(heal.tail_ids)
        if anchor is None or len(middle_ids) + bool(heal.text) > self.budgets.middle_tokens:
            # A single huge line: anchor at the cursor, the line's start becomes prefix text.
            anchor, middle, middle_ids, heal = cursor, "", [], _Heal(0, (), "")
        new_head = self._head(text, anchor, cursor, context(), language_id, head)
        cut_ids = middle_ids[: len(middle_ids) - len(heal.tail_ids)]
        pieces = pieces_of(self.tokenizer, middle[: heal.cut], cut_ids) + self._tail(middle, heal)
        return Prompt(new_head.ids + array("q", middle_ids), new_head, False, middle, pieces, 0, heal.text)

    def extend(self, text: str, cursor: int, head: Head, known: Sequence[Piece] = ()) -> Prompt | None:
        """The prompt that keeps `head` and appends the middle (the typing case), or None when the head no
        longer holds or the middle outgrew its budget (then `build` makes a new head)."""
        if not self._head_valid(head, text, cursor):
            return None
        middle = text[head.anchor : cursor]
        heal = self._heal(middle)
        pieces, taken = cut_known(self.tokenizer, middle[: heal.cut], known)
        pieces += self._tail(middle, heal)
        if len(pieces) > self.budgets.middle_tokens:
            return None
        ids = head.ids + array("q", [p.token_id for p in pieces])
        return Prompt(ids, head, True, middle, pieces, taken, heal.text)

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
        return tokens * MAX_CHARS_PER_TOKEN

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
        context_ids = self._context.ids(context, self.budgets.context_tokens, language_id)
        start = self._prefix_start(text, anchor, previous)
        prefix_ids = tok.encode(lf(text[start:anchor])) if start < anchor else []
        suffix_ids = self._suffix_ids(text, cursor)
        ids = array("q", (tok.bos_id, tok.fim_begin_id))
        ids.extend(context_ids)
        ids.extend(prefix_ids)
        ids.append(tok.fim_hole_id)
        ids.extend(suffix_ids)
        ids.append(tok.fim_end_id)
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
            if same and len(self.tokenizer.encode(lf(text[start:anchor]))) <= budget:
                return start
        target = budget - min(self.budgets.truncation_step_tokens, budget // 2)
        pos, used = anchor, 0
        while pos > 0:
            start_or_none = _line_start(text, pos - 1, low)
            if start_or_none is None:
                break
            cost = len(self.tokenizer.encode(lf(text[start_or_none:pos])))
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
        return leading_lines(self.tokenizer, text, cursor, self.budgets.suffix_tokens)
