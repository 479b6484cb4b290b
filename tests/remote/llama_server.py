"""llama.cpp's own server (`llama-server`, built by `install_llama_server.sh`) as a process the tests own:
started on a free loopback port with the bundled model converted to GGUF (`remote_llama`'s launcher),
asked directly for reference completions, read through its log and metrics, and killed when a test needs
the engine to die."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

from lsp_dscoder import remote_llama
from lsp_dscoder.remote_llama import convert, free_port, llama_dir

INSTALL = "bash tests/remote/install_llama_server.sh"
__all__ = ["INSTALL", "LlamaServer", "convert", "free_port", "llama_dir"]


class LlamaServer(remote_llama.LlamaServer):
    def start(self, timeout: float = 60.0) -> LlamaServer:
        super().start(timeout)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def released_at_last_cancel(self) -> int:
        """Tokens in the slot when llama.cpp released the last task it cancelled (prompt + generated)."""
        task = re.findall(r"cancel task, id_task = (\d+)", self.log())[-1]
        deadline = time.monotonic() + 10
        while not (found := re.findall(rf"task {task} \| stop processing: n_tokens = (\d+)", self.log())):
            assert time.monotonic() < deadline, f"llama.cpp did not release task {task}"
            time.sleep(0.01)
        return int(found[-1])

    def complete(self, ids: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
        """A direct, non-streamed greedy completion: the reference our server's results must equal."""
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1, **extra}
        request = urllib.request.Request(
            f"{self.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            result: dict[str, Any] = json.load(r)
        return result

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            lines = r.read().decode().splitlines()
        pairs = (ln.split() for ln in lines if ln and not ln.startswith("#"))
        return {name: float(value) for name, value, *_ in pairs}
