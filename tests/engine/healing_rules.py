"""Token healing rules side by side on the bundled model (CPU), on the same cases and keystrokes:

- `em`: `lsp-dscoder eval`'s line exact match with the server's healed prompt (its `line_healed` row:
  same cases, seed, budgets and context files), each rule generating from the same cached prompt;
- `keys`: held-out lines typed one character at a time into the server's prompt builder (its head and
  the slot's pieces carried from key to key; every key sent to the engine, or with `--through` only
  those the suggestion shown did not predict, as the server does), with the decode steps before the
  first visible text of each key and what each invisible step spelled.

    python tests/engine/healing_rules.py em --samples 300 --odds 1,4,inf
    python tests/engine/healing_rules.py keys --lines 40 --odds 1,4,inf [--through]

`--odds` are rules `P` or `P/E`: `Healing.partial_odds` P and `exact_odds` E (1 if not given; 1/1:
plain healing; inf: a covering token whenever one exists). With a tree whose `generate` has no `healing`
parameter (PYTHONPATH), its own rule runs once.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine import CompletionRequest, SamplingParams, TokenEvent
from lsp_dscoder.engine.config import ModelConfig
from lsp_dscoder.engine.factory import assemble
from lsp_dscoder.engine.generate import generate
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.engine.weights import load_weights
from lsp_dscoder.evaluate import Case, ContextFile, context_files, line_cases, load_heldout, server_prompt
from lsp_dscoder.postprocess import CursorContext
from lsp_dscoder.prompt import Budgets, Head, PromptBuilder
from lsp_dscoder.tokens import Piece

RULED = "healing" in inspect.signature(generate).parameters


class Bench:
    """The engine's parts, driven synchronously: one slot per rule so that each keeps its own cache."""

    def __init__(self, slots: int, max_context: int = 4096) -> None:
        folder = default_model_path()
        cfg = ModelConfig.from_file(folder / "config.json")
        self.tok = Tokenizer(folder)
        weights = load_weights(folder, cfg, torch.device("cpu"), torch.float32)
        cpu = torch.device("cpu")
        built = assemble(
            cfg, weights, num_slots=slots, max_context=max_context, device=cpu, dtype=torch.float32
        )
        self.runner, self.cache, self.max_context = built.runner, built.cache, max_context

    def run(self, request: CompletionRequest, odds: str | None) -> tuple[Any, list[TokenEvent]]:
        events: list[TokenEvent] = []
        extra: dict[str, Any] = {}
        if RULED and odds is not None:
            from lsp_dscoder.engine.generate import Healing

            partial, _, exact = odds.partition("/")
            extra["healing"] = Healing(float(partial), float(exact or 1))
        with torch.inference_mode():
            done = generate(
                request,
                self.runner,
                self.cache,
                self.tok,
                threading.Event(),
                events.append,
                512,
                time.perf_counter(),
                **extra,
            )
        return done, events


def exact_match(args: argparse.Namespace, rules: list[str | None]) -> dict[str, Any]:
    folder = default_model_path()
    docs = load_heldout(None, folder)
    bench = Bench(slots=1)
    rng = random.Random(args.seed)
    cases = line_cases(docs, args.samples, rng)
    context_rng = random.Random(args.seed)
    context = {case: context_files(docs, case, 2, context_rng) for case in cases}
    budgets = replace(Budgets(), prefix_tokens=768, suffix_tokens=256).fit(4096, 48)
    builder = PromptBuilder(bench.tok, budgets)
    hits = Counter[str]()
    differ: list[dict[str, Any]] = []
    params = SamplingParams(max_tokens=48, stop=("\n",))
    for k, case in enumerate(cases):
        got = {}
        for odds in rules:
            if args.typed:
                ids, heal = typed_prompt(bench, builder, case, context[case], odds)
            else:
                ids, heal = server_prompt(builder, case, context[case])
            done, _ = bench.run(CompletionRequest(ids, params, slot_key="em", heal_text=heal), odds)
            got[str(odds)] = done.text
            hits[str(odds)] += done.text == case.middle
        if len(set(got.values())) > 1 and len(differ) < 40:
            differ.append({"heal": heal, "want": case.middle, "got": got})
        hit = {r: got[r] == case.middle for r in got}
        print(
            json.dumps({"case": k, "heal": heal, "hit": hit, "hits": dict(hits)}), file=sys.stderr, flush=True
        )
    return {"cases": len(cases), "typed": args.typed, "hits": dict(hits), "differ": differ}


def typed_prompt(
    bench: Bench, builder: PromptBuilder, case: Case, context: Sequence[ContextFile], odds: str | None
) -> tuple[tuple[int, ...], str]:
    """The server's prompt at the case's cursor after a request one character earlier, whose
    generation the slot holds (as when the last key typed did not match the suggestion)."""
    start = case.prefix.rfind("\n") + 1
    text, cursor = case.prefix + case.suffix, len(case.prefix)
    first = builder.build(case.prefix[:start] + case.suffix, start, lambda: context, "python")
    if cursor - 1 <= start:
        again = builder.build(text, cursor, lambda: context, "python", first.head, first.middle_pieces)
        return again.ids, again.heal_text
    before = text[: cursor - 1] + text[cursor:]
    p = builder.build(before, cursor - 1, lambda: context, "python", first.head, first.middle_pieces)
    params = SamplingParams(max_tokens=8, stop=("\n",))
    _, events = bench.run(CompletionRequest(p.ids, params, slot_key="em", heal_text=p.heal_text), odds)
    rewound = events[0].rewound if events else 0
    known = list(p.middle_pieces)[: len(p.middle_pieces) - rewound]
    known += [Piece(e.token_id, e.piece or "") for e in events if e.token_id is not None]
    typed = builder.build(text, cursor, lambda: context, "python", p.head, known)
    return typed.ids, typed.heal_text


