"""The simulator's Messages API, driven by Anthropic's own client (and raw HTTP for errors)."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from pipeline.testing.simulator import SimConfig, Simulator, main
from tests.anthropic_helpers import (
    HEADERS,
    KEY,
    MODEL,
    anthropic,
    cached_text,
    client,
    params,
    raw,
    text,
)
from tests.client.test_limits import FakeClock
from tests.testing.test_simulator import FEEDBACK_SCHEMA, validate

# Model names only pick a price and a cache minimum here: a real model's retirement notice
# from the SDK is beside the point.
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are a careful reviewer."
QUESTION = "Explain the approach in three sentences."


def test_a_message_comes_back_in_anthropics_shape() -> None:
    """A plain request gets a Message: id, role, one text block, end_turn, exact usage, and
    a request-id header; the log names the provider and the server's own token counts."""
    with Simulator(SimConfig(api_key=KEY)) as sim, client(sim) as c:
        reply = c.messages.with_raw_response.create(**params(QUESTION, system=SYSTEM))
        message = reply.parse()
        entry = sim.requests[-1]
    assert reply.headers["request-id"].startswith("req_")
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == MODEL
    assert [b.type for b in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    usage = message.usage
    prompt_chars = len(SYSTEM) + len(QUESTION)
    assert usage.input_tokens == -(-prompt_chars // 4)
    assert usage.cache_creation_input_tokens == 0 and usage.cache_read_input_tokens == 0
    assert usage.output_tokens == -(-len(message.content[0].text) // 4)
    assert (entry.provider, entry.status, entry.completed) == ("anthropic", 200, True)
    assert (entry.prompt_tokens, entry.completion_tokens) == (
        usage.input_tokens,
        usage.output_tokens,
    )


def test_both_dialects_answer_one_conversation_alike() -> None:
    """The same system prompt and question get the same answer over OpenAI's chat
    completions and Anthropic's messages (both derive it from the conversation)."""
    with Simulator(SimConfig()) as sim, client(sim) as c:
        message = c.messages.create(**params(QUESTION, system=SYSTEM))
        with openai.OpenAI(base_url=sim.url, api_key="k", max_retries=0) as o:
            chat = o.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": QUESTION},
                ],
            )
    assert message.content[0].text == chat.choices[0].message.content


def test_consecutive_turns_of_one_role_are_combined() -> None:
    """Two user turns in a row answer as one turn holding both texts (Anthropic combines
    them rather than refusing them)."""
    split = [{"role": "user", "content": "first part"}, {"role": "user", "content": "second"}]
    joined = [{"role": "user", "content": "first part\nsecond"}]
    with Simulator(SimConfig()) as sim, client(sim) as c:
        one = c.messages.create(model=MODEL, max_tokens=200, messages=split)
        other = c.messages.create(model=MODEL, max_tokens=200, messages=joined)
    assert one.content[0].text == other.content[0].text


@pytest.mark.parametrize(
    ("headers", "status", "error_type", "words"),
    [
        ({"anthropic-version": "2023-06-01"}, 401, "authentication_error", "x-api-key"),
        ({**HEADERS, "x-api-key": "wrong"}, 401, "authentication_error", "invalid x-api-key"),
        ({"x-api-key": KEY}, 400, "invalid_request_error", "anthropic-version"),
        ({**HEADERS, "anthropic-version": "june"}, 400, "invalid_request_error", "version"),
    ],
)
def test_key_and_version_headers_are_checked(
    headers: dict[str, str], status: int, error_type: str, words: str
) -> None:
    """A missing or wrong key is a 401 authentication_error, a missing or malformed
    anthropic-version a 400, both in Anthropic's envelope with a request_id."""
    with Simulator(SimConfig(api_key=KEY)) as sim:
        got, response_headers, body = raw(sim, "POST", "/v1/messages", params(), headers)
    assert got == status
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert words in body["error"]["message"]
    assert body["request_id"] == response_headers["request-id"]
    assert KEY not in orjson.dumps(body).decode()


def test_the_key_is_also_taken_as_a_bearer_token() -> None:
    """Recent SDKs send the key as ``Authorization: Bearer``; it is checked the same way."""
    bearer = {"authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"}
    wrong = {"authorization": "Bearer nope", "anthropic-version": "2023-06-01"}
    with Simulator(SimConfig(api_key=KEY)) as sim:
        assert raw(sim, "POST", "/v1/messages", params(), bearer)[0] == 200
        assert raw(sim, "POST", "/v1/messages", params(), wrong)[0] == 401


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"max_tokens": None}, 400, "max_tokens: Field required"),
        ({"max_tokens": -1}, 400, "max_tokens: Input should be greater than or equal to 0"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, 'Unexpected role "system"'),
        ({"messages": []}, 400, "at least one message"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
            400,
            "non-empty",
        ),
        ({"response_format": {"type": "json_object"}}, 400, "response_format: Extra inputs"),
        ({"temperature": 1.5}, 400, "temperature"),
        ({"tool_choice": {"type": "any"}}, 400, "tool_choice may only be specified"),
        ({"stream": True}, 400, "not supported by the simulator"),
        ({"model": "claude-nope"}, 404, "model: claude-nope"),
    ],
)
def test_invalid_requests_are_refused_as_anthropic_refuses_them(
    change: dict[str, Any], status: int, words: str
) -> None:
    """Each malformed request gets its status and a message naming the field."""
    body = {k: v for k, v in {**params(), **change}.items() if v is not None}
    with Simulator(SimConfig(api_key=KEY, models=(MODEL,))) as sim:
        got, _, answer = raw(sim, "POST", "/v1/messages", body)
    error_type = "not_found_error" if status == 404 else "invalid_request_error"
    assert (got, answer["error"]["type"]) == (status, error_type)
    assert words in answer["error"]["message"]


