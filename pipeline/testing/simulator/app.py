"""Routing: which part of the simulated API answers a request, behind one API key."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from .anthropic import AnthropicApi, is_anthropic
from .anthropic.errors import error_reply as anthropic_error
from .anthropic.errors import new_id
from .auth import auth_error
from .batches import BatchStore
from .config import SimConfig
from .engine import Engine, models_reply
from .files import MAX_UPLOAD_BYTES, FileStore
from .log import RequestLog, RequestLogger
from .replies import Reply, error_body, error_reply, json_reply

__all__ = ["MAX_BODY_BYTES", "App", "Clock"]

Clock = Callable[[], float]  # seconds, monotonic: the server's clock

MAX_BODY_BYTES: Final = 64 * 1024 * 1024


def _noop() -> None:
    pass


class App:
    """The simulated APIs: OpenAI's chat completions, models, files and batches; Anthropic's
    messages and Message Batches (``anthropic``). Time is ``clock``'s."""

    def __init__(
        self,
        config: SimConfig,
        log_path: Path | None,
        *,
        keep_requests: bool,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall0 = time.time() - clock()  # Unix time at clock zero
        self.logger = RequestLogger(log_path, keep=keep_requests)
        self.engine = Engine(self.logger)
        self.files = FileStore()
        self.batches = BatchStore(self.engine, self.files, self.wall0)
        self.anthropic = AnthropicApi(self.logger, self.engine.bill, self.wall0)
        # Set by the server: wakes the loop that advances batches once one is created.
        self.wake = _noop

    @property
    def t0(self) -> float:
        """Server-clock time at which the server started listening."""
        return self.engine.t0

    def open(self) -> None:
        """Start the clock and open the request log."""
        now = self.clock()
        self.engine.open(now)
        self.anthropic.open(now)
        self.logger.open()

    def close(self) -> None:
        """Close the request log."""
        self.logger.close()

    def body_limit(self, method: str, target: str) -> int:
        """The largest request body accepted for this request line."""
        path = target.split("?", 1)[0].rstrip("/")
        if method == "POST" and path == "/v1/files":
            return MAX_UPLOAD_BYTES
        limit = self.anthropic.body_limit(self.config, method, path)
        return limit if limit is not None else MAX_BODY_BYTES

    def refusal(self, status: int, message: str, target: str | None) -> Reply:
        """An error the HTTP layer answers itself, in the dialect of the route asked for."""
        path = (target or "").split("?", 1)[0]
        if path.startswith("/v1/messages"):
            if status == 413:
                message = "Request exceeds the maximum allowed number of bytes."
            return anthropic_error(status, message, new_id("req_"))
        error_type = "server_error" if status >= 500 else "invalid_request_error"
        return Reply(status, error_body(message, error_type))

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Reply:
        """Answer one request."""
        path, _, query = target.partition("?")
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/")
        cfg = self.config
        now = self.clock()
        if is_anthropic(path, headers):
            reply = self.anthropic.handle(cfg, method, path, query, headers, body, now)
            if method == "POST" and path.startswith("/v1/messages/batches") and reply.status == 200:
                self.wake()
            return reply
        if path == "/v1/chat/completions" and method == "POST":
            return self.engine.chat(cfg, headers, body, now)
        if path == "/v1/sim/bill" and method == "GET":  # the server's own bill, for tests
            return json_reply(self.engine.bill.to_json())
        api = path.split("/", 3)[:3]
        if api not in (["", "v1", "models"], ["", "v1", "files"], ["", "v1", "batches"]):
            return error_reply(404, f"Invalid URL ({method} {path})", None, "unknown_url")
        auth = auth_error(cfg.api_key, headers)
        if auth is not None:
            return Reply(401, auth)
        if api[2] == "models" and method == "GET":
            return models_reply(cfg, path)
        if api[2] == "files":
            return self.files.handle(method, path, query, headers, body, self.batches.wall(now))
        if api[2] == "batches":
            reply = self.batches.handle(cfg, method, path, query, body, now)
            if method == "POST" and reply.status == 200:
                self.wake()
            return reply
        return error_reply(404, f"Invalid URL ({method} {path})", None, "unknown_url")

    def record(self, entry: RequestLog) -> None:
        """Log a request as its reply goes out (or its client leaves first)."""
        self.logger.record(entry)

    def tick(self) -> bool:
        """Advance the batches to now; return whether any is still in flight."""
        now = self.clock()
        openai = self.batches.advance(self.config, now)
        return self.anthropic.tick(now) or openai
