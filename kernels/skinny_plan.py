"""Host-side planning of the skinny GEMM (kernels/skinny_gemm.py): its tiles (SkinnyConfig, the defaults the
H200 sweep ranked), the grid of one launch (N blocks, K shares) checked against the config, and the split-K
workspace that the caller owns so that CUDA graphs see fixed addresses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton

from .contract import interpreting
from .skinny_parts import BLOCK_ROWS


@dataclass(frozen=True)
class SkinnyConfig:
    """Tiles of one launch. split_k shares of K per N block; warps and stages as Triton takes them."""

    block_n: int = 16
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


@dataclass(frozen=True)
class SkinnyWorkspace:
    """Split-K partials and arrival counters, owned by the caller so CUDA graphs see fixed addresses.

    One workspace serves any number of launches in stream order (each leaves the counters at zero)."""

    partials: torch.Tensor  # (max_split * MAX_M * (max_n + 64),) fp32, by program tile
    counts: torch.Tensor  # (max_blocks,) int32

    @staticmethod
    def allocate(max_n: int, max_split: int, device: torch.device, min_block_n: int = 16) -> SkinnyWorkspace:
        """For launches of up to max_n W rows (their tiles padded to the largest block, 64 rows)."""
        return SkinnyWorkspace(
            torch.empty(max_split * BLOCK_ROWS * (max_n + 64), dtype=torch.float32, device=device),
            torch.zeros(triton.cdiv(max_n, min_block_n), dtype=torch.int32, device=device),
        )


@dataclass(frozen=True)
class SkinnyGrid:
    """One launch: its tiles, the K columns of a share (a multiple of block_k), the shares that hold any K
    at all, and the N blocks."""

    config: SkinnyConfig
    k_per_split: int
    split: int
    blocks: int


def default_config(m: int, n: int, k: int, device: torch.device) -> SkinnyConfig:
    """Tiles from the shape and the SM count, as the H200 sweep (kernels/check_skinny.py) ranked them at the
    DeepSeek-Coder shapes for M = 1, 4, 16: 32-row blocks with whole rows when they give about one program
    per SM or more; otherwise 64-row blocks over 4 K shares (the 2048-wide 1.3B O and down projections).
    16-row blocks and deeper splits ranked lower at every shape."""
    if interpreting() or device.type != "cuda":
        return SkinnyConfig(block_n=16, block_k=32, split_k=1, num_warps=4, num_stages=1)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if triton.cdiv(n, 32) * 10 >= sms * 9 or k < 4 * 128:
        return SkinnyConfig(block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=4)
    return SkinnyConfig(block_n=64, block_k=128, split_k=4, num_warps=4, num_stages=4)


def column_blocks(n: int, k: int, device: torch.device) -> int:
    """N blocks of a launch with the default tiles: what an RmsScale after a ResidualEpilogue must name."""
    return int(triton.cdiv(n, default_config(1, n, k, device).block_n))


def plan_grid(
    m: int, n: int, k: int, device: torch.device, config: SkinnyConfig | None, glu: bool, head_dim: int | None
) -> SkinnyGrid:
    """The grid of x (m, k) @ W.T for n output columns; config None: the default for the whole matrix
    ([gate | up] with glu); head_dim: a rope epilogue's, to which the tiles are cut."""
    if config is None:  # tiles as ranked for the whole matrix ([gate | up] with glu)
        config = default_config(m, 2 * n if glu else n, k, device)
    # A rope tile holds dims of one head only; block_n and head_dim are powers of two, so it divides it.
    if head_dim is not None and config.block_n > head_dim:
        config = dataclasses.replace(config, block_n=head_dim)
    cfg = config
    for name in ("block_n", "block_k"):
        size = getattr(cfg, name)
        if size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {size}")
    if cfg.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {cfg.split_k}")
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)  # shares that hold any K at all
    blocks = triton.cdiv(n, cfg.block_n // 2 if glu else cfg.block_n)  # a glu tile: half of it per half
    return SkinnyGrid(cfg, k_per_split, split, blocks)


def split_workspace(
    workspace: SkinnyWorkspace | None, grid: SkinnyGrid, m: int, n: int, device: torch.device
) -> SkinnyWorkspace:
    """The workspace of a split-K launch: the caller's, checked, or a fresh one."""
    split, blocks, block_n = grid.split, grid.blocks, grid.config.block_n
    if workspace is None:
        workspace = SkinnyWorkspace.allocate(blocks * block_n, split, device, block_n)
    if workspace.partials.numel() < split * m * blocks * block_n or workspace.counts.numel() < blocks:
        raise ValueError(f"workspace too small for split_k {split}, M {m}, N {n}, {blocks} N blocks")
    return workspace