def test_an_answer_longer_than_max_tokens_is_cut_with_stop_reason_max_tokens() -> None:
    """max_tokens cuts the text: stop_reason max_tokens and exactly max_tokens output."""
    with Simulator(SimConfig()) as sim, client(sim) as c:
        whole = c.messages.create(**params(QUESTION))
        cut = c.messages.create(**{**params(QUESTION), "max_tokens": 5})
    assert whole.stop_reason == "end_turn" and whole.usage.output_tokens > 5
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 5
    assert whole.content[0].text.startswith(cut.content[0].text)
    assert len(cut.content[0].text) == 20


def test_a_stop_sequence_ends_the_answer_where_it_first_appears() -> None:
    """The answer stops before the first stop sequence found: stop_reason stop_sequence,
    stop_sequence naming it."""
    with Simulator(SimConfig()) as sim, client(sim) as c:
        whole = c.messages.create(**params(QUESTION)).content[0].text
        stop = whole.split()[3]
        cut = c.messages.create(**params(QUESTION, stop_sequences=["never there", stop]))
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == whole[: whole.index(stop)]


def test_a_forced_tool_returns_its_input_valid_against_the_schema() -> None:
    """tool_choice naming a tool (or "any") answers one tool_use block, stop_reason tool_use,
    whose input is an instance of the tool's input_schema."""
    tools = [
        {"name": "other", "input_schema": {"type": "object", "properties": {}}},
        {"name": "feedback", "description": "Give feedback.", "input_schema": FEEDBACK_SCHEMA},
    ]
    with Simulator(SimConfig()) as sim, client(sim) as c:
        forced = c.messages.create(
            **params("Review it."), tools=tools, tool_choice={"type": "tool", "name": "feedback"}
        )
        anyone = c.messages.create(**params("Review it."), tools=tools, tool_choice={"type": "any"})
        free = c.messages.create(**params("Review it."), tools=tools)
    (block,) = forced.content
    assert forced.stop_reason == "tool_use"
    assert block.type == "tool_use" and block.name == "feedback" and block.id.startswith("toolu_")
    validate(block.input, FEEDBACK_SCHEMA)
    assert anyone.content[0].name == "other"
    assert free.content[0].type == "text" and free.stop_reason == "end_turn"


