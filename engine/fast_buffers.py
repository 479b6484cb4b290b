"""The buffers the fast path (engine/fast.py) allocates once, which every step reads: the rotary table, the
row sums of squares the fused layer's epilogues pass from one GEMM to the next (kernels/skinny_parts.py),
decode attention's arrival counters, the skinny GEMM's split-K workspace, and the buffers of a packed INT4
model's matrices (engine/awq_fast.py). Fixed addresses: the CUDA graphs captured over them replay as is."""

from __future__ import annotations

from typing import NamedTuple

import torch

from lsp_dscoder.engine.awq_fast import PackedLinears
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.kernels.rope_store import rope_cos_sin
from lsp_dscoder.kernels.skinny_gemm import MAX_M
from lsp_dscoder.kernels.skinny_plan import SkinnyWorkspace, column_blocks

ATTN_IN, MLP_IN = 0, 1  # StepBuffers.sums rows: before the QKV projection, before gate/up


class StepBuffers(NamedTuple):
    """A model's step buffers, made by `step_buffers`."""

    cos_sin: torch.Tensor  # (capacity, D) float32: the rotary table
    sum_blocks: tuple[int, int]  # the block counts of a down and an O projection's launch
    sums: torch.Tensor  # (2, max(sum_blocks) * MAX_M) float32: the row sums of squares per N block they leave
    attn_counts: torch.Tensor | None  # (KVH,) int32; None: a second kernel merges decode attention's splits
    workspace: SkinnyWorkspace | None  # None: cuBLAS only
    packed: PackedLinears | None  # None: a dense checkpoint


def step_buffers(model: Transformer, capacity: int, skinny: bool, fused_combine: bool | None) -> StepBuffers:
    """The buffers of `model`'s steps over `capacity` cache rows a slot; `skinny`: the skinny GEMM may run
    (a workspace); `fused_combine`: decode attention merges its splits in its last program (None: without
    GQA)."""
    cfg, dev = model.cfg, model.device
    cos_sin = rope_cos_sin(capacity, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor, dev)
    c = cfg.hidden_size
    sum_blocks = (column_blocks(c, cfg.intermediate_size, dev), column_blocks(c, cfg.q_size, dev))
    sums = torch.zeros(2, max(sum_blocks) * MAX_M, dtype=torch.float32, device=dev)
    # Decode attention's arrival counters (one per KV head): the last split merges the partials. Only
    # without GQA by default: it merges one query head at a time (33B at 4K: 11.5 -> 22.2 us).
    if fused_combine is None:
        fused_combine = cfg.num_heads == cfg.num_kv_heads
    attn_counts = torch.zeros(cfg.num_kv_heads, dtype=torch.int32, device=dev) if fused_combine else None
    # Split-K partials for the widest layer matrix; one workspace serves every launch of a step.
    widest = max(2 * cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
    workspace = SkinnyWorkspace.allocate(widest, 8, dev) if skinny else None
    packed = PackedLinears.of(model, widest)  # AWQ checkpoints: every layer matrix packed
    return StepBuffers(cos_sin, sum_blocks, sums, attn_counts, workspace, packed)
