"""Anthropic's error envelope, its object ids, and the two headers every request must carry.

Every error is ``{"type": "error", "error": {"type": ..., "message": ...}, "request_id":
...}``; the HTTP status names the type (``STATUS_TYPES``). Every reply carries a
``request-id`` header, the same id as an error body's ``request_id``.
"""

from __future__ import annotations

import re
import secrets
import string
from typing import Final

import orjson

from ..config import SimConfig
from ..replies import Reply

__all__ = [
    "STATUS_TYPES",
    "error_body",
    "error_reply",
    "header_error",
    "new_id",
]

# The status of each error type, as Anthropic documents them (api/errors).
STATUS_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
# An ``anthropic-version`` is a date (2023-06-01; recent SDKs send later ones).
_VERSION: Final = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ALPHABET: Final = string.ascii_letters + string.digits


def new_id(prefix: str) -> str:
    """A fresh id in Anthropic's style: ``req_011…``, ``msg_01…``, ``msgbatch_01…``."""
    tail = "".join(secrets.choice(_ALPHABET) for _ in range(22))
    return f"{prefix}01{tail}"


def error_body(status: int, message: str, request_id: str) -> bytes:
    """Anthropic's error envelope for ``status`` (its documented type) with ``message``."""
    error_type = STATUS_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    error = {"type": error_type, "message": message}
    return orjson.dumps({"type": "error", "error": error, "request_id": request_id})


def error_reply(status: int, message: str, request_id: str) -> Reply:
    """A reply carrying Anthropic's error envelope and the ``request-id`` header."""
    return Reply(status, error_body(status, message, request_id), [("request-id", request_id)])


def header_error(cfg: SimConfig, headers: dict[str, str], request_id: str) -> Reply | None:
    """The refusal of a request without a valid key or ``anthropic-version``.

    The key comes in ``x-api-key`` or, as recent SDKs send it, as a bearer token in
    ``Authorization``. Any key is accepted when ``cfg.api_key`` is None, but one must be sent.
    """
    key = headers.get("x-api-key", "")
    auth = headers.get("authorization", "")
    if not key and auth[:7].lower() == "bearer ":
        key = auth[7:].strip()
    if not key:
        return error_reply(401, "x-api-key header is required", request_id)
    if cfg.api_key is not None and key != cfg.api_key:
        return error_reply(401, "invalid x-api-key", request_id)
    version = headers.get("anthropic-version", "")
    if not version:
        return error_reply(400, "anthropic-version: header is required", request_id)
    if not _VERSION.match(version):
        message = f"anthropic-version: {version!r} is not a valid version"
        return error_reply(400, message, request_id)
    return None
