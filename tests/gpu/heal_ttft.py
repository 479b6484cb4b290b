"""A healed keystroke's time to its first token, the engine alone (no server), and where it goes.

    python -m tests.gpu.heal_ttft [--model lsp_dscoder/bundled] [--device cuda] [--dtype bfloat16]
        [--gap 0.1] [--rounds 3]

One thread submits keystrokes `--gap` seconds apart (as an editor does: every keystroke then runs cold),
each prompt one typed character longer than the last, ending before the word being typed, which is the
request's `heal_text`, as the server's prompt builder leaves it. The first round warms up; the others are
reported: the engine's own `queue_s`, `ttft_s` and `text_s`, and the time spent in the engine's stages on
the way to the first token (cache slot match, the healing candidates, the masking, the sample), p50 µs.
Runs on the CPU too (`--device cpu --dtype float32`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lsp_dscoder.engine.generate as gen_mod
import lsp_dscoder.engine.kv_cache as kv_mod
import lsp_dscoder.engine.tokenizer as tok_mod
from lsp_dscoder.engine.api import CompletionRequest, SamplingParams
from lsp_dscoder.engine.config import EngineConfig
from lsp_dscoder.engine.engine import Engine

TYPED = "    return self.buffer"


class Stages:
    """Time inside wrapped functions until the request's first token is sampled."""

    def __init__(self) -> None:
        self.now: dict[str, float] = defaultdict(float)
        self.first_done = False

    def wrap(self, owner: Any, name: str, tag: str, first_token: bool = False) -> None:
        fn: Callable[..., Any] | None = getattr(owner, name, None)
        if fn is None:  # a tree without that stage
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if not self.first_done:
                self.now[tag] += time.perf_counter() - start
                self.first_done = first_token
            return out

        setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lsp_dscoder/bundled")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--gap", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    stages = Stages()
    stages.wrap(kv_mod.KVCache, "match", "cache slot match")
    stages.wrap(tok_mod.Tokenizer, "healing_index", "healing candidates")
    stages.wrap(gen_mod.Healing, "logits", "masking")
    stages.wrap(gen_mod.Healing, "sample", "healed sample (the two above in it)", first_token=True)
    stages.wrap(gen_mod, "sample", "plain sample", first_token=True)
    config = EngineConfig(model=Path(args.model), device=args.device, dtype=args.dtype, num_slots=2)
    seen: dict[str, list[float]] = defaultdict(list)
    with Engine(config) as eng:
        tok = eng.tokenizer
        base = tok.encode(Path(gen_mod.__file__).read_text()[:6000])[:1500]
        for r in range(args.rounds):
            for i in range(1, len(TYPED)):
                typed = TYPED[:i]
                cut = typed.rfind(" ") + 1
                heal = typed[cut:]
                if not heal or not tok.can_heal(heal):
                    continue
                prompt = (*base, *tok.encode(typed[:cut]))
                request = CompletionRequest(
                    prompt, SamplingParams(max_tokens=8), slot_key="doc", heal_text=heal
                )
                time.sleep(args.gap)
                stages.now.clear()
                stages.first_done = False
                s = eng.submit(request).result(30).stats
                if r == 0:
                    continue
                for tag, spent in stages.now.items():
                    seen[tag].append(spent)
                seen["queue (engine)"].append(s.queue_s)
                seen["TTFT (engine)"].append(s.ttft_s or 0.0)
                if s.text_s is not None:
                    seen["first visible text (engine)"].append(s.text_s)
    print(f"{args.model} on {args.device} ({args.dtype}), {args.gap * 1e3:.0f} ms between keystrokes")
    for tag, values in seen.items():
        print(f"  {tag:38s} p50 {statistics.median(values) * 1e6:8.1f} us  (n={len(values)})")


if __name__ == "__main__":
    main()
