"""Plain-PyTorch definitions that both the reference path (engine/model.py) and the kernels' oracles use:
the rotary table and RMSNorm, each defined once. No Triton here: the reference path runs without it.
"""

from __future__ import annotations

import torch


def rope_cos_sin(
    max_ctx: int, head_dim: int, theta: float, scaling_factor: float, device: torch.device | str
) -> torch.Tensor:
    """(max_ctx, head_dim) fp32: cos in the first half, sin in the second, for positions 0..max_ctx-1.

    Computed as Hugging Face's LlamaRotaryEmbedding does for rope_type "default" (scaling_factor 1.0) and
    "linear" (inverse frequencies divided by the factor), with the same fp32 steps: inverse frequencies on
    the CPU, then position * inverse frequency."""
    if max_ctx < 1 or head_dim < 2 or head_dim % 2:
        raise ValueError(f"need max_ctx >= 1 and an even head_dim, got {max_ctx}, {head_dim}")
    if not (theta > 0.0 and scaling_factor > 0.0):
        raise ValueError(f"theta and scaling_factor must be > 0, got {theta}, {scaling_factor}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    inv_freq = (inv_freq / scaling_factor).to(device)  # (D/2,)
    freqs = torch.arange(max_ctx, device=device).float()[:, None] * inv_freq[None, :]  # (max_ctx, D/2)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()


def rope_cos_sin_full(
    max_ctx: int, head_dim: int, theta: float, scaling_factor: float, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (max_ctx, head_dim) fp32 in rotate-half layout (each half-table repeated), as Hugging Face's
    `emb = cat(freqs, freqs)` gives them: the same values as `rope_cos_sin`."""
    cos, sin = rope_cos_sin(max_ctx, head_dim, theta, scaling_factor, device).chunk(2, dim=-1)
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """rmsnorm(x) * weight with Hugging Face's LlamaRMSNorm arithmetic: normalise in fp32, round to the
    input dtype, multiply by the weight (one rounding, to x.dtype). With `residual`: residual += x in place
    first (rounded to residual's dtype, as the model's separate add is), and that sum is normalised."""
    if residual is not None:
        residual.copy_((residual.float() + x.float()).to(residual.dtype))
        h_in = residual
    else:
        h_in = x
    h = h_in.float()
    normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(h_in.dtype)
    return (normed.float() * weight.float()).to(x.dtype)
