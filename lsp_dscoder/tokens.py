"""Token pieces of the prompt's middle: which known tokens can be kept, and where re-tokenising starts.

A `Piece` pairs a token id with the text it completes ('' for a token that ends inside a UTF-8
sequence; the character goes to the token that finishes it). The engine reports generated tokens this
way; `pieces_of` derives the same for tokens the tokenizer produced.

BPE merges never cross a pre-tokenizer split, so a boundary between a non-space character and a
character of another class (word / space / punctuation) is *safe*: tokenising the text after it alone
gives the same tokens as tokenising the whole. Known tokens are kept up to the last safe boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Piece:
    token_id: int
    text: str


def _kind(char: str) -> int:
    if char.isalnum() or char == "_":
        return 0
    if char.isspace():
        return 1
    return 2


def safe_boundary(text: str, at: int) -> bool:
    """Whether tokenising text[:at] and text[at:] separately gives the tokens of the whole."""
    if at <= 0 or at >= len(text):
        return True
    before, after = text[at - 1], text[at]
    return not before.isspace() and _kind(before) != _kind(after)


def pieces_of(tokenizer: TextTokenizer, text: str, ids: Sequence[int]) -> tuple[Piece, ...]:
    """Pieces for `ids`, the tokenisation of `text`. Each token's text is what decoding it adds to the
    tokens since the last character boundary (with one token before them as context, as incremental
    detokenisers do), so the work is linear in the number of tokens."""
    pieces = []
    done = 0  # characters of `text` spelled so far
    start = 0  # first token after the last character boundary
    for k, token_id in enumerate(ids):
        context = max(0, start - 1)
        base = tokenizer.decode(ids[context:start]) if context < start else ""
        full = tokenizer.decode(ids[context : k + 1])
        chunk = full[len(base) :] if full.startswith(base) else ""
        if chunk and not chunk.endswith("\ufffd") and text.startswith(chunk, done):
            pieces.append(Piece(token_id, chunk))
            done, start = done + len(chunk), k + 1
        else:
            pieces.append(Piece(token_id, ""))
    return tuple(pieces)


def cut_known(tokenizer: TextTokenizer, text: str, known: Sequence[Piece]) -> tuple[tuple[Piece, ...], int]:
    """Pieces for `text`: the longest run of `known` that spells a prefix of it ending at a safe
    boundary, then the tokenisation of the rest. Returns the pieces and how many came from `known`."""
    keep, keep_at, at = 0, 0, 0
    for k, piece in enumerate(known):
        if not text.startswith(piece.text, at):
            break
        at += len(piece.text)
        if piece.text and safe_boundary(text, at):
            keep, keep_at = k + 1, at
    if keep and tokenizer.decode([p.token_id for p in known[:keep]]) != text[:keep_at]:
        keep, keep_at = 0, 0  # pieces that do not spell their tokens (held-back stop text): re-tokenise
    rest = text[keep_at:]
    rest_ids = tokenizer.encode(rest) if rest else []
    return tuple(known[:keep]) + pieces_of(tokenizer, rest, rest_ids), keep
