"""llama.cpp's own server (`llama-server`, built by `tests/remote/install_llama_server.sh`) for the remote
backend's bench and tests: started as a child process on a free loopback port, on a checkpoint converted to
GGUF by llama.cpp's converter (`python -m lsp_dscoder.remote_llama LLAMA_DIR CHECKPOINT OUT [TYPE]`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


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


def convert(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """`folder` as GGUF at `out`, by llama.cpp's converter in a process of its own (it patches classes)."""
    argv = [sys.executable, "-m", "lsp_dscoder.remote_llama", str(llama_dir()), str(folder), str(out)]
    subprocess.run([*argv, outtype], check=True, capture_output=True)
    return out


class LlamaServer:
    """llama.cpp's `llama-server` as a child process on a free loopback port."""

    def __init__(
        self, gguf: Path, log: Path, port: int | None = None, slots: int = 2, extra: tuple[str, ...] = ()
    ) -> None:
        self.gguf, self.log_path, self.slots, self.extra = gguf, log, slots, extra
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> LlamaServer:
        binary = llama_dir() / "bin" / "llama-server"
        args = [str(binary), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["-c", str(4096 * self.slots), "-np", str(self.slots), "--metrics", "--no-webui"]
        args += list(self.extra) or ["-t", "1"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/health", timeout=2) as r,
            ):
                if r.status == 200:
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def convert_main(argv: list[str]) -> int:
    """llama.cpp's converter on a DeepSeek-Coder-format folder. The bundled model's BPE tokenizer has a
    fingerprint the converter does not know: its pre-tokenizer is declared `deepseek-coder` (the same
    splits; it matters only to text prompts), and a folder without `tokenizer.model` goes straight to the
    BPE path instead of failing on a missing sentencepiece model."""
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    src = Path(argv[0]) / "src"
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    from conversion import base, llama

    known = base.TextModel.get_vocab_base_pre

    def vocab_pre(self: Any, tokenizer: Any) -> str:
        try:
            return str(known(self, tokenizer))
        except NotImplementedError:
            return "deepseek-coder"

    stock_vocab = llama.LlamaModel.set_vocab

    def set_vocab(self: Any) -> None:
        if (self.dir_model / "tokenizer.model").is_file():
            stock_vocab(self)
        else:
            self._set_vocab_gpt2()

    base.TextModel.get_vocab_base_pre = vocab_pre
    llama.LlamaModel.set_vocab = set_vocab
    outtype = argv[3] if len(argv) == 4 else "f32"
    sys.argv = ["convert_hf_to_gguf.py", argv[1], "--outfile", argv[2], "--outtype", outtype]
    script = src / "convert_hf_to_gguf.py"
    namespace: dict[str, Any] = {"__name__": "convert_hf_to_gguf", "__file__": str(script)}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    namespace["main"]()
    return 0


if __name__ == "__main__":
    sys.exit(convert_main(sys.argv[1:]))
