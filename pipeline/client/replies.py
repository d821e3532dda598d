"""What an endpoint replied: the chat completion's text and usage, or its error message.

Shared by the real-time client (``chat``) and the Batch API driver, whose output lines
carry the same objects.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai

from ..errors import CallError

__all__ = ["error_message", "http_client", "read_reply", "redact"]


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` masked."""
    if secret and len(secret) >= 4:
        return text.replace(secret, "***")
    return text


def read_reply(data: Any) -> dict[str, Any]:
    """The text, finish reason and usage of a chat completion object; CallError if it is none.

    Shared with the Batch API driver, whose output lines carry the same object.
    """
    try:
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
    except (KeyError, IndexError, TypeError, AttributeError) as err:
        raise CallError("bad_response", "malformed response body (no choices)") from err
    if not content:
        refusal = message.get("refusal")
        if refusal:
            raise CallError("refusal", f"model refused: {refusal}")
        raise CallError("empty", "empty answer")
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    tier = data.get("service_tier")
    return {
        "service_tier": tier if isinstance(tier, str) else None,
        "text": content,
        "finish_reason": choice.get("finish_reason"),
        "usage": {
            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
            "cached_tokens": int(details.get("cached_tokens") or 0),
        },
    }


def http_client(limits: httpx2.Limits) -> httpx2.AsyncClient:
    """The SDK's aiohttp transport when installed, else its default one.

    Measured here (scripts/bench_throughput.py, zero-latency simulator) the aiohttp
    transport costs about half the CPU per call of the default httpx transport,
    which decides throughput once latency is hidden by concurrency.
    """
    try:
        return openai.DefaultAioHttpClient(limits=limits)
    except RuntimeError:  # openai installed without its aiohttp extra
        return openai.DefaultAsyncHttpx2Client(limits=limits)


def error_message(err: openai.APIStatusError) -> str:
    """The message of an error answer: the body's ``error.message`` when it has one."""
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return err.message
