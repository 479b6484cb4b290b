"""Train the bundled model: a small LlamaForCausalLM in DeepSeek-Coder's checkpoint format.

Trains for a wall-clock budget (the cosine schedule's length is fixed once the step time is measured),
with AdamW, fp32 master weights under bf16 autocast, SDPA attention, torch.compile, and FIM (PSM, rate
0.5, drawn afresh each epoch; see `fim.FimPlacement`) prepared by a background thread. Then saves bf16
safetensors shards with a DeepSeek-Coder-style config.json, measures held-out loss, and writes
train_log.json, all to --out. Seeded.

    # end-to-end check on CPU with a tiny model (a minute):
    python -m lsp_dscoder.training.train --shape tiny --device cpu --seq-len 128 --batch-size 8 \\
        --max-steps 12 --warmup-steps 2 --heldout-limit 3 --max-shard-mb 1 --out /tmp/tiny-run
    # the bundled model, on one H200 with the corpus in .train_data (see bundled/MODEL_CARD.md):
    # stage 1 from scratch, then stage 2 with one infilling example per piece of at most 1024
    # tokens and the junction targets weighted 5x
    python -m lsp_dscoder.training.train --budget-s 480 --out stage1
    python -m lsp_dscoder.training.train --init stage1 --lr 1e-3 --warmup-steps 50 \\
        --fim-piece-tokens 1024 --junction-weight 5 --budget-s 470 --out stage2
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from lsp_dscoder.training.batches import Batches, DataConfig
from lsp_dscoder.training.checkpoint import (
    SHAPES,
    llama_config,
    reload_check,
    round_to_bf16,
    save,
)
from lsp_dscoder.training.corpus import read_docs
from lsp_dscoder.training.fim import FimPlacement, SpecialIds
from lsp_dscoder.training.heldout import autocast, heldout_loss
from lsp_dscoder.training.optim import TrainConfig, lr_at, optimizer
from lsp_dscoder.training.probe import fim_probe, format_probe, probe_examples


def junction_mask(x: torch.Tensor, ids: SpecialIds) -> torch.Tensor:
    """(B, T-1) bool: the targets x[:, 1:] where infilling differs from left-to-right completion: the
    first middle token (right after `<｜fim▁end｜>`) and the `<eos>` that closes a middle."""
    first = x[:, :-1] == ids.fim_end
    special = (
        (x == ids.bos) | (x == ids.eos) | (x == ids.fim_begin) | (x == ids.fim_hole) | (x == ids.fim_end)
    )
    positions = torch.arange(x.shape[1], device=x.device).expand_as(x)
    last = torch.where(special, positions, -1).cummax(dim=1).values  # last special token at or before t
    before = last[:, :-1]  # for the target at t + 1: the last special token up to t
    in_middle = (before >= 0) & (x.gather(1, before.clamp(min=0)) == ids.fim_end)
    return first | ((x[:, 1:] == ids.eos) & in_middle)


def forward_backward(
    model: Any, x: torch.Tensor, device: torch.device, ids: SpecialIds, junction_weight: float
) -> torch.Tensor:
    """Backpropagate the next-token loss; returns the plain mean loss (what is logged).

    With junction_weight != 1 the junction targets (`junction_mask`) weigh that much more in the
    gradient: each infilling example has only two of them among thousands of tokens.
    """
    with autocast(device):
        if junction_weight == 1:
            loss: torch.Tensor = model(input_ids=x, labels=x).loss
            torch.autograd.backward(loss)
            return loss
        logits = model(input_ids=x).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="none"
    ).view(x.shape[0], -1)
    weights = 1 + (junction_weight - 1) * junction_mask(x, ids).float()
    torch.autograd.backward((nll * weights).mean())
    return nll.mean().detach()


def train(args: argparse.Namespace, cfg: TrainConfig, start: float) -> dict[str, Any]:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    torch.manual_seed(cfg.data.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    ids = SpecialIds.from_tokenizer(tok)
    texts = [d["text"] for d in read_docs(args.data / "train.jsonl.xz")]
    heldout = [d["text"] for d in read_docs(args.data / "heldout.jsonl.xz")][: args.heldout_limit]
    model: Any
    if args.init is None:
        config = llama_config(SHAPES[args.shape], tok.get_vocab_size(), ids, cfg.rope)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")  # type: ignore[no-untyped-call]
        model = model.to(device)
    else:  # continue training a saved checkpoint (its shape, not --shape)
        model = AutoModelForCausalLM.from_pretrained(
            args.init, dtype=torch.float32, attn_implementation="sdpa"
        )
        model, config = model.to(device), model.config
        if config.vocab_size != tok.get_vocab_size():
            raise ValueError(
                f"{args.init} has {config.vocab_size} tokens, the tokenizer {tok.get_vocab_size()}"
            )
    model.config.use_cache = False
    probes = (
        probe_examples(tok, heldout, cfg.probe_examples, seed=cfg.data.seed) if cfg.probe_examples else []
    )
    probe_history: list[dict[str, Any]] = []
    probe_s = 0.0  # time spent probing, left out of the training budget

    def probe(at_step: int) -> None:
        nonlocal probe_s
        if probes:
            began = time.time()
            result = fim_probe(model, probes, ids, device)
            probe_s += time.time() - began
            probe_history.append({"step": at_step, **result})
            print(f"probe step {at_step}: {format_probe(result)}", flush=True)

    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, from {args.init or args.shape}", flush=True)
    step_model = torch.compile(model) if cfg.compile else model
    opt = optimizer(model, cfg, device)
    batches = Batches(tok, texts, ids, cfg.data, pin=device.type == "cuda")
    history, step, total_steps, tokens, timed_from, data_wait_s = [], 0, cfg.max_steps, 0, None, 0.0
    running = torch.zeros((), device=device)
    print(f"setup done at {time.time() - start:.1f}s", flush=True)
    if args.init is not None:
        probe(0)
    while True:
        elapsed = time.time() - start - probe_s
        if (total_steps is not None and step >= total_steps) or elapsed > cfg.budget_s:
            break
        waited = time.time()
        epoch, x = batches.queue.get()
        data_wait_s += time.time() - waited
        x = x.to(device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total_steps, cfg)
        try:
            loss = forward_backward(step_model, x, device, ids, cfg.junction_weight)
        except Exception as exc:  # a compiler failure must not cost the run: continue uncompiled
            if step_model is model:
                raise
            print(f"torch.compile failed ({type(exc).__name__}: {exc}); continuing eagerly", flush=True)
            step_model = model
            opt.zero_grad(set_to_none=True)
            loss = forward_backward(step_model, x, device, ids, cfg.junction_weight)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running += loss.detach()
        step, tokens = step + 1, tokens + x.numel()
        if step == 10:  # compilation and warm-up are behind us: time the steady state from here
            if device.type == "cuda":
                torch.cuda.synchronize()
            timed_from = (time.time(), step)
        if step == 40 and timed_from is not None and cfg.max_steps is None:
            if device.type == "cuda":
                torch.cuda.synchronize()
            step_s = (time.time() - timed_from[0]) / (step - timed_from[1])
            total_steps = step + int((cfg.budget_s - (time.time() - start - probe_s)) / step_s)
            print(f"{step_s * 1e3:.1f} ms/step: schedule set to {total_steps} steps", flush=True)
        if step % cfg.log_every == 0 or step == total_steps:
            mean = running.item() / (cfg.log_every if step % cfg.log_every == 0 else step % cfg.log_every)
            running.zero_()
            rate = tokens / (time.time() - start)
            history.append(
                {
                    "step": step,
                    "loss": mean,
                    "lr": lr_at(step - 1, total_steps, cfg),
                    "epoch": epoch,
                    "elapsed_s": time.time() - start,
                    "data_wait_s": data_wait_s,
                }
            )
            print(
                f"step {step} loss {mean:.4f} epoch {epoch} lr {history[-1]['lr']:.2e} "
                f"{rate / 1e3:.0f}k tok/s (overall) {time.time() - start:.0f}s, data wait {data_wait_s:.1f}s",
                flush=True,
            )
        if step % cfg.probe_every == 0 and step != total_steps:
            probe(step)
    batches.close()
    train_s = time.time() - start
    model.eval()
    round_to_bf16(model)
    save(model, config, args.out, args.max_shard_mb * 1_000_000)  # first: the weights must come back
    probe(step)
    results = {
        "heldout_plain": heldout_loss(model, tok, heldout, ids, cfg.data, device, fim_rate=0.0),
        "heldout_fim": heldout_loss(model, tok, heldout, ids, cfg.data, device, fim_rate=1.0),
        "reload_max_abs_diff": reload_check(model, args.out),
    }
    return {
        "parameters": n_params,
        "init": str(args.init) if args.init else None,
        "shape": {k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "intermediate_size")},
        "train_config": json.loads(json.dumps(asdict(cfg), default=lambda v: v.value)),
        "steps": step,
        "tokens": tokens,
        "train_s": train_s,
        "data_wait_s": data_wait_s,
        "compiled": step_model is not model,
        "epochs_prepared": batches.epochs_done,
        "train_files": len(texts),
        "heldout_files": len(heldout),
        "history": history,
        "probe_history": probe_history,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        **results,
    }


def main(argv: list[str] | None = None) -> int:
    start = time.time()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path(".train_data"))
    parser.add_argument("--tokenizer", type=Path, default=Path("lsp_dscoder/bundled"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="bundled")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-shard-mb", type=float, default=14.0, help="each file comes back <= 16 MiB")
    data_fields = ("seq_len", "batch_size", "seed", "fim_line_rate", "fim_piece_tokens")
    train_fields = (
        "budget_s",
        "lr",
        "junction_weight",
        "warmup_steps",
        "max_steps",
        "log_every",
        "probe_every",
        "probe_examples",
    )
    defaults = {**asdict(DataConfig()), **asdict(TrainConfig())}
    for name in data_fields + train_fields:
        kind = int if name in ("max_steps", "fim_piece_tokens") else type(defaults[name])
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=defaults[name])
    parser.add_argument("--init", type=Path, default=None, help="continue from this checkpoint folder")
    parser.add_argument("--fim-placement", choices=[p.value for p in FimPlacement], default="window")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument(
        "--heldout-limit", type=int, default=None, help="evaluate on the first N held-out files"
    )
    args = parser.parse_args(argv)
    data = DataConfig(
        fim_placement=FimPlacement(args.fim_placement), **{k: getattr(args, k) for k in data_fields}
    )
    cfg = TrainConfig(data=data, compile=not args.no_compile, **{k: getattr(args, k) for k in train_fields})
    args.out.mkdir(parents=True, exist_ok=True)
    log = train(args, cfg, start)
    log["total_s"] = time.time() - start
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    keys = ("steps", "tokens", "train_s", "heldout_plain", "heldout_fim", "reload_max_abs_diff")
    if log["probe_history"]:
        print(
            f"final probe: {format_probe({k: v for k, v in log['probe_history'][-1].items() if k != 'step'})}"
        )
    print(json.dumps({k: log[k] for k in keys}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
