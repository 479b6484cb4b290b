"""`lsp-dscoder complete FILE --line L --col C`: one completion in the terminal, streamed, with timings.

The prompt is the one the server builds (PSM layout with the edit anchor at the cursor's line).
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from pathlib import Path

from lsp_dscoder.engine import CompletionRequest, Engine, EngineConfig, SamplingParams
from lsp_dscoder.engine.config import resolve
from lsp_dscoder.engine.errors import EngineError
from lsp_dscoder.engine.lookup import DRAFT_MAX
from lsp_dscoder.errors import ServerError
from lsp_dscoder.positions import Encoding, offset_at, sanitize
from lsp_dscoder.postprocess import CursorContext, Shaper
from lsp_dscoder.progress import StderrProgress
from lsp_dscoder.prompt import Budgets, PromptBuilder
from lsp_dscoder.settings import DEFAULTS, MIN_PROMPT_TOKENS, Settings, prompt_room

MAX_CONTEXT = 1 << 20  # the largest maxContext the server accepts


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Options that choose and run a checkpoint (shared by the commands that load one)."""
    p.add_argument(
        "--model",
        help="checkpoint folder or Hugging Face repo id in the local cache (default: the bundled model)",
    )
    p.add_argument(
        "--device", default="auto", help="auto, cpu or cuda[:N] (default: auto, cuda when available)"
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=("auto", "float32", "bfloat16", "float16"),
        help="weights and KV dtype (default: auto, float32 on cpu, bfloat16 on cuda)",
    )
    p.add_argument("--max-context", type=int, default=4096, help="KV buffer size in tokens (default: 4096)")


def engine_config(args: argparse.Namespace, num_slots: int = 1) -> EngineConfig:
    if args.model:
        model = Path(args.model)
    else:
        from lsp_dscoder.bundled import default_model_path

        model = default_model_path()
    device, dtype = resolve(args.device, args.dtype)
    return EngineConfig(
        model=model,
        device=device,
        dtype=dtype,
        max_context=args.max_context,
        num_slots=num_slots,
        draft_tokens=getattr(args, "draft_tokens", None),
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, help="source file to complete")
    p.add_argument("--line", type=int, required=True, help="0-based line of the cursor")
    p.add_argument("--col", type=int, required=True, help="0-based column of the cursor in UTF-16 code units")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULTS.max_tokens,
        help=f"tokens to generate at most (default: {DEFAULTS.max_tokens}, as the server's maxTokens)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 for greedy (default)")
    p.add_argument(
        "--draft-tokens",
        type=int,
        choices=range(DRAFT_MAX + 1),
        metavar=f"0..{DRAFT_MAX}",
        default=None,
        help="greedy draft tokens a step, from the prompt (default: 7 on the GPU fast path, else 0)",
    )
    p.add_argument("--json", action="store_true", help='print {"text", "token_ids", "stats"} instead')
    p.add_argument(
        "--raw",
        action="store_true",
        help="print the model's text as generated, without the editor's stop rules",
    )
    add_model_arguments(p)


def read_source(path: Path) -> str:
    """A source file's text: UTF-8 (with or without a BOM), else a ValueError that says what it is."""
    data = path.read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_LE)):
        raise ValueError(f"{path} is UTF-16/32 text; complete reads UTF-8, convert it first")
    if b"\0" in data:
        raise ValueError(f"{path} is a binary file (it holds NUL bytes), not source text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}; Latin-1?); "
            "convert it to UTF-8 first"
        ) from None
    return sanitize(text)


def _check_numbers(args: argparse.Namespace) -> None:
    """Numbers the engine would take but that cannot give a completion (one line each, exit code 2)."""
    if not 1 <= args.max_tokens <= 1 << 16:
        raise ValueError(f"--max-tokens must be in [1, 65536], got {args.max_tokens}")
    if not 64 <= args.max_context <= MAX_CONTEXT:
        raise ValueError(f"--max-context must be in [64, {MAX_CONTEXT}], got {args.max_context}")
    room = prompt_room(Settings(max_context=args.max_context, max_tokens=args.max_tokens))
    if room < MIN_PROMPT_TOKENS:
        raise ValueError(
            f"--max-context {args.max_context} leaves {room} tokens for the prompt after --max-tokens "
            f"{args.max_tokens} and the prompt's middle; raise --max-context or lower --max-tokens"
        )


def run(args: argparse.Namespace) -> int:
    progress = StderrProgress()
    try:
        _check_numbers(args)
        text = read_source(args.file)
        cursor = offset_at(text, args.line, args.col, Encoding.UTF16)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
        with _open_engine(args, progress) as engine:
            progress.close()
            budgets = Budgets().fit(engine.max_context, args.max_tokens)
            prompt = PromptBuilder(engine.tokenizer, budgets).build(text, cursor)
            request = CompletionRequest(prompt_ids=prompt.ids, params=params, heal_text=prompt.heal_text)
            handle = engine.submit(request)
            # The same stop rules as the editor's suggestion, unless --raw.
            shaper = None if args.raw else Shaper(CursorContext.at(text, cursor))
            shown = ""
            for event in handle:
                if shaper is not None:
                    shaper.feed(event.text)
                    if shaper.stopped:
                        handle.cancel()
                shown = _show(shown, shaper.text if shaper else shown + event.text, args.json)
            done = handle.result()
            if shaper is not None:
                shown = _show(shown, shaper.finish(), args.json)
    except (EngineError, ServerError, OSError, ValueError) as e:
        progress.close()
        print(f"lsp-dscoder: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        progress.close()
        print("lsp-dscoder: interrupted", file=sys.stderr)
        return 130
    s = done.stats
    rule = shaper.rule.value if shaper is not None else None
    if args.json:
        stats = {**s.as_dict(), "stop_rule": rule}
        print(
            json.dumps({"text": shown, "token_ids": list(done.token_ids), "stats": stats}, ensure_ascii=False)
        )
        return 0
    rate = f"{s.decode_tokens_per_s:.1f} tok/s" if s.decode_tokens_per_s else "n/a"
    ttft = f"{1e3 * s.ttft_s:.1f} ms" if s.ttft_s is not None else "n/a"
    stop = f"rule {rule}" if rule not in (None, "none") else s.stop_reason.value
    drafts = f"; drafts kept {s.accepted_tokens} of {s.drafted_tokens}" if s.drafted_tokens else ""
    print(
        f"\n-- {s.generated_tokens} tokens, stop: {stop}; TTFT {ttft}; decode {rate}{drafts}; "
        f"prompt {s.prompt_tokens} tokens ({s.prefilled_tokens} prefilled)",
        file=sys.stderr,
    )
    return 0


def _open_engine(args: argparse.Namespace, progress: StderrProgress) -> Engine:
    config = engine_config(args)
    try:
        return Engine(config, progress=progress)
    except (RuntimeError, MemoryError) as e:  # torch's allocation failures
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"cannot run the model with --max-context {args.max_context} on {config.device}: {first}"
        ) from None


def _show(shown: str, text: str, quiet: bool) -> str:
    """Print what `text` adds to what is already on the terminal; return the new total."""
    if not quiet and len(text) > len(shown):
        sys.stdout.write(text[len(shown) :])
        sys.stdout.flush()
    return text
