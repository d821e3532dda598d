"""Just enough HTTP/1.1 on raw asyncio protocols: keep-alive, Content-Length or chunked
request bodies, 100-continue, and the faults a reply may carry (delay, hang, reset, cut).

Raw protocols rather than an HTTP library keep thousands of requests per second within
reach of one core, which the throughput benchmarks need.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import Final, Protocol, cast

from .log import RequestLog
from .replies import REASONS, Reply

__all__ = ["MAX_HEAD_BYTES", "Connection", "Handler", "HttpServer"]

MAX_HEAD_BYTES: Final = 64 * 1024
_MAX_CHUNK_LINE: Final = 1024

# method, target, headers, length (the body limit when chunked), keep-alive, chunked
_Head = tuple[str, str, dict[str, str], int, bool, bool]


class Handler(Protocol):
    """What answers the requests a connection reads."""

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Reply:
        """Answer one request."""
        ...

    def body_limit(self, method: str, target: str) -> int:
        """The largest request body accepted for this request line."""
        ...

    def record(self, entry: RequestLog) -> None:
        """Log a request as its reply goes out (or its client leaves first)."""
        ...

    def refusal(self, status: int, message: str, target: str | None) -> Reply:
        """The error reply for a request this layer refuses (``target``: its request target,
        when known), in the error shape of the API it was meant for."""
        ...


def _encode_head(
    status: int, headers: Sequence[tuple[str, str]], length: int, close: bool, content_type: str
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
        f"content-type: {content_type}",
        f"content-length: {length}",
        "connection: close" if close else "connection: keep-alive",
        *(f"{name}: {value}" for name, value in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class HttpServer:
    """The live connections of one listening socket, and the handler they share."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.conns: set[Connection] = set()
        self.closing = False

    def protocol(self) -> Connection:
        """A protocol for one new connection (the ``create_server`` factory)."""
        return Connection(self)

    def abort_all(self) -> None:
        """Stop accepting work and reset every open connection."""
        self.closing = True
        for conn in list(self.conns):
            conn.abort()


