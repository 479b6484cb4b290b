"""A JSON-RPC server over stdio that does no work: `python -m lsp_dscoder.bench_null`.

Every request is answered `{"result": null}` as soon as it is framed; notifications are read and dropped;
`exit` or the end of stdin ends it. It reads stdin as `lsp-dscoder --stdio` does (`transport.read_stdin`:
the same event loop and framing) and writes each answer with one `os.write`, without pygls and without
handlers, so a round trip to it is what any stdio language server pays on the machine: the pipes, and each
process waking up to read. `lsp-dscoder bench --protocol` times it at the keystrokes' pace, next to the
server's own times.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from lsp_dscoder.framing import framed
from lsp_dscoder.transport import read_stdin


def answer(out_fd: int, body: bytes) -> bool:
    """Answers `body` on `out_fd` if it is a request; False at `exit`."""
    try:
        message: Any = json.loads(body)
    except ValueError:
        return True
    if not isinstance(message, dict):
        return True
    if message.get("method") == "exit":
        return False
    if "id" in message and "method" in message:
        os.write(out_fd, framed(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": None}).encode()))
    return True


def main() -> int:
    out = sys.stdout.fileno()
    read_stdin(sys.stdin.buffer, lambda body: answer(out, body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
