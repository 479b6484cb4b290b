"""The prompt's parts that do not depend on the cursor: token budgets, other open documents (with a
tokenisation cache), and whole lines within a budget. `prompt.py` lays them out around the cursor."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from lsp_dscoder.positions import lf

_C_LIKE = {"c", "cpp", "csharp", "cuda-cpp", "go", "java", "javascript", "javascriptreact", "typescript"}
_C_LIKE |= {"typescriptreact", "rust", "kotlin", "scala", "swift", "dart", "php", "objective-c", "zig"}
_DASHES = {"lua", "sql", "haskell", "elm", "ada"}
_CONTEXT_CACHE_SIZE = 64
MAX_CHARS_PER_TOKEN = 8  # a window this wide holds enough tokens for the budget in practice
_FIM_MARKERS = 4  # <bos> FIM_BEGIN FIM_HOLE FIM_END


class FimTokenizer(Protocol):
    @property
    def bos_id(self) -> int: ...

    @property
    def fim_begin_id(self) -> int: ...

    @property
    def fim_hole_id(self) -> int: ...

    @property
    def fim_end_id(self) -> int: ...

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


def comment_prefix(language_id: str | None) -> str:
    if language_id in _C_LIKE:
        return "//"
    if language_id in _DASHES:
        return "--"
    return "#"


def leading_lines(tokenizer: FimTokenizer, text: str, start: int, budget: int) -> list[int]:
    """Tokens of the most whole lines from `start` that fit `budget`, tokenised together (lines
    tokenised one by one would split "\n" from the next line's indentation). Looks at most
    MAX_CHARS_PER_TOKEN characters per token of the budget."""
    ends, pos, estimate = [], start, 0
    limit = start + budget * MAX_CHARS_PER_TOKEN  # lines ending past this cannot fit
    while pos < len(text):
        nxt = text.find("\n", pos, limit)
        if nxt < 0 and limit < len(text):
            break
        end = len(text) if nxt < 0 else nxt + 1
        estimate += len(tokenizer.encode(lf(text[pos:end])))
        if estimate > budget:
            break
        ends.append(end)
        pos = end
    while ends:
        ids = tokenizer.encode(lf(text[start : ends.pop()]))
        if len(ids) <= budget:
            return ids
    return []


class ContextCache:
    """Other documents' tokens, kept by (document version, room, language) across keystrokes."""

    def __init__(self, tokenizer: FimTokenizer) -> None:
        self.tokenizer = tokenizer
        self._blocks: OrderedDict[tuple[Any, ...], tuple[int, ...]] = OrderedDict()

    def ids(self, files: Sequence[ContextFile], budget: int, language_id: str | None) -> list[int]:
        """Other documents with path headers, in path order (stable across keystrokes), each cut at a
        line end so that the total stays within the context budget."""
        ids: list[int] = []
        for f in sorted(files, key=lambda f: f.path):
            room = budget - len(ids)
            if room <= 0:
                break
            key = (f.key, room, language_id)
            block = self._blocks.get(key)
            if block is None:
                block = self._block(f, room, language_id)
                self._blocks[key] = block
                if len(self._blocks) > _CONTEXT_CACHE_SIZE:
                    self._blocks.popitem(last=False)
            else:
                self._blocks.move_to_end(key)
            ids += block
        return ids

    def _block(self, f: ContextFile, room: int, language_id: str | None) -> tuple[int, ...]:
        header = f"{comment_prefix(language_id or f.language_id)} {f.path}\n"
        limit = room * MAX_CHARS_PER_TOKEN
        body = f.text if len(f.text) <= limit else f.text[: f.text.rfind("\n", 0, limit) + 1]
        body = lf(body if body.endswith("\n") or not body else body + "\n")
        ids = leading_lines(self.tokenizer, header + body, 0, room)
        return tuple(ids) if len(ids) > len(self.tokenizer.encode(header)) else ()
