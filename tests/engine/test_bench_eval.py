"""`lsp-dscoder eval` and the bench's builders on tiny checkpoints: the eval report's structure, the
server prompt of its server-layout rows, the protocol bench's random checkpoints, and the engine factory."""

from __future__ import annotations

import importlib
import inspect
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lsp_dscoder.bench_docs import tokenizer_vocab, write_random_checkpoint
from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.engine import ReferenceRunner
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.factory import assemble
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.engine.weights import load_weights
from lsp_dscoder.evaluate import Case, ContextFile, server_prompt
from lsp_dscoder.prompt import Budgets, PromptBuilder

MODULES = ("json.decoder", "json.encoder", "textwrap")


def _heldout(path: Path) -> Path:
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for name in MODULES:
            text = inspect.getsource(importlib.import_module(name))
            f.write(json.dumps({"id": f"stdlib:{name.replace('.', '/')}.py", "text": text}) + "\n")
    return path


@pytest.mark.slow
def test_eval_report_on_tiny_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    data = _heldout(tmp_path / "heldout.jsonl.xz")
    argv = [sys.executable, "-m", "lsp_dscoder", "eval", "--model", str(tiny_model), "--data", str(data)]
    argv += ["--samples", "3", "--ppl-tokens", "300", "--ppl-window", "128", "--timing-runs", "1", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["heldout_files"] == len(MODULES) and report["context_files"] == 2
    for row in ("line", "line_anchored", "line_healed", "line_l2r", "fim"):
        assert report[row]["cases"] == 3 and len(report[row]["examples"]) == 3
        assert report[row]["exact_match"] == sum(e["hit"] for e in report[row]["examples"]) / 3
    assert report["ppl"]["tokens"] >= 300 and report["ppl"]["perplexity"] > 1.0
    # eval itself fails unless the +4 typed tokens reuse the first prompt's cache
    assert report["ttft"]["runs"] == 1 and 0 < report["ttft"]["prompt_prefilled_tokens"] <= 1024


def test_server_prompt_is_the_servers_layout(tiny_model: Path) -> None:
    tok = Tokenizer(tiny_model)
    budgets = Budgets(context_tokens=200, prefix_tokens=300, suffix_tokens=100)
    other = ContextFile("pkg/util.py", "def helper(x):\n    return x\n", "python", ("stdlib:pkg/util.py", 1))
    line = "    value = compute(arg"
    case = Case("stdlib:a.py", "import os\n\ndef f(arg):\n" + line, "s)", "\n    return value\n")
    ids, heal = server_prompt(PromptBuilder(tok, budgets, heal=True), case, (other,))
    enc = tok.encode
    head = (tok.bos_id, tok.fim_begin_id, *enc("# pkg/util.py\ndef helper(x):\n    return x\n"))
    head += (
        *enc("import os\n\ndef f(arg):\n"),
        tok.fim_hole_id,
        *enc("\n    return value\n"),
        tok.fim_end_id,
    )
    assert heal == "arg" and ids == head + tuple(enc("    value = compute("))
    # the same ids as the server's builder gives the document directly at the cursor
    fresh = PromptBuilder(tok, budgets, heal=True).build(
        case.prefix + case.suffix, len(case.prefix), lambda: (other,), "python"
    )
    assert (tuple(fresh.ids), fresh.heal_text) == (ids, heal)
    plain_ids, plain_heal = server_prompt(PromptBuilder(tok, budgets, heal=False), case, (other,))
    assert plain_heal == "" and plain_ids == head + tuple(enc(line))


def test_random_checkpoint_never_generates_past_the_tokenizer(tiny_model: Path, tmp_path: Path) -> None:
    config = {**json.loads((tiny_model / "config.json").read_text()), "vocab_size": 512}
    folder = write_random_checkpoint(tmp_path / "ckpt", config, tiny_model)
    vocab = tokenizer_vocab(tiny_model)
    cfg = ModelConfig.from_file(folder / "config.json")
    weights = load_weights(folder, cfg, torch.device("cpu"), torch.float32)
    assert cfg.vocab_size == 512 and vocab < 512
    assert (
        torch.count_nonzero(weights.lm_head[vocab:]) == 0 and torch.count_nonzero(weights.lm_head[:vocab]) > 0
    )
    with Engine(EngineConfig(model=folder, max_context=256, num_slots=1)) as engine:
        tok = engine.tokenizer
        prompt = (tok.bos_id, *tok.encode("def main():\n"))
        done = engine.complete(CompletionRequest(prompt_ids=prompt, params=SamplingParams(max_tokens=16)))
    assert len(done.token_ids) == 16 and max(done.token_ids) < vocab


def test_factory_builds_the_reference_path_on_cpu(tiny_model: Path) -> None:
    cfg = ModelConfig.from_file(tiny_model / "config.json")
    cpu = torch.device("cpu")
    weights = load_weights(tiny_model, cfg, cpu, torch.float32)
    built = assemble(cfg, weights, num_slots=2, max_context=64, device=cpu, dtype=torch.float32)
    assert isinstance(built.runner, ReferenceRunner) and not built.fast_path and built.warmup_s == 0.0
    assert built.cache.capacity == 64 and len(built.cache.slots) == 2  # no graph padding off the fast path
    ids = torch.tensor([1, 5, 9])
    want = built.model.forward_reference(ids, 0, built.cache, 1)
    assert torch.equal(built.runner.prefill(ids, 0, 1), want)
    with pytest.raises(EngineError, match="needs a CUDA device"):
        assemble(cfg, weights, num_slots=1, max_context=64, device=cpu, dtype=torch.float32, fast_path=True)
