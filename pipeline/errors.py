"""One error hierarchy for the whole package.

Errors from openai, orjson and the OS are translated where they enter and chained
with ``raise ... from err``::

    RefineError
    ├── ConfigError            bad usage or configuration: stops the run (exit 2)
    │   ├── JobError           a job file is invalid (names the key)
    │   ├── RunDirError        RUN_DIR belongs to another job, model or input
    │   ├── RunLocked          another process holds RUN_DIR
    │   └── LocalModelError    the local model cannot be had or served (pipeline.local)
    │       ├── UnknownModelError      not a known name, hf: reference or .gguf file
    │       ├── ModelFetchError        packages or the hub could not deliver the file
    │       │   └── ModelIntegrityError    the file has the wrong SHA-256 or size
    │       ├── LlamaCppMissingError   the local extra (llama-server) is not installed
    │       └── ServerStartError       llama-server exited or never answered
    ├── InputError             one input line cannot become a record (line, field)
    ├── CallError              one model call failed for good: fails its record
    │   └── FatalCallError     the failure would hit every record: stops the run
    │       ├── AuthError      the endpoint refused the credentials (exit 3)
    │       └── UnavailableError  the endpoint stayed down past --max-outage (exit 5)
    ├── FeedbackParseError     a feedback answer could not be parsed (a step error)
    └── StoreError             the run directory cannot be written (exit 4)
"""

from __future__ import annotations

from typing import Any


class RefineError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(RefineError):
    """Bad usage or configuration; the run cannot start or go on."""


class JobError(ConfigError):
    """A job definition is invalid."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source = source
        self.key = key
        super().__init__(f"{source}: {key}: {message}")


class RunDirError(ConfigError):
    """RUN_DIR was started with another job, model or input."""


class RunLocked(ConfigError):
    """Another live process holds the RUN_DIR lock."""


class LocalModelError(ConfigError):
    """The local model cannot be resolved, fetched or served; the run cannot start."""


class UnknownModelError(LocalModelError, ValueError):
    """The name is not a registered model, an ``hf:`` reference or a usable .gguf file."""


class ModelFetchError(LocalModelError):
    """The model file could not be downloaded or assembled."""


class ModelIntegrityError(ModelFetchError):
    """The file does not have the SHA-256 or size it was published with."""


class LlamaCppMissingError(LocalModelError):
    """llama.cpp's server (the ``local`` extra) is not installed."""


class ServerStartError(LocalModelError):
    """The llama.cpp server exited or did not become ready while starting."""


class InputError(RefineError):
    """An input line that cannot become a record."""

    def __init__(self, line: int, message: str, field: str | None = None) -> None:
        self.line = line
        self.field = field
        self.reason = message
        self.raw: str | None = None  # the start of the offending line, set by the reader
        where = f"line {line}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


class CallError(RefineError):
    """A model call that failed for good (after any retries)."""

    def __init__(
        self, kind: str, message: str, *, status: int | None = None, attempts: int = 1
    ) -> None:
        self.kind = kind
        self.status = status
        self.attempts = attempts
        super().__init__(message)

    def as_dict(self) -> dict[str, Any]:
        """The ``{type, message}`` shape written to outputs and traces."""
        return {"type": self.kind, "message": str(self)}


class FatalCallError(CallError):
    """A call failure that every record would hit (unknown model, bad URL)."""


class AuthError(FatalCallError):
    """The endpoint refused the API key (401/403)."""


class UnavailableError(FatalCallError):
    """The endpoint kept failing longer than the run waits for an outage."""


class FeedbackParseError(RefineError):
    """Feedback text that holds no usable JSON object."""


class StoreError(RefineError):
    """The run directory cannot be written (disk full, read-only)."""
