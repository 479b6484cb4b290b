"""Command line: `lsp-dscoder [serve] --stdio|--tcp`, `complete`, `bench`, `eval`, `quantize`."""

from __future__ import annotations

import argparse
import importlib
import sys

from lsp_dscoder import __version__

# subcommand -> module defining add_arguments(parser) and run(args) -> int
COMMANDS = {
    "serve": ("lsp_dscoder.server_main", "run the language server (default)"),
    "complete": ("lsp_dscoder.cli_complete", "complete a file at a position and print the timings"),
    "bench": ("lsp_dscoder.bench", "benchmark the engine against transformers and the hardware floors"),
    "eval": (
        "lsp_dscoder.evaluate",
        "evaluate a model on held-out files (FIM, line exact match, perplexity)",
    ),
    "quantize": (
        "lsp_dscoder.quantize",
        "write an INT4 AWQ checkpoint (AutoAWQ GEMM format) from a bf16/fp16/fp32 one",
    ),
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser; only the chosen command's module is imported (the others may pull in heavy deps)."""
    parser = argparse.ArgumentParser(prog="lsp-dscoder", description=__doc__)
    parser.add_argument("--version", action="version", version=f"lsp-dscoder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `lsp-dscoder --stdio` and a bare `lsp-dscoder` mean `serve`.
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "serve")
    args = build_parser(argv[0]).parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
