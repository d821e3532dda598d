"""Batch input and output lines, as pure functions: building, splitting and reading them.

A line's ``custom_id`` is ``TOKEN-I``: the token of the batch that carries it (random, hex)
and the line's position in that batch's input file. The ledger maps the position to the
record and step, so record ids (any characters, any length) never reach the provider,
and an id is unique across the whole run, not only within its batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ...client.replies import read_reply
from ...client.retry import classify_status
from ...core.steps import Request
from ...errors import AuthError, CallError
from .api import ENDPOINT

__all__ = [
    "LINE_OVERHEAD",
    "UNFINISHED_CODES",
    "LineReply",
    "custom_id",
    "input_line",
    "line_index",
    "read_output",
    "read_result",
    "request_body",
    "split",
]

# Bytes a line adds around its body: the envelope with the longest custom_id we make.
LINE_OVERHEAD = 128
# Error codes of lines a batch never ran (it expired or was cancelled first).
UNFINISHED_CODES = frozenset({"batch_expired", "batch_cancelled"})


def custom_id(token: str, index: int) -> str:
    """The custom_id of line ``index`` of the batch with ``token``."""
    return f"{token}-{index}"


def line_index(cid: Any, token: str) -> int | None:
    """The line position a custom_id names, or None when it is not one of ``token``'s."""
    if not isinstance(cid, str):
        return None
    head, sep, tail = cid.rpartition("-")
    if not sep or head != token or not tail.isdigit():
        return None
    return int(tail)


def request_body(
    model: str, sent: list[dict[str, str]], request: Request, extra: Mapping[str, Any]
) -> bytes:
    """A line's request body (JSON bytes): ``request`` for ``model``, its messages as
    ``sent`` with the format's fields ``extra`` (both as the format ladder gives them)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": sent,
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
    }
    if request.frequency_penalty is not None:
        body["frequency_penalty"] = request.frequency_penalty
    return orjson.dumps({**body, **extra})


def input_line(cid: str, body: bytes) -> bytes:
    """One line of a batch input file: the request ``body`` (JSON bytes) under ``cid``."""
    envelope = {"custom_id": cid, "method": "POST", "url": ENDPOINT, "body": orjson.Fragment(body)}
    return orjson.dumps(envelope) + b"\n"


def split(sizes: Sequence[int], max_lines: int, max_bytes: int) -> list[tuple[int, int]]:
    """Cut lines of the given sizes, in order, into files within both limits: (start, end) pairs.

    A line too big for any file goes alone into one (the provider refuses it, and the
    driver fails its record before sending).
    """
    files: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_lines or used + size > max_bytes):
            files.append((start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        files.append((start, len(sizes)))
    return files


@dataclass(frozen=True, slots=True)
class LineReply:
    """The reply a batch line carries: the completion's text, finish reason and usage."""

    text: str
    finish_reason: str | None
    usage: Mapping[str, int]


def read_result(line: Mapping[str, Any]) -> LineReply | CallError | None:
    """What one output or error line says: a reply, the call's failure, or None (never run).

    A failure carries the HTTP status the line reports, so the real-time retry policy
    decides what follows: 429/5xx retried, 401/403 stop the run, other 4xx fail the record.
    A line an API implementation read itself (Message Batches: ``anthropic``) carries the
    answer read (``answer``: text, finish_reason, usage) or why it is none (``failed``).
    """
    read = line.get("answer")
    if isinstance(read, Mapping):
        return LineReply(str(read["text"]), read.get("finish_reason"), read["usage"])
    unread = line.get("failed")
    if isinstance(unread, Mapping):
        return CallError(str(unread.get("category") or "bad_response"), str(unread.get("message")))
    response = line.get("response")
    error = line.get("error")
    if not isinstance(response, Mapping):
        err = error if isinstance(error, Mapping) else {}
        code = err.get("code")
        if code in UNFINISHED_CODES:
            return None
        message = str(err.get("message") or "the line has neither a response nor an error")
        # No status: a provider-side failure of this line, which another attempt may not hit.
        return CallError("bad_response", f"batch line error {code or 'unknown'}: {message}")
    status = response.get("status_code")
    body = response.get("body")
    if status != 200:
        code = int(status) if isinstance(status, int) else 500
        text = f"HTTP {code}: {_message(body)}"
        if classify_status(code) == "auth":
            return AuthError("auth", text, status=code)
        return CallError(f"http_{code}", text, status=code)
    try:
        reply = read_reply(body)
    except CallError as err:
        return err
    return LineReply(reply["text"], reply["finish_reason"], reply["usage"])


def _message(body: Any) -> str:
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and inner.get("message"):
            return str(inner["message"])
    return "error"


def read_output(data: bytes, token: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The lines of an output or error file that belong to ``token``'s batch, by position.

    A line that cannot be read, or names another batch's custom_id, is skipped: its call
    counts as never run and goes out again.
    """
    for raw in data.splitlines():
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        index = line_index(obj.get("custom_id"), token)
        if index is not None:
            yield index, obj
