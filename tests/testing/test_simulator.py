"""Tests of the OpenAI-compatible simulator, driven by the real ``openai`` client over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema

from pipeline.testing.simulator import SimConfig, Simulator, main
from pipeline.testing.simulator.cli import build_parser, notice

ROOT = Path(__file__).resolve().parents[2]

FEEDBACK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "done": {"type": "boolean"},
        "score": {"type": "number", "minimum": 1, "maximum": 5},
        "issues": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "summary": {"type": "string", "minLength": 20},
        "severity": {"type": "string", "enum": ["low", "medium", "high"]},
        "note": {"type": ["string", "null"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 3},
        "extra": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]},
        "points": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "maxItems": 2},
    },
    "required": [
        "done",
        "score",
        "issues",
        "summary",
        "severity",
        "note",
        "count",
        "extra",
        "points",
    ],
    "additionalProperties": False,
    "$defs": {
        "Point": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "label": {"type": "string"}},
            "required": ["x", "label"],
            "additionalProperties": False,
        }
    },
}


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> None:
    """Assert that ``value`` is an instance of ``schema`` (the subset the simulator supports)."""
    root = schema if root is None else root
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        validate(value, target, root)
        return
    if "anyOf" in schema:
        errors = []
        for branch in schema["anyOf"]:
            try:
                validate(value, branch, root)
                return
            except AssertionError as exc:
                errors.append(exc)
        raise AssertionError(f"{value!r} matches no anyOf branch: {errors}")
    if "enum" in schema:
        assert value in schema["enum"], (value, schema["enum"])
    types = schema.get("type")
    if types is None:
        return
    types = types if isinstance(types, list) else [types]
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    matching = [k for k in types if checks[k](value)]
    assert matching, f"{value!r} is not of type {types}"
    type_ = matching[0]
    if type_ == "object":
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            assert key in value, f"missing required {key!r} in {value!r}"
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(props), f"extra keys {set(value) - set(props)}"
        for key, sub in props.items():
            if key in value:
                validate(value[key], sub, root)
    elif type_ == "array":
        assert len(value) >= schema.get("minItems", 0)
        assert len(value) <= schema.get("maxItems", len(value))
        for item in value:
            validate(item, schema.get("items", {}), root)
    elif type_ == "string":
        assert len(value) >= schema.get("minLength", 0)
    elif type_ in ("number", "integer"):
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value)


BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def schema_format(schema: dict[str, Any] = FEEDBACK_SCHEMA) -> ResponseFormatJSONSchema:
    return {"type": "json_schema", "json_schema": {"name": "f", "schema": schema, "strict": True}}


def msgs(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(SimConfig()) as server:
        yield server


def client(server: Simulator, **kw: Any) -> openai.OpenAI:
    kw.setdefault("api_key", "sk-test")
    kw.setdefault("timeout", 5.0)
    return openai.OpenAI(base_url=server.url, max_retries=0, **kw)


def raw_exchange(port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, read until the server closes; return everything received."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def http_request(
    method: str, path: str, body: bytes = b"", headers: str = "", close: bool = True
) -> bytes:
    conn = "Connection: close\r\n" if close else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}{conn}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def test_structured_output_validates(sim: Simulator) -> None:
    """json_schema response_format returns JSON valid against the schema, with usage."""
    with client(sim) as c:
        for i in range(20):
            r = c.chat.completions.create(
                model="m", messages=msgs(f"critique {i}"), response_format=schema_format()
            )
            content = r.choices[0].message.content
            assert content is not None and r.choices[0].finish_reason == "stop"
            validate(json.loads(content), FEEDBACK_SCHEMA)
            assert r.usage is not None and r.usage.prompt_tokens >= 1
            assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
            assert r.object == "chat.completion" and r.model == "m" and r.system_fingerprint


def test_answers_are_deterministic(sim: Simulator) -> None:
    """The same request always gets the same answer; different messages differ."""
    with client(sim) as c:

        def ask(text: str, **kw: Any) -> str | None:
            r: ChatCompletion = c.chat.completions.create(model="m", messages=msgs(text), **kw)
            return r.choices[0].message.content

        assert ask("draft an essay") == ask("draft an essay")
        assert ask("draft an essay") != ask("refine this essay")
        assert ask("x", response_format=schema_format()) == ask(
            "x", response_format=schema_format()
        )
        prose = ask("Tell me about rivers")
        assert prose is not None and prose.count("\n") >= 3 and "[sim " in prose
        essay = ask("draft an essay")
    with Simulator(SimConfig(seed=1)) as other, client(other) as c2:
        r = c2.chat.completions.create(model="m", messages=msgs("draft an essay"))
        assert r.choices[0].message.content != essay


def test_p_done_controls_done_flag() -> None:
    """A boolean `done` property follows p_done (all true at 1.0, all false at 0.0)."""
    for p, expected in ((1.0, True), (0.0, False)):
        with Simulator(SimConfig(p_done=p)) as server, client(server) as c:
            for i in range(5):
                r = c.chat.completions.create(
                    model="m", messages=msgs(f"q{i}"), response_format=schema_format()
                )
                assert json.loads(r.choices[0].message.content or "")["done"] is expected


def test_json_object_mode_rejects_json_schema_but_honours_schema() -> None:
    """llama.cpp-style server: json_schema gets 400 on response_format; json_object+schema works."""
    with Simulator(SimConfig(structured="json_object")) as server, client(server) as c:
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(
                model="m", messages=msgs("q"), response_format=schema_format()
            )
        assert err.value.status_code == 400 and err.value.param == "response_format"
        r = c.chat.completions.create(
            model="m",
            messages=msgs("q"),
            response_format=cast(Any, {"type": "json_object", "schema": FEEDBACK_SCHEMA}),
        )
        validate(json.loads(r.choices[0].message.content or ""), FEEDBACK_SCHEMA)
        r = c.chat.completions.create(
            model="m", messages=msgs("q"), response_format={"type": "json_object"}
        )
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
        assert [x.outcome for x in server.requests] == ["bad_request", "ok", "ok"]


def test_none_mode_fenced_schema_in_prompt() -> None:
    """structured=none rejects response_format and answers a prompt schema with fenced JSON."""
    config = SimConfig(structured="none", fence_json=True)
    with Simulator(config) as server, client(server) as c:
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(
                model="m", messages=msgs("q"), response_format={"type": "json_object"}
            )
        assert err.value.param == "response_format"
        prompt = f"Give feedback as JSON:\n```json\n{json.dumps(FEEDBACK_SCHEMA)}\n```\n"
        r = c.chat.completions.create(model="m", messages=msgs(prompt))
        content = r.choices[0].message.content or ""
        assert content.startswith("```json\n") and content.endswith("\n```")
        validate(json.loads(content[len("```json\n") : -len("\n```")]), FEEDBACK_SCHEMA)
    with Simulator(SimConfig(structured="none")) as server, client(server) as c:
        r = c.chat.completions.create(model="m", messages=msgs(prompt))
        validate(json.loads(r.choices[0].message.content or ""), FEEDBACK_SCHEMA)


def test_wrong_api_key_gets_401_and_headers_are_logged() -> None:
    """A wrong bearer token gets 401 invalid_api_key; the log keeps the request headers."""
    with Simulator(SimConfig(api_key="sk-right")) as server:
        with (
            client(server, api_key="sk-wrong-key-123") as c,
            pytest.raises(openai.AuthenticationError) as err,
        ):
            c.chat.completions.create(model="m", messages=msgs("q"))
        assert err.value.code == "invalid_api_key"
        assert "sk-wrong-key-123" not in err.value.message
        with client(server, api_key="sk-right") as c:
            c.chat.completions.create(model="m", messages=msgs("q"))
        logs = server.requests
        assert [(x.status, x.outcome, x.completed) for x in logs] == [
            (401, "auth", False),
            (200, "ok", True),
        ]
        assert logs[0].headers["authorization"] == "Bearer sk-wrong-key-123"
        assert logs[1].headers["authorization"] == "Bearer sk-right"


def test_unknown_model_404_and_models_endpoint() -> None:
    """An unconfigured model gets 404 model_not_found; GET /v1/models lists the models."""
    with Simulator(SimConfig(models=("a", "b"))) as server, client(server) as c:
        with pytest.raises(openai.NotFoundError) as err:
            c.chat.completions.create(model="zzz", messages=msgs("q"))
        assert err.value.code == "model_not_found"
        assert [m.id for m in c.models.list()] == ["a", "b"]
        assert c.chat.completions.create(model="b", messages=msgs("q")).model == "b"
    with Simulator() as server, client(server) as c:
        assert [m.id for m in c.models.list()] == ["sim-model"]


def test_rpm_limit_429_with_headers_then_paced_requests_pass() -> None:
    """Bursting past rpm/60 gets 429 with OpenAI headers; pacing under the rate never does."""
    with Simulator(SimConfig(rpm=1800)) as server, client(server) as c:  # 30 per second
        admitted = 0
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as err:
            while admitted < 60:
                raw = c.chat.completions.with_raw_response.create(model="m", messages=msgs("q"))
                admitted += 1
                assert raw.headers["x-ratelimit-limit-requests"] == "1800"
        refill = 30 * (time.monotonic() - started)  # what accrued while the burst ran
        assert 30 <= admitted <= 31 + refill  # a burst of rpm/60 plus the refill, no more
        assert int(raw.headers["x-ratelimit-remaining-requests"]) <= 1
        headers = err.value.response.headers
        assert 0 < int(headers["retry-after-ms"]) <= 40
        assert headers["retry-after"] == "1"
        for name in ("limit", "remaining", "reset"):
            assert f"x-ratelimit-{name}-requests" in headers
        assert err.value.code == "rate_limit_exceeded" and err.value.type == "requests"
        assert "Please try again in" in err.value.message
        time.sleep(float(headers["retry-after-ms"]) / 1000)
        for _ in range(15):  # 25/s < 30/s
            time.sleep(0.04)
            c.chat.completions.create(model="m", messages=msgs("q"))
        outcomes = [x.outcome for x in server.requests]
        assert outcomes.count("rate_limited") == 1 and outcomes.count("ok") == admitted + 15


def test_tpm_limit_429_tokens() -> None:
    """A token budget of tpm/60 per second refuses the next request with type "tokens"."""
    with Simulator(SimConfig(tpm=6000)) as server, client(server) as c:  # 100 tokens/s
        raw = c.chat.completions.with_raw_response.create(
            model="m", messages=msgs("q"), max_tokens=150
        )
        assert raw.headers["x-ratelimit-limit-tokens"] == "6000"
        with pytest.raises(openai.RateLimitError) as err:
            c.chat.completions.create(model="m", messages=msgs("q"), max_tokens=50)
        assert err.value.type == "tokens"
        assert float(err.value.response.headers["retry-after-ms"]) > 400
        assert [x.outcome for x in server.requests] == ["ok", "rate_limited"]


def test_max_tokens_cuts_answer_with_length() -> None:
    """A small max_tokens cuts the answer and reports finish_reason "length"."""
    with Simulator() as server, client(server) as c:
        r = c.chat.completions.create(model="m", messages=msgs("q"), max_tokens=3)
        assert r.choices[0].finish_reason == "length"
        assert len(r.choices[0].message.content or "") <= 12
        assert r.usage is not None and r.usage.completion_tokens <= 3
        assert server.requests[-1].outcome == "length" and not server.requests[-1].completed
    with Simulator(SimConfig(p_length=1.0)) as server, client(server) as c:
        r = c.chat.completions.create(
            model="m", messages=msgs("q"), response_format=schema_format()
        )
        assert r.choices[0].finish_reason == "length"
        with pytest.raises(json.JSONDecodeError):
            json.loads(r.choices[0].message.content or "")


def test_refusal() -> None:
    """p_refusal=1 gives content null and a refusal message."""
    with Simulator(SimConfig(p_refusal=1.0)) as server, client(server) as c:
        r = c.chat.completions.create(model="m", messages=msgs("q"))
        assert r.choices[0].message.content is None and r.choices[0].message.refusal
        assert server.requests[0].outcome == "refusal" and server.completed_bodies() == []


@pytest.mark.parametrize(
    ("config", "outcome"),
    [(SimConfig(p_reset=1.0), "reset"), (SimConfig(p_truncate=1.0), "truncated")],
)
def test_reset_and_truncate_are_connection_errors(config: SimConfig, outcome: str) -> None:
    """Reset connections and truncated bodies surface as openai.APIConnectionError."""
    with Simulator(config) as server, client(server) as c:
        with pytest.raises(openai.APIConnectionError):
            c.chat.completions.create(model="m", messages=msgs("q"))
        log = server.requests[0]
        assert log.outcome == outcome and not log.completed
        assert log.status == (0 if outcome == "reset" else 200)


def test_hang_triggers_client_timeout() -> None:
    """A hung request makes the client's timeout fire; stop() still returns promptly."""
    with Simulator(SimConfig(p_hang=1.0)) as server:
        with client(server, timeout=0.3) as c, pytest.raises(openai.APITimeoutError):
            c.chat.completions.create(model="m", messages=msgs("q"))
        assert server.requests[0].outcome == "hang" and server.requests[0].status == 0
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(http_request("POST", "/v1/chat/completions", orjson.dumps(BODY)))
        while len(server.requests) < 2:
            time.sleep(0.005)
        started = time.monotonic()
    assert time.monotonic() - started < 2.0
    s.settimeout(2.0)
    with s:
        try:
            data = s.recv(10)
        except ConnectionResetError:
            data = b""
        assert data == b""


