"""Programmatic dependent launch (Hopper and later): the next kernel of a small step launches while this one
finishes, so its launch and start-up overlap the end of this one instead of following it.

Every kernel that takes `PDL` waits (`pdl_wait`) before it touches memory another kernel writes, and lets
its successor launch (`pdl_release`). Where it does so matters. Kernels with a main loop (the GEMMs, the
attention kernels) release once their loop is done: their successor then launches during the epilogue.
The small kernels (norms, RoPE, SwiGLU, the split combine) release at entry (`pdl_enter`), so the GEMM or
attention kernel after them is resident and waiting when they finish. Releasing at entry in the big kernels
too, or prefetching weights into L2 before the wait, made steps slower on the H200 (docs/kernels.md). A
predecessor launched without the attribute (a cuBLAS GEMM, a PyTorch op) simply completes first, as in any
stream; the wait then returns at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .contract import interpreting


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """Let the next kernel in the stream launch (its own wait still orders its memory accesses)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait until the previous kernel has completed and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    pdl_release(PDL)
    pdl_wait(PDL)


def pdl_supported(device: torch.device) -> bool:
    """Hopper (sm_90) or later, compiled (the interpreter has no grids to overlap)."""
    return device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(pdl: bool) -> dict[str, bool]:
    """Keywords for a kernel launch; a launch with `pdl` must pass PDL=True to the kernel as well."""
    return {"launch_pdl": True} if pdl else {}


def check_pdl(pdl: bool, device: torch.device) -> None:
    if pdl and not pdl_supported(device):
        raise ValueError(f"pdl needs a compiled launch on an sm_90 or later CUDA device, not {device}")
