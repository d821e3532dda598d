"""The model client against the simulator: degradation, retries, fatal errors, pacing."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from pipeline.client.chat import OpenAIClient
from pipeline.client.limits import Limiter
from pipeline.client.replies import redact
from pipeline.core.steps import Request
from pipeline.errors import AuthError, CallError, FatalCallError, UnavailableError
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import NO_BACKOFF

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["actions", "done"],
    "properties": {
        "actions": {"type": "array", "items": {"type": "string"}},
        "done": {"type": "boolean"},
    },
}
MESSAGES = ({"role": "user", "content": "Review this code: print(1)"},)


def make_client(sim: Simulator, **kw: Any) -> OpenAIClient:
    args: dict[str, Any] = dict(
        model="m",
        base_url=sim.url,
        api_key="sk-test-key",
        timeout=2.0,
        max_retries=3,
        limiter=Limiter(),
        delays=NO_BACKOFF,
        rng=random.Random(0),
    )
    args.update(kw)
    return OpenAIClient(**args)


def test_redact_masks_secret() -> None:
    """A secret inside an error message is masked."""
    assert redact("bad key sk-abcdef given", "sk-abcdef") == "bad key *** given"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("structured", "expected_level"), [("json_schema", 0), ("json_object", 1), ("none", 2)]
)
async def test_structured_output_degrades(structured: str, expected_level: int) -> None:
    """The client falls back json_schema -> json_object -> text and still gets JSON feedback."""
    with Simulator(SimConfig(structured=structured, fence_json=True)) as sim:
        client = make_client(sim)
        comp = await client.complete(
            Request(MESSAGES, temperature=0, max_tokens=200, schema=SCHEMA)
        )
        await client.aclose()
        assert client.level == expected_level
        assert "actions" in comp.text
        sent = sim.completed_bodies()[-1]
    if expected_level == 0:
        assert sent["response_format"]["type"] == "json_schema"
    elif expected_level == 1:
        assert sent["response_format"] == {"type": "json_object", "schema": SCHEMA}
    else:
        assert "response_format" not in sent
        assert "JSON Schema" in sent["messages"][-1]["content"]
    # The messages recorded for the trace are the ones really sent.
    assert comp.messages == sent["messages"]


@pytest.mark.anyio
async def test_retries_server_errors_then_succeeds() -> None:
    """5xx answers are retried within --max-retries and the attempts are counted."""
    with Simulator(SimConfig(p_500=0.5, faults_seed=3)) as sim:
        client = make_client(sim, max_retries=10)
        results = [
            await client.complete(
                Request(
                    (*MESSAGES, {"role": "user", "content": str(i)}), temperature=0, max_tokens=50
                )
            )
            for i in range(10)
        ]
        await client.aclose()
        statuses = [r.status for r in sim.requests]
    assert 500 in statuses
    assert sum(r.attempts for r in results) == len(statuses)
    assert client.retries == statuses.count(500)


@pytest.mark.anyio
async def test_gives_up_after_max_retries() -> None:
    """A failing call is tried 1 + --max-retries times, then raises a CallError with the status
    and the call's trace data, from the last attempt's own failure."""
    with Simulator(SimConfig(p_503=1.0)) as sim:
        client = make_client(sim, max_retries=2)
        client.outage.threshold = 1000  # this test looks at one call's budget, not outages
        with pytest.raises(CallError) as info:
            await client.complete(Request(MESSAGES, temperature=0, max_tokens=50))
        await client.aclose()
        assert len(sim.requests) == 3
    assert info.value.category == "http_503"
    assert info.value.attempts == 3 and [t.status for t in info.value.tries] == [503] * 3
    assert (info.value.messages, info.value.model) == (list(MESSAGES), "m")
    assert isinstance(info.value.__cause__, CallError) and info.value.__cause__.status == 503


@pytest.mark.anyio
async def test_endless_failures_become_an_outage_that_stops() -> None:
    """A server failing every call opens the circuit; past --max-outage the run must stop."""
    with Simulator(SimConfig(p_503=1.0)) as sim:
        client = make_client(sim, max_retries=2, max_outage=0.5)
        with pytest.raises(UnavailableError, match="resumable"):
            await client.complete(Request(MESSAGES, temperature=0, max_tokens=50))
        await client.aclose()
        # Beyond the retries that opened the circuit, only a few spaced probes were sent.
        assert 3 <= len(sim.requests) <= 8


@pytest.mark.anyio
async def test_wrong_key_is_fatal_and_redacted() -> None:
    """401 raises AuthError at once (no retries) and the key never appears in the message."""
    with Simulator(SimConfig(api_key="sk-right")) as sim:
        client = make_client(sim, api_key="sk-wrong-canary-123")
        with pytest.raises(AuthError) as info:
            await client.complete(Request(MESSAGES, temperature=0, max_tokens=50))
        await client.aclose()
        assert len(sim.requests) == 1
    assert "sk-wrong-canary-123" not in str(info.value)


@pytest.mark.anyio
async def test_unknown_model_is_fatal() -> None:
    """A 404 for the model stops the run rather than failing records one by one."""
    with Simulator(SimConfig(models=("real-model",))) as sim:
        client = make_client(sim, model="no-such-model")
        with pytest.raises(FatalCallError, match="404"):
            await client.complete(Request(MESSAGES, temperature=0, max_tokens=50))
        await client.aclose()


@pytest.mark.anyio
async def test_bad_request_fails_record_without_retry(sim: Simulator) -> None:
    """A 400 unrelated to the response format fails the call at once, with the server's reason."""
    client = make_client(sim)
    with pytest.raises(CallError) as info:
        await client.complete(Request(MESSAGES, temperature=0, max_tokens=0))
    await client.aclose()
    assert info.value.category == "http_400"
    assert "max_tokens" in str(info.value)
    assert len(sim.requests) == 1


