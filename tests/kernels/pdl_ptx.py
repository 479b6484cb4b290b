"""The PTX Triton emits for sm_90 for the kernel cases of tests/kernels/test_pdl_order.py, compiled on this
machine (no GPU needed). Run as a script without TRITON_INTERPRET (the interpreter has no compiler): it
prints one JSON object, case name -> PTX lines (stripped), or {"skip": reason}."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

CASES: dict[
    str, tuple[str, str, dict[str, str], dict[str, Any], int]
] = {}  # name -> module, kernel, types, ...


def _case(name: str, module: str, kernel: str, types: dict[str, str], consts: dict[str, Any], warps: int = 4):
    CASES[name] = (module, kernel, types, consts, warps)


_SKINNY_TYPES = {n: "*bf16" for n in ("x_ptr", "w_ptr", "out_ptr", "res_ptr", "norm_w_ptr")}
_SKINNY_TYPES |= {"part_ptr": "*fp32", "count_ptr": "*i32", "sums_ptr": "*fp32", "eps": "fp32"}
_SKINNY_TYPES |= {n: "i32" for n in ("M", "N", "K", "k_per_split", "sum_blocks", "max_ctx")}
_SKINNY_TYPES |= {"cos_sin_ptr": "*fp32", "start_ptr": "*i32", "k_ptr": "*bf16", "v_ptr": "*bf16"}
_SKINNY = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, GLU=False)
_SKINNY |= dict(RESIDUAL=False, RMS=False, BLOCK_B=1, ROPE=False, H=1, KVH=1, D=1)
_SKINNY |= dict(EVEN_K=True, UPCAST=False, PRECISION="tf32")
for split in (1, 4):
    _case(
        f"skinny split {split}",
        "skinny_gemm",
        "_skinny_kernel",
        _SKINNY_TYPES,
        {**_SKINNY, "SPLIT_K": split, "PDL": True},
    )
# The residual epilogue (split-K: in the last share) and the RMS scale: the release stays after the loop.
_case(
    "skinny residual",
    "skinny_gemm",
    "_skinny_kernel",
    _SKINNY_TYPES,
    _SKINNY | dict(SPLIT_K=4, PDL=True, RESIDUAL=True),
)
_case(
    "skinny rms",
    "skinny_gemm",
    "_skinny_kernel",
    _SKINNY_TYPES,
    _SKINNY | dict(SPLIT_K=1, PDL=True, RMS=True, BLOCK_B=128),
)
_case(
    "skinny glu rms",
    "skinny_gemm",
    "_skinny_kernel",
    _SKINNY_TYPES,
    _SKINNY | dict(SPLIT_K=1, PDL=True, GLU=True, RMS=True, BLOCK_B=64),
)
_ROPE = dict(SPLIT_K=1, PDL=True, RMS=True, BLOCK_B=64, ROPE=True, H=16, KVH=16, D=128)
_case("skinny rope rms", "skinny_gemm", "_skinny_kernel", _SKINNY_TYPES, _SKINNY | _ROPE)
_case(
    "skinny no pdl", "skinny_gemm", "_skinny_kernel", _SKINNY_TYPES, {**_SKINNY, "SPLIT_K": 1, "PDL": False}
)

_DECODE_TYPES = {
    "q_ptr": "*bf16",
    "k_ptr": "*bf16",
    "v_ptr": "*bf16",
    "seq_len_ptr": "*i32",
    "out_ptr": "*bf16",
}
_DECODE_TYPES |= {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "count_ptr": "*i32"}
_DECODE_TYPES |= {"max_ctx": "i32", "num_splits": "i32", "qk_scale": "fp32"}
_case(
    "decode attention",
    "decode_attention",
    "_decode_kernel",
    _DECODE_TYPES,
    dict(H=16, G=1, D=128, BLOCK_H=16, BLOCK_N=64, SPLIT=True, FUSED=True, BLOCK_S=16, UPCAST=False)
    | dict(PRECISION="tf32", PDL=True),
)
_MMA_TYPES = {"x_ptr": "*i32", "qp_ptr": "*i32", "qz_ptr": "*i32", "s_ptr": "*fp16", "out_ptr": "*bf16"}
_MMA_TYPES |= {"acc_ptr": "*fp32", "count_ptr": "*i32", "M": "i32", "groups_per_split": "i32"}
_case(
    "awq mma",
    "awq_mma",
    "_mma_kernel",
    _MMA_TYPES,
    dict(N=4096, K=4096, GROUP=128, LW=4, NW=1, SPLIT_K=4, DEPTH=1, MB=1, PDL=True, SUMS=False),
    warps=1,
)
_NORM_TYPES = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "C": "i32"}
_case(
    "rms norm",
    "rms_norm",
    "_rms_norm_kernel",
    _NORM_TYPES | {"eps": "fp32"},
    dict(HAS_RESIDUAL=True, BLOCK_C=2048, PDL=True, SUMS=False),
)
# Split-K sums (kernels/split_sums.py): the GEMM only adds, the norm takes fp32 totals and zeroes them.
_case(
    "awq mma sums",
    "awq_mma",
    "_mma_kernel",
    _MMA_TYPES | {"out_ptr": "*fp32"},
    dict(N=4096, K=4096, GROUP=128, LW=4, NW=1, SPLIT_K=4, DEPTH=1, MB=1, PDL=True, SUMS=True),
    warps=1,
)
_case(
    "rms norm sums",
    "rms_norm",
    "_rms_norm_kernel",
    _NORM_TYPES | {"x_ptr": "*fp32", "eps": "fp32"},
    dict(HAS_RESIDUAL=True, BLOCK_C=2048, PDL=True, SUMS=True),
)


def compile_all() -> dict[str, Any]:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget

    out: dict[str, Any] = {}
    for name, (module, kernel, types, consts, warps) in CASES.items():
        fn = getattr(importlib.import_module(f"lsp_dscoder.kernels.{module}"), kernel)
        signature = {arg: types.get(arg, "constexpr") for arg in fn.arg_names}
        missing = [a for a, kind in signature.items() if kind == "constexpr" and a not in consts]
        if missing:
            raise ValueError(f"{name}: no value for constexprs {missing}")
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts)
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        except RuntimeError as e:  # a Triton build without the NVIDIA backend's tools
            return {"skip": f"cannot compile for sm_90 here: {e}"}
        out[name] = [line.strip() for line in compiled.asm["ptx"].splitlines()]
    return out


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run without TRITON_INTERPRET=1: the interpreter compiles nothing")
    json.dump(compile_all(), sys.stdout)
