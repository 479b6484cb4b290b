"""The hot path: prefill the tokens the cache lacks, then decode one token at a time.

`generate` reads top to bottom: match a cache slot, plan where decoding starts (`plan`), prefill in
chunks (checking cancel/deadline between chunks and, inside a forward, between layers), then sample /
stream / feed back until a stop condition. The arithmetic is a `Runner`'s: the reference path (any
device) or the fast path (CUDA).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from lsp_dscoder.engine.api import (
    Completion,
    CompletionRequest,
    CompletionStats,
    SamplingParams,
    StopReason,
    TokenEvent,
)
from lsp_dscoder.engine.kv_cache import KVCache, Match
from lsp_dscoder.engine.lookup import DRAFT_MAX, Drafts
from lsp_dscoder.engine.stops import StopStringFilter
from lsp_dscoder.engine.tokenizer import Tokenizer

MAX_REWOUND_HEAL = 32  # characters: healing longer text than this is not worth a saved prefill


Interrupted = Callable[[], bool]


class Runner(Protocol):
    """The arithmetic of one forward. `interrupted` is asked between layers (reference path) or graph
    replays (fast path); when it says so the forward stops early and returns None, its rows not valid."""

    def prefill(
        self, ids: torch.Tensor, start: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        """Run ids (T,) at positions start.. of slot; logits (1, V) float32 of the last position."""
        ...

    def decode(
        self, token: int, pos: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        """Run one token at position pos; logits (1, V) float32."""
        ...

    def chunk(self, remaining: int, start: int, limit: int) -> int:
        """Tokens of the next prefill step at `start`, of `remaining` (at most `limit` where the runner has
        no longer steps that run faster)."""
        ...

    def verify(
        self, ids: torch.Tensor, start: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        """prefill's step for a token and its drafts (at most DRAFT_MAX + 1 ids); logits (T, V) float32 of
        every position."""
        ...


def sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax(dim=-1).item())
    probs = torch.softmax(logits.float().squeeze(0) / temperature, dim=-1)  # (V,)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen).item())


@dataclass(frozen=True)
class Healing:
    """How generation spells the healed text. Every token that can spell it stays allowed (the
    model's own choice is what makes healing worth it), but the tokens differ in when the suggestion
    shows: one that spells more than the text shows it at once; the one that is exactly the text shows
    nothing until the next decode step; one that spells only part of it shows nothing for a step or more
    and leaves the rest to spell in pieces. So the exact token's odds are divided by `exact_odds` against
    the longer ones, and a partial token's by `partial_odds` more: each is chosen only when the model is
    that much surer of it. Indentation is healed plainly, every tier even: the tokenizer itself spells
    spaces before a word as a run and a space on the word (4 typed spaces before `return` are "   " +
    " return", a partial token), and a longer run indents deeper than the user did; favouring it turned
    4 typed spaces into 8. Odds of 1 are plain healing; the measured choice of `exact_odds` is in
    docs/benchmarks.md."""

    partial_odds: float = 16.0
    exact_odds: float = 4.0

    def __post_init__(self) -> None:
        for name in ("partial_odds", "exact_odds"):
            if not getattr(self, name) >= 1.0:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def logits(
        self,
        logits: npt.ArrayLike,
        longer: npt.NDArray[np.int64],
        exact: npt.NDArray[np.int64],
        partial: npt.NDArray[np.int64],
        text: str,
    ) -> npt.NDArray[np.float32]:
        """A copy of `logits` (V,) or (1, V), float32 on the host, with only the candidates for `text`
        left (`Tokenizer.healing_index`), handicapped by tier. A tier with none above it is not
        handicapped: a common handicap would change nothing."""
        row = np.asarray(logits, dtype=np.float32).reshape(-1)
        out = np.full_like(row, -np.inf)
        out[longer] = row[longer]
        if text.isspace():  # indentation: every tier even (a longer run indents deeper than typed)
            out[exact], out[partial] = row[exact], row[partial]
            return out
        handicap = 0.0
        if len(exact):
            handicap = math.log(self.exact_odds) if len(longer) else 0.0
            out[exact] = row[exact] - np.float32(handicap)
        if len(partial):
            handicap += math.log(self.partial_odds) if len(longer) or len(exact) else 0.0
            out[partial] = row[partial] - np.float32(handicap)
        return out

    def sample(
        self,
        logits: torch.Tensor,
        tokenizer: Tokenizer,
        text: str,
        params: SamplingParams,
        gen: torch.Generator | None,
    ) -> int:
        """The first token(s) of a healed request, chosen on the host: the logits row comes over once
        (the sample needs it there anyway) and numpy masks it, where the same masking on the device took
        about ten launches and their waits, a third of a keystroke's time to its first token (H200,
        docs/benchmarks.md). Greedy picks the first maximum in vocabulary order, as `argmax` does."""
        masked = self.logits(logits.detach().to("cpu").numpy(), *tokenizer.healing_index(text), text)
        if params.temperature <= 0:
            return int(masked.argmax())
        return sample(torch.from_numpy(masked).unsqueeze(0), params.temperature, params.top_p, gen)


HEALING = Healing()


@dataclass(frozen=True)
class Start:
    """Where decoding starts: the prompt still to run, the text left to heal, the logits to sample
    first (None: after the prefill), and how many prompt tokens were moved into the healing."""

    prompt: Sequence[int]
    heal: str
    logits: torch.Tensor | None
    rewound: int


def plan(request: CompletionRequest, match: Match, tokenizer: Tokenizer) -> Start:
    """Skip the 1-token prefill of a prompt whose last token is cached without its logits while the
    token before has them: heal that token's text instead (the first sampled token spells it again,
    usually together with the suggestion's first characters)."""
    prompt, heal = request.prompt_ids, request.heal_text
    n = len(prompt)
    if match.cached_logits is not None or match.reused != n - 1 or n < 2:
        return Start(prompt, heal, match.cached_logits, 0)
    before = match.slot.logits_at(n - 2)
    text = tokenizer.decode([prompt[-1]])
    healable = bool(text) and "\ufffd" not in text and len(text + heal) <= MAX_REWOUND_HEAL
    if before is None or not healable or not tokenizer.can_heal(text + heal):
        return Start(prompt, heal, None, 0)
    return Start(prompt[:-1], text + heal, before, 1)


