"""How a step's graph is cut into parts and how the parts are run: the layer ranges, the part count, and
the order that lets a stale step stop between parts. CUDA graphs do not run on this machine:
the parts here record what happens to them; the real graphs are checked against the eager forward on
the GPU (`python -m tests.gpu.step_parts`)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from lsp_dscoder.bench import hf_config
from lsp_dscoder.engine.config import PREFILL_CHUNK, ModelConfig
from lsp_dscoder.engine.step_graphs import (
    MAX_PARTS,
    MIN_PART_BYTES,
    MIN_PARTS,
    PART_BYTES,
    PREFILL_STEP_FLOP,
    StepGraph,
    eager_prefill_steps,
    eager_steps,
    next_chunk,
    part_bounds,
    part_count,
    prefill_buckets,
)


def test_part_bounds_cover_every_layer_once_in_order() -> None:
    assert part_bounds(24, 1) == [range(0, 24)]
    assert part_bounds(32, 8) == [range(4 * i, 4 * i + 4) for i in range(8)]
    assert part_bounds(62, 8) == [range(0, 7), range(7, 15), range(15, 23), range(23, 31),
                                  range(31, 38), range(38, 46), range(46, 54), range(54, 62)]  # fmt: skip
    assert part_bounds(3, 8) == [range(0, 1), range(1, 2), range(2, 3)]


def test_long_prefill_steps_only_for_models_whose_step_stays_short() -> None:
    macs = {name: ModelConfig.from_dict(hf_config(name)).linear_macs for name in ("1.3b", "6.7b", "33b")}
    assert macs["1.3b"] == 24 * (2048 * 6144 + 2048 * 2048 + 3 * 2048 * 5504)
    assert prefill_buckets(macs["1.3b"], 8256) == (1024, 2048, 4096)
    assert prefill_buckets(macs["1.3b"], 3000) == (1024, 2048)  # a bucket must fit a slot from position 0
    assert prefill_buckets(macs["6.7b"], 8256) == prefill_buckets(macs["33b"], 8256) == ()
    assert prefill_buckets(int(PREFILL_STEP_FLOP / 2 / 2048), 8256) == (1024, 2048)  # the bound included
    # A quarter of the free device memory for a long graph's pool: a small GPU keeps the shorter ones.
    token = 2 * 2 * (2048 + 2 * 2048 + 3 * 5504 + 3 * 2048)  # the 1.3B estimate of engine/fast.py
    assert prefill_buckets(macs["1.3b"], 8256, token, 80 << 30) == (1024, 2048, 4096)
    assert prefill_buckets(macs["1.3b"], 8256, token, 4 * token * 4096 - 1) == (1024, 2048)
    assert prefill_buckets(macs["1.3b"], 8256, token, 1 << 20) == ()


def test_eager_steps_are_the_lengths_predicted_to_stay_within_the_time_bound() -> None:
    long = (1024, 2048, 4096)
    # Without a FLOP bound every length that fits a slot is a candidate, whatever the model's size.
    assert prefill_buckets(10**12, 8256, step_flop=math.inf) == long
    assert prefill_buckets(10**12, 3000, step_flop=math.inf) == (1024, 2048)
    # A fixed cost a step (dequantizing every packed matrix) plus a cost a token, the line through both
    # timings: 4 ms + 7/256 ms a token predicts 32, 60 and 116 ms (the 6.7B shape on INT4 weights).
    assert eager_prefill_steps((256, 11.0), (512, 18.0), long) == (1024, 2048)
    assert eager_prefill_steps((256, 11.0), (512, 18.0), long, budget_ms=116.0) == long
    assert eager_prefill_steps((256, 11.0), (512, 18.0), long, budget_ms=59.9) == (1024,)
    # 33B on INT4 weights: 29 ms + 0.113 ms a token is 145 ms for 1024 tokens: it keeps its short steps.
    assert eager_prefill_steps((256, 58.0), (512, 87.0), long) == ()
    # Timings that do not grow with the tokens (noise), or whose line would have a negative fixed cost,
    # are read as a cost per token alone: 9/512 ms a token, then 13/512.
    assert eager_prefill_steps((256, 10.0), (512, 9.0), long) == long
    assert eager_prefill_steps((256, 5.0), (512, 13.0), long) == (1024, 2048)
    with pytest.raises(ValueError, match="more tokens"):
        eager_prefill_steps((512, 13.0), (512, 13.0), long)


def test_eager_steps_time_the_two_largest_graphs_and_skip_what_the_graphs_reach(monkeypatch: Any) -> None:
    """What capture asks for (engine/fast.py): the 6.7B shape on INT4-like timings, with 80 GiB free."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (80 << 30, 141 << 30))
    cfg, weights = ModelConfig.from_dict(hf_config("6.7b")), torch.empty(1, dtype=torch.bfloat16)
    ms = {256: 11.0, 512: 18.0, 128: 999.0}
    graphs: dict[int, Any] = {b: f"graph {b}" for b in ms}
    timed: list[tuple[int, Any]] = []

    def replay_ms(bucket: int, graph: Any) -> float:
        timed.append((bucket, graph))
        return ms[bucket]

    assert eager_steps(cfg, 8256, weights, 512, graphs, replay_ms) == (1024, 2048)
    assert timed == [(256, "graph 256"), (512, "graph 512")]  # the two largest, smaller first
    # Candidates stop at what the graphs reach and at the slot; nothing is timed without one.
    timed.clear()
    assert eager_steps(cfg, 8256, weights, 1024, graphs, replay_ms) == (2048,)
    assert eager_steps(cfg, 8256, weights, 4096, graphs, replay_ms) == ()
    assert eager_steps(cfg, 1000, weights, 512, graphs, replay_ms) == ()
    assert eager_steps(cfg, 8256, weights, 512, {512: "graph 512"}, replay_ms) == ()
    assert timed == [(256, "graph 256"), (512, "graph 512")]


