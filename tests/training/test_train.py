"""The trainer on CPU: the junction loss weight, the infilling probe, and a whole tiny run end to end."""

from __future__ import annotations

import json
import lzma
import sysconfig
from pathlib import Path

import pytest
import torch

from lsp_dscoder.training import train as trainer
from lsp_dscoder.training.checkpoint import SHAPES, RopeSettings, llama_config
from lsp_dscoder.training.fim import SpecialIds
from lsp_dscoder.training.probe import KINDS, fim_probe, probe_examples

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ["textwrap.py", "colorsys.py", "bisect.py", "keyword.py", "shlex.py", "fnmatch.py"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [(STDLIB / name).read_text(encoding="utf-8") for name in FILES]


@pytest.fixture(scope="module")
def tiny_model(tok, special: SpecialIds):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = llama_config(SHAPES["tiny"], tok.get_vocab_size(), special, RopeSettings())
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()


def test_junction_mask_marks_first_middle_token_and_closing_eos(special: SpecialIds) -> None:
    b, e, fb, fh, fe = special.bos, special.eos, special.fim_begin, special.fim_hole, special.fim_end
    x = torch.tensor(
        [
            # plain document, then a PSM example with middle [30, 31], then one with an empty middle
            [b, 10, 11, e, b, fb, 20, fh, 21, fe, 30, 31, e, b, fb, 22, fh, fe, e, 40],
        ]
    )
    mask = trainer.junction_mask(x, special)
    # target index t + 1 for mask index t: 30 (first middle), <eos> after 31, <eos> right after fim_end
    assert torch.nonzero(mask[0]).flatten().tolist() == [9, 11, 17]


def test_forward_backward_weights_only_the_junctions(tiny_model, tok, special: SpecialIds) -> None:
    ids = [special.bos, special.fim_begin, *tok.encode("def f(x):\n").ids, special.fim_hole]
    ids += [*tok.encode("\nprint(f(1))\n").ids, special.fim_end]
    ids += [*tok.encode("    return x\n").ids, special.eos]
    x = torch.tensor([ids])
    device = torch.device("cpu")

    def grads(weight: float) -> tuple[float, torch.Tensor]:
        tiny_model.zero_grad(set_to_none=True)
        loss = trainer.forward_backward(tiny_model, x, device, special, weight)
        return loss.item(), tiny_model.lm_head.weight.grad.clone()

    plain_loss, plain_grad = grads(1.0)
    weighted_loss, weighted_grad = grads(4.0)
    assert weighted_loss == pytest.approx(plain_loss, rel=1e-2)  # the logged loss is never weighted
    # the same gradient by hand: mean of per-token losses, the two junction targets counted 4 times
    tiny_model.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        logits = tiny_model(input_ids=x).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none")
    weights = torch.ones_like(nll)
    weights[trainer.junction_mask(x, special)[0]] = 4.0
    assert int((weights == 4.0).sum()) == 2
    (nll * weights).mean().backward()
    torch.testing.assert_close(weighted_grad, tiny_model.lm_head.weight.grad)
    assert not torch.allclose(weighted_grad, plain_grad)


def test_probe_examples_are_seeded_and_of_each_kind(tok, texts: list[str]) -> None:
    examples = probe_examples(tok, texts, per_kind=5, seed=3)
    assert [e.kind for e in examples] == [k for k in KINDS for _ in range(5)]
    assert examples == probe_examples(tok, texts, per_kind=5, seed=3)
    for e in examples:
        assert e.middle and len(e.prefix) <= 512 and len(e.suffix) <= 256
        middle = tok.decode(list(e.middle))
        if e.kind == "lines":
            assert middle.endswith("\n") and 1 <= middle.count("\n") <= 3
        if e.kind == "line_rest":
            assert "\n" not in middle and tok.decode(list(e.suffix)).startswith("\n")


def test_fim_probe_reports_the_nll_at_the_junctions(tiny_model, tok, special: SpecialIds, texts) -> None:
    examples = probe_examples(tok, texts, per_kind=1, seed=0)
    result = fim_probe(tiny_model, examples, special, torch.device("cpu"))
    assert sorted(result) == sorted(KINDS)
    lines = next(e for e in examples if e.kind == "lines")
    ids = torch.tensor([lines.ids(special)])
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        logp = torch.log_softmax(tiny_model(input_ids=ids).logits[0].float(), dim=-1)
    first = ids.shape[1] - len(lines.middle) - 1
    assert result["lines"]["n"] == 1
    assert result["lines"]["first"] == pytest.approx(-logp[first - 1, lines.middle[0]].item(), rel=1e-4)
    assert result["lines"]["eos"] == pytest.approx(-logp[-2, special.eos].item(), rel=1e-4)


def test_tiny_training_run_end_to_end(tmp_path: Path, texts: list[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for split, docs in (("train", texts[:4]), ("heldout", texts[4:])):
        with lzma.open(data / f"{split}.jsonl.xz", "wt", encoding="utf-8") as f:
            for i, text in enumerate(docs):
                f.write(json.dumps({"id": f"{split}{i}", "text": text}) + "\n")
    out = tmp_path / "run"
    argv = ["--shape", "tiny", "--device", "cpu", "--seq-len", "64", "--batch-size", "4"]
    argv += ["--max-steps", "6", "--warmup-steps", "2", "--probe-every", "3", "--probe-examples", "2"]
    argv += ["--fim-piece-tokens", "32", "--junction-weight", "3", "--no-compile", "--max-shard-mb", "0.5"]
    argv += ["--data", str(data), "--out", str(out)]
    assert trainer.main(argv) == 0
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 6 and log["tokens"] == 6 * 4 * 64
    assert log["reload_max_abs_diff"] == 0.0
    assert [p["step"] for p in log["probe_history"]] == [3, 6]
    assert log["train_config"]["junction_weight"] == 3.0
    assert log["train_config"]["data"]["fim_piece_tokens"] == 32
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded as the bundled model is
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] == {"type": "linear", "factor": 4.0}
