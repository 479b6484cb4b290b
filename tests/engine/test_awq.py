"""INT4 AWQ checkpoints: the nibble order, AutoAWQ's own dequantization as an oracle, config and shape
checks, `quantize` (AWQ and RTN) end to end, and the reference and fast paths running the result."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file, save_file

from lsp_dscoder.__main__ import main
from lsp_dscoder.bench_build import shared_state_dict
from lsp_dscoder.engine import CompletionRequest, SamplingParams, awq_fast
from lsp_dscoder.engine.awq import AwqConfig
from lsp_dscoder.engine.config import EngineConfig, ModelConfig
from lsp_dscoder.engine.engine import Engine
from lsp_dscoder.engine.errors import CheckpointError, UnsupportedModelError
from lsp_dscoder.engine.factory import assemble
from lsp_dscoder.engine.fast import FastRunner
from lsp_dscoder.engine.kv_cache import KVCache
from lsp_dscoder.engine.model import Transformer
from lsp_dscoder.engine.weights import load_weights
from lsp_dscoder.kernels.awq_format import dequantize, pack_int4, unpack_int4
from lsp_dscoder.kernels.awq_gemm import AwqWorkspace, awq_gemm_ref
from lsp_dscoder.kernels.split_sums import SplitSums
from lsp_dscoder.quantize import QuantizeOptions, quantize_checkpoint
from lsp_dscoder.quantize_search import ScaleChoice, search_scales
from tests.tiny import cached_checkpoint

CPU = torch.device("cpu")
# Calibration kept small: the search runs `grid` quantizations per group of linears on 2 shared cores.
OPTS = {"seq_len": 64, "max_sequences": 2, "grid": 5}
# INT4 with groups of 32 moves each weight of the random tiny model by ~0.1 of its spread; through 2 layers
# of random (so unstructured, error-amplifying) weights the logits move by 0.28-0.35 of their norm (AWQ
# and RTN alike, three prompts). Unrelated logits (a wrong nibble order, a lost scale) are ~1.4 apart.
LOGIT_REL_L2 = 0.45


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Every linear's dims are multiples of 128; K/V heads = query heads, so the O projection is searched too.
    return cached_checkpoint(
        tmp_path_factory.mktemp("awq"), "dense", hidden_size=128, intermediate_size=256, num_attention_heads=4
    )


@pytest.fixture(scope="module")
def made(dense: Path) -> dict[str, tuple[Path, list[ScaleChoice]]]:
    out = {}
    for method in ("awq", "rtn"):
        opts = QuantizeOptions(group_size=32, method=method, **OPTS)
        out[method] = dense.parent / method, quantize_checkpoint(dense, dense.parent / method, opts)
    return out


@pytest.fixture(scope="module")
def quantized(made: dict[str, tuple[Path, list[ScaleChoice]]]) -> dict[str, Path]:
    return {method: folder for method, (folder, _) in made.items()}


def autoawq_packing() -> ModuleType:
    """AutoAWQ's packing_utils (torch only), loaded from the installed sdist without importing the
    package (whose __init__ needs CUDA kernels and an older transformers)."""
    spec = importlib.util.find_spec("awq")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("autoawq is not installed (pip install --no-deps autoawq==0.2.9)")
    path = Path(spec.submodule_search_locations[0]) / "utils" / "packing_utils.py"
    mod_spec = importlib.util.spec_from_file_location("autoawq_packing_utils", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def logits(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    cfg = ModelConfig.from_file(folder / "config.json")
    cache = KVCache(cfg, 1, 128, CPU, torch.float32)
    model = Transformer(cfg, load_weights(folder, cfg, CPU, torch.float32), cache.capacity)
    return model.forward_reference(ids, 0, cache, 0, all_logits=True)


def test_nibble_order_hand_worked() -> None:
    # Columns 0..7 hold 0..7, columns 8..15 hold 15..8. Nibble i (from the low end) holds column ORDER[i]
    # = 0, 2, 4, 6, 1, 3, 5, 7: reading nibbles 7..0 gives 7 5 3 1 6 4 2 0 and 8 a c e 9 b d f.
    values = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 15, 14, 13, 12, 11, 10, 9, 8]])
    words = pack_int4(values)
    assert words.dtype == torch.int32
    assert words.tolist() == [[0x75316420, 0x8ACE9BDF - 2**32]]
    assert unpack_int4(words).tolist() == values.tolist()
    random = torch.randint(0, 16, (5, 24), dtype=torch.int32)
    assert torch.equal(unpack_int4(pack_int4(random)), random)


def test_dequantize_is_autoawq_bit_for_bit() -> None:
    awq = autoawq_packing()
    q = torch.randint(0, 16, (128, 48), dtype=torch.int32)
    z = torch.randint(0, 16, (2, 48), dtype=torch.int32)
    s = (torch.rand(2, 48) * 0.1).half()
    qweight, qzeros = pack_int4(q), pack_int4(z)
    iw, iz = awq.reverse_awq_order(*awq.unpack_awq(qweight, qzeros, 4), 4)
    assert torch.equal(iw & 0xF, unpack_int4(qweight).to(iw.dtype))
    assert torch.equal(iz & 0xF, unpack_int4(qzeros).to(iz.dtype))
    theirs = awq.dequantize_gemm(qweight, qzeros, s, 4, 64)  # fp16, one rounding of (q - z) * s
    assert torch.equal(dequantize(qweight, qzeros, s).half(), theirs)


@pytest.mark.slow
def test_quantized_checkpoint_read_back_by_autoawq(quantized: dict[str, Path]) -> None:
    awq = autoawq_packing()
    folder = quantized["awq"]
    tensors = load_file(str(folder / "model.safetensors"))
    cfg = ModelConfig.from_file(folder / "config.json")
    ours = load_weights(folder, cfg, CPU, torch.float32)
    p = "model.layers.1.mlp.down_proj."
    theirs = awq.dequantize_gemm(tensors[p + "qweight"], tensors[p + "qzeros"], tensors[p + "scales"], 4, 32)
    assert torch.equal(ours.layers[1].w_down.T.half(), theirs)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["quantization_config"] == {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 32,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    }
    assert tensors["model.embed_tokens.weight"].dtype == torch.float16
    assert tensors[p + "qweight"].shape == (256, 128 // 8) and tensors[p + "scales"].shape == (8, 128)


@pytest.mark.parametrize(
    ("qc", "message"),
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "marlin"}, "version 'marlin'"),
        ({"quant_method": "awq", "bits": 8, "group_size": 128, "version": "gemm"}, "bits=8"),
        ({"quant_method": "awq", "bits": 4, "group_size": 256, "version": "gemm"}, "group_size=256"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "method 'gptq'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "zero_point=False"),
    ],
)
def test_unsupported_quantization_is_refused_naming_it(qc: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        AwqConfig.from_dict(qc, "config.json")


def test_quant_config_json_beside_config(dense: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((dense / "config.json").read_text())
    # AutoAWQ's own keys, as older checkpoints keep them in quant_config.json
    qc = {"zero_point": True, "q_group_size": 64, "w_bit": 4, "version": "GEMM"}
    (tmp_path / "quant_config.json").write_text(json.dumps(qc))
    assert ModelConfig.from_file(tmp_path / "config.json").quantization == AwqConfig(group_size=64)


@pytest.mark.slow
def test_awq_logits_close_to_original_and_search_beats_rtn(
    dense: Path, quantized: dict[str, Path], made: dict[str, tuple[Path, list[ScaleChoice]]]
) -> None:
    ids = torch.randint(0, 300, (48,), generator=torch.Generator().manual_seed(3))
    want = logits(dense, ids)
    got = {m: logits(f, ids) for m, f in quantized.items()}
    for method, value in got.items():
        rel = float((value - want).norm() / want.norm())
        assert rel < LOGIT_REL_L2, (method, rel)
    # The search's own criterion, per group of linears on the calibration activations: never worse than RTN
    # (alpha = 0 is RTN), and here better.
    choices = made["awq"][1]
    assert made["rtn"][1] == []
    assert len(choices) == 2 * 4
    assert all(c.mse <= c.rtn_mse for c in choices)
    assert sum(c.mse for c in choices) < sum(c.rtn_mse for c in choices)


def test_search_beats_rtn_with_outlier_channels() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=gen)
    x[:, :4] *= 30.0  # a few salient input channels, as LLM activations have
    w = torch.randn(48, 64, generator=gen) * 0.05
    choice = search_scales(x, [w], group=32)
    assert choice.alpha > 0
    assert choice.mse < 0.7 * choice.rtn_mse


@pytest.mark.slow
def test_engine_generates_what_transformers_does_on_the_dequantized_weights(
    quantized: dict[str, Path],
) -> None:
    from transformers import LlamaForCausalLM

    folder = quantized["awq"]
    cfg = ModelConfig.from_file(folder / "config.json")
    w = load_weights(folder, cfg, CPU, torch.float32)
    hf = LlamaForCausalLM.from_pretrained(dense_folder(folder), dtype=torch.float32).eval()
    hf.load_state_dict(shared_state_dict(cfg, w))  # the dequantized weights, unfused
    prompt = [5, 77, 190, 33, 250, 12]
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    with Engine(EngineConfig(model=folder, max_context=64)) as eng:
        got = eng.complete(CompletionRequest(prompt_ids=tuple(prompt), params=SamplingParams(max_tokens=12)))
    assert list(got.token_ids) == want[0, len(prompt) :].tolist()


def dense_folder(awq_folder: Path) -> Path:
    return awq_folder.parent / "dense"


@pytest.mark.slow
def test_fast_path_on_packed_weights_matches_reference(quantized: dict[str, Path]) -> None:
    folder = quantized["rtn"]
    cfg = ModelConfig.from_file(folder / "config.json")
    packed = load_weights(folder, cfg, CPU, torch.float32, packed=True)
    assert packed.layers[0].quant is not None and packed.layers[0].wqkv.is_meta
    cache = KVCache(cfg, 2, 64, CPU, torch.float32, pad=16)
    fast = FastRunner(Transformer(cfg, packed, cache.capacity), cache, graphs=False)
    fast.pdl_candidate = True  # as on an sm_90 GPU
    # Packed layers run their own kernels whatever the GEMM choice, and no fused layer: only PDL is timed.
    assert fast._choices(4) == ("skinny", "skinny+pdl") and fast._choices(32) == ("cublas",)
    assert fast.packed is not None and not fast.packed.fragments  # no bf16 MMAs here
    fast.packed.fragments = True  # as on a GPU with them: 17-32 rows may stream the packed weights
    assert [fast._choices(b) for b in (16, 17, 32, 33, 64, 256)] == [
        ("skinny", "skinny+pdl"),
        ("cublas", "packed"),
        ("cublas", "packed"),
        ("cublas",),
        ("cublas",),
        ("cublas",),
    ]
    fast.packed.fragments, fast.pdl_candidate = False, False
    ref = Transformer(cfg, load_weights(folder, cfg, CPU, torch.float32), cache.capacity)
    ids = torch.randint(0, cfg.vocab_size, (17,), generator=torch.Generator().manual_seed(4))
    # Same fp32 arithmetic in another order (see tests/engine/test_fast_path.py): ~1e-6 on logits ~3.
    torch.testing.assert_close(
        fast.prefill(ids, 0, 0), ref.forward_reference(ids, 0, cache, 1), atol=1e-4, rtol=0
    )
    step = ref.forward_reference(torch.tensor([9]), 17, cache, 1)
    torch.testing.assert_close(fast.decode(9, 17, 0), step, atol=1e-4, rtol=0)  # the CUDA-core kernel
    keys = torch.tensor([3, 4, 5, 6, 7])  # a keystroke's few tokens: the tensor-core kernel
    want = ref.forward_reference(keys, 18, cache, 1)
    torch.testing.assert_close(fast.prefill(keys, 18, 0), want, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_split_sums_through_the_layers(quantized: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path's plumbing of split-K sums (kernels/split_sums.py) on the CPU: the tensor-core kernel
    that leaves them is inline PTX, so a stand-in adds the reference product into the accumulator as it
    would. Every GEMM must find the accumulator zero, the logits must be the reference's, and a step
    stopped between layers must leave it zero."""
    folder = quantized["rtn"]
    cfg = ModelConfig.from_file(folder / "config.json")
    cache = KVCache(cfg, 2, 64, CPU, torch.float32, pad=16)
    packed = load_weights(folder, cfg, CPU, torch.float32, packed=True)
    fast = FastRunner(Transformer(cfg, packed, cache.capacity), cache, graphs=False)
    ref = Transformer(cfg, load_weights(folder, cfg, CPU, torch.float32), cache.capacity)

    def sums(x: torch.Tensor, *layer: torch.Tensor, workspace: AwqWorkspace, pdl: bool) -> SplitSums:
        totals = workspace.accum[: x.shape[0] * layer[2].shape[1]].view(x.shape[0], -1)
        assert torch.count_nonzero(totals) == 0, "a GEMM found sums nobody took"
        return SplitSums(totals.add_(awq_gemm_ref(x, *layer).float()), x.dtype)

    monkeypatch.setattr(awq_fast, "awq_skinny", sums)
    ids = torch.randint(0, cfg.vocab_size, (5,), generator=torch.Generator().manual_seed(4))
    prefix = torch.tensor([1, 2, 3])  # a 3-token prefill, then a 5-token step over it: both run the stand-in
    torch.testing.assert_close(
        fast.prefill(prefix, 0, 0), ref.forward_reference(prefix, 0, cache, 1), atol=1e-4, rtol=0
    )
    want = ref.forward_reference(ids, 3, cache, 1)
    torch.testing.assert_close(fast.prefill(ids, 3, 0), want, atol=1e-4, rtol=0)
    asked = iter([False, False, True])  # the step's own check, layer 0, then stop before layer 1
    assert fast.prefill(ids, 8, 0, interrupted=lambda: next(asked)) is None
    assert fast.packed is not None and torch.count_nonzero(fast.packed.workspace.accum) == 0


