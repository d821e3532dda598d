"""Unreachable is not an outage: before any success a refused connection, an unknown host
or a failed TLS handshake stops the run at once (exit 2) with the URL and the OS error."""

from __future__ import annotations

import contextlib
import http.server
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from pipeline import Settings, run
from pipeline.client.chat import OpenAIClient
from pipeline.client.delays import NO_DELAYS
from pipeline.client.limits import Limiter
from pipeline.client.reach import os_error, preflight, unreachable
from pipeline.client.replies import http_client
from pipeline.core.steps import Request
from pipeline.errors import CallError, UnavailableError, UnreachableError
from pipeline.testing.simulator import SimConfig, Simulator
from tests.cli.test_cli import refine
from tests.helpers import NO_BACKOFF, read_jsonl, tasks, write_jsonl

MESSAGES = ({"role": "user", "content": "Say hello"},)
DNS_FAILS = "http://nonexistent.invalid/v1"  # .invalid never resolves (RFC 6761)


def closed_port_url() -> str:
    """A loopback URL where nothing listens: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def plain_http() -> Iterator[int]:
    """A plain HTTP server (it answers a TLS hello with an HTTP error): its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def client_for(url: str, **kw: object) -> OpenAIClient:
    args: dict[str, object] = dict(
        model="m", base_url=url, api_key="k", timeout=10, max_retries=3,
        limiter=Limiter(), rng=random.Random(0), delays=NO_BACKOFF,
    )  # fmt: skip
    args.update(kw)
    return OpenAIClient(**args)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_the_sdks_wrapped_errors_are_told_apart(transport: str) -> None:
    """Refused, unresolvable and TLS failures are found under the SDK's wrapping (which the
    aiohttp transport even calls a timeout), with either transport."""
    with plain_http() as port:
        urls = {
            "connection refused": closed_port_url(),
            "does not resolve": DNS_FAILS,
            "TLS handshake failed": f"https://127.0.0.1:{port}/v1",
        }
        for expected, url in urls.items():
            made = http_client(httpx2.Limits()) if transport == "aiohttp" else None
            conn = openai.AsyncOpenAI(
                api_key="k", base_url=url, max_retries=0, timeout=10,
                http_client=made or openai.DefaultAsyncHttpx2Client(),
            )  # fmt: skip
            with pytest.raises(openai.APIConnectionError) as caught:
                await conn.get("/models", cast_to=httpx2.Response)
            await conn.close()
            why = unreachable(caught.value)
            assert why is not None and expected in why


def test_a_timeout_is_not_unreachable() -> None:
    """A plain timeout (no OS error under it) says nothing of reachability."""
    timeout = openai.APITimeoutError(request=httpx2.Request("GET", "http://x"))
    assert unreachable(timeout) is None and os_error(timeout) is None


@pytest.mark.anyio
@pytest.mark.parametrize("url", [closed_port_url(), DNS_FAILS])
async def test_before_any_success_the_first_failure_stops(url: str) -> None:
    """A call to an endpoint that never answered raises UnreachableError at once, naming
    the URL and the OS error; no retry is spent."""
    client = client_for(url)
    started = time.monotonic()
    with pytest.raises(UnreachableError) as caught:
        await client.complete(Request(MESSAGES, temperature=0, max_tokens=5))
    await client.aclose()
    assert time.monotonic() - started < 10
    assert url.removesuffix("/v1") in str(caught.value) and client.retries == 0


@pytest.mark.anyio
async def test_after_a_success_a_refused_connection_is_an_endpoint_fault() -> None:
    """Once a call succeeded, a refused connection fails a call like any broken connection,
    and an endpoint that keeps refusing is an outage (waited out up to --max-outage, then
    exit 5), not a wrong URL."""
    sim = Simulator(SimConfig()).start()
    alone = client_for(sim.url, max_retries=0)
    waits = client_for(sim.url, max_retries=3, max_outage=0.2, delays=NO_DELAYS)  # no backoff
    for client in (alone, waits):
        await client.complete(Request(MESSAGES, temperature=0, max_tokens=5))
    sim.stop()
    with pytest.raises(CallError) as failed:
        await alone.complete(Request(MESSAGES, temperature=0, max_tokens=5))
    with pytest.raises(UnavailableError):
        await waits.complete(Request(MESSAGES, temperature=0, max_tokens=5))
    for client in (alone, waits):
        await client.aclose()
    assert not isinstance(failed.value, UnreachableError)
    assert failed.value.category == "connection"  # (the pooled connection was reset)


@pytest.mark.anyio
async def test_preflight_finds_what_answers_and_what_cannot() -> None:
    """The pre-flight passes an endpoint that answers anything (even 401) and raises for a
    refused one."""
    with Simulator(SimConfig(api_key="the-right-key")) as sim:
        wrong_key = openai.AsyncOpenAI(api_key="wrong", base_url=sim.url, max_retries=0)
        await preflight([wrong_key])
        await wrong_key.close()
    nobody = openai.AsyncOpenAI(api_key="k", base_url=closed_port_url(), max_retries=0)
    with pytest.raises(UnreachableError, match="connection refused"):
        await preflight([nobody])
    await nobody.close()


@pytest.mark.parametrize("url", [closed_port_url(), DNS_FAILS])
def test_refine_run_exits_2_with_the_url_and_the_cause(tmp_path: Path, url: str) -> None:
    """`refine run` against a URL where nothing answers exits 2 within seconds, naming the
    URL and the cause, not 'resumable'; the records stay pending."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    started = time.monotonic()
    out = refine("run", "code-improve", str(inp), "--out", str(tmp_path / "run"),
                 "--base-url", url, "--model", "m", "--quiet")  # fmt: skip
    assert time.monotonic() - started < 60
    assert out.returncode == 2, out.stderr
    assert f"cannot reach {url}" in out.stderr and "resumable" not in out.stderr
    assert read_jsonl(tmp_path / "run" / "outputs.jsonl") == []


def test_an_unreachable_critic_stops_the_run_before_any_call(tmp_path: Path) -> None:
    """The critic's endpoint is checked with the generator's before the first call: no
    generate call is paid for a run whose critic cannot be reached."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    with Simulator(SimConfig()) as sim:
        settings = Settings(
            model="sim-model", base_url=sim.url, feedback_model="critic",
            feedback_base_url=closed_port_url(), max_iters=1,
        )  # fmt: skip
        summary = run(
            "code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False
        )
        assert sim.requests == []
    assert summary.exit_code == 2
    assert summary.message is not None and "connection refused" in summary.message