@pytest.mark.anyio
async def test_hang_times_out_and_is_retried() -> None:
    """A server that never answers hits --timeout; the retry succeeds."""
    with Simulator(SimConfig(p_hang=0.5, hang_s=30, faults_seed=1)) as sim:
        client = make_client(sim, timeout=0.5, max_retries=6)
        outs = [
            await client.complete(
                Request(({"role": "user", "content": f"q{i}"},), temperature=0, max_tokens=20)
            )
            for i in range(4)
        ]
        await client.aclose()
        outcomes = [r.outcome for r in sim.requests]
    assert "hang" in outcomes
    assert all(o.text for o in outs)


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["p_reset", "p_truncate"])
async def test_broken_connections_are_retried(fault: str) -> None:
    """Connection resets and truncated bodies are retried, not crashes."""
    with Simulator(SimConfig(**{fault: 0.5}, faults_seed=2)) as sim:  # type: ignore[arg-type]
        client = make_client(sim, max_retries=8)
        outs = [
            await client.complete(
                Request(({"role": "user", "content": f"q{i}"},), temperature=0, max_tokens=20)
            )
            for i in range(6)
        ]
        await client.aclose()
        outcomes = {r.outcome for r in sim.requests}
    assert outcomes & {"reset", "truncated"}
    assert len(outs) == 6


@pytest.mark.anyio
async def test_refusal_fails_the_call() -> None:
    """A refusal is reported as such, not retried forever."""
    with Simulator(SimConfig(p_refusal=1.0)) as sim:
        client = make_client(sim)
        with pytest.raises(CallError) as info:
            await client.complete(Request(MESSAGES, temperature=0, max_tokens=50))
        await client.aclose()
    assert info.value.category == "refusal"