def generate(
    request: CompletionRequest,
    runner: Runner,
    cache: KVCache,
    tokenizer: Tokenizer,
    cancel: threading.Event,
    emit: Callable[[TokenEvent], None],
    prefill_chunk: int,
    queued_at: float,
    healing: Healing = HEALING,
    launched: Callable[[], None] | None = None,
    draft_tokens: int = 0,
) -> Completion:
    """Run `request` to its stop, emitting token events. `launched` is called once: when this thread is
    about to wait for a forward it queued (the runner asks `stale` there, and the sample after a forward
    waits), or to emit visible text, whichever comes first; not at all if the request stops before.
    `draft_tokens`: greedy decoding runs up to that many tokens looked up in the request's own tokens
    (engine/lookup.py) with the token it decodes, as one step, and keeps those the model agrees with."""
    if not 0 <= draft_tokens <= DRAFT_MAX:
        raise ValueError(f"draft_tokens must be in [0, {DRAFT_MAX}], got {draft_tokens}")
    started = time.perf_counter()
    params = request.params
    device = cache.buffer.device

    def interrupted() -> StopReason | None:
        if cancel.is_set():
            return StopReason.CANCELLED
        if request.deadline is not None and time.monotonic() >= request.deadline:
            return StopReason.DEADLINE
        return None

    def release() -> None:
        nonlocal launched
        if launched is not None:
            launched()
            launched = None

    def stale() -> bool:  # asked inside a forward: stop it rather than finish work nobody will read
        release()  # asked once part of the forward is queued, before waiting for it
        return interrupted() is not None

    # 1. Prefix reuse: only the tokens after the longest common prefix are prefilled.
    match = cache.match(request.prompt_ids, request.slot_key)
    slot = match.slot
    begin = plan(request, match, tokenizer)
    prompt, logits, pos = begin.prompt, begin.logits, len(slot.tokens)
    stop = interrupted()
    while stop is None and pos < len(prompt):
        n = runner.chunk(len(prompt) - pos, pos, prefill_chunk)
        ids = torch.tensor(prompt[pos : pos + n], dtype=torch.long, device=device)  # (n,)
        logits = runner.prefill(ids, pos, slot.index, stale)
        if logits is None:
            stop = interrupted() or StopReason.CANCELLED
            break
        slot.extend(prompt[pos : pos + n], logits if pos + n == len(prompt) else None)  # kept if cancelled
        pos += n
        stop = interrupted()
    prefilled = pos - match.reused
    # The slot's rows past the reused prompt, from the last request: valid while this one runs the
    # same tokens at the same positions (healing spelling the word as it did on the key before). Not
    # after a prefill: the fast path pads it to a graph bucket, writing rows past the prompt.
    draft, kept = (match.draft, match.draft_kept) if prefilled == 0 else ((), frozenset())

    # 2. Decode: sample, stream, feed the token back (its K/V stays cached for the next request).
    gen = torch.Generator(device="cpu").manual_seed(params.seed) if params.seed is not None else None
    decoder, stops = tokenizer.stream(), StopStringFilter(params.stop)
    out: list[int] = []
    ttft: float | None = None
    first_at = time.perf_counter()
    steps, steps_to_text = 0, None  # forwards after the first sample; those before visible text
    replayed = 0  # tokens fed back without a forward: the draft held them
    text_at: float | None = None
    heal = begin.heal  # still to be spelled by the generated tokens, and not emitted
    greedy_drafts = draft_tokens if params.temperature <= 0 else 0  # prompt lookup (engine/lookup.py)
    drafts = Drafts(request.prompt_ids, out, greedy_drafts, params.max_tokens)
    while stop is None:
        assert logits is not None
        if len(out) >= params.max_tokens:
            stop = StopReason.MAX_TOKENS
            break
        if steps or prefilled:  # the sample waits for a forward: let others use the interpreter
            release()
        if heal:
            token = healing.sample(logits, tokenizer, heal, params, gen)
        elif (pick := drafts.pick()) is not None:
            token = pick  # greedy's choice from `logits`, a row of the last drafting step
        else:
            token = sample(
                logits.to("cpu") if params.temperature > 0 else logits, params.temperature, params.top_p, gen
            )
        if ttft is None:
            first_at = time.perf_counter()
            ttft = first_at - started
        if token == tokenizer.eos_id:
            stop = StopReason.EOS
            break
        out.append(token)
        drafts.push(token)
        piece = visible = decoder.push(token)
        if heal:  # candidates decode whole: the piece spells (part of) what is left to heal
            n = min(len(heal), len(piece))
            heal, visible = heal[n:], piece[n:]
        text, hit = stops.push(visible)
        if text and steps_to_text is None:
            steps_to_text, text_at = steps, time.perf_counter()
        rewound = begin.rewound if len(out) == 1 else 0
        if text:
            release()
        emit(TokenEvent(index=len(out) - 1, token_id=token, text=text, piece=piece, rewound=rewound))
        if hit:
            stop = StopReason.STOP_STRING
        elif len(out) >= params.max_tokens:
            stop = StopReason.MAX_TOKENS  # no need to run the model for a token nobody will read
        elif pos >= cache.max_context:
            stop = StopReason.CONTEXT_FULL
        else:
            stop = interrupted()
        if stop is None:
            held = draft[pos - match.reused] if pos - match.reused < len(draft) else None
            if held == token and pos in kept:
                logits = slot.draft_logits(pos)  # this token ran here last time: its rows and logits stand
                replayed += 1
            elif (row := drafts.kept(token)) is not None:
                logits = row  # the model agreed with the draft: its step's logits stand
            else:
                draft = ()  # from here on the rows are rewritten
                room = min(params.max_tokens - len(out) - 1, cache.max_context - pos - 1)
                guess = drafts.guess(0 if heal else room)
                if guess:  # the token and its drafts in one step
                    ids = torch.tensor((token, *guess), dtype=torch.long, device=device)  # (1 + k,)
                    rows = runner.verify(ids, pos, slot.index, stale)  # (1 + k, V)
                    logits = None if rows is None else drafts.ran(guess, rows)
                else:
                    logits = runner.decode(token, pos, slot.index, stale)
                steps += 1
                if logits is None:
                    stop = interrupted() or StopReason.CANCELLED
                    break
            logits = slot.extend((token,), logits)
            pos += 1
    if stop is not StopReason.STOP_STRING:
        tail = stops.push(decoder.flush())[0] + stops.flush()
        if tail:
            if steps_to_text is None:
                steps_to_text, text_at = steps, time.perf_counter()
            release()
            emit(TokenEvent(index=len(out), token_id=None, text=tail))
    done = time.perf_counter()
    decode_s = done - first_at
    stats = CompletionStats(
        prompt_tokens=len(request.prompt_ids),
        reused_tokens=match.reused,
        prefilled_tokens=prefilled,
        generated_tokens=len(out),
        queue_s=started - queued_at,
        ttft_s=ttft,
        decode_tokens_per_s=(len(out) - 1) / decode_s if len(out) > 1 and decode_s > 0 else None,
        total_s=done - started,
        stop_reason=stop,
        slot=slot.index,
        steps_to_text=steps_to_text,
        text_s=text_at - started if text_at is not None else None,
        replayed_tokens=replayed,
        drafted_tokens=drafts.drafted,
        accepted_tokens=drafts.accepted,
    )
    return Completion(text=stops.text[: stops.emitted], token_ids=tuple(out), stats=stats)
