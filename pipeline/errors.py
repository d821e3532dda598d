"""One error hierarchy for the whole package.

Errors from openai, orjson and the OS are translated where they enter and chained
with ``raise ... from err``::

    RefineError
    ├── ConfigError            bad usage or configuration: stops the run (exit 2)
    │   ├── JobError           a job file is invalid (names the key)
    │   ├── RunDirError        RUN_DIR belongs to another job, model or input
    │   ├── RunLocked          another process holds RUN_DIR
    │   ├── BatchFailed        the Batch API refused a batch for good (its errors shown)
    │   ├── SandboxError       kernel isolation for programs is missing (strict mode)
    │   └── LocalModelError    the local model cannot be had or served (pipeline.serving)
    │       ├── UnknownModelError      not a known name, hf: reference or .gguf file
    │       ├── ModelFetchError        packages or the hub could not deliver the file
    │       │   └── ModelIntegrityError    the file has the wrong SHA-256 or size
    │       ├── LlamaCppMissingError   the local extra (llama-server) is not installed
    │       └── ServerStartError       llama-server exited or never answered
    ├── InputError             one input line cannot become a record (line, field)
    ├── CallError              one model call failed for good: fails its record
    │   └── FatalCallError     the failure would hit every record: stops the run
    │       ├── AuthError      the endpoint refused the credentials (exit 3)
    │       ├── UnreachableError  the endpoint never answered: refused, unknown host, TLS (exit 2)
    │       └── UnavailableError  the endpoint stayed down past --max-outage (exit 5)
    ├── FeedbackParseError     a feedback answer could not be parsed (a step error)
    ├── BudgetReached          the next call cannot be paid within --budget (exit 6)
    └── StoreError             the run directory cannot be written (exit 4)

Retryable failures inside the client never leave it: it retries them or turns them
into a CallError once the retry policy gives up. A CallError that leaves a model call
carries the call's trace data (attempts, tries, the messages as sent, the model) from its
construction: the retry sequence (``pipeline.client.attempts``) builds it whole with
``CallError.traced``, raised from the attempt's own failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

MAX_SHOWN_ERRORS = 5  # of a failed batch's validation errors, in the message


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


class SandboxError(ConfigError):
    """A job runs programs and a kernel layer of the sandbox is missing (no --sandbox weak)."""


class BatchFailed(ConfigError):
    """The Batch API refused a batch for a reason a retry would meet again (its errors shown)."""

    def __init__(self, message: str, errors: Sequence[object] = ()) -> None:
        self.errors = tuple(errors)
        shown = "; ".join(str(e) for e in self.errors[:MAX_SHOWN_ERRORS])
        more = len(self.errors) - MAX_SHOWN_ERRORS
        if more > 0:
            shown += f"; and {more} more"
        super().__init__(f"{message}{': ' + shown if shown else ''}; its records stay pending")


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
        self,
        category: str,
        message: str,
        *,
        status: int | None = None,
        attempts: int = 1,
        tries: tuple[Any, ...] = (),
        messages: list[dict[str, str]] | None = None,
        model: str | None = None,
    ) -> None:
        self.category = category
        self.status = status
        # The call's trace data: read-only, given whole when the error is built (``traced``).
        self._attempts = attempts
        self._tries = tries
        self._messages = messages
        self._model = model
        super().__init__(message)

    @property
    def attempts(self) -> int:
        """The attempts the call made (0: it failed unsent)."""
        return self._attempts

    @property
    def tries(self) -> tuple[Any, ...]:
        """Each attempt's status and latency (``core.steps.Try``), in order."""
        return self._tries

    @property
    def messages(self) -> list[dict[str, str]] | None:
        """The messages as last sent, when the client changed them."""
        return self._messages

    @property
    def model(self) -> str | None:
        """The model the call asked, as the run records it."""
        return self._model

    def traced(
        self,
        *,
        attempts: int,
        tries: tuple[Any, ...],
        messages: list[dict[str, str]] | None,
        model: str,
    ) -> Self:
        """This failure again, of the same type, carrying a call's trace data: the error a
        call ends with (raise it ``from`` this one)."""
        return type(self)(
            self.category,
            str(self),
            status=self.status,
            attempts=attempts,
            tries=tries,
            messages=messages,
            model=model,
        )

    def as_dict(self) -> dict[str, Any]:
        """The ``{type, message, status}`` shape written to traces (status when HTTP gave one)."""
        d: dict[str, Any] = {"type": self.category, "message": str(self)}
        if self.status is not None:
            d["status"] = self.status
        return d


class FatalCallError(CallError):
    """A call failure that every record would hit (unknown model, bad URL)."""


class AuthError(FatalCallError):
    """The endpoint refused the API key (401/403)."""


class UnreachableError(FatalCallError):
    """Nothing answers at the endpoint's URL, and no call there has ever succeeded."""


class UnavailableError(FatalCallError):
    """The endpoint kept failing longer than the run waits for an outage."""


class FeedbackParseError(RefineError):
    """Feedback text that holds no usable JSON object."""


class BudgetReached(RefineError):
    """The next call cannot be reserved within ``--budget``: the run stops taking calls."""


class StoreError(RefineError):
    """The run directory cannot be written (disk full, read-only)."""