@pytest.mark.anyio
async def test_rate_limit_429_honours_retry_after_and_slows_pool() -> None:
    """A 429 is retried after the server's wait, and the limiter's factor drops."""
    with Simulator(SimConfig(rpm=60)) as sim:  # one request a second, bucket of one
        limiter = Limiter()
        client = make_client(sim, limiter=limiter, max_retries=5)
        for i in range(3):
            await client.complete(
                Request(({"role": "user", "content": f"q{i}"},), temperature=0, max_tokens=5)
            )
        await client.aclose()
        statuses = [r.status for r in sim.requests]
    assert statuses.count(200) == 3
    # The server's headers told the limiter its limit, so pacing avoided most refusals.
    assert statuses.count(429) <= 1


class _TerseServer:
    """A server that answers a bare 400 ("Bad Request") to any response_format."""

    def __init__(self) -> None:
        import http.server
        import threading

        import orjson

        seen: list[dict[str, Any]] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append(body)
                payload: dict[str, Any]
                if "response_format" in body:
                    status, payload = 400, {"error": {"message": "Bad Request"}}
                else:
                    answer = '{"actions": ["x"], "done": false}'
                    status, payload = (
                        200,
                        {
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": answer},
                                }
                            ],
                            "usage": {"prompt_tokens": 5, "completion_tokens": 5},
                        },
                    )
                data = orjson.dumps(payload)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.anyio
async def test_terse_400_to_response_format_degrades_per_call_then_pool() -> None:
    """A 400 naming nothing is retried one level down; after a few such calls the pool moves."""
    server = _TerseServer()
    try:
        client = OpenAIClient(
            model="m", base_url=server.url, api_key="k", timeout=5, max_retries=0, limiter=Limiter()
        )
        for i in range(4):
            comp = await client.complete(
                Request(
                    ({"role": "user", "content": f"q{i}"},),
                    temperature=0,
                    max_tokens=20,
                    schema=SCHEMA,
                )
            )
            assert "actions" in comp.text
        await client.aclose()
    finally:
        server.close()
    with_format = [b for b in server.seen if "response_format" in b]
    # Three calls each probed json_schema and json_object before text; the fourth went
    # straight to text.
    assert len(with_format) == 6
    assert client.level == 2


BOUNDED: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["actions", "done"],
    "properties": {
        "actions": {
            "type": "array",
            "maxItems": 3,
            "items": {"type": "string", "maxLength": 50, "minLength": 1},
        },
        "done": {"type": "boolean"},
    },
}


@pytest.mark.anyio
@pytest.mark.parametrize("structured", ["json_schema", "json_object"])
async def test_string_lengths_go_only_where_a_grammar_enforces_them(structured: str) -> None:
    """json_schema (OpenAI's strict mode) gets the schema without string lengths; a llama.cpp
    server (json_object) gets them all, and the answer keeps within them."""
    with Simulator(SimConfig(structured=structured)) as sim:
        client = make_client(sim)
        comp = await client.complete(
            Request(MESSAGES, temperature=0, max_tokens=200, schema=BOUNDED)
        )
        await client.aclose()
        sent = sim.completed_bodies()[-1]["response_format"]
    if structured == "json_schema":
        items = sent["json_schema"]["schema"]["properties"]["actions"]
        assert items == {"type": "array", "maxItems": 3, "items": {"type": "string"}}
        assert sent["json_schema"]["strict"] is True
    else:
        assert sent["schema"] == BOUNDED
        actions = orjson.loads(comp.text)["actions"]
        assert 1 <= len(actions) <= 3 and all(1 <= len(a) <= 50 for a in actions)


@pytest.mark.anyio
@pytest.mark.parametrize("penalty", [None, 0.5])
async def test_frequency_penalty_is_sent_only_when_given(penalty: float | None) -> None:
    """A frequency penalty reaches the request body when asked for, and is absent otherwise."""
    with Simulator(SimConfig()) as sim:
        client = make_client(sim)
        await client.complete(
            Request(MESSAGES, temperature=0, max_tokens=500, frequency_penalty=penalty)
        )
        await client.aclose()
        body = sim.completed_bodies()[-1]
    assert body.get("frequency_penalty") == penalty
    assert ("frequency_penalty" in body) is (penalty is not None)
