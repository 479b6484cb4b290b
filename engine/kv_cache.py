"""The KV buffer: allocated once, a few slots (one per recently used document), prefix matching.

Layout: one tensor (layers, 2, slots, KVH, capacity, D); for a layer and slot, K and V are each
(KVH, capacity, D), contiguous. `capacity` is the max context plus `pad` rows so that a padded,
fixed-size prefill (CUDA graph bucket) never writes past the end.

A `Slot` is the one owner of what its rows hold: tokens enter it only through `extend` (after the
forward that wrote their K/V), leave it through `truncate`, and `match` measures what a prompt reuses.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.prefix import common_prefix

# Logits kept per slot (the newest positions): enough for a whole suggestion typed through.
MAX_CACHED_LOGITS = 192


@dataclass
class Slot:
    index: int
    # ids whose K/V rows [0, len) are valid; read-only outside this class
    tokens: array[int] = field(default_factory=lambda: array("q"))
    key: str | None = None
    last_used: int = 0
    # Logits (1, V) computed at a position, kept for prompt ends and generated positions so that a prompt
    # ending inside cached tokens (typing through a suggestion) needs no prefill at all. Position p's are
    # row p % MAX_CACHED_LOGITS of one buffer, allocated at the first keep: dropping them (every keystroke
    # truncates the last suggestion) frees no tensors and a match makes none.
    _ring: torch.Tensor | None = None  # (MAX_CACHED_LOGITS, V)
    _kept: set[int] = field(default_factory=set)  # positions whose logits are in the ring
    _owner: dict[int, int] = field(default_factory=dict)  # row -> the position that wrote it last

    def match(self, prompt: Sequence[int]) -> int:
        """Length of the longest common prefix of the cached tokens and `prompt`."""
        return common_prefix(self.tokens, prompt)

    def extend(self, tokens: Sequence[int], logits: torch.Tensor | None = None) -> torch.Tensor | None:
        """Tokens whose K/V rows were just written after the cached ones; `logits` are the model's
        output at the last of them (kept for a later prompt that ends there). Returns the kept copy."""
        self.tokens.extend(tokens)
        if logits is None:
            return None
        pos = len(self.tokens) - 1
        if self._ring is None:
            shape = (MAX_CACHED_LOGITS, logits.shape[-1])
            self._ring = torch.empty(shape, dtype=logits.dtype, device=logits.device)
        row = pos % MAX_CACHED_LOGITS
        self._kept.discard(self._owner.get(row, pos))  # an older position's logits that shared the row
        self._owner[row] = pos
        self._kept.add(pos)
        kept = self._ring[row : row + 1]  # (1, V)
        if kept.data_ptr() != logits.data_ptr():  # a draft's logits are already in their row
            kept.copy_(logits.reshape(1, -1))
        return kept

    def truncate(self, n: int) -> set[int]:
        """Keep only the first n cached tokens (the rest will be overwritten). Returns the positions past
        them whose logits were kept: their rows hold them until those positions are written again."""
        del self.tokens[n:]
        dropped = {p for p in self._kept if p >= n}
        self._kept -= dropped
        return dropped

    def logits_at(self, pos: int) -> torch.Tensor | None:
        """The cached logits after position `pos`, if that token is cached and they were kept."""
        return self._row(pos) if pos < len(self.tokens) and pos in self._kept else None

    def kept_positions(self) -> frozenset[int] | set[int]:
        """The positions whose logits are kept (read-only)."""
        return self._kept

    def draft_logits(self, pos: int) -> torch.Tensor:
        """The logits at a position of `Match.draft_kept`: its row holds them until this position is
        written again (a draft covers at most MAX_CACHED_LOGITS positions, one row each)."""
        return self._row(pos)

    def _row(self, pos: int) -> torch.Tensor:
        assert self._ring is not None, "no logits were kept in this slot"
        row = pos % MAX_CACHED_LOGITS
        return self._ring[row : row + 1]  # (1, V)


@dataclass(frozen=True)
class Match:
    slot: Slot
    reused: int  # tokens of the prompt whose K/V is already in the slot
    cached_logits: torch.Tensor | None  # logits at the prompt's last position when fully cached
    # The tokens the slot held from position `reused` on, and the positions among them whose logits
    # were kept (`Slot.draft_logits`): the rows are still in the buffer, valid for a request that runs the
    # same tokens there again (healing that re-spells what the last generation spelled), which then
    # needs no forward for them.
    draft: Sequence[int] = ()
    draft_kept: frozenset[int] | set[int] = frozenset()


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        num_slots: int,
        max_context: int,
        device: torch.device,
        dtype: torch.dtype,
        pad: int = 0,
    ) -> None:
        self.max_context = max_context
        self.capacity = max_context + pad
        # Never zero-filled: rows are written before they are read (attention masks beyond the length).
        self.buffer = torch.empty(
            (cfg.num_layers, 2, num_slots, cfg.num_kv_heads, self.capacity, cfg.head_dim),
            device=device,
            dtype=dtype,
        )
        self.slots = [Slot(i) for i in range(num_slots)]
        self._clock = 0

    def k(self, layer: int, slot: int) -> torch.Tensor:
        return self.buffer[layer, 0, slot]  # (KVH, capacity, D)

    def v(self, layer: int, slot: int) -> torch.Tensor:
        return self.buffer[layer, 1, slot]  # (KVH, capacity, D)

    def match(self, prompt: Sequence[int], key: str | None) -> Match:
        """Choose a slot for `prompt`: the document's own slot (`key`), unless another slot holds at
        least twice as long a prefix; a new document takes another's slot only if it holds most of the
        prompt, else the LRU one. Without a key, the longest prefix wins."""
        self._clock += 1
        own = next((s for s in self.slots if key is not None and s.key == key), None)
        own_lcp = own.match(prompt) if own is not None else 0
        if own is not None and 2 * own_lcp >= len(prompt):
            best, n = own, own_lcp  # no slot can hold twice as much: the others are not compared
        else:
            lcp = {s.index: own_lcp if s is own else s.match(prompt) for s in self.slots}
            best = max(self.slots, key=lambda s: (lcp[s.index], s.last_used))
            if own is not None and 2 * lcp[own.index] >= lcp[best.index]:
                best = own
            elif own is None and (
                lcp[best.index] == 0 or (key is not None and 2 * lcp[best.index] < len(prompt))
            ):
                best = min(self.slots, key=lambda s: (bool(s.tokens), s.last_used))
            n = lcp[best.index]
        best.key, best.last_used = key, self._clock
        cached = best.logits_at(len(prompt) - 1) if n == len(prompt) else None
        # The last prompt token must be run through the model unless its logits are cached.
        reused = n if cached is not None else min(n, len(prompt) - 1)
        # Rows past `reused` are rewritten: a last prompt token cached without its logits is run again
        # (or healed, its row then taken by the token that spells it again).
        draft = best.tokens[reused : reused + MAX_CACHED_LOGITS]  # past that no logits are kept
        kept = best.truncate(reused)
        return Match(slot=best, reused=reused, cached_logits=cached, draft=draft, draft_kept=kept)
