"""The cases `check_gpu` runs: each builds a kernel launch at a model's shapes and a check of what it wrote
against the kernel's reference; the attention kernels' graph-replay check (captured at one position, replayed
at another); plus the buffers, tolerances and FLOP/byte counts they share."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import decode_attention as da
from . import extend_attention as ea
from .rms_norm import rms_norm, rms_norm_ref
from .rope_store import rope_cos_sin, rope_store, rope_store_ref
from .shapes import Model
from .silu_mul import silu_mul, silu_mul_ref
from .skinny_gemm import MAX_M, skinny_gemm
from .skinny_parts import RmsScale
from .skinny_plan import SkinnyWorkspace
from .split_sums import SplitSums

Call = Callable[[], object]
# make() -> (launch, verify): verify compares what the first launch wrote with the reference.
Make = Callable[[], tuple[Call, Callable[[], float]]]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    if not torch.isfinite(got).all():
        return math.inf
    return float(((got - want).norm() / want.norm().clamp_min(1e-30)).item())


def randn(*shape: int, dev: torch.device) -> torch.Tensor:
    return torch.randn(*shape, device=dev).to(torch.bfloat16)


def kv_cache(m: Model, max_ctx: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return randn(m.kv_heads, max_ctx, m.head_dim, dev=dev), randn(m.kv_heads, max_ctx, m.head_dim, dev=dev)


def rms_case(m: Model, n_tok: int, dev: torch.device) -> Make:
    def make() -> tuple[Call, Callable[[], float]]:
        x, res, w = randn(n_tok, m.hidden, dev=dev), randn(n_tok, m.hidden, dev=dev), randn(m.hidden, dev=dev)
        x0, res0, out = x.clone(), res.clone(), torch.empty_like(x)
        return (
            lambda: rms_norm(x, w, 1e-6, residual=res, out=out),
            lambda: max(rel_err(out, rms_norm_ref(x0, w, 1e-6, residual=res0)), rel_err(res, res0)),
        )

    return make


def silu_case(m: Model, n_tok: int, dev: torch.device) -> Make:
    def make() -> tuple[Call, Callable[[], float]]:
        gate_up = randn(n_tok, 2 * m.inter, dev=dev)
        out = torch.empty(n_tok, m.inter, device=dev, dtype=torch.bfloat16)
        return lambda: silu_mul(gate_up, out=out), lambda: rel_err(out, silu_mul_ref(gate_up))

    return make


def rope_case(m: Model, n_tok: int, start: int, max_ctx: int, dev: torch.device) -> Make:
    def make() -> tuple[Call, Callable[[], float]]:
        cos_sin = rope_cos_sin(max_ctx, m.head_dim, 100000.0, 4.0, dev)
        qkv = randn(n_tok, (m.heads + 2 * m.kv_heads) * m.head_dim, dev=dev)
        k, v = kv_cache(m, max_ctx, dev)
        k0, v0, pos = k.clone(), v.clone(), torch.tensor([start], device=dev)
        out = torch.empty(n_tok, m.heads, m.head_dim, device=dev, dtype=torch.bfloat16)

        def verify() -> float:
            q_ref = rope_store_ref(qkv, cos_sin, pos, k0, v0, m.heads, m.kv_heads)
            return max(rel_err(out, q_ref), rel_err(k, k0), rel_err(v, v0))

        return lambda: rope_store(qkv, cos_sin, pos, k, v, m.heads, m.kv_heads, out=out), verify

    return make


def sums_case(m: Model, op: str, n_tok: int, dev: torch.device) -> Make:
    """A reader of split-K sums (kernels/split_sums.py) against the same reader on the totals rounded to
    bf16: what it writes must be equal (rel. error 0), and the totals must be left zero (error 1 if not)."""
    qkv = (m.heads + 2 * m.kv_heads) * m.head_dim

    def make() -> tuple[Call, Callable[[], float]]:
        totals = (
            torch.randn(n_tok, {"rmsnorm": m.hidden, "silu": 2 * m.inter, "rope": qkv}[op], device=dev) * 3
        )
        rounded = totals.to(torch.bfloat16)
        w, res, (k, v) = randn(m.hidden, dev=dev), randn(n_tok, m.hidden, dev=dev), kv_cache(m, 64, dev)
        kept = [res.clone(), k.clone(), v.clone()]  # the reference reader's own residual and cache
        cos_sin, pos = rope_cos_sin(64, m.head_dim, 100000.0, 4.0, dev), torch.tensor([n_tok], device=dev)

        def read(x: torch.Tensor | SplitSums, state: list[torch.Tensor]) -> torch.Tensor:
            if op == "rmsnorm":
                return rms_norm(x, w, 1e-6, residual=state[0])
            if op == "silu":
                return silu_mul(x)
            return rope_store(x, cos_sin, pos, state[1], state[2], m.heads, m.kv_heads)

        got: list[torch.Tensor] = []

        def verify() -> float:
            want = read(rounded, kept)
            same = [rel_err(a, b) for a, b in zip((got[0], res, k, v), (want, *kept), strict=True)]
            return max(*same, 1.0 if torch.count_nonzero(totals) else 0.0)

        return lambda: got.append(read(SplitSums(totals, torch.bfloat16), [res, k, v])), verify

    return make


def attn_case(
    m: Model,
    n_tok: int,
    prefix: int,
    max_ctx: int,
    dev: torch.device,
    decode: bool,
    splits: int | None = None,
) -> Make:
    def make() -> tuple[Call, Callable[[], float]]:
        q = randn(n_tok, m.heads, m.head_dim, dev=dev)
        k, v = kv_cache(m, max_ctx, dev)
        pos = torch.tensor([prefix + n_tok if decode else prefix], device=dev)
        out, scale = torch.empty_like(q), m.head_dim**-0.5
        if decode:
            return (
                lambda: da.decode_attention(q, k, v, pos, scale, out=out, num_splits=splits),
                lambda: rel_err(out, da.decode_attention_ref(q, k, v, pos, scale)),
            )
        return (
            lambda: ea.extend_attention(q, k, v, pos, scale, out=out, num_splits=splits),
            lambda: rel_err(out, ea.extend_attention_ref(q, k, v, pos, scale)),
        )

    return make


def fused_decode_case(m: Model, kv_len: int, max_ctx: int, dev: torch.device) -> Make:
    """Decode attention merging its own splits (arrival counters), as the fast path may run it."""

    def make() -> tuple[Call, Callable[[], float]]:
        q = randn(1, m.heads, m.head_dim, dev=dev)
        k, v = kv_cache(m, max_ctx, dev)
        pos, out, scale = torch.tensor([kv_len], device=dev), torch.empty_like(q), m.head_dim**-0.5
        counts = torch.zeros(m.kv_heads, dtype=torch.int32, device=dev)
        return (
            lambda: da.decode_attention(q, k, v, pos, scale, out=out, counts=counts),
            lambda: rel_err(out, da.decode_attention_ref(q, k, v, pos, scale)),
        )

    return make


def rms_gemm_case(m: Model, n_tok: int, n_out: int, dev: torch.device, glu: bool) -> Make:
    """The QKV or gate/up projection of the fused layer: x = residual * norm weight, scaled by the rows'
    1 / rms from block sums (RmsScale), gate/up with the SwiGLU in the epilogue (glu), as the fast path runs
    them for a small step."""

    def make() -> tuple[Call, Callable[[], float]]:
        res, w = randn(n_tok, m.hidden, dev=dev), randn(n_out, m.hidden, dev=dev)
        scale = (1 + 0.1 * torch.randn(m.hidden, device=dev)).to(torch.bfloat16)  # a trained norm's spread
        x_w = (res.float() * scale.float()).to(torch.bfloat16)
        sums = torch.zeros(4 * MAX_M, device=dev)
        sums.view(4, MAX_M)[:2, :n_tok] = res.float().square().view(n_tok, 2, -1).sum(-1).T  # two blocks
        rms = RmsScale(sums, 2, 1e-6)
        out = torch.empty(n_tok, n_out // 2 if glu else n_out, device=dev, dtype=torch.bfloat16)
        workspace = SkinnyWorkspace.allocate(n_out, 8, dev)

        def verify() -> float:
            # Against the kernels it replaces (each checked against its reference in this table).
            y = skinny_gemm(rms_norm(res, scale, 1e-6), w, workspace=workspace)
            return rel_err(out, silu_mul(y) if glu else y)

        return lambda: skinny_gemm(x_w, w, out=out, workspace=workspace, rms=rms, glu=glu), verify

    return make


def graph_replay_checks(m: Model, max_ctx: int, dev: torch.device, log: Callable[[str], None]) -> float:
    """Capture at one position, replay at another: the kernels must read positions on the device.
    Returns the worst relative error."""
    q1 = randn(1, m.heads, m.head_dim, dev=dev)
    q4 = randn(4, m.heads, m.head_dim, dev=dev)
    k, v = kv_cache(m, max_ctx, dev)
    pos = torch.tensor([7], device=dev)
    scale = m.head_dim**-0.5
    worst = 0.0
    calls = {
        "decode": lambda: da.decode_attention(q1, k, v, pos, scale),
        "extend": lambda: ea.extend_attention(q4, k, v, pos, scale),
    }
    for name, call in calls.items():
        call()
        if dev.type == "cuda":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = call()
            pos.fill_(max_ctx - 5)
            graph.replay()
        else:  # the interpreter has no graphs: a second call at the new position checks the rest
            pos.fill_(max_ctx - 5)
            out = call()
        ref = (
            da.decode_attention_ref(q1, k, v, pos, scale)
            if name == "decode"
            else ea.extend_attention_ref(q4, k, v, pos, scale)
        )
        err = rel_err(out, ref)
        worst = max(worst, err)
        log(f"graph replay {name:7s} {m.name}: captured at 7, replayed at {max_ctx - 5}: rel err {err:.2e}")
        pos.fill_(7)
    return worst


def attn_cost(m: Model, n_tok: int, prefix: int) -> tuple[float, float]:
    kv_len = prefix + n_tok
    io = 2 * n_tok * m.heads * m.head_dim * 2 + 2 * m.kv_heads * kv_len * m.head_dim * 2
    visible = n_tok * prefix + n_tok * (n_tok + 1) / 2  # causal (query, key) pairs
    return io, 4 * m.heads * m.head_dim * visible
