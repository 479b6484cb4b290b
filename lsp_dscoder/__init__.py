"""lsp-dscoder: a language server with a warm in-process DeepSeek-Coder engine."""

__version__ = "0.1.0"
