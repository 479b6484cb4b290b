"""How `lsp-dscoder bench` (engine, bench_engine.py; --quant awq, bench_awq.py) measures a scenario: the
runner's GPU time by CUDA events (median of repetitions) and its host time (launch, replay, sampling, sync),
in the steps the engine takes; transformers on the same tokens; and the floor, a step's FLOPs at the GEMM
rate or its bytes at the copy bandwidth, both measured by this command itself (kernels/check_gpu.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lsp_dscoder.engine.config import PREFILL_CHUNK, ModelConfig


def _events(fn: Callable[[], object], reps: int) -> float:
    """Median GPU milliseconds of fn() over reps runs (after warm-up)."""
    from lsp_dscoder.kernels.check_gpu import median_ms

    return float(median_ms(fn, reps))


def measure_floors() -> dict[str, float]:
    """The measured ceilings (the kernels' check uses the same measurement)."""
    from lsp_dscoder.kernels.check_gpu import measure_floors as floors

    copy_bps, gemm_flops = floors(torch.device("cuda"))
    return {"gemm_tflops": gemm_flops / 1e12, "copy_tbps": copy_bps / 1e12}


def flop_ms(cfg: ModelConfig, new: int, prefix: int, floors: dict[str, float]) -> float:
    """A step's multiply-adds (layers, attention, the LM head on one row) at the measured GEMM rate."""
    attn = 4 * cfg.num_layers * cfg.q_size * new * (prefix + (new + 1) / 2)
    flops = 2 * new * cfg.linear_macs + attn + 2 * cfg.hidden_size * cfg.vocab_size
    return flops / (floors["gemm_tflops"] * 1e9)


def floor_ms(cfg: ModelConfig, new: int, prefix: int, floors: dict[str, float]) -> tuple[float, str]:
    c, v, layers = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    kv_bytes = layers * 2 * cfg.kv_size * 2 * (prefix + new)
    weight_bytes = 2 * (cfg.linear_macs + c * v)
    t_flop = flop_ms(cfg, new, prefix, floors)
    t_mem = (weight_bytes + kv_bytes) / (floors["copy_tbps"] * 1e9)
    return max(t_flop, t_mem), "FLOP" if t_flop > t_mem else "bytes"


def prefill_steps(runner: Any, ids: torch.Tensor, start: int) -> torch.Tensor:
    """ids at positions start.. of slot 0 in the steps the engine takes (engine/generate.py: the runner's
    `chunk` of the engine's default PREFILL_CHUNK); the last step's logits."""
    pos, end = start, start + len(ids)
    while pos < end:
        n = runner.chunk(end - pos, pos, PREFILL_CHUNK)
        logits: torch.Tensor = runner.prefill(ids[pos - start : pos - start + n], pos, 0)
        pos += n
    return logits


def measure(
    runner: Any, hf: Any, cfg: ModelConfig, new: int, prefix: int, reps: int, floors: dict[str, float]
) -> dict[str, Any]:
    ids = torch.randint(2, cfg.vocab_size, (prefix + new,), device="cuda")
    if prefix:
        prefill_steps(runner, ids[:prefix], 0)

    def step() -> torch.Tensor:
        if new == 1 and prefix:
            logits: torch.Tensor = runner.decode(int(ids[-1]), prefix, 0)
        else:
            logits = prefill_steps(runner, ids[prefix:], prefix)
        return logits

    n = reps if new <= 512 else max(3, reps // 4)
    ours = _events(lambda: step().argmax(-1), n)
    before = dict(runner.counts)
    step()
    # Of one step (the timing above warms up more): graph replays, and eager forwards of long steps.
    replays, eager = (runner.counts[k] - before[k] for k in ("graph_replays", "eager_forwards"))
    # That step was only launched: without the sync the host timing would include what is left of it
    # (up to half a step more per rep at two reps).
    torch.cuda.synchronize()
    t = time.perf_counter()
    host_reps = 5 if new <= 512 else 2  # a cold 8K prompt at 33B is ~1 s a run
    for _ in range(host_reps):
        int(step().argmax(-1).item())  # host view: launch + replay + sampling + sync
    host = (time.perf_counter() - t) / host_reps * 1e3
    theirs = hf_time(hf, ids, new, prefix, reps) if hf is not None else None
    floor, bound = floor_ms(cfg, new, prefix, floors)
    return {
        "ours_ms": ours,
        "ours_host_ms": host,
        "transformers_ms": theirs,
        "floor_ms": floor,
        "bound": bound,
        "graph_replays_per_step": replays,
        "eager_forwards_per_step": eager,
    }


def hf_time(hf: Any, ids: torch.Tensor, new: int, prefix: int, reps: int) -> float:
    from transformers import DynamicCache

    with torch.no_grad():
        if not prefix:
            return _events(lambda: hf(ids[None], logits_to_keep=1), max(3, reps // 4))
        cache = DynamicCache()
        hf(ids[None, :prefix], past_key_values=cache, use_cache=True, logits_to_keep=1)

        def step() -> None:
            hf(ids[None, prefix:], past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(prefix)

        return _events(step, reps)
