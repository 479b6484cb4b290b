"""The fast path's warm-up (engine/fast.py): every kernel variant compiled by an eager run per bucket, the
CUDA graphs captured per (slot, bucket) into one memory pool, each bucket's candidates (`FastRunner._choices`,
engine/fast_choices.py: cuBLAS or the skinny GEMM, the fused layer, PDL, packed weights streamed) timed on
this GPU and the fastest kept, and the eager prefill steps planned from the graphs' timings (engine/
step_graphs.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from lsp_dscoder.engine.lookup import DRAFT_MAX
from lsp_dscoder.engine.step_graphs import StepGraph, eager_steps, part_bounds

if TYPE_CHECKING:
    from lsp_dscoder.engine.fast import FastRunner, State

Progress = Callable[[str, int, int], None]


def capture(runner: FastRunner, progress: Progress | None = None) -> None:
    """Compile, capture and time; afterwards `runner.graphs`, `chosen`, `graph_pool_bytes`, `eager_buckets`
    and `prefill_steps` are set, and the eager choice is in use."""
    r = runner
    r.part_done = [torch.cuda.Event() for _ in range(r.parts)]  # type: ignore[no-untyped-call]
    r.stream = torch.cuda.current_stream()  # the engine thread's: every step runs on it
    todo = [(s, b) for s in range(len(r.cache.slots)) for b in r.buckets]
    r.start.zero_()
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for b in r.buckets:  # eager runs compile the Triton kernels (and set up cuBLAS) per shape
            r.last.fill_(b - 1)
            for choice in r._choices(b):
                r._use(choice)
                r.forward(r.ids[:b], r.start, r.last, 0)
    torch.cuda.current_stream().wait_stream(side)
    # The pool's size is what the captures add to the reserved memory, cached free blocks released on
    # both sides so that only the graphs' own segments count.
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    r.pool = torch.cuda.graph_pool_handle()  # one memory pool for every graph of this runner
    # Graphs that lost a timing stay alive until every capture into the shared pool is done: freeing
    # the only graphs of a pool releases it, and a later capture into it fails.
    losers: list[StepGraph] = []
    for i, (slot, b) in enumerate(todo):
        if b in r.chosen:
            r._use(r.chosen[b])
            r.graphs[(slot, b)] = capture_one(r, b, slot)
        else:
            r.chosen[b], r.graphs[(slot, b)] = time_choices(r, b, slot, losers)
        if progress:
            progress("capturing CUDA graphs", i + 1, len(todo))
    r._use(r.eager_choice)
    torch.cuda.synchronize()
    losers.clear()
    torch.cuda.empty_cache()
    r.graph_pool_bytes = torch.cuda.memory_reserved() - reserved
    padded = {b: g for (s, b), g in r.graphs.items() if s == 0 and b not in r.long_buckets}
    w, longest = r.model.w.embed, max(r.buckets, default=0)
    timed = functools.partial(replay_ms, r)
    r.eager_buckets = eager_steps(r.cfg, r.cache.max_context, w, longest, padded, timed)
    r.prefill_steps = (*r.long_buckets, *r.eager_buckets)


def replay_ms(runner: FastRunner, bucket: int, graph: StepGraph, reps: int = 8) -> float:
    """Median replay time of a bucket's graph (at warm-up: its rows are never read)."""
    runner.last.fill_(bucket - 1)  # the replays run: `last` must index this bucket's rows
    return graph.median_ms(runner.part_done, runner.stream, reps)


def capture_one(runner: FastRunner, bucket: int, slot: int) -> StepGraph:
    """The step of `bucket` tokens on `slot` with the choice in use, one graph per part."""
    r = runner
    parts: list[torch.cuda.CUDAGraph] = []
    held: list[torch.Tensor] = []
    state: State | None = None
    logits: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    bounds = part_bounds(len(r.model.w.layers), r.parts)
    for i, layers in enumerate(bounds):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=r.pool):
            state = r.run_layers(state or r.embed(r.ids[:bucket]), layers, r.start, slot)
            assert state is not None  # nothing interrupts a capture
            if i == len(bounds) - 1:
                # Steps that may carry drafts (engine/lookup.py) keep every row's logits (bucket, V).
                rows = r.head(state, None) if bucket <= DRAFT_MAX + 1 else None
                logits = r.head(state, r.last) if rows is None else rows.index_select(0, r.last)
        parts.append(graph)
        held.extend(t for t in state if isinstance(t, torch.Tensor))
    assert logits is not None
    return StepGraph(tuple(parts), logits, tuple(held), rows)


def time_choices(
    runner: FastRunner, bucket: int, slot: int, losers: list[StepGraph]
) -> tuple[str, StepGraph]:
    """The choice whose graph replays fastest for this bucket (median of 9 timed replays), and that graph;
    the others go to `losers`."""
    timed: dict[str, tuple[float, StepGraph]] = {}
    choices = runner._choices(bucket)
    reps = 12 if len(choices) > 1 else 0  # a single choice is not timed
    for choice in choices:
        runner._use(choice)
        captured = capture_one(runner, bucket, slot)
        timed[choice] = (replay_ms(runner, bucket, captured, reps), captured)
    best = min(timed, key=lambda c: timed[c][0])
    losers.extend(g for c, (_, g) in timed.items() if c != best)
    return best, timed[best][1]
