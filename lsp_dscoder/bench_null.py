"""A JSON-RPC server over stdio that does no work: `python -m lsp_dscoder.bench_null`.

Every request is answered `{"result": null}` as soon as it is framed; notifications are read and dropped;
`exit` or the end of stdin ends it. It reads and writes as `lsp-dscoder --stdio` does (the same event
loop, `framing.Framer`, one `os.write` per message), without pygls and without handlers, so a round trip
to it is what any stdio language server pays on the machine: the pipes, and each process waking up to read.
`lsp-dscoder bench --protocol` times it at the keystrokes' pace, next to the server's own times.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from typing import Any

from lsp_dscoder.framing import Framer
from lsp_dscoder.transport import new_loop


class NullServer(asyncio.Protocol):
    """Frames stdin and answers each request at once; `finished` at `exit` or the end of input, when
    `done` (if given) resolves too."""

    def __init__(self, out_fd: int, done: asyncio.Future[None] | None = None) -> None:
        self._out = out_fd
        self._done = done
        self.finished = False
        self._framer = Framer(lambda reason: print(f"bench_null: skipped input ({reason})", file=sys.stderr))

    def data_received(self, data: bytes) -> None:
        for body in self._framer.feed(data):
            try:
                message: Any = json.loads(body)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if message.get("method") == "exit":
                self._finish()
                return
            if "id" in message and "method" in message:
                reply = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": None}).encode()
                os.write(self._out, b"Content-Length: %d\r\n\r\n%b" % (len(reply), reply))

    def eof_received(self) -> bool:
        self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        self.finished = True
        if self._done is not None and not self._done.done():
            self._done.set_result(None)


def main() -> int:
    fd = sys.stdin.fileno()
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)):
        # a regular file or a device such as /dev/null, which the event loop refuses: read it plainly
        server = NullServer(sys.stdout.fileno())
        while not server.finished and (data := os.read(fd, 1 << 16)):
            server.data_received(data)
        return 0
    loop = new_loop()

    async def serve() -> None:
        done: asyncio.Future[None] = loop.create_future()
        await loop.connect_read_pipe(lambda: NullServer(sys.stdout.fileno(), done), sys.stdin)
        await done

    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
