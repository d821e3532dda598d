"""The request log: one entry per model call (chat completion or message), real time or batch."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["RequestLog", "RequestLogger"]


@dataclass(frozen=True, slots=True)
class RequestLog:
    """One model call: a request on ``/v1/chat/completions`` or ``/v1/messages``, or a
    processed batch line.

    ``status`` is the HTTP status sent (0 when none was: hang, reset, client gone) or, for a
    batch line, the line's status (a Message Batches line: 200 when it succeeded, else its
    error's status). ``model`` and the token counts are the server's own accounting (zero
    tokens when no answer was produced; ``prompt_tokens`` counts every input token, cache
    reads and writes included). Batch lines carry ``batch_id`` and ``custom_id``;
    real-time requests have both ``None``. ``provider`` names the API: openai or anthropic.
    """

    t: float
    body: dict[str, Any]
    status: int
    outcome: str
    completed: bool
    headers: dict[str, str]
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    batch_id: str | None = None
    custom_id: str | None = None
    provider: str = "openai"

    @property
    def is_batch(self) -> bool:
        """Whether this entry is a batch line rather than a real-time request."""
        return self.batch_id is not None

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


class RequestLogger:
    """Keeps the entries in memory (unless told not to) and appends them to a JSONL file."""

    def __init__(self, path: Path | None, *, keep: bool) -> None:
        self.path = path
        self.keep = keep
        self._entries: list[RequestLog] = []
        self._file: IO[bytes] | None = None
        # Entries are written on the server thread and read from the caller's.
        self._lock = threading.Lock()

    def open(self) -> None:
        """Open the log file for appending (creating its folder)."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("ab")

    def close(self) -> None:
        """Close the log file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def record(self, entry: RequestLog) -> None:
        """Keep one entry."""
        line = orjson.dumps(entry) + b"\n" if self.path is not None else b""
        with self._lock:
            if self.keep:
                self._entries.append(entry)
            if self._file is not None:
                self._file.write(line)
                self._file.flush()

    def entries(self) -> list[RequestLog]:
        """A snapshot of the entries kept so far."""
        with self._lock:
            return list(self._entries)
