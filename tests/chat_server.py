"""A minimal OpenAI-compatible chat server for tests: one function decides each answer.

``serve_chat(answer)`` runs it on 127.0.0.1 in a thread and yields the base URL. Every
chat completion's reply text is ``answer(body)``; ``GET /v1/models`` (the run's reachability
check before its first call) lists no model; any other request (another path, another GET)
is refused with 404 and its path kept in ``strays``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

__all__ = ["serve_chat"]


def _completion(body: dict[str, Any], text: str) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140},
        }
    )


@contextmanager
def serve_chat(
    answer: Callable[[dict[str, Any]], str], strays: list[str] | None = None
) -> Iterator[str]:
    """Serve chat completions answered by ``answer``; yields the base URL (``.../v1``)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _stray(self) -> None:
            if strays is not None:
                strays.append(f"{self.command} {self.path}")
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/v1/models":
                self._stray()
                return
            listing = orjson.dumps({"object": "list", "data": []})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(listing)))
            self.end_headers()
            self.wfile.write(listing)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self.path.endswith("/chat/completions"):
                self._stray()
                return
            body = orjson.loads(raw)
            reply = _completion(body, answer(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
