"""Keeping the engine thread's host work warm between keystrokes (`Engine.keep_warm`).

Before a keystroke's first token the engine thread does host work only: the slot match, the plan, the
healed sample (the logits row copied to the host, the candidates looked up, the row masked) and the first
token's decoding. After the 100-200 ms pause between keystrokes that code and its data have left the CPU
caches (docs/benchmarks.md, "Keeping the keystroke path warm"). While requests keep coming, the idle engine
thread replays that work for the last request every few milliseconds on its own core: it reads the slot
(never changes it), copies the kept logits row, masks and samples it, decodes the token, and drops it all.
The device only serves the row's copy, and only while nothing else runs on it.
"""

from __future__ import annotations

from lsp_dscoder.engine.api import KEEP_WARM_WINDOW_S, CompletionRequest, TokenEvent
from lsp_dscoder.engine.generate import HEALING
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.stops import StopStringFilter
from lsp_dscoder.engine.tokenizer import Tokenizer

WINDOW_S = KEEP_WARM_WINDOW_S  # no request for this long ends the replays


def rehearse(request: CompletionRequest, cache: KVCache, tokenizer: Tokenizer) -> None:
    """The host work of `generate` up to the first token's event, for `request`, read-only."""
    prompt = request.prompt_ids
    slot = next((s for s in cache.slots if s.key == request.slot_key and s.tokens), None)
    if slot is None or not prompt:
        return
    n = min(slot.match(prompt), len(prompt))
    logits = slot.logits_at(n - 1) if n else None
    if logits is None:
        return
    row = logits.detach().to("cpu").numpy()
    heal = request.heal_text
    if heal:
        token = int(HEALING.logits(row, *tokenizer.healing_index(heal), heal).argmax())
    else:
        token = int(row.argmax())
    piece = tokenizer.stream().push(token)
    text, _ = StopStringFilter(request.params.stop).push(piece[len(heal) :])
    TokenEvent(index=0, token_id=token, text=text, piece=piece, rewound=0)
