"""What a step of the fast path (engine/fast.py) may run as: the step lengths that get CUDA graphs (buckets),
the choices the warm-up times for each bucket (engine/warmup.py), and the flags a choice sets.

A choice is named as the warm-up reports it (`FastRunner.chosen`, `lsp-dscoder bench`'s "GEMM choice"
line): "cublas"; "packed" (INT4 weights streamed by the tensor-core kernel past MAX_M rows, engine/
awq_fast.py); or "skinny" (kernels/skinny_gemm.py) with "+res" (the fused layer: residual adds, norms,
SwiGLU and RoPE in the GEMMs' epilogues, kernels/skinny_parts.py) and "+pdl" (programmatic dependent
launch, kernels/pdl.py). The winner depends on shape, bucket and GPU (docs/kernels.md §4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from lsp_dscoder.engine.step_graphs import long_prefill_buckets
from lsp_dscoder.kernels.skinny_gemm import MAX_M

if TYPE_CHECKING:
    from lsp_dscoder.engine.awq_fast import PackedLinears
    from lsp_dscoder.engine.kv_cache import KVCache
    from lsp_dscoder.engine.model import Transformer

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GEMM_CHOICES = ("auto", "cublas", "skinny")


class ChoiceFlags(NamedTuple):
    """The flags the launches read while a forward is traced or run."""

    skinny: bool  # the skinny GEMM for steps of at most MAX_M rows
    stream_packed: bool  # packed weights streamed by the tensor-core kernel past MAX_M rows
    residual: bool  # the fused layer
    pdl: bool  # programmatic dependent launch


def choice_flags(choice: str, fused_residual: bool | None, pdl: bool | None) -> ChoiceFlags:
    """The flags of `choice`; `fused_residual` (on the skinny GEMM) and `pdl` set to True force theirs on
    whatever the choice (FastRunner's options of the same names)."""
    parts = choice.split("+")
    skinny = parts[0] == "skinny"
    return ChoiceFlags(
        skinny=skinny,
        stream_packed=parts[0] == "packed",
        residual="res" in parts or (skinny and fused_residual is True),
        pdl="pdl" in parts or pdl is True,
    )


def eager_choice(gemm: str) -> str:
    """The choice of steps without a graph for FastRunner's `gemm` option, which is checked here."""
    if gemm not in GEMM_CHOICES:
        raise ValueError(f"gemm must be one of {GEMM_CHOICES}, got {gemm!r}")
    return "cublas" if gemm == "cublas" else "skinny"


def bucket_choices(
    bucket: int,
    gemm: str,
    fused_residual: bool | None,
    pdl_candidate: bool,
    packed: PackedLinears | None,
) -> tuple[str, ...]:
    """The choices the warm-up times for a graph bucket (a single one is not timed), from FastRunner's
    options: `gemm` (GEMM_CHOICES), `fused_residual` (None: both ways), whether PDL is a candidate, and the
    model's packed INT4 matrices (None: a dense model)."""
    if packed is not None and packed.streams(bucket):
        return ("cublas", "packed")  # dequantized for cuBLAS, or the packed weights streamed
    if bucket > MAX_M or gemm == "cublas":
        return ("cublas",)
    # Where an option is None, both ways are timed. PDL only with the skinny GEMM: a cuBLAS kernel
    # between two Triton ones breaks the chain. Packed layers run their own kernels and no fused
    # layer whatever the choice: only PDL is theirs to time.
    res = ("", "+res") if fused_residual is None and packed is None else ("",)
    pdl = ("", "+pdl") if pdl_candidate else ("",)
    skinny = tuple(f"skinny{r}{p}" for r in res for p in pdl)
    return ("cublas", *skinny) if gemm == "auto" and packed is None else skinny


def graph_buckets(
    model: Transformer, cache: KVCache, buckets: tuple[int, ...], long_buckets: tuple[int, ...] | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(every bucket that gets graphs, the long ones among them). Padded `buckets` fit at any position (the
    cache's spare rows); `long_buckets` (None: engine/step_graphs.py's for this model on its device) are
    kept where longer than those, and `chunk` plans prefill steps with them."""
    padded = tuple(b for b in buckets if b <= cache.capacity - cache.max_context)
    if long_buckets is None:
        long_buckets = long_prefill_buckets(model.cfg, cache.max_context, model.w.embed)
    long = tuple(b for b in long_buckets if b > max(padded, default=0))
    return (*padded, *long), long
