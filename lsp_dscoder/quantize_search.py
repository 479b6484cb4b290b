"""Activation-aware scale search (AWQ, Lin et al. 2023) for one transformer layer, in plain PyTorch.

The layer runs on the calibration hidden states in fp32. For each group of linears that share an input
(QKV; gate/up; down; O when K/V heads equal query heads), the search tries per-input-channel scales
s = mean|x|^alpha for alpha on a grid of 0, 1/20, ..., 19/20 and keeps the one whose quantized output is
closest to the full-precision output (mean squared error over the calibration tokens):

    (x / s) @ Q(W * s).T  ~  x @ W.T

alpha = 0 is s = 1, plain round-to-nearest, so the search never does worse than RTN on its own data. The
chosen s is folded into the op before the group (an RMSNorm weight, or the rows of v_proj / up_proj), so
the checkpoint needs no extra tensors and any AWQ reader runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.model import apply_rope_ref, rms_norm_ref, rope_tables
from lsp_dscoder.kernels.awq_format import quantize_groups

GRID = 20
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fake_quant(w: torch.Tensor, group: int) -> torch.Tensor:
    """W (out, in) quantized to INT4 per group of `group` input channels and back, fp32."""
    q, z, s = quantize_groups(w.T, group)
    w_t: torch.Tensor = (q - z.repeat_interleave(group, 0)).float() * s.float().repeat_interleave(group, 0)
    return w_t.T


@dataclass(frozen=True)
class ScaleChoice:
    """The search's outcome for one group of linears: scales (in,), their alpha, and both errors."""

    scales: torch.Tensor
    alpha: float
    mse: float
    rtn_mse: float


def search_scales(x: torch.Tensor, weights: list[torch.Tensor], group: int, grid: int = GRID) -> ScaleChoice:
    """x (N, in) calibration inputs of linears `weights` [(out_i, in)], all fp32."""
    w = torch.cat(weights)  # (O, in)
    want = x @ w.T  # (N, O)
    x_mean = x.abs().mean(0)  # (in,)
    best: ScaleChoice | None = None
    rtn = float("nan")
    for i in range(grid):
        alpha = i / grid
        s = x_mean.pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()  # centred in log scale: neither the norm nor W drifts far
        got = x @ (fake_quant(w * s, group) / s).T
        mse = float((got - want).pow(2).mean())
        if i == 0:
            rtn = mse
        if best is None or mse < best.mse:
            best = ScaleChoice(s, alpha, mse, rtn)
    assert best is not None
    return ScaleChoice(best.scales, best.alpha, best.mse, rtn)


@dataclass
class DenseLayer:
    """One layer's full-precision tensors by checkpoint name suffix (q_proj, ..., input_layernorm)."""

    linears: dict[str, torch.Tensor]  # name -> (out, in) fp32
    input_norm: torch.Tensor  # (C,)
    post_norm: torch.Tensor  # (C,)


def run_layer(
    cfg: ModelConfig,
    layer: DenseLayer,
    hidden: list[torch.Tensor],
    group: int,
    search: bool,
    grid: int = GRID,
) -> tuple[list[torch.Tensor], list[ScaleChoice]]:
    """Fold the searched scales into `layer` (in place) and return the next layer's hidden states, computed
    with the full-precision layer, and the choices made. Without `search` nothing is scaled (RTN)."""
    lin = layer.linears
    acts: dict[str, list[torch.Tensor]] = {"qkv": [], "o": [], "gate_up": [], "down": []}
    out = []
    h_, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    for h in hidden:  # (T, C) one calibration sequence
        t = h.shape[0]
        cos, sin = rope_tables(cfg, t, h.device)
        x = rms_norm_ref(h, layer.input_norm, cfg.rms_norm_eps)
        acts["qkv"].append(x)
        q = apply_rope_ref((x @ lin["q_proj"].T).view(t, h_, d), cos, sin)  # (T, H, D)
        k = apply_rope_ref((x @ lin["k_proj"].T).view(t, kvh, d), cos, sin)  # (T, KVH, D)
        v = (x @ lin["v_proj"].T).view(t, kvh, d)
        k, v = (a.transpose(0, 1).repeat_interleave(h_ // kvh, dim=0) for a in (k, v))  # (H, T, D)
        attn = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True)  # (H, T, D)
        attn = attn.transpose(0, 1).reshape(t, cfg.q_size)  # (T, H*D)
        acts["o"].append(attn)
        h = h + attn @ lin["o_proj"].T
        x = rms_norm_ref(h, layer.post_norm, cfg.rms_norm_eps)
        acts["gate_up"].append(x)
        a = F.silu(x @ lin["gate_proj"].T) * (x @ lin["up_proj"].T)  # (T, I)
        acts["down"].append(a)
        out.append(h + a @ lin["down_proj"].T)
    if not search:
        return out, []
    choices = []
    # (activations, linears scaled up by s, where 1/s is folded: a norm weight or a linear's rows)
    plan: list[tuple[str, tuple[str, ...], str]] = [
        ("qkv", ("q_proj", "k_proj", "v_proj"), "input_norm"),
        ("gate_up", ("gate_proj", "up_proj"), "post_norm"),
        ("down", ("down_proj",), "up_proj"),
    ]
    if kvh == h_:  # with GQA one v_proj row feeds several o_proj columns: no single scale per row
        plan.append(("o", ("o_proj",), "v_proj"))
    for key, names, into in plan:
        choice = search_scales(torch.cat(acts[key]), [lin[n] for n in names], group, grid)
        for n in names:
            lin[n] = lin[n] * choice.scales  # (out, in) columns times s
        if into == "input_norm":
            layer.input_norm = layer.input_norm / choice.scales
        elif into == "post_norm":
            layer.post_norm = layer.post_norm / choice.scales
        else:
            lin[into] = lin[into] / choice.scales[:, None]  # rows: that linear's output divided by s
        choices.append(choice)
    return out, choices
