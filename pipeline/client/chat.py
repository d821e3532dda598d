"""The OpenAI dialect: one chat completion through the openai SDK's transport (its retries off).

``OpenAIClient`` is a ``calls.ChatClient``: the loop around a call (pacing, budget, the
retry sequence, the outage breaker, probes) is the base class's; this module says how an
OpenAI-compatible endpoint is asked and what it answers. The body is ``/chat/completions``'
(the structured-output level's ``response_format``, the record's ``prompt_cache_key``
where the endpoint takes it, ``service_tier``); a 400 naming ``prompt_cache_key`` drops
the key for that endpoint and the call goes again without it (``caching``); the flex
tier's refusals are waited out by the loop (``flex``); an answer is read by
``replies.read_reply``.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import orjson

from ..core.steps import Request
from ..errors import CallError
from .caching import CACHE_KEY_PARAM, cache_key_refused, cache_options
from .calls import ChatClient, Failed, HttpReply, Status
from .flex import tier_options
from .outage import PROBE_MAX_TOKENS, PROBE_MESSAGES
from .reach import PREFLIGHT_S, base_url, os_error, preflight, unreachable
from .replicas import Replica
from .replies import error_message, http_client, read_reply, redact
from .retry import error_fields

__all__ = ["OpenAIClient"]


class OpenAIClient(ChatClient[openai.AsyncOpenAI]):
    """An OpenAI-compatible chat endpoint (or several replicas) behind the run's policies."""

    def _connect(
        self, url: str | None, api_key: str | None, connections: int
    ) -> openai.AsyncOpenAI:
        limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
        return openai.AsyncOpenAI(
            api_key=api_key or "no-key",
            base_url=url,
            max_retries=0,  # the one retry layer is attempts.Attempts
            timeout=self.timeout,
            http_client=http_client(limits),
        )

    async def _close(self, conn: openai.AsyncOpenAI) -> None:
        await conn.close()

    def _url(self, conn: openai.AsyncOpenAI) -> str:
        return base_url(conn)

    async def preflight(self) -> None:
        """Raise UnreachableError for an endpoint that cannot be reached (``reach.preflight``)."""
        wait = min(self.timeout or PREFLIGHT_S, PREFLIGHT_S)
        await preflight((e.conn for e in self.replicas.all), wait)

    def _body(
        self, request: Request, level: int, replica: Replica[openai.AsyncOpenAI]
    ) -> tuple[list[dict[str, str]], bytes]:
        """The chat completion's body: sampling, the format's fields, the cache key."""
        sent, extra = self.formats.request(request.messages, request.schema, level)
        body: dict[str, Any] = {
            "model": self._request_model,
            "messages": sent,
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            **tier_options(self.service_tier),
        }
        if request.frequency_penalty is not None:
            body["frequency_penalty"] = request.frequency_penalty
        body.update(cache_options(request.cache_key, replica.takes_cache_key))
        body.update(extra)
        return sent, orjson.dumps(body)

    def _probe_body(self) -> tuple[list[dict[str, str]], bytes]:
        sent = [dict(m) for m in PROBE_MESSAGES]
        body = {
            "model": self._request_model,
            "messages": sent,
            "temperature": 0,
            "max_tokens": PROBE_MAX_TOKENS,
        }
        return sent, orjson.dumps(body)

    def _read_reply(self, data: Any) -> dict[str, Any]:
        return read_reply(data)

    def _refused(
        self, replica: Replica[openai.AsyncOpenAI], payload: bytes, failed: Failed
    ) -> bool:
        """A 400 refusing ``prompt_cache_key`` (when this attempt sent it: another call may
        have dropped it meanwhile): dropped for this endpoint."""
        failure = failed.failure
        if failure.status != 400:
            return False
        sent_key = CACHE_KEY_PARAM in orjson.loads(payload)  # (a refusal without it fails)
        if sent_key and cache_key_refused(failure.status, str(failure), failed.param):
            replica.takes_cache_key = False  # unknown to this server: go again without
            return True
        return False

    async def _send(self, replica: Replica[openai.AsyncOpenAI], payload: bytes) -> HttpReply:
        """POST the request; translate every failure into Failed."""
        try:
            # A plain POST of bytes we encode: the SDK's typed resource method transforms
            # every message dict and json-encodes with the standard library, which costs
            # more CPU per call than the rest of the pipeline. Auth, base URL and the
            # mapping of error statuses to exceptions stay the SDK's.
            raw = await replica.conn.post(
                "/chat/completions",
                cast_to=httpx2.Response,
                content=payload,
                options={"headers": {"Content-Type": "application/json"}},
            )
            await raw.aread()
            return HttpReply(raw.headers, raw.content)
        except openai.APIStatusError as err:
            code, param = error_fields(err.body)
            raise self._status(
                Status(err.status_code, err.response.headers, error_message(err), code, param)
            ) from err
        except openai.APIConnectionError as err:  # timeouts too: a refused connect may be one
            why = unreachable(err)
            if why is not None:
                failure = CallError("connection", f"cannot reach {base_url(replica.conn)}: {why}")
                raise Failed(failure, unreachable=why) from err
            broke = os_error(err)
            if broke is None and isinstance(err, openai.APITimeoutError):
                failure = CallError("timeout", f"no answer within {self.timeout:g} s")
                raise Failed(failure) from err
            message = redact(f"connection failed: {broke or err.__cause__ or err}", self._secret)
            raise Failed(CallError("connection", message)) from err
        except httpx2.HTTPError as err:  # a body cut short while reading it
            message = f"response broken off: {type(err).__name__}"
            raise Failed(CallError("connection", message)) from err
