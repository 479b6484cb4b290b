"""Host side of the INT4 AWQ launches (kernels/awq_gemv.py, awq_gemm.py, awq_mma.py): the row limits, the
split-K workspace, each kernel's tiles (checked where they enter) and how they are chosen, the K shares of
a launch, and the contract check of the AutoAWQ tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .awq_format import PACK
from .contract import FLOAT_DTYPES, check_tensor, interpreting
from .skinny_gemm import MAX_M

GEMV_MAX_M = 1  # a second row of x doubles the FMAs per weight: the tensor cores take M >= 2
ROWS_MAX = 16  # rows of one fragment-kernel launch (kernels/awq_mma.py): the atomic workspace holds them
MAX_SPLIT = 32  # K shares of a tensor-core launch: a workspace holds MAX_SPLIT partials of (16, N), so
# of one row, 16 * MAX_SPLIT: the CUDA-core kernel's limit


@dataclass(frozen=True)
class AwqWorkspace:
    """Split-K buffers of the AWQ launches, owned by the caller so that CUDA graphs see fixed addresses;
    every launch leaves them as it found them, so one serves any number of launches in stream order.

    partials: the tensor-core kernel's per-share partials, summed by the last share to arrive. accum: the
    CUDA-core kernel's shares add into it atomically (it may have hundreds of shares; one program summing
    that many partials would take longer than the stream), the last one reads it out and zeroes it."""

    partials: torch.Tensor  # (MAX_SPLIT * MAX_M * max_n,) fp32
    counts: torch.Tensor  # (max_n / 128,) int32, zero between launches
    accum: torch.Tensor  # (ROWS_MAX * max_n,) fp32, zero between launches

    @staticmethod
    def allocate(max_n: int, device: torch.device, max_split: int = 32) -> AwqWorkspace:
        return AwqWorkspace(
            torch.empty(max_split * MAX_M * max_n, dtype=torch.float32, device=device),
            torch.zeros(triton.cdiv(max_n, 2 * PACK), dtype=torch.int32, device=device),
            torch.zeros(ROWS_MAX * max_n, dtype=torch.float32, device=device),
        )


@dataclass(frozen=True)
class GemvTiles:
    """block_k rows of K per load; split_k shares of K in parts of groups (`sub` parts a group: the group
    formula is linear in D and X, so parts of a group sum to it); num_warps sets BLOCK_W = 128 * num_warps;
    num_stages > 1 lets Triton prefetch later tiles through shared memory; atomic: shares add into one fp32
    row instead of writing partials for the last share to sum."""

    block_k: int = 8
    split_k: int = 1
    num_warps: int = 1
    sub: int = 1
    num_stages: int = 1
    atomic: bool = True
    prefetch: bool = False  # load the next tile before this one's arithmetic (Triton pipelines only dots)

    def check(self, group: int) -> None:
        part = group // max(1, self.sub)
        if self.sub < 1 or group % self.sub or part % self.block_k or self.block_k & (self.block_k - 1):
            raise ValueError(
                f"block_k {self.block_k} must be a power of two dividing group {group} / sub {self.sub}"
            )


@dataclass(frozen=True)
class AwqTiles:
    """Tiles of one launch: BLOCK_N a multiple of 128 on the GPU (16 words), BLOCK_K dividing the group."""

    block_m: int = 16
    block_n: int = 128
    block_k: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    pairs: bool = False  # bf16 on the GPU: _pair_dots (inline PTX, so never under the interpreter)

    def check(self, group: int) -> None:
        if self.block_n % PACK or self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 16, got {self.block_n}")
        if not interpreting() and self.block_n < 128:  # tl.dot on the GPU needs N >= 16: 16 words
            raise ValueError(f"block_n must be >= 128 on the GPU, got {self.block_n}")
        if self.block_k < 16 or group % self.block_k:
            raise ValueError(f"block_k {self.block_k} must be >= 16 and divide the group size {group}")


@dataclass(frozen=True)
class MmaTiles:
    """split_k shares of whole groups; num_warps column tiles of 16 a program (one warp each)."""

    split_k: int = 1
    num_warps: int = 1
    depth: int = 1  # loads (words and x) in flight ahead of the MMAs: 0 or 1 (2 measured no faster)
    one_pass: bool = False  # 9..16 rows in one launch (each weight read once), not two of 8

    def check(self, n: int) -> None:
        if self.depth not in (0, 1):
            raise ValueError(f"depth must be 0 or 1, got {self.depth}")
        if (n // 16) % self.num_warps:
            raise ValueError(f"num_warps {self.num_warps} must divide the {n // 16} column tiles")


def split_shares(parts: int, split_k: int) -> tuple[int, int]:
    """(parts a share, shares) for split_k shares asked of `parts` groups or parts of groups: only the
    shares that hold any part at all are launched (16 asked of 3 parts: 3 shares)."""
    per_split = triton.cdiv(parts, max(1, split_k))
    return per_split, triton.cdiv(parts, per_split)


def check_awq(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> int:
    """Shapes and dtypes of one launch; returns the group size."""
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    k = x.shape[1]
    check_tensor("qweight", qweight, ndim=2, dtypes=(torch.int32,), device=x.device)
    check_tensor("qzeros", qzeros, ndim=2, dtypes=(torch.int32,), device=x.device)
    check_tensor("scales", scales, ndim=2, dtypes=(torch.float16,), device=x.device)
    words = qweight.shape[1]
    groups = scales.shape[0]
    if qweight.shape[0] != k or words < 1:
        raise ValueError(f"qweight {tuple(qweight.shape)} must be ({k}, N/8) for x with {k} columns")
    if groups < 1 or k % groups or tuple(scales.shape) != (groups, words * PACK):
        raise ValueError(f"scales {tuple(scales.shape)} must be (K/group, {words * PACK}) with K = {k}")
    if tuple(qzeros.shape) != (groups, words):
        raise ValueError(f"qzeros {tuple(qzeros.shape)} must be ({groups}, {words})")
    group = k // groups
    if group < 16 or group & (group - 1):
        raise ValueError(f"group size {group} must be a power of two >= 16")
    return group


def gemv_tiles(n: int, k: int, group: int, device: torch.device) -> GemvTiles:
    """One warp per program and K shares of quarter groups, up to about sixteen programs per SM: a warp has
    one tile of loads in flight at a time, and on the H200 more and shorter programs streamed faster at
    every DeepSeek-Coder shape (docs/awq.md)."""
    if device.type != "cuda":
        return GemvTiles(block_k=16, split_k=1, num_warps=1)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = triton.cdiv(n // PACK, 128)
    sub = 4 if group >= 32 else 2
    split = max(1, min(16 * MAX_SPLIT, sub * k // group, triton.cdiv(16 * sms, blocks)))
    return GemvTiles(block_k=8, split_k=split, num_warps=1, sub=sub)


def skinny_tiles(m: int, n: int, k: int, group: int, device: torch.device) -> AwqTiles:
    """Tiles for 2 <= M <= 16: 256-column blocks (32 words: four warps of one 8-column MMA each, so no
    warp repeats another's work), whole groups per K share, about two programs per SM, unit values made
    two at a time (the fastest of the H200 sweep, docs/awq.md)."""
    if interpreting() or device.type != "cuda":
        return AwqTiles(16, 32, min(32, group), 1, 4, 1)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = triton.cdiv(n, 256)
    split = max(1, min(MAX_SPLIT, triton.cdiv(2 * sms, blocks), k // group))
    return AwqTiles(16, 256, min(group, 64), split, 4, 3, pairs=True)


def gemm_tiles(m: int, n: int, k: int, group: int, device: torch.device) -> AwqTiles:
    """Tiles for a prefill: 64 x 256 output tiles on the tensor cores, 64-deep K."""
    if interpreting() or device.type != "cuda":
        return AwqTiles(32, 32, min(32, group), 1, 4, 1)
    return AwqTiles(64, 256, min(group, 64), 1, 4, 3)


def mma_tiles(n: int, k: int, group: int, device: torch.device) -> MmaTiles:
    """One warp a program, K shares of whole groups for about 32 programs per SM (as many one-warp
    programs as an SM holds at 64 registers; 16 streamed 15-29% faster than 8 on the H200), one load
    ahead; 9..16 rows in one launch (H200, the four 6.7B matrices at 16 rows: 4-12% faster than two
    launches of 8, the same error against the reference)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return MmaTiles(max(1, min(k // group, triton.cdiv(32 * sms, n // 16))), 1, 1, one_pass=True)
