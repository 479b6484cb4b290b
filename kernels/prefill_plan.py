"""Host-side planning of the long-step extend kernel (kernels/extend_prefill.py): its tiles, the step length
from which extend_attention hands a step to it, and its key splits, all from shapes and the device (never from
the live position, so CUDA graphs replay at any start).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .contract import interpreting


@dataclass(frozen=True)
class PrefillTiles:
    """Tiles of the long-step kernel; tma: load and store through tensor descriptors (sm_90+)."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    tma: bool = False
    # Registers per thread, when capped: 128 lets two 8-warp programs share an SM, so one's softmax runs
    # while the other's products do.
    maxnreg: int | None = None
    lazy: bool = False  # rescale the accumulator only when a row max rose by more than 2^8


# From this many new tokens a step is compute-bound and runs this kernel.
LONG_STEP = 256


def prefill_tiles(n_tok: int, n_heads: int, dtype: torch.dtype, device: torch.device) -> PrefillTiles | None:
    """Tiles for a step of n_tok new tokens, or None for extend_attention's own kernel."""
    if n_tok < LONG_STEP:
        return None
    if interpreting() or device.type != "cuda":
        # Small tiles so that tests at small shapes cross query blocks, key tiles and split boundaries.
        return PrefillTiles(16, 16, 4, 1)
    if dtype == torch.float32:
        return None  # the debug dtype: its tiles were never timed here, and the other kernel serves it
    tma = torch.cuda.get_device_capability(device)[0] >= 9
    sms: int = torch.cuda.get_device_properties(device).multi_processor_count
    if n_heads * triton.cdiv(n_tok, 128) >= sms // 2:
        # H200 sweep (docs/kernels.md): 128x128 tiles, 3 stages (one program an SM, 230 KB of shared
        # memory) were the fastest at 4K and 16K tokens for all three shapes, 1.40-1.58x the FLOP floor.
        return PrefillTiles(128, 128, 8, 3, tma)
    # Too few 128-row blocks to fill the SMs (a 256-token line at 1.3B/6.7B): 64-row tiles, two programs
    # an SM, and key splits for the rest.
    return PrefillTiles(64, 64, 4, 3, tma)


def prefill_splits(programs: int, max_ctx: int, tiles: PrefillTiles, device: torch.device) -> int:
    """Key splits when query blocks x heads leave SMs idle (a few hundred tokens); shapes only, never the
    live length. Each split costs an fp32 partial row per (token, head) written and read again."""
    if interpreting() or device.type != "cuda":
        return 1
    sms: int = torch.cuda.get_device_properties(device).multi_processor_count
    if programs >= 2 * sms:
        return 1
    return max(1, min(int(triton.cdiv(max_ctx, tiles.block_n)), 64, round(sms / programs)))
