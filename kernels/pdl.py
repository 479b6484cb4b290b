"""Programmatic dependent launch (Hopper and later): the next kernel of a small step starts while this one
finishes, so the launch gap between dependent kernels (about 1.5 us each inside a CUDA graph, ten kernels
a layer) overlaps the previous kernel instead of following it.

Every kernel that takes `PDL` calls `pdl_enter` before it touches memory another kernel writes: it lets its
own successor launch, then waits until its predecessor has finished and its writes are visible. Work that
reads only weights (nothing in the step writes them) may run before the wait: the skinny GEMM prefetches
its first weight tiles there. A predecessor launched without the attribute (a cuBLAS GEMM, a PyTorch op)
simply completes first, as in any stream; the wait then returns at once.
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
