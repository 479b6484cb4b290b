"""Draft tokens for greedy decoding, looked up in the request's own tokens (prompt lookup).

Code repeats itself: a name, a call, a line like the one above or below the cursor. So the tokens that
followed the latest earlier occurrence of the last few tokens (the prompt's, then the generated ones) are
often the model's next ones. generate.py runs them together with the token it decodes, as one step, and
keeps those the model agrees with: the output is greedy decoding's, and on the GPU a step of eight tokens
costs about what a step of one does (the weights are read once either way).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

DRAFT_MAX = 7  # draft tokens a step at most: with its token, the fast path's 8-token graph
# The fast path's default: a step of 8 tokens costs 1.04-1.07x a decode step at 4K cached (H200, 1.3B and
# 6.7B shapes), and 7 drafts kept more tokens than 3 (docs/benchmarks.md "Draft tokens").
FAST_PATH_DRAFTS = 7


class Lookup:
    """The request's tokens so far, and drafts for what follows them. `min_ngram`..`max_ngram`: how many
    of the last tokens must recur (the longest that does wins; among its occurrences, the latest)."""

    def __init__(self, prompt: Sequence[int], room: int, min_ngram: int = 2, max_ngram: int = 3) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.ids = np.empty(len(prompt) + room, dtype=np.int64)  # the prompt, then up to `room` tokens
        self.ids[: len(prompt)] = np.asarray(prompt, dtype=np.int64)
        self.n = len(prompt)

    def push(self, token: int) -> None:
        """A generated token (past `room` of them, not kept: drafts come from what is)."""
        if self.n < len(self.ids):
            self.ids[self.n] = token
            self.n += 1

    def propose(self, k: int) -> tuple[int, ...]:
        """Up to k tokens that followed the latest earlier occurrence of the last n tokens, n from
        max_ngram down to min_ngram; () when none recurs."""
        ids, end = self.ids, self.n
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if k < 1 or end <= n:
                continue
            # Occurrences starting at i < end - n, so that at least one token follows each.
            hit = ids[: end - n] == ids[end - n]
            for j in range(1, n):
                hit &= ids[j : end - n + j] == ids[end - n + j]
            found = np.flatnonzero(hit)
            if found.size:
                after = int(found[-1]) + n
                return tuple(int(t) for t in ids[after : min(after + k, end)])
        return ()


class Drafts:
    """One request's drafting (greedy decoding only; `k` 0 turns it off): the lookup over the prompt and
    the generated tokens `out` (made at the first draft, not on the way to the first token), and the rows
    of the last drafting step, valid while the sampled tokens keep matching its drafts."""

    def __init__(self, prompt: Sequence[int], out: list[int], k: int, max_tokens: int) -> None:
        self.prompt, self.out, self.k, self.max_tokens = prompt, out, k, max_tokens
        self.lookup: Lookup | None = None
        # each draft, and the logits its step computed after it
        self.rows: list[tuple[int, torch.Tensor]] = []
        self.picks: list[int] = []  # greedy's tokens from those rows, read in one wait for the step
        self.drafted = self.accepted = 0

    def pick(self) -> int | None:
        """Greedy's next token, if the last drafting step computed the logits it is sampled from."""
        return self.picks.pop(0) if self.picks else None

    def push(self, token: int) -> None:
        if self.lookup is not None:
            self.lookup.push(token)

    def kept(self, token: int) -> torch.Tensor | None:
        """The logits after `token` when it is the next draft (the model agreed with it); else None."""
        if self.rows and self.rows[0][0] == token:
            self.accepted += 1
            return self.rows.pop(0)[1]
        return None

    def guess(self, room: int) -> tuple[int, ...]:
        """Drafts to run after the token being decoded (at most `room`); the last step's rows are dropped."""
        self.rows, self.picks = [], []
        if self.k == 0 or room < 1:
            return ()
        if self.lookup is None:
            self.lookup = Lookup(self.prompt, self.max_tokens)
            for token in self.out:
                self.lookup.push(token)
        return self.lookup.propose(min(self.k, room))

    def ran(self, guess: tuple[int, ...], rows: torch.Tensor) -> torch.Tensor:
        """Keep a drafting step's rows (1 + len(guess), V); the logits after the decoded token."""
        self.rows = [(t, rows[i + 1 : i + 2]) for i, t in enumerate(guess)]
        self.picks = rows.argmax(dim=-1).tolist()
        self.drafted += len(guess)
        return rows[:1]