def typed_lines(docs: list[dict[str, str]], n: int, rng: random.Random) -> list[tuple[str, int, int]]:
    """(text, line start, line end) of `n` non-blank ASCII lines of at most 60 characters."""
    out: list[tuple[str, int, int]] = []
    while len(out) < n:
        text = rng.choice(docs)["text"]
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        start = rng.choice(starts)
        end = text.find("\n", start)
        line = text[start:end] if end >= 0 else ""
        if line.strip() and line.isascii() and len(line) <= 60 and len(line.strip()) >= 4:
            out.append((text, start, end))
    return out


def invisible_kinds(events: list[TokenEvent], heal: str) -> list[str]:
    """What each step before the first visible text spelled: `heal-exact` (the token that ends the
    healed text exactly: the forward a prompt without healing would have prefilled), `heal-partial`
    (healing's own cost), `bytes` (part of a character), `held` (text the stop filter held back)."""
    kinds, left = [], heal
    for e in events:
        if e.text or e.token_id is None:
            break
        piece = e.piece or ""
        if not piece:
            kinds.append("bytes")
        elif left and left.startswith(piece):
            left = left[len(piece) :]
            kinds.append("heal-partial" if left else "heal-exact")
        else:
            kinds.append("held")
    return kinds


def keystrokes(args: argparse.Namespace, rules: list[str | None]) -> dict[str, Any]:
    docs = load_heldout(None, default_model_path())
    bench = Bench(slots=len(rules), max_context=2048)
    lines = typed_lines(docs, args.lines, random.Random(args.seed))
    builder = PromptBuilder(bench.tok, Budgets().fit(bench.max_context, 16))
    rows: dict[str, list[dict[str, Any]]] = {str(r): [] for r in rules}
    for text, start, end in lines:
        line = text[start:end]
        state: dict[str, tuple[Head | None, list[Piece]]] = {str(r): (None, []) for r in rules}
        shown = dict.fromkeys(state, "")  # the suggestion left to type through, per rule
        for k in range(len(line) + 1):
            doc = text[:start] + line[:k] + text[end:]
            ctx = CursorContext.at(doc, start + k)
            params = SamplingParams(max_tokens=16, stop=("\n",) if ctx.single_line else ())
            for r in rules:
                if args.through and k and shown[str(r)][:1] == line[k - 1]:
                    shown[str(r)] = shown[str(r)][1:]  # answered from memory: the engine is not asked
                    continue
                head, known = state[str(r)]
                prompt = builder.build(doc, start + k, head=head, known=known)
                request = CompletionRequest(prompt.ids, params, slot_key=str(r), heal_text=prompt.heal_text)
                done, events = bench.run(request, r)
                rewound = events[0].rewound if events else 0
                pieces = list(prompt.middle_pieces)
                pieces = pieces[: len(pieces) - rewound]
                pieces += [Piece(e.token_id, e.piece or "") for e in events if e.token_id is not None]
                state[str(r)] = (prompt.head, pieces)
                shown[str(r)] = done.text
                if k == 0:
                    continue  # the line's first request: a cold prompt
                heal = (bench.tok.decode(prompt.ids[-rewound:]) if rewound else "") + prompt.heal_text
                s = done.stats
                rows[str(r)].append(
                    {
                        "heal": heal,
                        "steps": s.steps_to_text,
                        "prefilled": s.prefilled_tokens,
                        "replayed": getattr(s, "replayed_tokens", 0),
                        "kinds": invisible_kinds(events, heal),
                        "text": done.text[:12],
                        "typed_next": line[k : k + 1],
                    }
                )
    return {"lines": len(lines), "keys": {r: summarize(v) for r, v in rows.items()}, "rows": rows}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sorted(r["steps"] for r in rows if r["steps"] is not None)
    forwards = sorted((r["prefilled"] > 0) + r["steps"] for r in rows if r["steps"] is not None)
    kinds = Counter(k for r in rows for k in r["kinds"])
    hit = sum(bool(r["typed_next"]) and r["text"].startswith(r["typed_next"]) for r in rows)
    return {
        "keys": len(rows),
        "with_text": len(steps),
        "steps_p50": statistics.median(steps),
        "steps_p90": steps[int(0.9 * (len(steps) - 1))],
        "steps_hist": dict(sorted(Counter(steps).items())),
        "forwards_before_text_hist": dict(sorted(Counter(forwards).items())),
        "invisible_steps": dict(kinds),
        "beyond_prefill": sum(max(0, f - 1) for f in forwards),
        "next_char_predicted": hit,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("what", choices=("em", "keys"))
    parser.add_argument(
        "--odds", default="1,4,inf", help="rules, comma list: partial_odds or partial_odds/exact_odds"
    )
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--through", action="store_true", help="keys: type through a matching suggestion")
    parser.add_argument("--typed", action="store_true", help="em: after a request one character earlier")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", help="write the full JSON here; a summary goes to stdout")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rules: list[str | None] = args.odds.split(",") if RULED else [None]
    report = exact_match(args, rules) if args.what == "em" else keystrokes(args, rules)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    short = {k: v for k, v in report.items() if k not in ("rows", "differ")}
    print(json.dumps(short, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