def test_a_forced_tool_cut_at_max_tokens_keeps_an_empty_input() -> None:
    """A tool_use that does not fit max_tokens comes back incomplete: empty input,
    stop_reason max_tokens."""
    tool = {"name": "feedback", "input_schema": FEEDBACK_SCHEMA}
    choice = {"type": "tool", "name": "feedback"}
    with Simulator(SimConfig()) as sim, client(sim) as c:
        cut = c.messages.create(
            **{**params("Review it."), "max_tokens": 3}, tools=[tool], tool_choice=choice
        )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert cut.content[0].type == "tool_use" and cut.content[0].input == {}


def test_structured_output_answers_json_valid_against_output_config_format() -> None:
    """output_config.format (json_schema) makes the text an instance of the schema."""
    fmt = {"format": {"type": "json_schema", "schema": FEEDBACK_SCHEMA}}
    with Simulator(SimConfig()) as sim, client(sim) as c:
        message = c.messages.create(**params("Review it."), output_config=fmt)
    validate(orjson.loads(message.content[0].text), FEEDBACK_SCHEMA)


def test_a_server_without_structured_outputs_refuses_output_config_but_forces_tools() -> None:
    """With structured="none", output_config.format is a 400 naming it (the client's cue to
    fall back), while a forced tool still answers schema-valid JSON."""
    fmt = {"format": {"type": "json_schema", "schema": FEEDBACK_SCHEMA}}
    tool = {"name": "feedback", "input_schema": FEEDBACK_SCHEMA}
    with Simulator(SimConfig(structured="none")) as sim, client(sim) as c:
        with pytest.raises(anthropic.BadRequestError) as info:
            c.messages.create(**params("Review it."), output_config=fmt)
        forced = c.messages.create(
            **params("Review it."), tools=[tool], tool_choice={"type": "tool", "name": "feedback"}
        )
    assert "output_config.format" in info.value.body["error"]["message"]
    validate(forced.content[0].input, FEEDBACK_SCHEMA)


def test_max_tokens_zero_answers_nothing_but_fills_the_cache() -> None:
    """max_tokens 0 pre-warms the cache: no content, no output, the prefix written; the
    next call reads it."""
    system = [cached_text(text(2000))]
    with Simulator(SimConfig()) as sim, client(sim) as c:
        warm = c.messages.create(**{**params(QUESTION), "max_tokens": 0}, system=system)
        then = c.messages.create(**params(QUESTION), system=system)
    assert warm.content == [] and warm.stop_reason == "max_tokens"
    assert warm.usage.output_tokens == 0 and warm.usage.cache_creation_input_tokens == 2000
    assert then.usage.cache_read_input_tokens == 2000


@pytest.mark.parametrize(
    ("config", "status", "error_type", "error"),
    [
        (SimConfig(p_500=1.0), 500, "api_error", anthropic.InternalServerError),
        (SimConfig(p_529=1.0), 529, "overloaded_error", anthropic.InternalServerError),
        (SimConfig(p_429=1.0), 429, "rate_limit_error", anthropic.RateLimitError),
    ],
)
def test_drawn_faults_come_as_anthropic_sends_them(
    config: SimConfig, status: int, error_type: str, error: type[Exception]
) -> None:
    """p_500, p_529 and p_429 give 500 api_error, 529 overloaded_error and 429
    rate_limit_error (with retry-after), each with a request-id."""
    with Simulator(config) as sim, client(sim) as c, pytest.raises(error) as info:
        c.messages.create(**params())
    err: Any = info.value
    assert err.status_code == status and err.body["error"]["type"] == error_type
    assert err.response.headers["request-id"].startswith("req_")
    if status == 429:
        assert err.response.headers["retry-after"] == "1"


def test_fault_shares_are_drawn_reproducibly_per_seed() -> None:
    """A share of p_529 and p_429 is refused (about that share), the same requests for the
    same faults_seed; 5xx answers carry the configured Retry-After."""

    def statuses(seed: int) -> list[int]:
        config = SimConfig(p_529=0.2, p_429=0.2, faults_seed=seed, retry_after_s=2)
        with Simulator(config) as sim:
            got = [raw(sim, "POST", "/v1/messages", params(f"q{i}")) for i in range(150)]
        assert all(h["retry-after"] == "2" for s, h, _ in got if s == 529)
        return [s for s, _, _ in got]

    first = statuses(1)
    assert first == statuses(1) and first != statuses(2)
    assert 15 <= first.count(529) <= 45
    assert 10 <= first.count(429) <= 40  # drawn after the 529s: 20% of the other 80%
    assert set(first) == {200, 429, 529}


