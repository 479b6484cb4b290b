"""llama.cpp's own server (`llama-server`, built by `install_llama_server.sh`) as a process the tests own:
started on a free loopback port with the bundled model converted to GGUF, asked directly for reference
completions, read through its metrics, and killed when a test needs the engine to die."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
INSTALL = "bash tests/remote/install_llama_server.sh"


def llama_dir() -> Path:
    """Where install_llama_server.sh put llama.cpp's server (its default or $LSP_DSCODER_LLAMA_DIR)."""
    env = os.environ.get("LSP_DSCODER_LLAMA_DIR")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "lsp-dscoder" / "llama.cpp-0.3.36"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def convert(folder: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, str(HERE / "convert_gguf.py"), str(llama_dir()), str(folder), str(out)],
        check=True,
        capture_output=True,
    )
    return out


class LlamaServer:
    def __init__(self, gguf: Path, log: Path, port: int | None = None, slots: int = 2) -> None:
        self.gguf, self.log_path, self.slots = gguf, log, slots
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LlamaServer:
        binary = llama_dir() / "bin" / "llama-server"
        args = [str(binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["-c", str(4096 * self.slots), "-np", str(self.slots), "-t", "1", "--metrics", "--no-webui"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

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
