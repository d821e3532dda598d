"""Helpers for the tests of the simulator's Anthropic API: clients, raw HTTP, long texts."""

from __future__ import annotations

import http.client
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from pipeline.testing.simulator import Simulator

anthropic = pytest.importorskip("anthropic", reason="the anthropic extra is not installed")

KEY = "sk-ant-sim-test"
MODEL = "claude-sonnet-4-6"  # $3 / $15 per million tokens, prefixes of 1,024 tokens cached
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def client(sim: Simulator, key: str = KEY) -> Any:
    """Anthropic's own client of ``sim``, never retrying."""
    return anthropic.Anthropic(base_url=sim.anthropic_url, api_key=key, max_retries=0, timeout=10)


def raw(
    sim: Simulator,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One plain HTTP request: status, headers (lower-case names), the decoded JSON body."""
    url = urlsplit(sim.anthropic_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    payload = data if data is not None else orjson.dumps(body) if body is not None else None
    sent = {"content-type": "application/json", **(HEADERS if headers is None else headers)}
    try:
        conn.request(method, path, body=payload, headers=sent)
        response = conn.getresponse()
        content = response.read()
        got = {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()
    try:
        decoded: Any = orjson.loads(content)
    except orjson.JSONDecodeError:
        decoded = content
    return response.status, got, decoded


def text(tokens: int, tag: str = "") -> str:
    """A text of exactly ``tokens`` simulated tokens (four characters each)."""
    unit = f"{tag} context " if tag else "context "
    return (unit * (tokens * 4 // len(unit) + 1))[: tokens * 4]


def params(content: Any = "hello", **extra: Any) -> dict[str, Any]:
    """A minimal Messages request on ``MODEL``."""
    return {
        "model": MODEL,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def cached_text(value: str, ttl: str | None = None) -> dict[str, Any]:
    """A text block carrying a cache breakpoint."""
    marker: dict[str, str] = {"type": "ephemeral"}
    if ttl is not None:
        marker["ttl"] = ttl
    return {"type": "text", "text": value, "cache_control": marker}