def test_shapes_and_sharding_checked(quantized: dict[str, Path], tmp_path: Path) -> None:
    src = quantized["rtn"]
    tensors = load_file(str(src / "model.safetensors"))
    cfg = ModelConfig.from_file(src / "config.json")
    whole = load_weights(src, cfg, CPU, torch.float32)
    # Sharded as AutoAWQ writes large models: same weights through the index.
    sharded = tmp_path / "sharded"
    opts = QuantizeOptions(group_size=32, method="rtn", shard_bytes=40_000, **OPTS)
    quantize_checkpoint(dense_folder(src), sharded, opts)
    assert (
        len(list(sharded.glob("model-*-of-*.safetensors"))) > 2
        and (sharded / "model.safetensors.index.json").exists()
    )
    again = load_weights(sharded, cfg, CPU, torch.float32)
    assert torch.equal(again.layers[1].w_gate_up, whole.layers[1].w_gate_up)
    # A qzeros of the wrong shape is refused, naming the tensor and both shapes.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((src / "config.json").read_text())
    name = "model.layers.0.self_attn.k_proj.qzeros"
    tensors[name] = tensors[name][:2].contiguous()
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"{name} has shape \(2, 16\) but .* implies \(4, 16\)"):
        load_weights(broken, cfg, CPU, torch.float32)


