"""A small step of the fast path as CUDA graphs: one graph per part (a run of consecutive layers), so that
a stale step can stop between parts.

A keystroke that supersedes a running decode step used to wait for that whole forward to finish on the
GPU (the engine thread sits in the step's sync until then): 4.7 ms at the 6.7B shape, 17 ms at 33B. With
the layers in parts, each part is launched once the one before has finished and `interrupted` is asked
each time: a new request waits for the running part only. Letting one part queue behind the running one
(`AHEAD` = 1) keeps the GPU from idling between parts, but a stop then waits for both; on the H200 that
saved 1-2% of a decode step and cost a keystroke 0.5-0.7 ms of stop (docs/benchmarks.md).

A part costs one graph launch (a few microseconds), so parts are sized by the bytes of weights they
stream, about `PART_BYTES` each, at least `MIN_PARTS` and at most `MAX_PARTS`. A model whose parts would
then stream less than `MIN_PART_BYTES` each (its launches would no longer be small next to its parts)
stays one graph. On the H200 the 1.3B shape's decode step in 4 parts stops 0.23 ms after it is told to
(1.53 ms as one graph) for 2% of its step time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from lsp_dscoder.engine.config import ModelConfig

PART_BYTES = 3 << 29  # 1.5 GiB of weights streamed per part: ~0.4 ms on an H200
MIN_PART_BYTES = 1 << 29  # 512 MiB: ~0.13 ms on an H200
MIN_PARTS = 4
MAX_PARTS = 8  # each part is a graph per (slot, bucket): capture time and memory grow with it

# Parts queued behind the running one. 0: each part is launched when the one before has finished (a
# launch gap per part), and a stop waits for the running part only. 1: the GPU never idles between parts,
# and a stop waits for the running part and the queued one.
AHEAD = 0

Interrupted = Callable[[], bool]

# Prefill steps longer than the padded buckets (engine/fast_choices.py BUCKETS), each one graph: a cold
# prompt in a few long steps instead of 512-token ones, whose GEMMs run further from the FLOP rate. Only where
# such a step stays short: a keystroke that supersedes it waits for the running part, and an unfinished step's
# rows are lost, so a step must end well within the time between two keystrokes. PREFILL_STEP_FLOP is
# ~13 ms of GEMMs at an H200's ~770 TFLOP/s: 4096 tokens of the 1.3B shape, none of 6.7B's (whose
# 512-token steps already run near its FLOP floor).
PREFILL_BUCKETS = (1024, 2048, 4096)
PREFILL_STEP_FLOP = 1.0e13
# A model too large for long graphs still takes prefill steps of these lengths, run eagerly (no graph pool),
# where its step is predicted to end within PREFILL_STEP_MS: each step has a fixed cost as well as a cost
# per token (a packed INT4 model dequantizes every matrix once a step: at the 6.7B shape 8 steps of 512
# tokens took 145 ms for a 4K prompt where 2 of 2048 took 108), and the longer steps pay it fewer times.
# The bound is what a keystroke may lose: an eager step that a newer request stops between layers leaves
# no rows, so a step must stay under the time between two keystrokes of a fast typist.
PREFILL_STEP_MS = 100.0


def part_count(layer_bytes: int, layers: int) -> int:
    """How many parts a step of a model whose layers hold `layer_bytes` of weights is cut into."""
    parts = min(MAX_PARTS, layers, max(MIN_PARTS, -(-layer_bytes // PART_BYTES)))
    return parts if parts >= MIN_PARTS and layer_bytes // parts >= MIN_PART_BYTES else 1


def prefill_buckets(
    macs_per_token: int,
    max_context: int,
    token_bytes: int = 0,
    free_bytes: int | None = None,
    step_flop: float = PREFILL_STEP_FLOP,
) -> tuple[int, ...]:
    """The long prefill buckets a model gets: those that fit a slot from position 0, whose GEMMs stay
    under `step_flop` (`macs_per_token`: multiply-adds of all layers for one token), and whose
    graph pool (`token_bytes` a token: the fast path estimates twice its widest activations, 450 MiB for
    4096 tokens at the 1.3B shape, where the H200 measured 506) takes at most a quarter of `free_bytes`,
    the device memory left once weights and KV are in: a small GPU keeps the shorter ones, or none."""
    fits = (b for b in PREFILL_BUCKETS if b <= max_context and 2 * macs_per_token * b <= step_flop)
    return tuple(b for b in fits if free_bytes is None or 4 * token_bytes * b <= free_bytes)


def long_prefill_buckets(
    cfg: ModelConfig, max_context: int, weights: torch.Tensor, step_flop: float = PREFILL_STEP_FLOP
) -> tuple[int, ...]:
    """`prefill_buckets` for a model on its device: a long step's graph pool (or an eager step's
    activations) estimated as twice its widest activations (QKV, gate/up, SwiGLU's output, the residual
    stream and norms) in the weights' dtype, the free memory read now, with the weights and the KV buffer
    in. `step_flop`: the FLOP bound of a step (math.inf: none, for eager steps bounded by time instead)."""
    width = cfg.q_size + 2 * cfg.kv_size + 3 * cfg.intermediate_size + 3 * cfg.hidden_size
    free, _ = torch.cuda.mem_get_info(weights.device)
    return prefill_buckets(cfg.linear_macs, max_context, 2 * width * weights.element_size(), free, step_flop)


def eager_prefill_steps(
    small: tuple[int, float],
    large: tuple[int, float],
    candidates: Sequence[int],
    budget_ms: float = PREFILL_STEP_MS,
) -> tuple[int, ...]:
    """The `candidates` (tokens) whose step is predicted to take at most `budget_ms`, from two timed steps
    (tokens, ms) of the same model: a fixed cost plus a cost per token, the line through both. Timings
    that do not grow with the tokens (noise) are read as a cost per token alone, which predicts longer."""
    (n0, t0), (n1, t1) = small, large
    if n1 <= n0:
        raise ValueError(f"the large step must have more tokens than the small one, got {n0} and {n1}")
    per_token, fixed = (t1 - t0) / (n1 - n0), 0.0
    if per_token <= 0.0 or per_token * n1 > t1:
        per_token = t1 / n1
    else:
        fixed = t1 - per_token * n1
    return tuple(b for b in candidates if fixed + per_token * b <= budget_ms)


def eager_steps(
    cfg: ModelConfig,
    max_context: int,
    weights: torch.Tensor,
    longest: int,
    padded: Mapping[int, StepGraph],
    replay_ms: Callable[[int, StepGraph], float],
) -> tuple[int, ...]:
    """The eager prefill steps of a model on its device: PREFILL_BUCKETS longer than its `longest` graph
    that fit a slot and the free memory, and that `eager_prefill_steps` predicts within PREFILL_STEP_MS
    from the replay times of the two largest `padded` graphs (bucket -> graph; none with fewer than two)."""
    fits = long_prefill_buckets(cfg, max_context, weights, step_flop=math.inf)
    candidates = tuple(b for b in fits if b > longest)
    if not candidates or len(padded) < 2:
        return ()
    small, large = ((b, replay_ms(b, padded[b])) for b in sorted(padded)[-2:])
    return eager_prefill_steps(small, large, candidates)


def next_chunk(remaining: int, start: int, long_buckets: Sequence[int], capacity: int, limit: int) -> int:
    """Tokens of the next prefill step at `start`: all of them up to `limit` (the engine's chunk); past it,
    the longest bucket that the remaining tokens fill (no padding where a step costs FLOPs, not bytes) and
    that ends within the slot's `capacity` rows, else `limit`."""
    if remaining <= limit:
        return remaining
    fits = [b for b in long_buckets if limit < b <= remaining and start + b <= capacity]
    return max(fits, default=limit)


def part_bounds(layers: int, parts: int) -> list[range]:
    """Consecutive layer ranges, as equal as they can be, covering range(layers)."""
    parts = max(1, min(parts, layers))
    cuts = [layers * i // parts for i in range(parts + 1)]
    return [range(lo, hi) for lo, hi in itertools.pairwise(cuts)]


@dataclass(frozen=True)
class StepGraph:
    """One captured step: its parts in order, the logits buffer the last one writes, and the tensors that
    pass between parts (held so the graphs' shared memory pool never hands their memory to another
    capture)."""

    parts: tuple[torch.cuda.CUDAGraph, ...]
    logits: torch.Tensor
    held: tuple[torch.Tensor, ...]
    rows: torch.Tensor | None = None  # every token's logits (bucket, V), for steps that verify drafts

    def replay(
        self,
        done: Sequence[torch.cuda.Event],
        stream: torch.cuda.Stream,
        interrupted: Interrupted | None = None,
        ahead: int = AHEAD,
    ) -> bool:
        """Run the step on `stream`; False if `interrupted` said stop between parts (the parts already
        launched still run, and the rows they write are not valid). `done`: one event per part, reused by
        every step (recorded on `stream`: looking the current stream up costs tens of microseconds).
        `ahead`: parts queued behind the running one (see AHEAD)."""
        if len(self.parts) == 1:
            self.parts[0].replay()
            return True
        for i, part in enumerate(self.parts):
            if i > ahead:
                # Asked before the wait too: the caller learns that its part is queued, and a stop known
                # now does not wait for the running part.
                if interrupted is not None and interrupted():
                    return False
                done[i - 1 - ahead].synchronize()  # releases the GIL: the server runs while the GPU does
            if i >= 1 and interrupted is not None and interrupted():
                return False
            part.replay()
            done[i].record(stream)
        return True

    def median_ms(self, done: Sequence[torch.cuda.Event], stream: torch.cuda.Stream, reps: int) -> float:
        """Median GPU milliseconds of `reps` replays timed by events, the first 3 left out (they upload the
        graph and warm the caches); 0 when there is nothing to time."""
        samples = []
        for rep in range(reps):
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            self.replay(done, stream)
            end.record()
            end.synchronize()
            if rep >= 3:
                samples.append(begin.elapsed_time(end))
        return sorted(samples)[len(samples) // 2] if samples else 0.0