def test_error_faults_and_reproducible_draws() -> None:
    """p_500/p_503 give 500/503; the same faults_seed yields the same outcome sequence."""
    with Simulator(SimConfig(p_500=1.0)) as server, client(server) as c:
        with pytest.raises(openai.InternalServerError) as err:
            c.chat.completions.create(model="m", messages=msgs("q"))
        assert err.value.status_code == 500
    with Simulator(SimConfig(p_503=1.0)) as server, client(server) as c:
        with pytest.raises(openai.InternalServerError) as err:
            c.chat.completions.create(model="m", messages=msgs("q"))
        assert err.value.status_code == 503

    def outcomes(seed: int) -> list[str]:
        config = SimConfig(p_500=0.3, p_refusal=0.3, faults_seed=seed)
        with Simulator(config) as server, client(server) as c:
            for i in range(30):
                with contextlib.suppress(openai.InternalServerError):
                    c.chat.completions.create(model="m", messages=msgs(f"q{i}"))
            return [x.outcome for x in server.requests]

    first = outcomes(7)
    assert first == outcomes(7)
    assert {"ok", "error_500", "refusal"} <= set(first)


def test_outage_window_gives_503(sim: Simulator) -> None:
    """Requests inside an outage window (set at runtime) get 503 until it ends."""
    with client(sim) as c:
        c.chat.completions.create(model="m", messages=msgs("q"))
        now = sim.uptime_s
        sim.set_config(replace(sim.config, outages=((now, now + 0.3),)))
        with pytest.raises(openai.InternalServerError) as err:
            c.chat.completions.create(model="m", messages=msgs("q"))
        assert err.value.status_code == 503
        time.sleep(0.35)
        c.chat.completions.create(model="m", messages=msgs("q"))
    assert [x.outcome for x in sim.requests] == ["ok", "outage", "ok"]


