"""The fast path (CUDA): fused Triton kernels around cuBLAS GEMMs, and CUDA graphs for small steps.

One forward = per layer: fused residual-add + RMSNorm, one QKV GEMM, RoPE fused with the K/V store,
extend attention (decode attention for one token), one O GEMM, residual-add + RMSNorm, one gate/up GEMM,
SwiGLU, one down GEMM; then the LM head on the last valid position only.

Steps of at most 16 tokens (keystrokes, decode, small prefills) may run on the skinny GEMM (kernels/
skinny_gemm.py) instead of cuBLAS, as `fused_layer` (five launches a layer, six with GQA's split combine,
not ten) and with programmatic dependent launch: `capture` keeps the fastest per bucket (engine/
fast_choices.py). On INT4 AWQ weights those steps run the tensor-core kernel (kernels/awq_mma.py), whose
split-K sums the next kernel (RoPE, a norm, the SwiGLU) takes as it reads them (kernels/split_sums.py).

Small steps (a keystroke, a decode step) are captured as CUDA graphs per (slot, bucket): the step's
tokens are padded to the bucket, the start position and the index of the last real token live in device
tensors, so one replay serves any position. Padded tokens write K/V past the real ones, into rows that
are overwritten before they are ever read (the buffer has `max_bucket` spare rows at its end).
A cold prompt gets long prefill steps (engine/step_graphs.py PREFILL_BUCKETS, where they end within the
slot's rows): graphs for a small model, eager steps for a larger one where timed graphs predict them short.
Anything else larger runs eagerly: Triton takes the length as an argument, so no length recompiles.
"""

from __future__ import annotations

from typing import Any

import torch

from lsp_dscoder.engine import warmup
from lsp_dscoder.engine.awq import AwqLinear
from lsp_dscoder.engine.fast_buffers import ATTN_IN, MLP_IN, step_buffers
from lsp_dscoder.engine.fast_choices import BUCKETS, bucket_choices, choice_flags, eager_choice, graph_buckets
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.step_graphs import AHEAD, Interrupted, StepGraph, next_chunk, part_count
from lsp_dscoder.kernels.decode_attention import decode_attention
from lsp_dscoder.kernels.extend_attention import extend_attention
from lsp_dscoder.kernels.pdl import pdl_supported
from lsp_dscoder.kernels.rms_norm import rms_norm
from lsp_dscoder.kernels.rope_store import rope_store
from lsp_dscoder.kernels.silu_mul import silu_mul
from lsp_dscoder.kernels.skinny_gemm import MAX_M, skinny_gemm
from lsp_dscoder.kernels.skinny_parts import ResidualEpilogue, RmsScale, RopeEpilogue
from lsp_dscoder.kernels.split_sums import SplitSums

# What the layers pass on: the last layer's output (None before the first) and the residual stream.
Product = torch.Tensor | SplitSums  # a GEMM's output, or its sums for the next kernel to take
State = tuple[Product | None, torch.Tensor]


