"""The remote backend's own cost, without an engine's time in the way: `python -m tests.remote.loop_bench
[N] [PAUSE_MS]` submits N requests of a 1.1K-token prompt, one at a time with a pause between them, from
an asyncio loop (as the server does) to `bad_server.BadServer` answering at once in another process, and
prints submit -> first text event at a consumer on that loop (p10/p50/p90) and the process's CPU time per
request. Not a test: a measurement, for comparing versions of the backend on the same machine."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lsp_dscoder.bundled import default_model_path
from lsp_dscoder.engine.api import CompletionRequest, SamplingParams
from lsp_dscoder.remote import RemoteBackend
from lsp_dscoder.remote_config import RemoteConfig

# the endpoint, in a process of its own (it prints its URL, then serves until killed)
SERVER = (
    "import time; from tests.remote.bad_server import BadServer; "
    "print(BadServer().url, flush=True); time.sleep(1e4)"
)


async def measure(url: str, n: int, pause_s: float) -> tuple[list[float], float]:
    """First-text times (ms) and the process's CPU time per request (ms), over `n` requests."""
    loop = asyncio.get_running_loop()
    config = RemoteConfig(endpoint=url, tokenizer=Path(default_model_path()), model="bad-model")
    backend = await asyncio.to_thread(RemoteBackend, config, None, loop)
    await asyncio.sleep(0.5)  # the probe, and the spare connection
    prompt = tuple(range(300, 1400))
    times = []
    cpu = time.process_time()  # all threads of the process: a backend's reading threads too
    for i in range(n):
        params = SamplingParams(max_tokens=16)
        request = CompletionRequest(prompt_ids=(*prompt, 500 + i % 7), params=params, slot_key="a.py")
        started = time.perf_counter()
        handle = backend.submit(request)
        async for event in handle.stream():
            if event.text:
                times.append(1e3 * (time.perf_counter() - started))
                break
        await handle.wait()
        await asyncio.sleep(pause_s)
    cpu_ms = 1e3 * (time.process_time() - cpu) / n
    await asyncio.to_thread(backend.close)
    return times, cpu_ms


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 300
    pause_s = float(argv[1]) / 1000.0 if len(argv) > 1 else 0.01
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        times, cpu_ms = asyncio.run(measure(url, n, pause_s))
        times.sort()
    finally:
        server.kill()
    p10, p90 = times[len(times) // 10], times[9 * len(times) // 10]
    print(
        f"submit -> first text event, {n} requests: p10 {p10:.3f} / p50 {statistics.median(times):.3f} / "
        f"p90 {p90:.3f} ms; CPU time per request (all threads) {cpu_ms:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
