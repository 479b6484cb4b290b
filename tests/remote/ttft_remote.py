"""Keystroke TTFT through `lsp-dscoder --backend remote` next to llama.cpp's server called directly.

    python -m tests.remote.ttft_remote [--model DIR] [--gguf FILE] [--requests N] [--threads T]

Starts llama.cpp's server (install_llama_server.sh) on the GGUF of the model (converted if not given),
then: (1) the typing workload of `tests/lsp/ttft.py` through our server (client-side protocol TTFT: the
keystroke's request -> first partial), and (2) the same kind of prompts sent straight to llama.cpp by a
minimal client on an already-open connection (request written -> first streamed token), which is the
floor the remote backend stands on. Prints both tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import inspect
import json
import statistics
import tempfile
import time
from pathlib import Path

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine.tokenizer import Tokenizer
from lsp_dscoder.prompt import Budgets, PromptBuilder
from tests.lsp import ttft
from tests.lsp.client import start
from tests.remote.llama_server import LlamaServer, convert


def direct_typing(server: LlamaServer, tok: Tokenizer, n: int) -> list[float]:
    """TTFT (ms) of llama.cpp itself for a keystroke per request, on prompts that grow by one character."""
    text = inspect.getsource(json.decoder)
    offset = text.index("\n", text.index("def py_scanstring")) + 1
    word = ("value = scan_once(string, idx) " * (n // 30 + 1))[:n]
    builder = PromptBuilder(tok, Budgets().fit(4096, 32))
    head, known, rows = None, (), []
    for i in range(1, n + 1):
        typed = text[:offset] + word[:i] + text[offset:]
        prompt = builder.build(typed, offset + i, language_id="python", head=head, known=known)
        head, known = prompt.head, prompt.middle_pieces
        ids = list(prompt.ids) + tok.encode(prompt.heal_text)
        body = {"prompt": ids, "max_tokens": 4, "temperature": 0, "stream": True, "cache_prompt": True}
        conn = http.client.HTTPConnection("127.0.0.1", server.port)
        conn.connect()  # as the backend's spare connection: no handshake on the keystroke
        started = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        while line := response.readline():
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                rows.append((time.perf_counter() - started) * 1000.0)
                break
        conn.close()
    return rows


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path(default_model_path()))
    parser.add_argument("--gguf", type=Path, help="the model as GGUF (default: converted now)")
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = args.gguf or convert(args.model, Path(tmp) / "model.gguf")
        server = LlamaServer(gguf, Path(tmp) / "llama.log", slots=1).start()
        try:
            editor = await start(
                args.model,
                *("--backend", "remote", "--endpoint", server.url),
                init={"maxTokens": 32, "responseMode": "full"},
            )
            try:
                typed = await ttft.typing(editor, args.requests)
            finally:
                await editor.client.shutdown_session()
                await editor.client.stop()
            direct = direct_typing(server, Tokenizer(args.model), args.requests)
        finally:
            server.kill()
    header = " ".join(f"{c + ' p50':>8} {'p90':>8}" for c in ttft.COLUMNS)
    print(f"{'ms':<16}{'n':>4} {header} {'prefilled':>9}")
    print(ttft.summarize("remote typing", typed))
    ordered = sorted(direct)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    print(f"{'llama.cpp direct':<16}{len(direct):>4} {statistics.median(direct):8.2f} {p90:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
