"""The KV buffer: allocated once, a few slots (one per recently used document), prefix matching.

Layout: one tensor (layers, 2, slots, KVH, capacity, D); for a layer and slot, K and V are each
(KVH, capacity, D), contiguous. `capacity` is the max context plus `pad` rows so that a padded,
fixed-size prefill (CUDA graph bucket) never writes past the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lsp_dscoder.engine.config import ModelConfig


@dataclass
class Slot:
    index: int
    tokens: list[int] = field(default_factory=list)  # ids whose K/V rows [0, len) are valid
    # logits (V,) computed at a position, kept for the last prompt/generated positions so that a
    # prompt that ends inside cached tokens (typing through a suggestion) needs no prefill at all.
    logits: dict[int, torch.Tensor] = field(default_factory=dict)
    key: str | None = None
    last_used: int = 0

    def truncate(self, n: int) -> None:
        """Keep only the first n cached tokens (the rest will be overwritten)."""
        del self.tokens[n:]
        for pos in [p for p in self.logits if p >= n]:
            del self.logits[pos]


@dataclass(frozen=True)
class Match:
    slot: Slot
    reused: int  # tokens of the prompt whose K/V is already in the slot
    cached_logits: torch.Tensor | None  # logits at the prompt's last position when fully cached


def common_prefix(a: list[int], b: tuple[int, ...] | list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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

    def match(self, prompt: tuple[int, ...], key: str | None) -> Match:
        """Choose a slot for `prompt`: the document's own slot (`key`), unless another slot holds at
        least twice as long a prefix; a new document takes another's slot only if it holds most of the
        prompt, else the LRU one. Without a key, the longest prefix wins."""
        self._clock += 1
        lcp = {s.index: common_prefix(s.tokens, prompt) for s in self.slots}
        best = max(self.slots, key=lambda s: (lcp[s.index], s.last_used))
        own = next((s for s in self.slots if key is not None and s.key == key), None)
        if own is not None and 2 * lcp[own.index] >= lcp[best.index]:
            best = own
        elif own is None and (
            lcp[best.index] == 0 or (key is not None and 2 * lcp[best.index] < len(prompt))
        ):
            best = min(self.slots, key=lambda s: (bool(s.tokens), s.last_used))
        best.key, best.last_used = key, self._clock
        n = lcp[best.index]
        cached = best.logits.get(len(prompt) - 1) if n == len(prompt) else None
        # The last prompt token must be run through the model unless its logits are cached.
        reused = n if cached is not None else min(n, len(prompt) - 1)
        best.truncate(reused)
        return Match(slot=best, reused=reused, cached_logits=cached)
