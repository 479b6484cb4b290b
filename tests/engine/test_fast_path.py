"""The fast path's forward (Triton kernels, run eagerly under TRITON_INTERPRET=1 on CPU) against the
reference path on the same weights and cache: prefill over a cached prefix, and decode steps."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from lsp_dscoder.engine import CompletionRequest, SamplingParams
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.engine import ReferenceRunner
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.generate import generate
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.engine.weights import load_weights
from tests.tiny import cached_checkpoint

# float32 end to end; the kernels accumulate in a different order than PyTorch's SDPA/GEMM, and the
# interpreter's dots run in fp32: observed ~1e-6 on logits of magnitude ~3.
ATOL = 1e-4


def build(folder: Path) -> tuple[Transformer, KVCache]:
    cfg = ModelConfig.from_file(folder / "config.json")
    cache = KVCache(cfg, 2, 64, torch.device("cpu"), torch.float32, pad=8)
    return Transformer(
        cfg, load_weights(folder, cfg, torch.device("cpu"), torch.float32), cache.capacity
    ), cache


def test_fast_forward_matches_reference(tmp_path_factory) -> None:
    folder = cached_checkpoint(
        tmp_path_factory.mktemp("fast"),
        "gqa-hd16",
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        rope_scaling={"type": "linear", "factor": 4.0},
    )
    model, cache = build(folder)
    fast = FastRunner(model, cache, graphs=False)
    ref = ReferenceRunner(model, cache)
    ids = torch.randint(0, model.cfg.vocab_size, (13,), generator=torch.Generator().manual_seed(0))
    # slot 0 via the fast path, slot 1 via the reference: cold prefill, extend over a prefix, decode
    for a, b in ((0, 9), (9, 12)):
        torch.testing.assert_close(
            fast.prefill(ids[a:b], a, 0), ref.prefill(ids[a:b], a, 1), atol=ATOL, rtol=0
        )
    torch.testing.assert_close(
        fast.decode(int(ids[12]), 12, 0), ref.decode(int(ids[12]), 12, 1), atol=ATOL, rtol=0
    )
    # both paths wrote the same K/V rows
    for layer in range(model.cfg.num_layers):
        torch.testing.assert_close(cache.k(layer, 0)[:, :13], cache.k(layer, 1)[:, :13], atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.v(layer, 0)[:, :13], cache.v(layer, 1)[:, :13], atol=1e-5, rtol=0)
    assert fast.counts == {"graph_replays": 0, "eager_forwards": 3}


def test_fast_path_generates_the_reference_tokens(tiny_model: Path) -> None:
    tok = Tokenizer(tiny_model)
    prompt = (tok.bos_id, tok.fim_begin_id, *tok.encode("def f(x):\n    "), tok.fim_hole_id, tok.fim_end_id)
    request = CompletionRequest(prompt, SamplingParams(max_tokens=6))
    runs = []
    for kind in (FastRunner, ReferenceRunner):  # separate caches: nothing is reused between the two
        model, cache = build(tiny_model)
        runner = (
            FastRunner(model, cache, graphs=False) if kind is FastRunner else ReferenceRunner(model, cache)
        )
        runs.append(generate(request, runner, cache, tok, threading.Event(), lambda e: None, 8, 0.0))
    assert runs[0].stats.prefilled_tokens == runs[1].stats.prefilled_tokens == len(prompt)
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) >= 1


def test_gemm_choices_give_the_same_logits(tmp_path_factory) -> None:
    """Steps of <= 16 tokens on the skinny GEMM and on torch's matmul (cuBLAS on a GPU) agree."""
    folder = cached_checkpoint(tmp_path_factory.mktemp("gemm"), "gemm", hidden_size=64, intermediate_size=96)
    model, cache = build(folder)
    ids = torch.randint(0, model.cfg.vocab_size, (11,), generator=torch.Generator().manual_seed(1))
    got = {}
    for slot, gemm in enumerate(("skinny", "cublas")):
        runner = FastRunner(model, cache, graphs=False, gemm=gemm)
        assert runner.pdl is False  # no programmatic launches on the CPU
        got[gemm] = (runner.prefill(ids[:10], 0, slot), runner.decode(int(ids[10]), 10, slot))
    for a, b in zip(got["skinny"], got["cublas"], strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_warm_up_candidates_and_their_flags(tiny_model: Path) -> None:
    """What capture times per bucket, and the flags each choice sets for the launches (the timing itself
    runs on a GPU only; PDL is offered as where the GPU supports it)."""
    model, cache = build(tiny_model)
    auto = FastRunner(model, cache, graphs=False)
    auto.pdl_candidate = True  # as on an sm_90 GPU
    assert auto._choices(4) == ("cublas", "skinny", "skinny+pdl", "skinny+res", "skinny+res+pdl")
    assert auto._choices(16) == auto._choices(1) and auto._choices(32) == ("cublas",)
    auto._use("skinny+res+pdl")
    assert (auto.skinny, auto.residual_now, auto.pdl) == (True, True, True)
    auto._use("cublas")
    assert (auto.skinny, auto.residual_now, auto.pdl) == (False, False, False)
    plain = FastRunner(model, cache, graphs=False, fused_residual=False)
    assert plain._choices(4) == ("cublas", "skinny")  # no PDL on the CPU
    forced = FastRunner(model, cache, graphs=False, gemm="skinny", pdl=True, fused_residual=True)
    assert forced._choices(4) == ("skinny",)
    forced._use("skinny")
    assert (forced.skinny, forced.residual_now, forced.pdl) == (True, True, True)


def test_bad_runner_options(tiny_model: Path) -> None:
    model, cache = build(tiny_model)
    with pytest.raises(ValueError, match="gemm must be one of"):
        FastRunner(model, cache, graphs=False, gemm="cutlass")
    runner = FastRunner(model, cache, graphs=False, pdl=True)
    with pytest.raises(ValueError, match="pdl needs a compiled launch on an sm_90"):
        runner.prefill(torch.tensor([1, 2]), 0, 0)


def test_interrupted_step_returns_none(tiny_model: Path) -> None:
    model, cache = build(tiny_model)
    runner = FastRunner(model, cache, graphs=False)
    calls = []

    def stop_at_second_layer() -> bool:
        calls.append(1)
        return len(calls) >= 2

    assert runner.prefill(torch.tensor([1, 2, 3]), 0, 0, stop_at_second_layer) is None
    assert len(calls) == 2  # once before the step, once before the second layer
    assert runner.decode(4, 3, 0, lambda: True) is None
    assert runner.decode(4, 3, 0, lambda: False) is not None
