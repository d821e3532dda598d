"""Routing: which part of the simulated API answers a request, behind one API key."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

from .auth import auth_error
from .batches import BatchStore
from .config import SimConfig
from .engine import Engine, models_reply
from .files import MAX_UPLOAD_BYTES, FileStore
from .log import RequestLog, RequestLogger
from .replies import Reply, error_reply, json_reply

__all__ = ["MAX_BODY_BYTES", "App"]

MAX_BODY_BYTES: Final = 64 * 1024 * 1024


def _noop() -> None:
    pass


class App:
    """The simulated API: chat completions, models, files and batches."""

    def __init__(self, config: SimConfig, log_path: Path | None, *, keep_requests: bool) -> None:
        self.config = config
        self.logger = RequestLogger(log_path, keep=keep_requests)
        self.engine = Engine(self.logger)
        self.files = FileStore()
        self.batches = BatchStore(self.engine, self.files, time.time() - time.monotonic())
        # Set by the server: wakes the loop that advances batches once one is created.
        self.wake = _noop

    @property
    def t0(self) -> float:
        """Server-clock time at which the server started listening."""
        return self.engine.t0

    def open(self) -> None:
        """Start the clock and open the request log."""
        self.engine.open(time.monotonic())
        self.logger.open()

    def close(self) -> None:
        """Close the request log."""
        self.logger.close()

    def body_limit(self, method: str, target: str) -> int:
        """The largest request body accepted for this request line."""
        if method == "POST" and target.split("?", 1)[0].rstrip("/") == "/v1/files":
            return MAX_UPLOAD_BYTES
        return MAX_BODY_BYTES

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Reply:
        """Answer one request."""
        path, _, query = target.partition("?")
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/")
        cfg = self.config
        now = time.monotonic()
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
        return self.batches.advance(self.config, time.monotonic())
