"""Host-side checks shared by the kernel launchers: a bad argument raises ValueError naming it, before any
launch, instead of a Triton compile error or a silent out-of-bounds access on the device."""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
POSITION_DTYPES = (torch.int32, torch.int64)


def interpreting() -> bool:
    """True under Triton's interpreter, which runs kernels on CPU tensors (the CPU test suite)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_tensor(
    name: str,
    t: object,
    *,
    shape: tuple[int, ...] | None = None,
    ndim: int | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check one tensor argument; every kernel indexes its arguments as dense row-major arrays."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if not (t.is_cuda or interpreting()):
        raise ValueError(f"{name} must be a CUDA tensor (got {t.device}); CPU needs TRITON_INTERPRET=1")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, the other arguments on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {t.stride()} for shape {tuple(t.shape)})")
    return t


def check_position(name: str, t: object, device: torch.device) -> torch.Tensor:
    """A position held on the device (one int32/int64 element) so that a CUDA graph can replay with a new
    value; its value cannot be checked here without a device sync, so the kernels clamp what they touch."""
    check_tensor(name, t, dtypes=POSITION_DTYPES, device=device)
    assert isinstance(t, torch.Tensor)
    if t.numel() != 1:
        raise ValueError(f"{name} must hold exactly one element, got shape {tuple(t.shape)}")
    return t


def check_head_dim(head_dim: int) -> None:
    # Tiles span a whole head (tl.arange needs a power of two) and tl.dot needs K >= 16.
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")


def check_out(
    out: torch.Tensor | None, like_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The caller's output buffer (static addresses for CUDA graphs), or a fresh one."""
    if out is None:
        return torch.empty(like_shape, dtype=dtype, device=device)
    return check_tensor("out", out, shape=like_shape, dtypes=(dtype,), device=device)


def check_kv_caches(
    k_cache: object, v_cache: object, q: torch.Tensor, n_heads: int, head_dim: int
) -> tuple[int, int]:
    """One slot's caches for attention: k_cache and v_cache (KVH, max_ctx, head_dim) in q's dtype and
    device, with n_heads a multiple of KVH. Returns (KVH, max_ctx)."""
    k = check_tensor("k_cache", k_cache, ndim=3, dtypes=(q.dtype,), device=q.device)
    n_kv, max_ctx, cache_dim = k.shape
    check_tensor("v_cache", v_cache, shape=tuple(k.shape), dtypes=(q.dtype,), device=q.device)
    if cache_dim != head_dim:
        raise ValueError(f"k_cache head_dim {cache_dim} != q head_dim {head_dim}")
    if n_kv < 1 or n_heads % n_kv:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of KV heads ({n_kv})")
    return n_kv, max_ctx
