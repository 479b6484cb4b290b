"""`lsp-dscoder serve`: run the language server over stdio (default) or TCP.

stdout carries the protocol and nothing else: logs go to stderr or --log-file, and file descriptor 1 is
pointed at stderr once the protocol has its own copy, so a stray print cannot corrupt a message. On stderr
only warnings are logged by default (Neovim files every stderr line of a server as an error); a log file, or
`--log-level info`, gets a line per request.

The process ends within a second of `exit` or of losing its client, whatever it is doing: a model still
loading in a thread is not waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
from typing import Any

from lsp_dscoder import settings as settings_mod
from lsp_dscoder.settings import DType


def _port(text: str) -> int:
    port = int(text) if text.isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0..65535, got {text!r}")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true", help="speak LSP over stdin/stdout (default)")
    mode.add_argument("--tcp", action="store_true", help="listen for one client over TCP")
    parser.add_argument("--host", default="127.0.0.1", help="TCP address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=2087, help="TCP port (default 2087)")
    parser.add_argument("--model", help="checkpoint folder or cached repo id (default: the bundled model)")
    parser.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=[d.value for d in DType], help="default: auto")
    parser.add_argument("--max-context", type=int, help="KV cache length per slot, in tokens")
    parser.add_argument("--num-slots", type=int, help="documents whose KV stays cached")
    parser.add_argument("--backend", choices=["local", "remote"], help="local (default) or remote")
    parser.add_argument("--endpoint", help="remote: URL of an OpenAI-compatible server")
    parser.add_argument("--remote-model", help="remote: the served model (default: the first listed)")
    parser.add_argument("--api-key-env", help="remote: environment variable that holds the API key")
    parser.add_argument("--remote-prompt", choices=["tokens", "text"], help="remote: send token ids or text")
    parser.add_argument("--log-file", help="append logs here instead of stderr")
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="default: warning on stderr, info in --log-file",
    )


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Once stderr is gone (the terminal or editor closed), log records are dropped, not reported with a
    traceback of the failed write on the same broken stream."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)


def _setup_logging(args: argparse.Namespace) -> None:
    handler: logging.Handler
    handler = logging.FileHandler(args.log_file) if args.log_file else _StderrHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((args.log_level or ("info" if args.log_file else "warning")).upper())
    # pygls logs every message it sends at INFO: one line per streamed token.
    logging.getLogger("pygls").setLevel(max(logging.WARNING, root.level))


def _protocol_stdout() -> int:
    """A private copy of fd 1 for the protocol; fd 1 and sys.stdout then go to stderr."""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return fd


def _exit_now_if_a_thread_lingers(code: int) -> None:
    """A model load stuck in a thread (a slow disk, a stalled network file system) would hold the
    interpreter's exit until it ends: end the process now, logs flushed."""
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if not others:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the terminal is gone: nothing left to say
            stream.flush()
    os._exit(code)


def _message_type(level: int) -> Any:
    from lsprotocol import types

    return types.MessageType.Warning if level >= logging.WARNING else types.MessageType.Info


def run(args: argparse.Namespace) -> int:
    from lsp_dscoder import transport
    from lsp_dscoder.dispatch import BACKEND_STATUS
    from lsp_dscoder.rpc import DscoderProtocol
    from lsp_dscoder.server import create_server

    try:
        _setup_logging(args)
    except OSError as e:
        print(f"lsp-dscoder: error: cannot write the log file: {e}", file=sys.stderr)
        return 2
    cli = {
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "maxContext": args.max_context,
        "numSlots": args.num_slots,
        "backend": args.backend,
        "endpoint": args.endpoint,
        "remoteModel": args.remote_model,
        "apiKeyEnv": args.api_key_env,
        "remotePrompt": args.remote_prompt,
    }
    base, problems = settings_mod.parse({k: v for k, v in cli.items() if v is not None}, refuse=True)
    if problems:
        for problem in problems:
            print(f"lsp-dscoder: error: {problem.removeprefix('dscoder: ')}", file=sys.stderr)
        return 2
    ls = create_server(base)
    ls.host.notify = lambda level, message: ls.show(message, _message_type(level))
    ls.host.status = lambda params: ls.protocol.notify_json(BACKEND_STATUS, params)
    if isinstance(ls.protocol, DscoderProtocol):
        ls.protocol.warm()
    try:
        if args.tcp:
            transport.serve_tcp(ls, args.host, args.port, ls.keep_warm.saw)
        else:
            transport.serve_stdio(ls, sys.stdin.buffer, _protocol_stdout(), ls.keep_warm.saw)
    except transport.ListenError as exc:
        logging.getLogger(__name__).error("%s", exc)
        return 2
    finally:
        ls.completer.close_all()
        ls.host.close()
    logging.getLogger(__name__).info("server stopped (exit code %d)", ls.exit_code)
    _exit_now_if_a_thread_lingers(ls.exit_code)
    return ls.exit_code
