"""One place that turns weights into something that runs: KV cache, transformer, runner (reference or fast).

`lsp-dscoder bench` and `lsp-dscoder eval` build through here, and the engine should too, so that what they
measure is assembled exactly as what ships; tests that need a bare runner can use it as well.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.generate import Interrupted, Runner
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import KEY_BLOCK, Transformer, bounds_attention
from lsp_dscoder.engine.weights import Weights, dequantized_weights

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]


@dataclass
class Assembly:
    """A model ready to run: its cache, the runner that does the arithmetic, and how it was built."""

    model: Transformer
    cache: KVCache
    runner: Runner
    fast_path: bool
    warmup_s: float  # kernel compile + graph capture (0 on the reference path)


class ReferenceRunner:
    """Plain PyTorch on any device: the oracle. Stops between layers when `interrupted` says so."""

    def __init__(self, model: Transformer, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    def prefill(
        self, ids: torch.Tensor, start: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        return self.model.forward_interruptible(ids, start, self.cache, slot, interrupted=interrupted)

    def chunk(self, remaining: int, start: int, limit: int) -> int:
        return min(remaining, limit)

    def decode(
        self, token: int, pos: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        ids = torch.tensor([token], dtype=torch.long, device=self.model.device)
        return self.model.forward_interruptible(ids, pos, self.cache, slot, interrupted=interrupted)

    def verify(
        self, ids: torch.Tensor, start: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        return self.model.forward_interruptible(ids, start, self.cache, slot, True, interrupted)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def wants_fast_path(requested: bool | None, device: torch.device, cfg: ModelConfig) -> bool:
    """Whether to build the fast path. None: where it can run (CUDA, Triton, a head_dim its tiles span);
    True where it cannot raises EngineError."""
    head_dim = cfg.head_dim
    kernels_fit = head_dim >= 16 and head_dim & (head_dim - 1) == 0  # Triton tiles span a whole head
    if requested is None:
        return device.type == "cuda" and _triton_available() and kernels_fit
    if requested and (device.type != "cuda" or not kernels_fit):
        raise EngineError(
            "the fast path needs a CUDA device and a head_dim that is a power of two >= 16 "
            f"(device {device}, head_dim {head_dim}); use the reference path"
        )
    return requested


def assemble(
    cfg: ModelConfig,
    weights: Weights,
    *,
    num_slots: int,
    max_context: int,
    device: torch.device,
    dtype: torch.dtype,
    fast_path: bool | None = None,
    progress: Progress | None = None,
) -> Assembly:
    """Cache, transformer and runner for `weights`. The fast path compiles and captures here; if it fails
    to start and was not asked for explicitly, the reference path serves (logged)."""
    fast = wants_fast_path(fast_path, device, cfg)
    if fast:  # imported here: Triton is an optional dependency, needed only on CUDA
        from lsp_dscoder.engine.fast import FastRunner
        from lsp_dscoder.engine.fast_choices import BUCKETS
    # Spare rows: the fast path's padded buckets; the reference path's padded keys (engine/model.py).
    pad = max(BUCKETS) if fast else KEY_BLOCK if bounds_attention(device, dtype) else 0
    cache = KVCache(cfg, num_slots, max_context, device, dtype, pad=pad)
    model = Transformer(cfg, weights, cache.capacity)
    if fast:
        started = time.perf_counter()
        try:
            runner = FastRunner(model, cache)
            runner.capture(progress)
            return Assembly(model, cache, runner, True, time.perf_counter() - started)
        except Exception as e:  # a kernel that fails to build here must not cost the user the engine
            if fast_path:
                raise EngineError(f"the fast path failed to start: {e}") from e
            log.error("fast path unavailable (%s); serving with the reference path", e)
    if any(layer.quant is not None for layer in weights.layers):
        model = Transformer(cfg, dequantized_weights(weights, dtype), cache.capacity)
    return Assembly(model, cache, ReferenceRunner(model, cache), False, 0.0)
