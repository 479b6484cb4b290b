"""Infilling probe: how well a model in training predicts held-out FIM middles, by kind of hole.

Exact match needs generation and says little until a model is nearly right; the negative log-likelihood
at the three places where infilling differs from left-to-right completion moves early and tells whether
the model is learning to infill at all:

- `first`: the first middle token, right after `<｜fim▁end｜>` (continuing the prefix);
- `middle`: the middle tokens on average;
- `eos`: the `<eos>` after the middle (stopping where the suffix begins).

Kinds of hole (each a fixed, seeded set of held-out examples):

- `lines`: one to three whole non-blank lines (the eval's FIM task);
- `line_rest`: a line from its start to its end, the suffix starting at its newline (the server's anchored
  layout for single-line completion);
- `char`: two uniform character positions at most 200 characters apart (the FIM paper's cut).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from lsp_dscoder.training.fim import SpecialIds, psm_ids

KINDS = ("lines", "line_rest", "char")


@dataclass(frozen=True)
class ProbeExample:
    kind: str
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    middle: tuple[int, ...]

    def ids(self, special: SpecialIds) -> list[int]:
        return [*psm_ids(special, list(self.prefix), list(self.suffix), list(self.middle)), special.eos]


def _cut(text: str, kind: str, rng: random.Random) -> tuple[str, str, str] | None:
    lines = text.splitlines(keepends=True)
    if kind == "lines":
        k = rng.randint(1, 3)
        if len(lines) <= k:
            return None
        i = rng.randrange(len(lines) - k + 1)
        if not all(line.strip() for line in lines[i : i + k]):
            return None
        return "".join(lines[:i]), "".join(lines[i : i + k]), "".join(lines[i + k :])
    if kind == "line_rest":
        i = rng.randrange(len(lines)) if lines else 0
        if not lines or not lines[i].strip() or not lines[i].endswith("\n"):
            return None
        return "".join(lines[:i]), lines[i][:-1], "\n" + "".join(lines[i + 1 :])
    a = rng.randint(0, len(text))
    b = rng.randint(a, min(len(text), a + 200))
    if a == b:
        return None
    return text[:a], text[a:b], text[b:]


def probe_examples(
    tok, texts: list[str], per_kind: int, seed: int = 0, prefix_tokens: int = 512, suffix_tokens: int = 256
) -> list[ProbeExample]:
    """per_kind examples of each kind from texts (a `tokenizers.Tokenizer`), prefix and suffix budgeted."""
    rng = random.Random(seed)
    examples: list[ProbeExample] = []
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("no non-empty texts to probe")
    for kind in KINDS:
        made, tries = 0, 0
        while made < per_kind and tries < 100 * per_kind:
            tries += 1
            cut = _cut(rng.choice(texts), kind, rng)
            if cut is None:
                continue
            prefix, middle, suffix = (
                tok.encode(part, add_special_tokens=False).ids if part else [] for part in cut
            )
            if not middle:
                continue
            examples.append(
                ProbeExample(
                    kind, tuple(prefix[-prefix_tokens:]), tuple(suffix[:suffix_tokens]), tuple(middle)
                )
            )
            made += 1
    return examples


@torch.no_grad()
def fim_probe(model, examples: list[ProbeExample], special: SpecialIds, device: torch.device) -> dict:
    """{kind: {"first", "middle", "eos": mean NLL in nats, "n": examples}} for an HF causal LM."""
    sums = {kind: {"first": 0.0, "middle": 0.0, "eos": 0.0, "n": 0} for kind in KINDS}
    was_training = model.training
    model.eval()
    try:
        for ex in examples:
            ids = torch.tensor([ex.ids(special)], device=device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                logits = model(input_ids=ids).logits[0].float()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            targets = ids[0, 1:]
            nll = -logp.gather(1, targets[:, None])[:, 0]  # nll[i] predicts ids[i + 1]
            first = len(ids[0]) - len(ex.middle) - 1  # index of the first middle token
            span = nll[first - 1 :]  # the middle tokens, then <eos>
            s = sums[ex.kind]
            s["first"] += span[0].item()
            s["middle"] += span[:-1].mean().item()
            s["eos"] += span[-1].item()
            s["n"] += 1
    finally:
        model.train(was_training)
    return {
        kind: {k: (v / s["n"] if k != "n" else v) for k, v in s.items()} for kind, s in sums.items() if s["n"]
    }


def format_probe(result: dict) -> str:
    return "  ".join(
        f"{kind}: first {r['first']:.2f} middle {r['middle']:.2f} eos {r['eos']:.2f}"
        for kind, r in result.items()
    )


def main(argv: list[str] | None = None) -> int:
    """Probe checkpoints on held-out files: `python -m lsp_dscoder.training.probe MODEL... --data FILE`."""
    import argparse
    from pathlib import Path

    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    from lsp_dscoder.training.corpus import read_docs

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", type=Path, nargs="+", help="checkpoint folders")
    parser.add_argument("--data", type=Path, default=Path(".train_data/heldout.jsonl.xz"))
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: the first model's folder")
    parser.add_argument("--examples", type=int, default=48, help="per kind of hole")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    tok = Tokenizer.from_file(str((args.tokenizer or args.models[0]) / "tokenizer.json"))
    special = SpecialIds.from_tokenizer(tok)
    texts = [d["text"] for d in read_docs(args.data)]
    examples = probe_examples(tok, texts, args.examples, seed=args.seed)
    device = torch.device(args.device)
    for folder in args.models:
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
        print(f"{folder}: {format_probe(fim_probe(model, examples, special, device))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
