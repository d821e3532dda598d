"""Routing within Anthropic's API: messages, token counts, models, Message Batches."""

from __future__ import annotations

from typing import Final

import orjson

from ..config import DEFAULT_MODEL, SimConfig
from ..log import RequestLogger
from ..replies import Reply
from ..tiers import Bill
from .batches import PATH as BATCHES
from .batches import MessageBatchStore
from .errors import error_reply, header_error, new_id
from .messages import MessagesEngine

__all__ = ["MESSAGES_MAX_BYTES", "AnthropicApi", "is_anthropic"]

# Anthropic's request size limit for the Messages API (Message Batches: SimConfig's).
MESSAGES_MAX_BYTES: Final = 32 * 1024 * 1024
_CREATED: Final = "2025-05-14T00:00:00Z"


def is_anthropic(path: str, headers: dict[str, str]) -> bool:
    """Whether Anthropic's API answers this request: ``/v1/messages…``, or ``/v1/models…``
    asked with an ``anthropic-version`` header."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return True
    models = path == "/v1/models" or path.startswith("/v1/models/")
    return models and "anthropic-version" in headers


class AnthropicApi:
    """Anthropic's side of the simulator, sharing the request log and the bill."""

    def __init__(self, logger: RequestLogger, bill: Bill, wall0: float) -> None:
        self.messages = MessagesEngine(logger, bill, wall0)
        self.batches = MessageBatchStore(self.messages, wall0)

    def open(self, now: float) -> None:
        """Start the clock."""
        self.messages.open(now)

    def body_limit(self, cfg: SimConfig, method: str, path: str) -> int | None:
        """The largest body Anthropic takes on this route (None: not one of its routes)."""
        if method != "POST":
            return None
        if path == BATCHES:
            return cfg.message_batch_max_bytes
        if path.startswith("/v1/messages"):
            return MESSAGES_MAX_BYTES
        return None

    def handle(
        self,
        cfg: SimConfig,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        now: float,
    ) -> Reply:
        """Answer one request ``is_anthropic`` claimed."""
        if path == "/v1/messages" and method == "POST":
            return self.messages.create(cfg, headers, body, now)
        rid = new_id("req_")
        if path == "/v1/messages/count_tokens" and method == "POST":
            return self.messages.count_tokens(cfg, headers, body, rid)
        refused = header_error(cfg, headers, rid)
        if refused is not None:
            return refused
        if path == BATCHES or path.startswith(BATCHES + "/"):
            return self.batches.handle(cfg, method, path, query, headers, body, now, rid)
        if path.startswith("/v1/models") and method == "GET":
            return _models(cfg, path, rid)
        return error_reply(404, f"Not found: {method} {path}", rid)

    def tick(self, now: float) -> bool:
        """Advance the Message Batches to ``now``; return whether any is still in flight."""
        return self.batches.advance(now)


def _card(name: str) -> dict[str, str]:
    return {"type": "model", "id": name, "display_name": name, "created_at": _CREATED}


def _models(cfg: SimConfig, path: str, rid: str) -> Reply:
    """``GET /v1/models`` and ``/v1/models/{id}`` in Anthropic's shape; any model is served
    when ``cfg.models`` is None."""
    names = cfg.models if cfg.models is not None else (DEFAULT_MODEL,)
    headers = [("request-id", rid)]
    if path == "/v1/models":
        cards = [_card(n) for n in names]
        first, last = (names[0], names[-1]) if names else (None, None)
        page = {"data": cards, "has_more": False, "first_id": first, "last_id": last}
        return Reply(200, orjson.dumps(page), headers)
    wanted = path[len("/v1/models/") :]
    if cfg.models is not None and wanted not in cfg.models:
        return error_reply(404, f"model: {wanted}", rid)
    return Reply(200, orjson.dumps(_card(wanted)), headers)