@pytest.mark.parametrize(
    ("config", "content", "status", "error_type", "words"),
    [
        (SimConfig(outages=((0, 1e9),)), "q", 529, "overloaded_error", "Overloaded"),
        (SimConfig(throttles=((0, 1e9),)), "q", 429, "rate_limit_error", "rate limit"),
        (SimConfig(quota_requests=0), "q", 400, "invalid_request_error", "credit balance"),
        (
            SimConfig(context_limit=100),
            "x" * 800,
            400,
            "invalid_request_error",
            "prompt is too long: 200 tokens > 100",
        ),
        (SimConfig(context_limit=300), "x" * 800, 400, "invalid_request_error", "200 + 200 > 300"),
        (SimConfig(poison="BOOM"), "a BOOM b", 500, "api_error", "Internal server error"),
    ],
)
def test_the_simulators_real_faults_speak_anthropic(
    config: SimConfig, content: str, status: int, error_type: str, words: str
) -> None:
    """Outages, throttles, a spent quota, the context window and a poisoned request give
    Anthropic's statuses and error types (a throttle's 429 without retry-after)."""
    with Simulator(config) as sim:
        got, headers, body = raw(sim, "POST", "/v1/messages", params(content))
    assert (got, body["error"]["type"]) == (status, error_type)
    assert words in body["error"]["message"]
    if status == 429:
        assert "retry-after" not in headers


def test_a_refused_answer_has_stop_reason_refusal() -> None:
    """p_refusal answers with no content and stop_reason refusal."""
    with Simulator(SimConfig(p_refusal=1.0)) as sim, client(sim) as c:
        message = c.messages.create(**params())
    assert message.content == [] and message.stop_reason == "refusal"


def test_rate_limit_headers_come_with_every_reply() -> None:
    """With limits configured every reply, a 400 included, carries the requests,
    input-tokens, output-tokens and tokens headers: limits, what remains, an RFC 3339 reset."""
    clock = FakeClock(1000.0)
    config = SimConfig(rpm=600, itpm=60_000, otpm=12_000)
    with Simulator(config, clock=clock) as sim:
        ok, headers, body = raw(sim, "POST", "/v1/messages", params("x" * 400))
        bad = raw(sim, "POST", "/v1/messages", {**params(), "max_tokens": "many"})[1]
    usage = body["usage"]
    assert headers["anthropic-ratelimit-requests-limit"] == "600"
    assert headers["anthropic-ratelimit-requests-remaining"] == "9"  # 10 a second, one spent
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "60000"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == str(1000 - 100)
    assert headers["anthropic-ratelimit-output-tokens-limit"] == "12000"
    spent = usage["output_tokens"]
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == str(200 - spent)
    assert headers["anthropic-ratelimit-tokens-limit"] == "72000"
    assert headers["anthropic-ratelimit-tokens-remaining"] == str(1200 - 100 - spent)
    for name in ("requests", "input-tokens", "output-tokens", "tokens"):
        reset = datetime.fromisoformat(headers[f"anthropic-ratelimit-{name}-reset"])
        assert reset.tzinfo is not None and reset.year >= 2024
        assert f"anthropic-ratelimit-{name}-limit" in bad
    assert ok == 200


