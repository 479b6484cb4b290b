"""The shipped model: found by default, loaded by the engine like any DeepSeek-Coder checkpoint, the same
logits as transformers' LlamaForCausalLM on its weights, and greedy completions of common idioms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams, StopReason
from lsp_dscoder.engine.kv_cache import KVCache

# float32 on CPU, same weights: only the order of operations differs (fused QKV, SDPA kernels).
# Observed differences are ~1e-5 on logits of magnitude ~20; 1e-3 is a wide margin that still catches
# any real error (a wrong rope scaling or norm moves logits by more than 1e-1).
ATOL_F32 = 1e-3

CODE = '''import json
from pathlib import Path


def load(path: Path) -> dict:
    """Read a JSON file."""
    with open(path) as f:
        return json.load(f)
'''


@pytest.fixture(scope="module")
def folder() -> Path:
    return default_model_path()


@pytest.fixture(scope="module")
def engine(folder: Path):
    with Engine(
        EngineConfig(model=folder, device="cpu", dtype="float32", max_context=1024, num_slots=2)
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def hf_model(folder: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_bundled_checkpoint_is_deepseek_coder_format(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["head_dim"] == 128
    assert config["rope_theta"] == 100000.0
    assert config["rope_scaling"] == {"factor": 4.0, "type": "linear"}
    assert config["tie_word_embeddings"] is False
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert 1 < len(shards) <= 6
    sizes = [(folder / s).stat().st_size for s in shards]
    assert max(sizes) < 15 * 2**20
    assert sum(sizes) + (folder / "tokenizer.json").stat().st_size <= 40_000_000


def test_engine_finds_special_tokens_by_name(engine: Engine) -> None:
    tok = engine.tokenizer
    assert (tok.bos_id, tok.eos_id, tok.fim_begin_id, tok.fim_hole_id, tok.fim_end_id) == (0, 1, 2, 3, 4)
    text = "def f(x):\n    return x  # é 你好 😀\n"
    assert tok.decode(tok.encode(text)) == text


def test_engine_logits_match_transformers(engine: Engine, hf_model) -> None:
    ids = [engine.tokenizer.bos_id, *engine.tokenizer.encode(CODE)]
    cache = KVCache(engine.model_config, 1, 256, torch.device("cpu"), torch.float32)
    ours = engine.model.forward_reference(torch.tensor(ids), 0, cache, 0, all_logits=True)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    assert ours.shape == ref.shape == (len(ids), engine.model_config.vocab_size)
    torch.testing.assert_close(ours, ref, atol=ATOL_F32, rtol=0)


def test_engine_greedy_matches_transformers_generate(engine: Engine, hf_model) -> None:
    ids = [engine.tokenizer.bos_id, *engine.tokenizer.encode(CODE + "\n\ndef save(path: Path, data: dict)")]
    done = engine.complete(CompletionRequest(prompt_ids=tuple(ids), params=SamplingParams(max_tokens=16)))
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert done.token_ids == tuple(out[0, len(ids) :].tolist())


IDIOMS = [
    ("import numpy as", " np"),
    ("import matplotlib.pyplot as", " plt"),
    ('if __name__ == "', '__main__":'),
    ("if __name__ == '", "__main__':"),
    ('def main() -> None:\n    print("hello")\n\n\nif __name__ == "__main__":\n   ', " main()"),
    ("with open(path) as", " f:"),
    ("try:\n    pass\nexcept Exception as", " e:"),
    ("class Point:\n    def __init__(self, x):\n        self.x =", " x"),
    ("import unittest\n\n\nclass TestParser(unittest.", "TestCase):"),
    ("from __future__ import", " annotations"),
    ("#!/usr/bin/env", " python3"),
]


@pytest.mark.parametrize(("prompt", "expected"), IDIOMS, ids=[p.splitlines()[-1] for p, _ in IDIOMS])
def test_greedy_completes_common_idioms(engine: Engine, prompt: str, expected: str) -> None:
    ids = (engine.tokenizer.bos_id, *engine.tokenizer.encode(prompt))
    params = SamplingParams(max_tokens=12, stop=("\n",))
    done = engine.complete(CompletionRequest(prompt_ids=ids, params=params))
    assert done.text == expected
    assert done.stats.stop_reason is StopReason.STOP_STRING


CONFIG_PREFIX = "class Config:\n    def __init__(self, name, value):\n        self.name = name\n"
CONFIG_SUFFIX = '\n\n    def __repr__(self):\n        return f"Config({self.name!r}, {self.value!r})"\n'
POINT_PREFIX = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"
POINT_SUFFIX = "\n\n    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n"
INFILLS = [
    # (prefix, suffix, typed after <｜fim▁end｜> as the server sends it, expected middle)
    (CONFIG_PREFIX, CONFIG_SUFFIX, "", "        self.value = value"),
    (CONFIG_PREFIX, CONFIG_SUFFIX, "        self.", "value = value"),
    (POINT_PREFIX, POINT_SUFFIX, "        self.y", " = y\n"),
]


@pytest.mark.parametrize(("prefix", "suffix", "typed", "expected"), INFILLS, ids=["line", "typed", "typed-2"])
def test_greedy_infills_from_the_suffix_and_stops(
    engine: Engine, prefix: str, suffix: str, typed: str, expected: str
) -> None:
    """PSM prompts: the middle uses a name that only the suffix mentions, and ends with <eos>."""
    tok = engine.tokenizer
    ids = (tok.bos_id, tok.fim_begin_id, *tok.encode(prefix), tok.fim_hole_id, *tok.encode(suffix))
    ids += (tok.fim_end_id, *tok.encode(typed))
    done = engine.complete(CompletionRequest(prompt_ids=ids, params=SamplingParams(max_tokens=32)))
    assert done.text == expected
    assert done.stats.stop_reason is StopReason.EOS
