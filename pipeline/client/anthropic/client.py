"""The Anthropic dialect: one ``POST /v1/messages``, in raw HTTP, behind the run's policies.

``AnthropicClient`` is a ``calls.ChatClient``: pacing, budget, the retry sequence, the
outage breaker and probes are the base class's. This module says how Anthropic's Messages
API is asked (``messages.messages_body``: the system prompt, cache breakpoints, the format
ladder's level) and what its answers and errors mean:

- 429 ``rate_limit_error``: the pacer slows down and the call waits ``retry-after``;
  529 ``overloaded_error`` and other 5xx: endpoint faults, retried, counted by the outage
  breaker, exactly as the OpenAI dialect's;
- 400 "prompt is too long" (or prompt and ``max_tokens`` past the context limit): the
  call fails at once (``formats``: no other format is tried);
- 401 and 403: the key is refused (exit 3); a spent credit balance (400 naming it, or
  402): the quota stop (exit 5, resumable);
- ``stop_reason`` ``max_tokens``: a cut-off answer, which the loop repairs.

The ``anthropic-ratelimit-*`` headers of every answer feed the pacer, input and output
tokens apart; the input limit counts a prompt less what the cache served.

It speaks HTTP directly, over the same transport as the OpenAI client (aiohttp, when
installed), sending the key as Anthropic documents it (``x-api-key``) with the
``anthropic-version`` header; Anthropic's SDK is not needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import orjson

from ...core.steps import Request
from ...errors import CallError
from ..calls import ChatClient, Failed, HttpReply, Status
from ..models import ANTHROPIC_URL
from ..outage import PROBE_MAX_TOKENS, PROBE_MESSAGES
from ..reach import PREFLIGHT_S, os_error, unreachable, unreachable_error
from ..replicas import Replica
from ..replies import http_client, redact
from .messages import API_VERSION, error_of, messages_body, read_message, sent_messages

__all__ = ["AnthropicClient", "MessagesConnection", "api_root", "credit_spent", "headers_for"]

# A spent credit balance, in Anthropic's words (a 400), or its billing error (402).
_CREDIT = "credit balance"
_BILLING_STATUS = 402


def api_root(url: str | None) -> str:
    """The root of Anthropic's API a base URL names (``/v1`` and a trailing slash dropped:
    the paths carry ``/v1``)."""
    root = (url or ANTHROPIC_URL).rstrip("/")
    return root.removesuffix("/v1")


def headers_for(api_key: str | None) -> dict[str, str]:
    """The headers every request carries: the key as Anthropic documents it, the version."""
    return {
        "x-api-key": api_key or "no-key",
        "anthropic-version": API_VERSION,
        "content-type": "application/json",
    }


def credit_spent(status: int, message: str) -> bool:
    """Whether an error answer says the account's credit is spent (no wait helps)."""
    return status == _BILLING_STATUS or (status == 400 and _CREDIT in message.lower())


@dataclass(slots=True)
class MessagesConnection:
    """One endpoint: its API root, its HTTP client and the headers every request carries."""

    root: str
    http: httpx2.AsyncClient
    headers: dict[str, str] = field(repr=False)


class AnthropicClient(ChatClient[MessagesConnection]):
    """Anthropic's Messages API (or several replicas of it) behind the run's policies.

    ``cache_ttl`` is how long the prefixes its breakpoints mark stay cached: ``5m`` or
    ``1h`` (writes cost twice the input price instead of 1.25 times), None for no
    breakpoints at all.
    """

    def __init__(self, *, cache_ttl: str | None = "5m", **options: Any) -> None:
        self.cache_ttl = cache_ttl
        super().__init__(**options)

    def _connect(
        self, url: str | None, api_key: str | None, connections: int
    ) -> MessagesConnection:
        limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
        return MessagesConnection(api_root(url), http_client(limits), headers_for(api_key))

    async def _close(self, conn: MessagesConnection) -> None:
        await conn.http.aclose()

    def _url(self, conn: MessagesConnection) -> str:
        return conn.root

    async def preflight(self) -> None:
        """Raise UnreachableError for an endpoint that cannot be reached: each is asked for
        its model list (free); any HTTP answer, an error too, shows it is there."""
        wait = min(self.timeout or PREFLIGHT_S, PREFLIGHT_S)
        for replica in self.replicas.all:
            conn = replica.conn
            try:
                with anyio.fail_after(wait):
                    await conn.http.get(f"{conn.root}/v1/models", headers=conn.headers)
            except httpx2.HTTPError as err:
                why = unreachable(err)
                if why is not None:
                    raise unreachable_error(conn.root, why) from err
            except TimeoutError:
                pass  # a silent host: no verdict, left to the calls

    def _body(
        self, request: Request, level: int, replica: Replica[MessagesConnection]
    ) -> tuple[list[dict[str, str]], bytes]:
        sent = sent_messages(request.messages, request.schema, level)
        body = messages_body(
            self._request_model,
            sent,
            temperature=request.temperature,
            max_tokens=request.max_tokens,
            schema=request.schema,
            level=level,
            ttl=self.cache_ttl,
        )
        return sent, orjson.dumps(body)

    def _probe_body(self) -> tuple[list[dict[str, str]], bytes]:
        sent = [dict(m) for m in PROBE_MESSAGES]
        body = messages_body(
            self._request_model,
            sent,
            temperature=0.0,
            max_tokens=PROBE_MAX_TOKENS,
            schema=None,
            level=0,
            ttl=None,
        )
        return sent, orjson.dumps(body)

    def _read_reply(self, data: Any) -> dict[str, Any]:
        return read_message(data, self.cache_ttl)

    def _counted(self, usage: Mapping[str, int]) -> int:
        """Anthropic's input limit counts a prompt less what its cache served."""
        return usage["prompt_tokens"] - usage["cached_tokens"]

    def _quota_spent(self, status: int, code: str | None, message: str, wait: float | None) -> bool:
        return credit_spent(status, message)

    async def _send(self, replica: Replica[MessagesConnection], payload: bytes) -> HttpReply:
        """POST the request; translate every failure into Failed."""
        conn = replica.conn
        try:
            raw = await conn.http.post(
                f"{conn.root}/v1/messages", content=payload, headers=conn.headers
            )
        except httpx2.TimeoutException as err:
            why = unreachable(err)
            if why is not None:
                failure = CallError("connection", f"cannot reach {conn.root}: {why}")
                raise Failed(failure, unreachable=why) from err
            failure = CallError("timeout", f"no answer within {self.timeout:g} s")
            raise Failed(failure) from err
        except httpx2.HTTPError as err:
            why = unreachable(err)
            if why is not None:
                failure = CallError("connection", f"cannot reach {conn.root}: {why}")
                raise Failed(failure, unreachable=why) from err
            broke = os_error(err) or err.__cause__ or err
            message = redact(f"connection failed: {type(err).__name__}: {broke}", self._secret)
            raise Failed(CallError("connection", message)) from err
        if raw.status_code != 200:
            raise self._status(_status_of(raw))
        return HttpReply(raw.headers, raw.content)


def _status_of(raw: httpx2.Response) -> Status:
    """An error answer, read: its type (as the code) and message from Anthropic's envelope."""
    try:
        body: Any = orjson.loads(raw.content)
    except orjson.JSONDecodeError:
        body = None
    kind, message = error_of(body)
    text = message or raw.reason_phrase or f"HTTP {raw.status_code}"
    return Status(raw.status_code, raw.headers, text, kind)
