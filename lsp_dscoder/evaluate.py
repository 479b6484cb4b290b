"""`lsp-dscoder eval`: a model on held-out Python files, through the engine as the server runs it.

- line exact match: cursor at a random position inside a random line; the model fills the rest of the
  line (PSM prompt: text before the cursor, hole, text from the line's end), greedy, cut at the newline;
  the same cases with the server's prompt, built by its `PromptBuilder` as after typing the line (head
  built at the line start, then reused; `--context-files` other held-out files as open documents),
  without and with token healing, and with a left-to-right prompt (no suffix) as a baseline;
- FIM exact match: one to three whole lines removed; the model must produce exactly them and stop
  (its `<eos>`), greedy;
- perplexity of `<bos>file<eos>` in windows, with the engine's reference forward (its own logits);
- CPU/GPU time to first token for a 1K-token prompt and for a 4-token keystroke appended to it.

Held-out files and cases: `eval_cases.py` (drawn with `--seed`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lsp_dscoder.eval_cases import Case, Doc, context_files, fim_cases, line_cases, load_heldout
from lsp_dscoder.prompt import Budgets, ContextFile, FimTokenizer, PromptBuilder

if TYPE_CHECKING:
    from lsp_dscoder.engine import Engine

Prompted = tuple[tuple[int, ...], str]  # prompt ids, and the typed text left for token healing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: bundled)")
    parser.add_argument("--data", type=Path, default=None, help="held-out heldout.jsonl.xz")
    parser.add_argument("--samples", type=int, default=100, help="cases per exact-match task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix-tokens", type=int, default=768)
    parser.add_argument("--suffix-tokens", type=int, default=256)
    parser.add_argument("--context-files", type=int, default=2, help="other files in the server's prompt")
    parser.add_argument(
        "--ppl-tokens",
        type=int,
        default=32768,
        help="perplexity: whole files are scored until at least this many tokens are (default 32768)",
    )
    parser.add_argument("--ppl-window", type=int, default=1024)
    parser.add_argument("--timing-runs", type=int, default=5)
    parser.add_argument("--device", default="auto", help="auto (cuda if visible, else cpu), cpu, cuda[:N]")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on cuda, float32 on cpu), ...")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def psm_prompt(tok: FimTokenizer, case: Case, budgets: Budgets) -> tuple[int, ...]:
    """The trained PSM layout, prefix cut to its last tokens and suffix to its first tokens."""
    prefix = tok.encode(case.prefix)[-budgets.prefix_tokens :] if case.prefix else []
    suffix = tok.encode(case.suffix)[: budgets.suffix_tokens] if case.suffix else []
    return (tok.bos_id, tok.fim_begin_id, *prefix, tok.fim_hole_id, *suffix, tok.fim_end_id)


def server_prompt(builder: PromptBuilder, case: Case, context: Sequence[ContextFile]) -> Prompted:
    """The server's prompt after typing the line up to the cursor: built first with the cursor at the
    line's start (the edit anchor), then at the cursor from that prompt's head and tokens, as the server
    builds successive keystrokes. Returns (ids, heal_text)."""
    start = case.prefix.rfind("\n") + 1
    files = lambda: context
    first = builder.build(case.prefix[:start] + case.suffix, start, files, "python")
    text = case.prefix + case.suffix
    typed = builder.build(text, len(case.prefix), files, "python", first.head, first.middle_pieces)
    return tuple(typed.ids), typed.heal_text


def _served(
    builder: PromptBuilder, context: dict[Case, tuple[ContextFile, ...]]
) -> Callable[[Case], Prompted]:
    return lambda case: server_prompt(builder, case, context[case])


def l2r_prompt(tok: FimTokenizer, case: Case, budgets: Budgets) -> tuple[int, ...]:
    """Left to right: `<bos>` and the end of the prefix, no suffix (a baseline for the FIM prompt)."""
    return (tok.bos_id, *tok.encode(case.prefix)[-budgets.prefix_tokens :])


def exact_match(
    engine: Engine,
    cases: list[Case],
    prompt: Callable[[Case], Prompted],
    stop: tuple[str, ...],
    max_tokens: int,
) -> dict[str, Any]:
    from lsp_dscoder.engine import CompletionRequest, SamplingParams

    hits, examples = 0, list[dict[str, Any]]()
    for case in cases:
        params = SamplingParams(max_tokens=max_tokens, stop=stop)
        ids, heal_text = prompt(case)
        done = engine.complete(CompletionRequest(prompt_ids=ids, params=params, heal_text=heal_text))
        hit = done.text == case.middle
        hits += hit
        if len(examples) < 5:
            examples.append({"source": case.source, "want": case.middle, "got": done.text, "hit": hit})
    return {"exact_match": hits / len(cases), "cases": len(cases), "examples": examples}


@torch.inference_mode()
def perplexity(
    folder: Path, docs: list[Doc], max_tokens: int, window: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """Token-level perplexity of `<bos>file<eos>` windows via the engine's reference forward.

    Files are taken in the given order until max_tokens are scored (pass them shuffled).
    """
    from lsp_dscoder.engine.config import ModelConfig
    from lsp_dscoder.engine.factory import assemble
    from lsp_dscoder.engine.tokenizer import Tokenizer
    from lsp_dscoder.engine.weights import load_weights

    cfg = ModelConfig.from_file(folder / "config.json")
    tok = Tokenizer(folder)
    weights = load_weights(folder, cfg, device, dtype)
    built = assemble(
        cfg, weights, num_slots=1, max_context=window, device=device, dtype=dtype, fast_path=False
    )
    model, cache = built.model, built.cache
    nll, count, chars = 0.0, 0, 0
    for doc in docs:
        ids = torch.tensor([tok.bos_id, *tok.encode(doc["text"]), tok.eos_id])
        for start in range(0, len(ids) - 1, window - 1):
            chunk = ids[start : start + window]
            logits = model.forward_reference(chunk, 0, cache, 0, all_logits=True)  # (T, V)
            nll += torch.nn.functional.cross_entropy(logits[:-1], chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
        chars += len(doc["text"])
        if count >= max_tokens:
            break
    return {"perplexity": math.exp(nll / count), "tokens": count, "bits_per_char": nll / chars / math.log(2)}


def ttft(engine: Engine, docs: list[Doc], runs: int) -> dict[str, Any]:
    """Median time to first token: a fresh 1024-token prompt, then the same prompt + 4 typed tokens."""
    from lsp_dscoder.engine import CompletionRequest, SamplingParams

    tok = engine.tokenizer
    cold: list[float] = []
    warm: list[float] = []
    prefilled: list[int] = []
    texts = [d["text"] for d in docs if len(d["text"]) > 8000][:runs]
    for i, text in enumerate(texts):
        ids = tok.encode(text)
        # 800 tokens before the hole, 100 after it, then 120 tokens already typed in the middle: 1024 in all
        prompt = (tok.bos_id, tok.fim_begin_id, *ids[:800], tok.fim_hole_id, *ids[1000:1100], tok.fim_end_id)
        prompt += tuple(ids[800:920])
        typed = prompt + tuple(ids[920:924])
        params = SamplingParams(max_tokens=1)
        first = engine.complete(CompletionRequest(prompt_ids=prompt, params=params, slot_key=f"ttft{i}"))
        second = engine.complete(CompletionRequest(prompt_ids=typed, params=params, slot_key=f"ttft{i}"))
        if second.stats.reused_tokens != len(prompt) or second.stats.prefilled_tokens != 4:
            raise RuntimeError(f"the typed tokens did not reuse the prompt's cache: {second.stats}")
        if first.stats.ttft_s is None or second.stats.ttft_s is None:
            raise RuntimeError(f"no first token: {first.stats}, {second.stats}")
        cold.append(first.stats.ttft_s)
        prefilled.append(first.stats.prefilled_tokens)  # less what earlier prompts left in the cache
        warm.append(second.stats.ttft_s)
    return {
        "prompt_1024_ms": 1e3 * statistics.median(cold),
        "prompt_prefilled_tokens": min(prefilled),
        "keystroke_4_ms": 1e3 * statistics.median(warm),
        "runs": len(cold),
    }


def run(args: argparse.Namespace) -> int:
    from lsp_dscoder.bundled import default_model_path
    from lsp_dscoder.engine import Engine, EngineConfig
    from lsp_dscoder.engine.config import resolve

    folder = args.model or default_model_path()
    docs = load_heldout(args.data, default_model_path() if args.data is None else folder)
    if not docs:
        raise SystemExit("no held-out files found: pass --data PATH/heldout.jsonl.xz")
    budgets = replace(Budgets(), prefix_tokens=args.prefix_tokens, suffix_tokens=args.suffix_tokens)
    rng = random.Random(args.seed)
    report: dict[str, Any] = {"model": str(folder), "heldout_files": len(docs), "seed": args.seed}
    report |= {**asdict(budgets), "context_files": args.context_files}
    device, dtype = resolve(args.device, args.dtype)
    config = EngineConfig(model=folder, device=device, dtype=dtype, max_context=4096, num_slots=4)
    with Engine(config) as engine:
        tok, line_stop = engine.tokenizer, ("\n",)
        lines = line_cases(docs, args.samples, rng)
        context_rng = random.Random(args.seed)  # apart from `rng`: the cases drawn after stay the same
        context = {case: context_files(docs, case, args.context_files, context_rng) for case in lines}
        fitted = budgets.fit(config.max_context, 48)
        builders = {
            "line_anchored": PromptBuilder(tok, fitted, heal=False),
            "line_healed": PromptBuilder(tok, fitted),
        }
        psm = lambda case: (psm_prompt(tok, case, budgets), "")
        report["line"] = exact_match(engine, lines, psm, line_stop, 48)
        for row, builder in builders.items():
            report[row] = exact_match(engine, lines, _served(builder, context), line_stop, 48)
        l2r = lambda case: (l2r_prompt(tok, case, budgets), "")
        report["line_l2r"] = exact_match(engine, lines, l2r, line_stop, 48)
        report["fim"] = exact_match(engine, fim_cases(docs, args.samples, rng), psm, (), 96)
        report["ttft"] = ttft(engine, docs, args.timing_runs)
    shuffled = rng.sample(docs, len(docs))
    report["ppl"] = perplexity(
        folder, shuffled, args.ppl_tokens, args.ppl_window, torch.device(device), config.torch_dtype
    )
    if args.json:
        print(json.dumps(report, indent=1, ensure_ascii=False))
        return 0
    em = {
        key: f"{100 * report[key]['exact_match']:.1f}%"
        for key in ("line", "line_anchored", "line_healed", "line_l2r", "fim")
    }
    ppl, times = report["ppl"], report["ttft"]
    rows = [
        ("line exact match, FIM prompt", em["line"], f"{args.samples} cases, hole at the cursor"),
        ("line exact match, anchored", em["line_anchored"], "the server's prompt builder, no healing"),
        ("line exact match, healed", em["line_healed"], "the same, with the server's token healing"),
        ("line exact match, no suffix", em["line_l2r"], "left-to-right prompt"),
        ("FIM exact match (1-3 lines)", em["fim"], f"{args.samples} cases"),
        ("perplexity (tokens)", f"{ppl['perplexity']:.3f}", f"{ppl['tokens']} tokens"),
        ("bits per character", f"{ppl['bits_per_char']:.3f}", ""),
        ("TTFT, 1024-token prompt", f"{times['prompt_1024_ms']:.0f} ms", f"{device} {dtype}"),
        ("TTFT, +4 typed tokens", f"{times['keystroke_4_ms']:.0f} ms", "prefix reused"),
    ]
    print(f"{folder} on {len(docs)} held-out files, seed {args.seed}")
    for name, value, note in rows:
        print(f"  {name:<30} {value:>10}  {note}")
    return 0
