"""The transformer: Llama architecture as DeepSeek-Coder uses it, with the plain-PyTorch reference path.

The reference path runs anywhere (CPU included) and is the oracle the fast path is checked against.
Both read and write the same KV buffer (engine/kv_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.weights import Weights
from lsp_dscoder.kernels.reference import rms_norm_ref as rms_norm_ref  # one RMSNorm for both paths
from lsp_dscoder.kernels.reference import rope_cos_sin_full


def rope_tables(cfg: ModelConfig, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (length, D) in float32, with linear scaling: the fast path's table (kernels/reference.py)."""
    return rope_cos_sin_full(length, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor, device)


# Reduced precision on the CPU: a step of more than BOUNDED_FROM - 1 tokens has its queries padded to a
# power of two and its keys to a multiple of KEY_BLOCK for attention (`bounded_shapes`); the reference
# path's cache has KEY_BLOCK spare rows for them. Shorter steps (decode, keystrokes) keep their own shapes:
# over thousands of key counts they left torch's memory flat, and a mask would slow a decode step.
KEY_BLOCK = 256
BOUNDED_FROM = 9


def causal_mask(t: int, start: int, end: int, device: torch.device) -> torch.Tensor:
    """(T, end) bool: query i, at position start + i, sees the keys at positions <= start + i."""
    return torch.ones(t, end, dtype=torch.bool, device=device).tril(diagonal=start)


def bounds_attention(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the reference path pads attention's shapes (`bounded_shapes`): reduced precision on the CPU."""
    return device.type == "cpu" and dtype != torch.float32


def bounded_shapes(
    t: int, start: int, end: int, capacity: int, device: torch.device
) -> tuple[int, torch.Tensor]:
    """Attention of T queries at positions start..end-1 on shapes from a bounded set: the queries padded to
    P, the next power of two, the keys to E, the next multiple of KEY_BLOCK; returns E and the boolean mask
    (P, E). torch's CPU flash attention in bf16 keeps memory for every (queries, keys) shape it meets
    (docs/benchmarks.md: 72 MB over 6,000 calls of new shapes); on these it stays flat. Keys end..E are
    masked, and the padded queries see what the last real one sees (their outputs are dropped)."""
    p = 1 << (t - 1).bit_length()
    e = min(-(-end // KEY_BLOCK) * KEY_BLOCK, capacity)
    mask = torch.zeros(p, e, dtype=torch.bool, device=device)
    mask[:t, :end] = causal_mask(t, start, end, device)
    mask[t:] = mask[t - 1]
    return e, mask


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, D); cos/sin (T, D) already in x's dtype. The rotate-half convention of HF Llama."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Transformer:
    """Weights + config + rope tables; `forward_reference` is the readable path."""

    def __init__(self, cfg: ModelConfig, weights: Weights, rope_length: int) -> None:
        self.cfg = cfg
        self.w = weights
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.cos, self.sin = rope_tables(cfg, rope_length, self.device)
        self.bounded = bounds_attention(self.device, self.dtype)

    def forward_reference(
        self, ids: torch.Tensor, start: int, cache: KVCache, slot: int, all_logits: bool = False
    ) -> torch.Tensor:
        """Run tokens `ids` (T,) at positions start..start+T-1 of `slot`; store their K/V in the cache.

        Returns float32 logits (T, V) if all_logits else (1, V) for the last position.
        """
        logits = self.forward_interruptible(ids, start, cache, slot, all_logits)
        assert logits is not None  # never interrupted without an `interrupted` check
        return logits

    @torch.inference_mode()
    def forward_interruptible(
        self,
        ids: torch.Tensor,
        start: int,
        cache: KVCache,
        slot: int,
        all_logits: bool = False,
        interrupted: Callable[[], bool] | None = None,
    ) -> torch.Tensor | None:
        """`forward_reference` that asks `interrupted` before each layer after the first and, when it
        says so, stops and returns None: a new keystroke never waits for a stale forward. The rows it
        wrote are then not valid; the caller does not count them as cached."""
        cfg, w = self.cfg, self.w
        t = ids.shape[0]
        h_, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        groups = h_ // kvh
        end = start + t
        cos = self.cos[start:end].to(self.dtype)  # (T, D)
        sin = self.sin[start:end].to(self.dtype)
        # query i (absolute position start+i) sees key positions <= start+i; one query sees them all
        mask, keys_end, pad_rows = None, end, 0
        bounded = self.bounded and t >= BOUNDED_FROM
        if bounded:  # (P, E): queries and keys padded, see bounded_shapes
            keys_end, mask = bounded_shapes(t, start, end, cache.capacity, self.device)
            pad_rows = mask.shape[0] - t
        elif t > 1:
            mask = causal_mask(t, start, end, self.device)  # (T, S)
        h = w.embed[ids]  # (T, C)
        for n, layer in enumerate(w.layers):
            if n and interrupted is not None and interrupted():
                return None
            x = rms_norm_ref(h, layer.input_norm, cfg.rms_norm_eps)
            qkv = x @ layer.wqkv.T  # (T, (H + 2*KVH) * D)
            q, k, v = torch.split(qkv, [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = apply_rope_ref(q.view(t, h_, d), cos, sin)  # (T, H, D)
            k = apply_rope_ref(k.view(t, kvh, d), cos, sin)  # (T, KVH, D)
            k_cache, v_cache = cache.k(n, slot), cache.v(n, slot)  # (KVH, capacity, D)
            k_cache[:, start:end] = k.transpose(0, 1)
            v_cache[:, start:end] = v.view(t, kvh, d).transpose(0, 1)
            # Batched (1, H, T, D): on CPU that form takes PyTorch's fused attention kernel, the 3-D form
            # its unfused math path (half the speed of a decode step's attention at 1K-4K keys).
            if bounded:
                # Rows end..E hold nothing of this sequence; a NaN there would pass a zero weight.
                k_cache[:, end:keys_end].zero_()
                v_cache[:, end:keys_end].zero_()
                q = torch.cat([q, q.new_zeros(pad_rows, h_, d)]) if pad_rows else q  # (P, H, D)
            keys, values = k_cache[:, :keys_end], v_cache[:, :keys_end]  # (KVH, S, D)
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=0)  # (H, S, D)
                values = values.repeat_interleave(groups, dim=0)
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask
            )[0, :, :t]  # (H, T, D), the padded queries' rows dropped
            h = h + attn.transpose(0, 1).reshape(t, cfg.q_size) @ layer.wo.T  # (T, C)
            x = rms_norm_ref(h, layer.post_norm, cfg.rms_norm_eps)
            gate, up = (x @ layer.w_gate_up.T).chunk(2, dim=-1)  # (T, I) each
            h = h + (F.silu(gate) * up) @ layer.w_down.T
        if not all_logits:
            h = h[-1:]  # the LM head runs on the last position only
        return (rms_norm_ref(h, w.norm, cfg.rms_norm_eps) @ w.lm_head.T).float()  # (T or 1, V)