def test_input_and_output_tokens_are_limited_apart() -> None:
    """Cache reads do not count against input tokens per minute, output tokens are charged
    at max_tokens and settled to what was used, and each refusal names its limit and says
    when to retry."""
    clock = FakeClock()
    system = [cached_text(text(1200))]
    with Simulator(SimConfig(itpm=60 * 1500, otpm=60 * 1000), clock=clock) as sim:
        c = client(sim)
        assert c.messages.create(**params(), system=system).usage.cache_creation_input_tokens
        clock.advance(1.0)
        for _ in range(5):  # ~3 uncached tokens each: the 1,200 read ones are free
            assert c.messages.create(**params(), system=system).usage.cache_read_input_tokens
        c.messages.create(**params(text(1200)))  # 1,200 uncached input tokens
        with pytest.raises(anthropic.RateLimitError) as info:
            c.messages.create(**params(text(1200)))
        assert "input tokens per minute" in info.value.body["error"]["message"]
        assert info.value.response.headers["retry-after"] == "1"
        clock.advance(1.0)
        big = {**params(), "max_tokens": 800}
        c.messages.create(**big)  # uses ~100 of its 800: the rest is given back
        c.messages.create(**big)
        with pytest.raises(anthropic.RateLimitError) as info:
            c.messages.create(**{**big, "max_tokens": 990})
        assert "output tokens per minute" in info.value.body["error"]["message"]


def test_count_tokens_matches_the_messages_input() -> None:
    """count_tokens reports the input tokens a message with the same prompt is billed for."""
    system = [cached_text(text(1500))]
    with Simulator(SimConfig()) as sim, client(sim) as c:
        counted = c.messages.count_tokens(model=MODEL, system=system, messages=params()["messages"])
        usage = c.messages.create(**params(), system=system).usage
    total = usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
    assert counted.input_tokens == total == 1502


def test_models_are_listed_in_anthropics_shape() -> None:
    """GET /v1/models with anthropic-version answers Anthropic's model list; an unserved
    model is a 404 not_found_error."""
    with Simulator(SimConfig(models=(MODEL, "claude-haiku-4-5"))) as sim, client(sim) as c:
        names = [m.id for m in c.models.list()]
        with pytest.raises(anthropic.NotFoundError):
            c.models.retrieve("claude-nope")
    assert names == [MODEL, "claude-haiku-4-5"]


def test_the_bill_prices_claude_models_at_anthropics_rates() -> None:
    """A Claude model's answer is billed at its list prices (Sonnet: $3 in, $15 out, 5m
    writes at 1.25x, reads at 0.1x); a model the table lacks at the configured prices."""
    system = [cached_text(text(2000))]
    with Simulator(SimConfig(price_input=2.0, price_output=8.0)) as sim, client(sim) as c:
        first = c.messages.create(**params(), system=system).usage
        second = c.messages.create(**params(), system=system).usage
        other = c.messages.create(**{**params(), "model": "sim-model"}).usage
        charges = sim.bill.charges()
        bill = sim.bill.to_json()
    assert charges[0].usd == pytest.approx(
        (first.input_tokens * 3 + 2000 * 3.75 + first.output_tokens * 15) / 1e6
    )
    assert charges[1].usd == pytest.approx(
        (second.input_tokens * 3 + 2000 * 0.30 + second.output_tokens * 15) / 1e6
    )
    assert charges[2].usd == pytest.approx((other.input_tokens * 2 + other.output_tokens * 8) / 1e6)
    assert (charges[0].cache_write_5m_tokens, charges[1].cached_tokens) == (2000, 2000)
    assert {c.provider for c in charges} == {"anthropic"}
    assert bill["cache_write_5m_tokens"] == 2000 and bill["cached_tokens"] == 2000


def test_cli_flags_reach_the_messages_api(tmp_path: Path) -> None:
    """The simulator's flags for Anthropic set its config (a 529 for --p-529 1), and bad
    values exit 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [str(ROOT / "scripts" / "simulator"), "--p-529", "1", "--itpm", "1000", "--otpm", "500"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[1].removesuffix("/v1")
            with (
                anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as c,
                pytest.raises(anthropic.InternalServerError) as info,
            ):
                c.messages.create(**params())
        finally:
            proc.terminate()
            proc.wait(timeout=5)
    assert info.value.status_code == 529
    assert info.value.response.headers["anthropic-ratelimit-input-tokens-limit"] == "1000"
    assert main(["--p-529", "2"]) == 2
    assert main(["--otpm", "0"]) == 2
