"""Public types of the engine: requests, streamed events, results and their stats.

The server (and any other caller) talks to the engine only through these types and `Engine`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A typing burst ends this long after its last keystroke: the server's keep-warm replays and the engine
# thread's stop then (lsp_dscoder/keep_warm.py, engine/warm.py).
KEEP_WARM_WINDOW_S = 1.5


class StopReason(enum.Enum):
    EOS = "eos"
    MAX_TOKENS = "max_tokens"
    STOP_STRING = "stop_string"
    DEADLINE = "deadline"
    CANCELLED = "cancelled"
    CONTEXT_FULL = "context_full"
    ERROR = "error"  # a backend that reports failures as results (the remote one); see Completion.error


@dataclass(frozen=True)
class SamplingParams:
    """How to decode. Greedy unless temperature > 0."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0 <= self.temperature < math.inf:  # NaN too: sampling would fail on it mid-request
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class CompletionRequest:
    """A prompt already in token ids, how to decode it, and which cache slot it prefers.

    `heal_text` is token healing: the caller left the prompt's last token(s) out, and generation is
    constrained to tokens that spell that text first, so that the model can pick the token the text
    belongs to (`self.va` continues as `value`, not as `va` + `lue`). Every token that can spell it
    stays a candidate, but one that shows nothing yet needs better odds than the tokens that spell more
    (`Healing.exact_odds` times for the token that is exactly the text, `partial_odds` more for one that
    spells only a part: engine/generate.py). The healed characters are not part of the completion's
    text; the tokens that spell them are in its `token_ids`. The engine may heal one more prompt token
    itself (`TokenEvent.rewound`) when that saves running the model on it.

    `deadline` is an absolute `time.monotonic()` value; generation stops with
    StopReason.DEADLINE once it passes. `slot_key` (e.g. a document URI) is a hint: the slot with the
    longest common prefix wins, ties go to the slot last used with this key.
    """

    # the engine takes them as an array('q') (`prefix.as_ids`): pass one, and leave it as it is until done
    prompt_ids: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    slot_key: str | None = None
    deadline: float | None = None
    heal_text: str = ""  # text the completion must start with, left out of its text (token healing)
    # Called on the producing thread with each event before any consumer can see it; returns True when
    # it has delivered the event's text itself (then the producer does not wait for a consumer to take
    # the first visible text: CompletionHandle.HANDOVER_S). It must be quick and must not raise.
    observer: Callable[[TokenEvent], bool] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TokenEvent:
    """Text that became final. Normally one generated token (`text` may be '' mid UTF-8 character or
    while it could still be the start of a stop string); the last event of a stream may carry only the
    held-back text, with `token_id` None. The concatenated texts equal `Completion.text`."""

    index: int
    token_id: int | None
    text: str
    piece: str | None = None  # the token's own text as decoded, healed characters included; None: flush
    # prompt tokens (at its end) this token spells again: the engine healed them from cached logits
    # instead of running the model on them. Only the first event carries it.
    rewound: int = 0


@dataclass(frozen=True)
class CompletionStats:
    prompt_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    generated_tokens: int
    queue_s: float
    ttft_s: float | None
    decode_tokens_per_s: float | None
    total_s: float
    stop_reason: StopReason
    slot: int
    # decode steps run after the first sampled token before the first visible text (0: the first token
    # was visible); None when no text was produced. Token healing's cost, in forwards.
    steps_to_text: int | None = None
    # from the start of generation to the first visible text (the user's first character, as the engine
    # sees it); None when no text was produced. ttft_s is the first *sampled* token, which with token
    # healing may only spell typed text again.
    text_s: float | None = None
    # generated tokens fed back without a forward: the slot held them, with their logits, from the
    # request before (token healing spelling the typed word as the last generation did)
    replayed_tokens: int = 0
    # draft tokens looked up in the request's own tokens and run with a decoded token (greedy decoding,
    # engine/lookup.py), and those the model agreed with: generated without a step of their own
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    # of queue_s, the time until the request before this one stopped (a generation still running at the
    # submit, told to stop by the keystroke that sent this one); None when the engine was idle
    stopping_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["stop_reason"] = self.stop_reason.value
        return d


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]
    stats: CompletionStats
    error: str | None = None  # set only with StopReason.ERROR (the local engine raises instead)
