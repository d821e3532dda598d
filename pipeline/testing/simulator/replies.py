"""What a handler answers: a status, a body and how to deliver it (or not)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from .log import RequestLog

__all__ = [
    "REASONS",
    "Reply",
    "error_body",
    "error_reply",
    "json_reply",
    "new_id",
    "page",
    "query_int",
]

REASONS: Final[dict[int, str]] = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    529: "Overloaded",
}

Action = Literal["send", "hang", "reset", "truncate"]


@dataclass(slots=True)
class Reply:
    """One response, with the fault that delivers it (``action``) and its log entry."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    action: Action = "send"
    delay: float = 0.0
    hang_s: float = 0.0
    log: RequestLog | None = None
    close: bool = False
    content_type: str = "application/json"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    """OpenAI's error envelope."""
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def error_reply(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    type_: str = "invalid_request_error",
) -> Reply:
    """A reply carrying OpenAI's error envelope."""
    return Reply(status, error_body(message, type_, param, code))


def json_reply(value: Any, status: int = 200) -> Reply:
    """A JSON reply."""
    return Reply(status, orjson.dumps(value))


def new_id(prefix: str) -> str:
    """A fresh object id in OpenAI's style (``file-…``, ``batch_…``)."""
    return prefix + secrets.token_hex(12)


def page(items: list[dict[str, Any]], limit: int, after: str | None) -> dict[str, Any]:
    """One cursor page of ``items`` (already in list order): those after ``after``."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }


def query_int(query: dict[str, list[str]], name: str, default: int, hi: int) -> int | Reply:
    """The integer query parameter ``name`` within [1, ``hi``], or a 400 reply."""
    raw = query.get(name, [str(default)])[-1]
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= hi:
        return error_reply(400, f"Invalid '{name}': expected an integer in [1, {hi}].", name)
    return value