def test_cli_quantize(
    dense: Path, tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calib = tmp_path / "calib.py"
    calib.write_text("def add(a, b):\n    return a + b\n" * 20)
    dst = tmp_path / "rtn64"
    args = [
        "quantize",
        str(dense),
        str(dst),
        "--method",
        "rtn",
        "--group-size",
        "64",
        "--calibration",
        str(calib),
    ]
    assert main(args) == 0
    assert ModelConfig.from_file(dst / "config.json").quantization == AwqConfig(group_size=64)
    assert (dst / "tokenizer.json").read_bytes() == (dense / "tokenizer.json").read_bytes()
    # The default tiny model's intermediate size (176) is no multiple of 128: refused, exit code 2.
    assert main(["quantize", str(tiny_model), str(tmp_path / "no")]) == 2
    assert "cannot be AWQ-packed with group_size 128" in capsys.readouterr().err
    # An unsupported architecture and a truncated shard: one line each, no traceback.
    other = tmp_path / "v2"
    shutil.copytree(dense, other)
    raw = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**raw, "architectures": ["DeepseekV2ForCausalLM"]}))
    assert main(["quantize", str(other), str(tmp_path / "no2")]) == 2
    err = capsys.readouterr().err
    assert "unsupported architecture DeepseekV2ForCausalLM" in err and "Traceback" not in err
    shutil.copytree(dense, other, dirs_exist_ok=True)
    shard = next(other.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])
    assert main(["quantize", str(other), str(tmp_path / "no3"), "--method", "rtn", "--group-size", "64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") <= 2 and "lsp-dscoder quantize: " in err and "Traceback" not in err
    # A missing source, and a destination that already holds files (the checkpoint written above).
    assert main(["quantize", str(tmp_path / "missing"), str(tmp_path / "no4")]) == 2
    assert f"model folder {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert main(["quantize", str(dense), str(dst), "--method", "rtn", "--group-size", "64"]) == 2
    assert f"{dst} exists and is not an empty folder" in capsys.readouterr().err
    modes = {f.name: f.stat().st_mode & 0o777 for f in dst.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"]  # not safetensors' own 0600


def test_packed_weights_served_by_the_reference_path_are_dequantized(quantized: dict[str, Path]) -> None:
    """The engine loads AWQ layers packed wherever it wants the fast path; when the reference path serves
    instead (the fast path failed to start), the packed layers are dequantized, not run as meta tensors."""
    folder = quantized["rtn"]
    cfg = ModelConfig.from_file(folder / "config.json")
    packed = load_weights(folder, cfg, CPU, torch.float32, packed=True)
    built = assemble(
        cfg, packed, num_slots=1, max_context=64, device=CPU, dtype=torch.float32, fast_path=False
    )
    assert not built.fast_path and built.model.w.layers[0].quant is None
    dense_weights = load_weights(folder, cfg, CPU, torch.float32)
    for got, want in zip(built.model.w.layers, dense_weights.layers, strict=True):
        assert torch.equal(got.wqkv, want.wqkv) and torch.equal(got.w_down, want.w_down)
