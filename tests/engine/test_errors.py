"""Every bad input the engine can meet gets its own clear error (and the engine keeps serving)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams
from lsp_dscoder.engine.checkpoint import resolve_model
from lsp_dscoder.engine.errors import (
    CheckpointError,
    ContextOverflowError,
    EngineError,
    UnsupportedModelError,
)


@pytest.fixture()
def copy(tiny_model: Path, tmp_path: Path):
    def make() -> Path:
        dst = tmp_path / "ckpt"
        shutil.copytree(tiny_model, dst)
        return dst

    return make


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def load(folder: Path) -> Engine:
    return Engine(EngineConfig(model=folder, max_context=64))


def test_unsupported_architecture(copy) -> None:
    folder = copy()
    edit_config(folder, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2")
    with pytest.raises(UnsupportedModelError, match="unsupported architecture DeepseekV2ForCausalLM"):
        load(folder)


def test_an_architecture_and_model_type_that_disagree_are_both_named(copy) -> None:
    folder = copy()
    edit_config(folder, architectures=["LlamaForCausalLM"], model_type="deepseek_v2")
    with pytest.raises(
        UnsupportedModelError,
        match=r"unsupported architectures \['LlamaForCausalLM'\], model_type 'deepseek_v2' in",
    ):
        load(folder)
    edit_config(folder, architectures=[], model_type="llama")
    with pytest.raises(
        UnsupportedModelError, match=r"unsupported architecture llama \(no 'architectures' list\) in"
    ):
        load(folder)


def test_remote_code_is_refused(copy) -> None:
    folder = copy()
    edit_config(folder, auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    with pytest.raises(UnsupportedModelError, match="trust_remote_code"):
        load(folder)


def test_unsupported_rope_scaling(copy) -> None:
    folder = copy()
    edit_config(folder, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e5})
    with pytest.raises(UnsupportedModelError, match="rope scaling 'yarn'"):
        load(folder)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("config.json", "missing config.json"),
        ("tokenizer.json", "missing tokenizer.json"),
        ("model.safetensors", "missing model.safetensors or model.safetensors.index.json"),
    ],
)
def test_missing_file_is_named(copy, name: str, message: str) -> None:
    folder = copy()
    (folder / name).unlink()
    with pytest.raises(CheckpointError, match=message):
        load(folder)


def test_missing_shard_is_named(copy) -> None:
    folder = copy()
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors",
        },
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="missing shard model-00002-of-00002.safetensors"):
        load(folder)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupted_safetensors(copy, damage: str) -> None:
    folder = copy()
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(b"\x07not a safetensors file" if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load(folder)


def test_shape_mismatch_names_tensor(copy) -> None:
    folder = copy()
    edit_config(folder, intermediate_size=200)
    with pytest.raises(
        CheckpointError,
        match=r"mlp.gate_proj.weight has shape \(176, 64\) but config.json implies \(200, 64\)",
    ):
        load(folder)


def test_tokenizer_without_fim_tokens(copy) -> None:
    folder = copy()
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"] = [e for e in tok["added_tokens"] if e["content"] != "<｜fim▁hole｜>"]
    vocab = tok["model"]["vocab"]
    vocab["<hole>"] = vocab.pop("<｜fim▁hole｜>")
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    with pytest.raises(CheckpointError, match="has no <｜fim▁hole｜> token"):
        load(folder)


def test_bad_engine_config_values() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(model=Path("."), dtype="int8")
    with pytest.raises(ValueError, match="device must be"):
        EngineConfig(model=Path("."), device="tpu")
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
        SamplingParams(max_tokens=-1)


@pytest.mark.parametrize("method", ["submit", "validate"])
def test_bad_requests_are_refused_and_engine_keeps_serving(tiny_model: Path, method: str) -> None:
    with load(tiny_model) as eng:
        send = getattr(eng, method)  # validate: the same checks, nothing queued
        with pytest.raises(ContextOverflowError, match="prompt of 65 tokens exceeds the max context of 64"):
            send(CompletionRequest(prompt_ids=(eng.tokenizer.bos_id,) * 65))
        with pytest.raises(EngineError, match="empty prompt"):
            send(CompletionRequest(prompt_ids=()))
        with pytest.raises(EngineError, match="token id 99999 is outside the vocabulary"):
            send(CompletionRequest(prompt_ids=(1, 99999)))
        with pytest.raises(EngineError, match="token id -1 is outside the vocabulary"):
            send(CompletionRequest(prompt_ids=(1, -1)))
        with pytest.raises(EngineError, match=r"token ids must be integers, got 2\.0"):
            send(CompletionRequest(prompt_ids=(1, 2.0)))  # type: ignore[arg-type]
        with pytest.raises(EngineError, match=f"token id {2**70} is outside the vocabulary"):
            send(CompletionRequest(prompt_ids=(1, 2**70)))
        bos = eng.tokenizer.bos_id
        good = CompletionRequest(prompt_ids=(bos, 40, 41), params=SamplingParams(max_tokens=2))
        requests = eng.stats()["requests"]
        checked = eng.validate(good)
        assert list(checked.prompt_ids) == [bos, 40, 41] and eng.stats()["requests"] == requests
        ok = eng.complete(good)
        assert ok.stats.prefilled_tokens == 3


def test_repo_id_resolves_from_local_hf_cache(tiny_model: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError, match="hf download deepseek-ai/deepseek-coder-1.3b-base"):
        resolve_model("deepseek-ai/deepseek-coder-1.3b-base")
    repo = tmp_path / "hub" / "models--deepseek-ai--deepseek-coder-1.3b-base"
    snap = repo / "snapshots" / "abc123"
    shutil.copytree(tiny_model, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert resolve_model("deepseek-ai/deepseek-coder-1.3b-base") == snap
    with pytest.raises(CheckpointError, match="model folder ./no/such/dir does not exist"):
        resolve_model("./no/such/dir")


def test_fast_path_on_cpu_is_refused_clearly(tiny_model: Path) -> None:
    with pytest.raises(EngineError, match="the fast path needs a CUDA device"):
        Engine(EngineConfig(model=tiny_model, max_context=64, fast_path=True))
    with Engine(EngineConfig(model=tiny_model, max_context=64)) as eng:  # auto: the reference path on CPU
        assert eng.fast_path is False


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (None, "config.json must hold a JSON object, not a JSON array"),
        ({"num_attention_heads": 0}, "config.json: num_attention_heads=0 must be a positive integer"),
        ({"num_attention_heads": "4"}, 'config.json: num_attention_heads="4" must be a positive integer'),
        ({"num_key_value_heads": 0}, "config.json: num_key_value_heads=0 must be a positive integer"),
        ({"hidden_size": 64.5}, "config.json: hidden_size=64.5 must be a positive integer"),
        ({"num_hidden_layers": True}, "config.json: num_hidden_layers=true must be a positive integer"),
        ({"vocab_size": -5}, "config.json: vocab_size=-5 must be a positive integer"),
        ({"rms_norm_eps": "tiny"}, 'config.json: rms_norm_eps="tiny" must be a positive number'),
        ({"rope_parameters": [2]}, "config.json: rope_parameters=\\[2\\] must be a JSON object"),
        ({"eos_token_id": "x"}, 'config.json: eos_token_id="x" must be a token id'),
    ],
)
def test_nonsense_config_values_name_the_field_and_value(copy, changes, message) -> None:
    from lsp_dscoder.engine.config import ConfigValueError

    folder = copy()
    if changes is None:
        (folder / "config.json").write_text("[1, 2]")
    else:
        edit_config(folder, **changes)
    with pytest.raises(ConfigValueError, match=message) as error:
        load(folder)
    assert isinstance(error.value, ValueError) and isinstance(error.value, CheckpointError)


def test_a_file_given_as_the_model_folder(tiny_model: Path) -> None:
    with pytest.raises(CheckpointError, match=r"config.json is a file, not a checkpoint folder"):
        resolve_model(tiny_model / "config.json")