class FastRunner:
    """Runner (engine/generate.py) on the fast path. `graphs=False` runs the kernels eagerly (the CPU test
    suite does so under TRITON_INTERPRET=1). Steps of <= MAX_M tokens (engine/fast_choices.py): `gemm`
    "cublas", "skinny", or "auto" (the faster per graph bucket, timed in `capture`; eager steps take the
    skinny GEMM); `pdl` (sm_90+) and `fused_residual` (skinny path, `fused_layer`): always, never, or
    None: timed both ways where they apply. `fused_combine`: decode attention merges its splits in its last
    program instead of a second kernel (None: without GQA). `parts`: each step's graph in that many parts,
    which a stale step stops between (engine/step_graphs.py); None: by the weights' bytes."""

    # Set by the warm-up (engine/warmup.py): the engine thread's stream, every step's, and the graphs' pool.
    stream: torch.cuda.Stream
    pool: Any

    def __init__(
        self,
        model: Transformer,
        cache: KVCache,
        graphs: bool = True,
        buckets: tuple[int, ...] = BUCKETS,
        gemm: str = "auto",
        pdl: bool | None = None,
        fused_combine: bool | None = None,
        fused_residual: bool | None = None,
        parts: int | None = None,
        long_buckets: tuple[int, ...] | None = None,
    ) -> None:
        # The choice eager steps take; each graph is captured with its own (`_use`, `chosen`).
        self.eager_choice = eager_choice(gemm)  # checks `gemm`
        self.model, self.cache, self.cfg = model, cache, model.cfg
        dev, cfg = model.device, model.cfg
        plan = graph_buckets(model, cache, buckets, long_buckets) if graphs else ((), ())
        self.buckets, self.long_buckets = plan
        self.eager_buckets: tuple[int, ...] = ()  # longer steps without a graph: capture times them
        self.prefill_steps = self.long_buckets  # what `chunk` plans with: the long graphs, the eager steps
        self.scale = cfg.head_dim**-0.5
        # Static inputs of every graph: token ids (padded), start position, index of the last real token.
        self.ids = torch.zeros(max(self.buckets, default=1), dtype=torch.long, device=dev)
        self.start = torch.zeros(1, dtype=torch.int32, device=dev)
        self.last = torch.zeros(1, dtype=torch.long, device=dev)
        self.graphs: dict[tuple[int, int], StepGraph] = {}
        layer_bytes = sum(t.nbytes for layer in model.w.layers for t in layer.streamed())
        self.parts = part_count(layer_bytes, cfg.num_layers) if parts is None else max(1, parts)
        self.part_done: list[torch.cuda.Event] = []  # one per part, made by capture
        self.ahead = AHEAD  # parts queued behind the running one (engine/step_graphs.py)
        self.counts = {"graph_replays": 0, "eager_forwards": 0}
        self.gemm, self.pdl_option, self.fused_residual = gemm, pdl, fused_residual
        self.pdl_candidate = pdl is None and pdl_supported(dev)  # "skinny+pdl" is timed per bucket
        self._use(self.eager_choice)  # the flags read while a forward is traced or run
        self.chosen: dict[int, str] = {}  # bucket -> choice ("skinny+res+pdl", `_use`), filled by capture
        self.graph_pool_bytes = 0  # GPU memory of the captured graphs, measured by capture
        # What every step reads (engine/fast_buffers.py): the rotary table, the row sums of squares the fused
        # layer passes on, decode attention's arrival counters, the split-K workspace, packed INT4 buffers.
        bufs = step_buffers(model, cache.capacity, gemm != "cublas", fused_combine)
        self.cos_sin, self.sum_blocks, self.sums, self.attn_counts, self.workspace, self.packed = bufs

    def linear(self, x: torch.Tensor, w: torch.Tensor, packed: AwqLinear | None = None) -> Product:
        """x @ w.T for a layer matrix: the skinny GEMM for at most MAX_M rows when chosen, else cuBLAS; on
        packed weights, up to MAX_M rows as split-K sums for the next kernel (kernels/split_sums.py)."""
        if packed is not None:  # INT4 AWQ: the dense `w` is a meta tensor
            assert self.packed is not None  # made with the packed layers
            return self.packed.product(x, packed, self.pdl, self.stream_packed)
        if self.skinny and x.shape[0] <= MAX_M:
            return skinny_gemm(x, w, workspace=self.workspace, pdl=self.pdl)
        return x @ w.T

    # -- the forward pass ------------------------------------------------------------------------------
    def forward(
        self,
        ids: torch.Tensor,
        start: torch.Tensor,
        last: torch.Tensor | None,
        slot: int,
        interrupted: Interrupted | None = None,
    ) -> torch.Tensor | None:
        """ids (T,) at positions start..start+T-1 of `slot`; float32 logits (1, V) of token `last` (None:
        (T, V) of every token), or None when `interrupted` (asked between layers) says stop."""
        state = self.run_layers(self.embed(ids), range(len(self.model.w.layers)), start, slot, interrupted)
        return None if state is None else self.head(state, last)

    def embed(self, ids: torch.Tensor) -> State:
        return None, self.model.w.embed[ids]  # (T, C): the residual stream before the first layer

    def run_layers(
        self,
        state: State,
        layers: range,
        start: torch.Tensor,
        slot: int,
        interrupted: Interrupted | None = None,
    ) -> State | None:
        """The layers `layers` of the forward, from `state` (the last layer's output, None before the first
        layer, and the residual stream); None when `interrupted` says stop."""
        cfg, w, pdl, eps = self.cfg, self.model.w, self.pdl, self.cfg.rms_norm_eps
        x, residual = state
        t = residual.shape[0]
        seq_len = start + 1  # decode: the current token included
        for n in layers:
            if interrupted is not None and interrupted():
                self._stopped()
                return None
            layer = w.layers[n]
            if self.residual_now and layer.quant is None and t <= MAX_M:
                assert not isinstance(x, SplitSums)  # only packed layers leave sums
                x, residual = self.fused_layer(n, x, residual, start, seq_len, slot)
                continue
            aq = layer.quant  # packed AWQ matrices, or None
            qkv_p, o_p, gate_up_p, down_p = (aq.wqkv, aq.wo, aq.w_gate_up, aq.w_down) if aq else (None,) * 4
            if x is None:  # the embedding rows
                x = rms_norm(residual, layer.input_norm, eps, pdl=pdl)
                residual = residual.clone()
            else:  # residual += the MLP's output, then the norm
                x = rms_norm(x, layer.input_norm, eps, residual=residual, pdl=pdl)
            qkv = self.linear(x, layer.wqkv, qkv_p)  # (T, (H + 2*KVH) * D)
            kv = self.cache.k(n, slot), self.cache.v(n, slot)  # (KVH, capacity, D) each
            q = rope_store(qkv, self.cos_sin, start, *kv, cfg.num_heads, cfg.num_kv_heads, pdl=pdl)
            attn = self.attend(q, start, seq_len, n, slot)  # (T, H * D)
            o = self.linear(attn, layer.wo, o_p)  # (T, C)
            x = rms_norm(o, layer.post_norm, eps, residual=residual, pdl=pdl)  # residual += attention's out
            act = silu_mul(self.linear(x, layer.w_gate_up, gate_up_p), pdl=pdl)  # (T, I)
            x = self.linear(act, layer.w_down, down_p)  # (T, C)
        return x, residual

    def attend(
        self, q: torch.Tensor, start: torch.Tensor, seq_len: torch.Tensor, n: int, slot: int
    ) -> torch.Tensor:
        """Rotated q (T, H, D) or (T, H * D) attending over layer n's cache rows, the step's own K/V already
        stored: (T, H * D). seq_len (start + 1, made once a forward) is what decode attention reads."""
        kv = self.cache.k(n, slot), self.cache.v(n, slot)  # (KVH, capacity, D) each
        t, cfg, pdl = q.shape[0], self.cfg, self.pdl
        q = q.view(t, cfg.num_heads, cfg.head_dim)
        if t == 1:
            out = decode_attention(q, *kv, seq_len, self.scale, pdl=pdl, counts=self.attn_counts)
        else:
            out = extend_attention(q, *kv, start, self.scale, pdl=pdl)
        return out.view(t, cfg.q_size)

    def fused_layer(
        self,
        n: int,
        x: torch.Tensor | None,
        residual: torch.Tensor,
        start: torch.Tensor,
        seq_len: torch.Tensor,
        slot: int,
    ) -> State:
        """Layer n of a skinny step with the residual adds and norms in the GEMMs (kernels/skinny_parts.py):
        x is the residual times this layer's input-norm weight (after layer 0), and the layer returns the
        same for the next one; the last layer returns its down projection, for `head` to add and norm."""
        layers, eps, pdl, ws = self.model.w.layers, self.cfg.rms_norm_eps, self.pdl, self.workspace
        layer, cfg = layers[n], self.cfg
        scale = None
        if x is None:  # the embedding row: its norm as a kernel, once a step
            x = rms_norm(residual, layer.input_norm, eps, pdl=pdl)
            residual = residual.clone()
        else:
            scale = RmsScale(self.sums[ATTN_IN], self.sum_blocks[ATTN_IN], eps)
        k_cache, v_cache = self.cache.k(n, slot), self.cache.v(n, slot)
        rope = RopeEpilogue(self.cos_sin, start, k_cache, v_cache, cfg.num_heads, cfg.num_kv_heads)
        q = skinny_gemm(x, layer.wqkv, workspace=ws, pdl=pdl, rms=scale, rope=rope)  # (T, H * D), K/V stored
        attn = self.attend(q, start, seq_len, n, slot)  # (T, H * D)
        add = ResidualEpilogue(residual, layer.post_norm, self.sums[MLP_IN])
        x_mlp = skinny_gemm(attn, layer.wo, workspace=ws, pdl=pdl, residual=add)  # (T, C)
        scale = RmsScale(self.sums[MLP_IN], self.sum_blocks[MLP_IN], eps)
        # The SwiGLU in the same epilogue: one launch fewer, 1-2 % a step (docs/kernels.md §4).
        act = skinny_gemm(x_mlp, layer.w_gate_up, workspace=ws, pdl=pdl, rms=scale, glu=True)  # (T, I)
        if n == len(layers) - 1:
            return skinny_gemm(act, layer.w_down, workspace=ws, pdl=pdl), residual
        add = ResidualEpilogue(residual, layers[n + 1].input_norm, self.sums[ATTN_IN])
        return skinny_gemm(act, layer.w_down, workspace=ws, pdl=pdl, residual=add), residual

    def head(self, state: State, last: torch.Tensor | None) -> torch.Tensor:
        """The final norm and the LM head on row `last`: float32 logits (1, V); None: every row's (T, V)."""
        x, residual = state
        assert x is not None  # a model has at least one layer
        w = self.model.w
        x = rms_norm(x, w.norm, self.cfg.rms_norm_eps, residual=residual, pdl=self.pdl)  # (T, C)
        # The LM head stays on cuBLAS: at 32K rows it streams near copy bandwidth there (docs/kernels.md).
        if last is None:
            return (x @ w.lm_head.T).float()  # (T, V): a few rows cost what one does (the head is read once)
        return (x.index_select(0, last) @ w.lm_head.T).float()  # (1, V): LM head on one row

    # -- Runner protocol -------------------------------------------------------------------------------
    def prefill(
        self, ids: torch.Tensor, start: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        return self._step(ids, start, slot, interrupted)

    def chunk(self, remaining: int, start: int, limit: int) -> int:
        return next_chunk(remaining, start, self.prefill_steps, self.cache.capacity, limit)

    def decode(
        self, token: int, pos: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        self.ids[0] = token
        return self._step(self.ids[:1], pos, slot, interrupted)

    def verify(
        self, ids: torch.Tensor, start: int, slot: int, interrupted: Interrupted | None = None
    ) -> torch.Tensor | None:
        return self._step(ids, start, slot, interrupted, all_rows=True)

    def _step(
        self,
        ids: torch.Tensor,
        start: int,
        slot: int,
        interrupted: Interrupted | None,
        all_rows: bool = False,
    ) -> torch.Tensor | None:
        """One graph replay, which `interrupted` may stop between its parts (engine/step_graphs.py), or an
        eager forward that it may stop between layers; None when stopped, the rows it wrote not valid.
        Logits (1, V) of the last token, or (T, V) of every token when `all_rows`."""
        if interrupted is not None and interrupted():
            return None
        t = ids.shape[0]
        room = self.cache.capacity - start  # a bucket's padded rows must stay inside the slot
        bucket = next((b for b in self.buckets if t <= b <= room), None)
        step = self.graphs.get((slot, bucket)) if bucket is not None else None
        if step is None or (all_rows and step.rows is None):
            self.counts["eager_forwards"] += 1
            pos = torch.full((1,), start, dtype=torch.int32, device=ids.device)
            last = None if all_rows else torch.full((1,), t - 1, dtype=torch.long, device=ids.device)
            return self.forward(ids, pos, last, slot, interrupted)
        if ids.data_ptr() != self.ids.data_ptr():
            self.ids[:t].copy_(ids, non_blocking=True)
        self.start.fill_(start)
        self.last.fill_(t - 1)
        self.counts["graph_replays"] += 1
        if not step.replay(self.part_done, self.stream, interrupted, self.ahead):
            self._stopped()
            return None
        if all_rows:
            assert step.rows is not None
            return step.rows[:t].clone()
        return step.logits.clone()  # the graph's output buffer is rewritten by the next replay

    def _stopped(self) -> None:
        """A step stopped part-way may leave a GEMM's split-K sums untaken: zero them for the next one."""
        if self.packed is not None:
            self.packed.workspace.accum.zero_()

    # -- warm-up (engine/warmup.py): compile every kernel variant, capture and time the graphs --------
    def capture(self, progress: warmup.Progress | None = None) -> None:
        warmup.capture(self, progress)

    def _use(self, choice: str) -> None:
        """Set the flags the launches read for a choice (engine/fast_choices.py)."""
        flags = choice_flags(choice, self.fused_residual, self.pdl_option)
        self.skinny, self.stream_packed, self.residual_now, self.pdl = flags

    def _choices(self, bucket: int) -> tuple[str, ...]:
        return bucket_choices(bucket, self.gemm, self.fused_residual, self.pdl_candidate, self.packed)