def test_request_log_and_log_file(tmp_path: Path) -> None:
    """RequestLog records body, status, outcome and headers; log_path gets one JSON line each."""
    path = tmp_path / "sub" / "log.jsonl"
    with Simulator(SimConfig(api_key="k"), log_path=path) as server:
        with client(server, api_key="k") as c:
            c.chat.completions.create(model="m", messages=msgs("hello"), temperature=0.5)
        with client(server, api_key="bad") as c, pytest.raises(openai.AuthenticationError):
            c.chat.completions.create(model="m", messages=msgs("hello"))
        logs = server.requests
        assert server.completed_bodies() == [logs[0].body]
    assert logs[0].body == {"model": "m", "messages": msgs("hello"), "temperature": 0.5}
    assert logs[0].t >= 0 and logs[1].t >= logs[0].t
    lines = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    assert [(x["status"], x["outcome"], x["completed"]) for x in lines] == [
        (200, "ok", True),
        (401, "auth", False),
    ]
    assert lines[0]["body"] == logs[0].body and lines[1]["headers"]["authorization"] == "Bearer bad"


def test_request_log_records_model_and_usage() -> None:
    """The log gives each request's model and reported usage; a refused request used none."""
    with Simulator(SimConfig(models=("a", "b"), rpm=60)) as server, client(server) as c:
        r = c.chat.completions.create(model="b", messages=msgs("hello there"))
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model="a", messages=msgs("hello"))
        log = server.requests
    assert [(x.model, x.status) for x in log] == [("b", 200), ("a", 429)]
    assert r.usage is not None
    assert (log[0].prompt_tokens, log[0].completion_tokens, log[0].total_tokens) == (
        r.usage.prompt_tokens,
        r.usage.completion_tokens,
        r.usage.total_tokens,
    )
    assert log[1].total_tokens == 0
    assert not any(x.is_batch or x.custom_id for x in log)