def test_next_chunk_fills_long_buckets_without_padding_and_keeps_inside_the_slot() -> None:
    long, cap = (1024, 2048, 4096), 8192 + 512
    assert next_chunk(300, 0, long, cap, PREFILL_CHUNK) == 300  # up to the engine's chunk: all of it
    assert next_chunk(512, 0, long, cap, PREFILL_CHUNK) == 512
    assert next_chunk(900, 0, long, cap, PREFILL_CHUNK) == 512  # 1024 would pad 124 rows of FLOPs
    assert next_chunk(2500, 0, long, cap, PREFILL_CHUNK) == 2048
    assert next_chunk(4096, 0, long, cap, PREFILL_CHUNK) == 4096
    assert next_chunk(9000, 0, long, cap, PREFILL_CHUNK) == 4096
    assert next_chunk(9000, 5000, long, cap, PREFILL_CHUNK) == 2048  # 4096 would end past the slot's rows
    assert next_chunk(9000, 8000, long, cap, PREFILL_CHUNK) == 512
    assert next_chunk(9000, 0, (), cap, PREFILL_CHUNK) == 512  # no long buckets: the engine's chunk
    # A prompt of 6000 tokens, planned step by step: each step a bucket it fills, the tail padded as before.
    steps, pos = [], 0
    while pos < 6000:
        steps.append(next_chunk(6000 - pos, pos, long, cap, PREFILL_CHUNK))
        pos += steps[-1]
    assert steps == [4096, 1024, 512, 368]


def test_part_count_follows_the_bytes_and_skips_cuts_that_would_not_pay() -> None:
    assert part_count(2 * PART_BYTES, 24) == MIN_PARTS  # 1.3B (2.4 GB): never fewer than 4 parts
    assert part_count(4 * MIN_PART_BYTES - 1, 24) == 1  # parts too small to hide their launches
    assert part_count(4 * PART_BYTES, 32) == 4
    assert part_count(6 * PART_BYTES, 32) == 6
    assert part_count(100 * PART_BYTES, 62) == MAX_PARTS  # 33B
    assert part_count(100 * PART_BYTES, 5) == 5  # never more parts than layers


class _Part:
    def __init__(self, i: int, log: list[str]) -> None:
        self.i, self.log = i, log

    def replay(self) -> None:
        self.log.append(f"launch {self.i}")


class _Done:
    def __init__(self, i: int, log: list[str]) -> None:
        self.i, self.log = i, log

    def record(self, stream: object) -> None:
        assert stream is _STREAM
        self.log.append(f"record {self.i}")

    def synchronize(self) -> None:
        self.log.append(f"wait {self.i}")


_STREAM: Any = object()  # the stream the runner hands in


def test_a_step_of_one_part_is_one_replay_and_nothing_else() -> None:
    step, done, log = _step(1)
    assert step.replay(done, _STREAM, lambda: True)  # nothing to stop between
    assert log == ["launch 0"]


def _step(n: int) -> tuple[StepGraph, list[Any], list[str]]:
    log: list[str] = []
    parts: Any = tuple(_Part(i, log) for i in range(n))
    return StepGraph(parts, torch.zeros(1), ()), [_Done(i, log) for i in range(n)], log


def test_each_part_waits_for_the_one_before_and_asks_between_them() -> None:
    step, done, log = _step(4)
    asked: list[str] = []

    def interrupted() -> bool:
        asked.append(log[-1])
        return False

    assert step.replay(done, _STREAM, interrupted)
    assert log == [
        *("launch 0", "record 0", "wait 0", "launch 1", "record 1"),
        *("wait 1", "launch 2", "record 2", "wait 2", "launch 3", "record 3"),
    ]
    # Once a part is queued (the caller learns it can let others run) and again before the next launch.
    assert asked == ["record 0", "wait 0", "record 1", "wait 1", "record 2", "wait 2"]


def test_with_one_part_ahead_the_next_is_launched_before_the_running_one_ends() -> None:
    step, done, log = _step(4)
    assert step.replay(done, _STREAM, lambda: False, ahead=1)
    assert log == [
        *("launch 0", "record 0", "launch 1", "record 1"),
        *("wait 0", "launch 2", "record 2", "wait 1", "launch 3", "record 3"),
    ]


def _stale_at(call: int) -> tuple[list[str], bool]:
    step, done, log = _step(8)
    calls = 0

    def interrupted() -> bool:
        nonlocal calls
        calls += 1
        return calls == call

    return log, step.replay(done, _STREAM, interrupted)


def test_a_stale_step_stops_with_the_running_part_in_flight_only() -> None:
    # Stale before part 2 was launched (found after waiting for part 1): parts 0..1 launched, 2..7 never.
    log, finished = _stale_at(4)
    assert not finished
    assert log[-3:] == ["launch 1", "record 1", "wait 1"]
    assert sum(e.startswith("launch") for e in log) == 2
    # Stale while part 2 runs (found once it is queued): no wait for it, 3..7 never launched.
    log, finished = _stale_at(5)
    assert not finished
    assert log[-2:] == ["launch 2", "record 2"]
    assert sum(e.startswith("launch") for e in log) == 3
