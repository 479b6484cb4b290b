"""`lsp-dscoder eval`: a model on held-out Python files, through the engine as the server runs it.

- line exact match: cursor at a random position inside a random line; the model fills the rest of the
  line (PSM prompt: text before the cursor, hole, text from the line's end), greedy, cut at the newline;
  the same cases with the server's layout (hole at the line start, the line up to the cursor after
  `<｜fim▁end｜>`), with that layout and the server's token healing, and with a left-to-right prompt
  (no suffix) as a baseline;
- FIM exact match: one to three whole lines removed; the model must produce exactly them and stop
  (its `<eos>`), greedy;
- perplexity of `<bos>file<eos>` in windows, with the engine's reference forward (its own logits);
- CPU/GPU time to first token for a 1K-token prompt and for a 4-token keystroke appended to it.

Held-out files come from `--data` (a `heldout.jsonl.xz` written by `lsp_dscoder.training.corpus`), else
from the list recorded beside the bundled model, read from this machine's standard library and
site-packages (files whose content changed are skipped). Cases are drawn with `--seed`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import math
import random
import statistics
import sysconfig
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

HELDOUT_LIST = "heldout_files.txt"


@dataclass(frozen=True)
class Case:
    source: str
    prefix: str
    middle: str
    suffix: str


@dataclass(frozen=True)
class Budgets:
    prefix_tokens: int
    suffix_tokens: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: bundled)")
    parser.add_argument("--data", type=Path, default=None, help="held-out heldout.jsonl.xz")
    parser.add_argument("--samples", type=int, default=100, help="cases per exact-match task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix-tokens", type=int, default=768)
    parser.add_argument("--suffix-tokens", type=int, default=256)
    parser.add_argument("--ppl-tokens", type=int, default=32768, help="tokens scored for perplexity")
    parser.add_argument("--ppl-window", type=int, default=1024)
    parser.add_argument("--timing-runs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def load_heldout(data: Path | None, bundled: Path) -> list[dict]:
    """Held-out documents {"id", "text"}: from a corpus split file, or the recorded list on this machine."""
    from lsp_dscoder.training.corpus import read_docs

    if data is not None:
        return read_docs(data)
    docs = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for line in (bundled / HELDOUT_LIST).read_text(encoding="utf-8").splitlines():
        doc_id, digest = line.rsplit(" ", 1)
        source, rel = doc_id.split(":", 1)
        try:
            path = stdlib / rel if source == "stdlib" else Path(md.distribution(source).locate_file(rel))
            text = path.read_text(encoding="utf-8")
        except (md.PackageNotFoundError, OSError, UnicodeDecodeError):
            continue
        if hashlib.sha256(text.encode()).hexdigest().startswith(digest):
            docs.append({"id": doc_id, "text": text})
    return docs


def line_cases(docs: list[dict], n: int, rng: random.Random) -> list[Case]:
    """Cursor inside a line (before its last non-blank character); middle = the rest of the line."""
    cases = []
    while len(cases) < n:
        doc = rng.choice(docs)
        text = doc["text"]
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        start = rng.choice(starts)
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        content = text[start:end].rstrip()
        if not content.strip():
            continue
        cursor = start + rng.randrange(len(content))
        cases.append(Case(doc["id"], text[:cursor], text[cursor:end], text[end:]))
    return cases


def fim_cases(docs: list[dict], n: int, rng: random.Random) -> list[Case]:
    """One to three whole non-blank lines (with their newlines) removed; the model must restore them."""
    cases = []
    while len(cases) < n:
        doc = rng.choice(docs)
        lines = doc["text"].splitlines(keepends=True)
        k = rng.randint(1, 3)
        if len(lines) <= k:
            continue
        i = rng.randrange(len(lines) - k + 1)
        middle = "".join(lines[i : i + k])
        if not all(line.strip() for line in lines[i : i + k]):
            continue
        cases.append(Case(doc["id"], "".join(lines[:i]), middle, "".join(lines[i + k :])))
    return cases


def psm_prompt(tok, case: Case, budgets: Budgets) -> tuple[int, ...]:
    """The trained PSM layout, prefix cut to its last tokens and suffix to its first tokens."""
    prefix = tok.encode(case.prefix)[-budgets.prefix_tokens :] if case.prefix else []
    suffix = tok.encode(case.suffix)[: budgets.suffix_tokens] if case.suffix else []
    return (tok.bos_id, tok.fim_begin_id, *prefix, tok.fim_hole_id, *suffix, tok.fim_end_id)


def anchored_prompt(tok, case: Case, budgets: Budgets) -> tuple[int, ...]:
    """The server's layout: the hole at the start of the cursor's line (the edit anchor), and the line's
    text up to the cursor after `<｜fim▁end｜>`, as the middle typed so far."""
    start = case.prefix.rfind("\n") + 1
    head = Case(case.source, case.prefix[:start], case.middle, case.suffix)
    return psm_prompt(tok, head, budgets) + tuple(tok.encode(case.prefix[start:]))


def healed(case: Case) -> tuple[Case, str]:
    """The server's token healing: the typed line's text after its last safe token boundary moves out of
    the prefix, for the model to spell first. Returns the cut case and that text."""
    from lsp_dscoder.prompt import heal_start

    start = case.prefix.rfind("\n") + 1
    cut = start + heal_start(case.prefix[start:])
    return replace(case, prefix=case.prefix[:cut]), case.prefix[cut:]


def l2r_prompt(tok, case: Case, budgets: Budgets) -> tuple[int, ...]:
    """Left to right: `<bos>` and the end of the prefix, no suffix (a baseline for the FIM prompt)."""
    return (tok.bos_id, *tok.encode(case.prefix)[-budgets.prefix_tokens :])


def exact_match(
    engine,
    cases: list[Case],
    prompt: Callable,
    budgets: Budgets,
    stop: tuple[str, ...],
    max_tokens: int,
    heal: bool = False,
) -> dict:
    from lsp_dscoder.engine import CompletionRequest, SamplingParams

    hits, examples = 0, []
    for case in cases:
        params = SamplingParams(max_tokens=max_tokens, stop=stop)
        shown, heal_text = healed(case) if heal else (case, "")
        ids = prompt(engine.tokenizer, shown, budgets)
        done = engine.complete(CompletionRequest(prompt_ids=ids, params=params, heal_text=heal_text))
        hit = done.text == case.middle
        hits += hit
        if len(examples) < 5:
            examples.append({"source": case.source, "want": case.middle, "got": done.text, "hit": hit})
    return {"exact_match": hits / len(cases), "cases": len(cases), "examples": examples}


@torch.inference_mode()
def perplexity(folder: Path, docs: list[dict], max_tokens: int, window: int, dtype: torch.dtype) -> dict:
    """Token-level perplexity of `<bos>file<eos>` windows via the engine's reference forward on CPU.

    Files are taken in the given order until max_tokens are scored (pass them shuffled).
    """
    from lsp_dscoder.engine.config import ModelConfig
    from lsp_dscoder.engine.kv_cache import KVCache
    from lsp_dscoder.engine.model import Transformer
    from lsp_dscoder.engine.tokenizer import Tokenizer
    from lsp_dscoder.engine.weights import load_weights

    cfg = ModelConfig.from_file(folder / "config.json")
    tok = Tokenizer(folder)
    cache = KVCache(cfg, 1, window, torch.device("cpu"), dtype)
    model = Transformer(cfg, load_weights(folder, cfg, torch.device("cpu"), dtype), cache.capacity)
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


def ttft(engine, docs: list[dict], runs: int) -> dict:
    """Median time to first token: a fresh 1024-token prompt, then the same prompt + 4 typed tokens."""
    from lsp_dscoder.engine import CompletionRequest, SamplingParams

    tok, cold, warm, prefilled = engine.tokenizer, [], [], []
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
        cold.append(first.stats.ttft_s)
        prefilled.append(first.stats.prefilled_tokens)  # all but <bos><｜fim▁begin｜>, shared by every prompt
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

    folder = args.model or default_model_path()
    docs = load_heldout(args.data, default_model_path() if args.data is None else folder)
    if not docs:
        raise SystemExit("no held-out files found: pass --data PATH/heldout.jsonl.xz")
    budgets = Budgets(args.prefix_tokens, args.suffix_tokens)
    rng = random.Random(args.seed)
    report: dict = {"model": str(folder), "heldout_files": len(docs), "seed": args.seed, **asdict(budgets)}
    config = EngineConfig(model=folder, device=args.device, dtype=args.dtype, max_context=4096, num_slots=4)
    with Engine(config) as engine:
        lines = line_cases(docs, args.samples, rng)
        report["line"] = exact_match(engine, lines, psm_prompt, budgets, ("\n",), 48)
        report["line_anchored"] = exact_match(engine, lines, anchored_prompt, budgets, ("\n",), 48)
        report["line_healed"] = exact_match(engine, lines, anchored_prompt, budgets, ("\n",), 48, heal=True)
        report["line_l2r"] = exact_match(engine, lines, l2r_prompt, budgets, ("\n",), 48)
        report["fim"] = exact_match(engine, fim_cases(docs, args.samples, rng), psm_prompt, budgets, (), 96)
        report["ttft"] = ttft(engine, docs, args.timing_runs)
    shuffled = rng.sample(docs, len(docs))
    report["ppl"] = perplexity(folder, shuffled, args.ppl_tokens, args.ppl_window, config.torch_dtype)
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
        ("line exact match, anchored", em["line_anchored"], "the server's layout: hole at the line start"),
        ("line exact match, healed", em["line_healed"], "the same, with the server's token healing"),
        ("line exact match, no suffix", em["line_l2r"], "left-to-right prompt"),
        ("FIM exact match (1-3 lines)", em["fim"], f"{args.samples} cases"),
        ("perplexity (tokens)", f"{ppl['perplexity']:.3f}", f"{ppl['tokens']} tokens"),
        ("bits per character", f"{ppl['bits_per_char']:.3f}", ""),
        ("TTFT, 1024-token prompt", f"{times['prompt_1024_ms']:.0f} ms", f"{args.device} {args.dtype}"),
        ("TTFT, +4 typed tokens", f"{times['keystroke_4_ms']:.0f} ms", "prefix reused"),
    ]
    print(f"{folder} on {len(docs)} held-out files, seed {args.seed}")
    for name, value, note in rows:
        print(f"  {name:<30} {value:>10}  {note}")
    return 0