def test_http_robustness(sim: Simulator) -> None:
    """Keep-alive, header case, Connection: close, big bodies, bad paths and early disconnects."""
    body = orjson.dumps({"model": "m", "messages": msgs("q" * 3_000_000)})
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as s:
        reader = s.makefile("rb")
        for close in (False, False, True):
            s.sendall(
                http_request("POST", "/v1/chat/completions", body, "CONTENT-type: x\r\n", close)
            )
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            head = {}
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                head[name.lower()] = value.strip()
            payload = orjson.loads(reader.read(int(head["content-length"])))
            assert payload["usage"]["prompt_tokens"] > 750_000
        assert head["connection"] == "close" and reader.read() == b""
    missing = raw_exchange(sim.port, http_request("GET", "/v1/nope"))
    assert missing.startswith(b"HTTP/1.1 404")
    error = orjson.loads(missing.split(b"\r\n\r\n", 1)[1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert raw_exchange(sim.port, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", sim.port)) as s:  # disconnect mid-body
        s.sendall(http_request("POST", "/v1/chat/completions", body)[:1000])
    with client(sim) as c:  # the server is still fine
        assert c.chat.completions.create(model="m", messages=msgs("q")).choices


def test_disconnect_during_latency_is_logged() -> None:
    """A client that gives up while the answer is delayed is logged as client_closed."""
    with Simulator(SimConfig(latency_s=0.5)) as server:
        with client(server, timeout=0.1) as c, pytest.raises(openai.APITimeoutError):
            c.chat.completions.create(model="m", messages=msgs("q"))
        deadline = time.monotonic() + 2
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [(x.status, x.outcome) for x in server.requests] == [(0, "client_closed")]


def test_many_concurrent_keepalive_connections() -> None:
    """2,000 concurrent keep-alive connections are served in parallel (two requests each)."""
    request = http_request("POST", "/v1/chat/completions", orjson.dumps(BODY), close=False)

    async def one(port: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        ok = 0
        for _ in range(2):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = orjson.loads(await reader.readexactly(length))
            ok += head.startswith(b"HTTP/1.1 200") and body["choices"][0]["finish_reason"] == "stop"
        writer.close()
        await writer.wait_closed()
        return ok

    async def run(port: int) -> int:
        return sum(await asyncio.gather(*(one(port) for _ in range(2000))))

    with Simulator(SimConfig(latency_s=0.3)) as server:
        started = time.monotonic()
        assert asyncio.run(run(server.port)) == 4000
        assert time.monotonic() - started < 8  # serially this would take 20 minutes
        assert len(server.completed_bodies()) == 4000


def test_cli_process(tmp_path: Path) -> None:
    """The CLI prints one `listening URL` line, serves, logs to --log and exits on SIGTERM."""
    log = tmp_path / "cli.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [str(ROOT / "scripts" / "simulator"), "--port", "0", "--log", str(log), "--p-done", "1"]
    cmd += ["--models", "a,b", "--outage", "100:200", "--rpm", "600"]
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()
            assert line.startswith("listening http://127.0.0.1:") and line.endswith("/v1\n")
            with openai.OpenAI(base_url=line.split()[1], api_key="k", max_retries=0) as c:
                r = c.chat.completions.create(
                    model="a", messages=msgs("q"), response_format=schema_format()
                )
                assert json.loads(r.choices[0].message.content or "")["done"] is True
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
            assert proc.stdout.read() == ""
            # What it accepts is said on stderr, leaving stdout the one line scripts read.
            assert proc.stderr.read().splitlines()[0] == (
                "simulator: accepts the models a, b and any API key; its answers are "
                "synthetic, not a model's"
            )
        finally:
            if proc.poll() is None:
                proc.kill()
    assert orjson.loads(log.read_bytes().splitlines()[0])["outcome"] == "ok"


def test_cli_help_describes_every_option() -> None:
    """--help gives every option a description and says plainly what the server accepts."""
    parser = build_parser()
    undescribed = [a.option_strings for a in parser._actions if not a.help]
    assert undescribed == []
    text = " ".join((parser.description or "").split())
    assert "accepts any model name unless --models" in text
    assert "any API key unless --api-key" in text
    assert "answers are synthetic" in text


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (SimConfig(), "accepts any model name and any API key"),
        (SimConfig(api_key="k"), "any model name and only the API key given by --api-key"),
        (SimConfig(models=("m",)), "accepts the models m and any API key"),
    ],
)
def test_start_notice_says_what_is_accepted(config: SimConfig, said: str) -> None:
    """The line the simulator prints when it starts names what it accepts, per its settings."""
    assert said in notice(config)
    assert notice(config).endswith("its answers are synthetic, not a model's")


def test_cli_rejects_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid flag values are reported with exit status 2 instead of starting a server."""
    assert main(["--p-500", "2"]) == 2
    assert "p_500" in capsys.readouterr().err


def test_module_entry_point_help() -> None:
    """`python -m pipeline.testing.simulator --help` works."""
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.testing.simulator", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    assert "--p-truncate" in out and "--structured" in out


def test_cli_batch_flags(tmp_path: Path) -> None:
    """The CLI's batch flags reach the server: phases, line failures and their statuses."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [str(ROOT / "scripts" / "simulator"), "--api-key", "k", "--batch-validating", "0"]
    cmd += ["--batch-delay", "0.05", "--batch-finalizing", "0", "--p-line-fail", "1"]
    cmd += ["--line-fail-statuses", "503", "--batch-max-in-progress", "1"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[1]
            with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as c:
                line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}
                data = orjson.dumps({**line, "body": BODY}) + b"\n"
                uploaded = c.files.create(file=("in.jsonl", data), purpose="batch")
                batch = c.batches.create(
                    input_file_id=uploaded.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                )
                with pytest.raises(openai.RateLimitError):
                    c.batches.create(
                        input_file_id=uploaded.id,
                        endpoint="/v1/chat/completions",
                        completion_window="24h",
                    )
                while batch.status != "completed":
                    time.sleep(0.02)
                    batch = c.batches.retrieve(batch.id)
                assert batch.output_file_id is None and batch.error_file_id is not None
                failed = orjson.loads(c.files.content(batch.error_file_id).content)
                assert failed["response"]["status_code"] == 503
        finally:
            proc.terminate()
            proc.wait(timeout=5)


def test_cli_rejects_bad_batch_config(capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid batch flag values exit with status 2, naming the setting."""
    assert main(["--line-fail-statuses", "200"]) == 2
    assert "line_fail_statuses" in capsys.readouterr().err
    assert main(["--expire-fraction", "1.5"]) == 2
    assert "expire_fraction" in capsys.readouterr().err