class Connection(asyncio.Protocol):
    """One client connection: parses requests one at a time and writes the replies."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: _Head | None = None
        self.scan_from = 0
        self.busy = False
        self.closed = False
        self.pending: asyncio.TimerHandle | None = None
        self.pending_reply: Reply | None = None
        # Chunked bodies: the bytes decoded so far, and the bytes left in the current chunk.
        self.chunked = bytearray()
        self.chunk_left = -1

    # -- asyncio callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.server.closing:
            self.abort()
            return
        self.server.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.conns.discard(self)
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
        reply = self.pending_reply
        self.pending_reply = None
        if reply is not None and reply.log is not None and reply.action != "hang":
            left = replace(reply.log, status=0, outcome="client_closed", completed=False)
            self.server.handler.record(left)
        self.buf.clear()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.process()

    # -- parsing ---------------------------------------------------------------------------

    def process(self) -> None:
        buf = self.buf
        while not self.busy and not self.closed:
            if self.head is None:
                end = buf.find(b"\r\n\r\n", self.scan_from)
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        self.fail(431, "Request header fields too large.")
                    else:
                        self.scan_from = max(0, len(buf) - 3)
                    return
                raw_head = bytes(buf[:end])
                del buf[: end + 4]
                self.scan_from = 0
                if not raw_head.strip():
                    continue  # stray CRLFs between requests
                head = self.parse_head(raw_head)
                if head is None:
                    return
                self.head = head
                waiting = head[5] or len(buf) < head[3]
                if head[2].get("expect", "").lower() == "100-continue" and waiting:
                    assert self.transport is not None
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            method, target, headers, length, keep_alive, chunked = self.head
            if chunked:
                body = self.read_chunked(length)
                if body is None:
                    return
            else:
                if len(buf) < length:
                    return
                body = bytes(buf[:length])
                del buf[:length]
            self.head = None
            try:
                reply = self.server.handler.handle(method, target, headers, body)
            except Exception as exc:  # never let a bug kill the connection silently
                reply = self.server.handler.refusal(500, f"Simulator error: {exc!r}", target)
            if not keep_alive:
                reply.close = True
            self.dispatch(reply)

    def read_chunked(self, limit: int) -> bytes | None:
        """Decode as much of a chunked body as has arrived; the body once it is complete."""
        buf, out = self.buf, self.chunked
        while not self.closed:
            if self.chunk_left > 0:
                take = min(self.chunk_left, len(buf))
                out += buf[:take]
                del buf[:take]
                self.chunk_left -= take
                if self.chunk_left > 0:
                    return None
            if self.chunk_left == 0:  # the CRLF after a chunk's data
                if len(buf) < 2:
                    return None
                if buf[:2] != b"\r\n":
                    self.fail(400, "Malformed chunked body.", self.target())
                    return None
                del buf[:2]
                self.chunk_left = -1
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > _MAX_CHUNK_LINE:
                    self.fail(400, "Malformed chunked body.", self.target())
                return None
            try:
                size = int(bytes(buf[:end]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.fail(400, "Malformed chunked body.", self.target())
                return None
            if size < 0 or len(out) + size > limit:
                self.fail(413, "Request body too large.", self.target())
                return None
            if size > 0:
                del buf[: end + 2]
                self.chunk_left = size
                continue
            # The last chunk: skip any trailer fields up to the blank line.
            trailer_end = buf.find(b"\r\n\r\n", end) if buf[end + 2 : end + 4] != b"\r\n" else end
            if trailer_end < 0:
                return None
            del buf[: trailer_end + 4]
            body = bytes(out)
            out.clear()
            return body
        return None

    def parse_head(self, raw: bytes) -> _Head | None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.fail(400, "Malformed request line.")
            return None
        method, target, version = parts
        method = method.upper()
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self.fail(400, "Malformed header line.")
                return None
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        limit = self.server.handler.body_limit(method, target)
        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in connection
        else:
            keep_alive = "close" not in connection
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.chunk_left = -1
            return method, target, headers, limit, keep_alive, True
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self.fail(400, "Invalid Content-Length.", target)
            return None
        if length > limit:
            self.fail(413, "Request body too large.", target)
            return None
        return method, target, headers, length, keep_alive, False

    def target(self) -> str | None:
        """The request target of the request being read, if its head was parsed."""
        return self.head[1] if self.head is not None else None

    def fail(self, status: int, message: str, target: str | None = None) -> None:
        reply = self.server.handler.refusal(status, message, target)
        reply.close = True
        self.dispatch(reply)

    # -- replying --------------------------------------------------------------------------

    def dispatch(self, reply: Reply) -> None:
        if reply.action == "hang":
            self.busy = True
            if reply.log is not None:
                self.server.handler.record(reply.log)
            loop = asyncio.get_running_loop()
            self.pending = loop.call_later(reply.hang_s, self.abort)
            return
        if reply.delay > 0:
            self.busy = True
            self.pending_reply = reply
            loop = asyncio.get_running_loop()
            self.pending = loop.call_later(reply.delay, self.fire)
            return
        self.execute(reply)

    def fire(self) -> None:
        self.pending = None
        reply = self.pending_reply
        self.pending_reply = None
        if reply is None or self.closed:
            return
        self.execute(reply)
        if self.closed:
            return
        self.busy = False
        self.process()

    def execute(self, reply: Reply) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if reply.log is not None:
            self.server.handler.record(reply.log)
        if reply.action == "reset":
            self.abort()
            return
        close = reply.close or reply.action == "truncate" or transport.is_closing()
        head = _encode_head(reply.status, reply.headers, len(reply.body), close, reply.content_type)
        if reply.action == "truncate":
            transport.write(head + reply.body[: len(reply.body) // 2])
            self.closed = True
            transport.close()
            return
        transport.write(head + reply.body)
        if close:
            self.closed = True
            transport.close()

    def abort(self) -> None:
        """Close abruptly (TCP RST where possible), dropping anything unsent."""
        self.pending = None
        transport = self.transport
        if transport is None:
            return
        self.closed = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
