"""The engine's error hierarchy: every refusal the engine makes is one of these, with a clear message."""


class EngineError(Exception):
    """Base class for errors the engine reports to its callers."""


class CheckpointError(EngineError):
    """A checkpoint folder is missing, incomplete, corrupted or inconsistent with its config."""


class UnsupportedModelError(EngineError):
    """The checkpoint's architecture is not one the engine implements."""


class ContextOverflowError(EngineError):
    """The prompt does not fit in the configured maximum context."""


class EngineClosedError(EngineError):
    """A request was submitted to an engine that has been shut down."""
