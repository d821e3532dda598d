"""Claude over Anthropic's Messages API (``client.anthropic``), against the simulator's
Anthropic side: the request as Anthropic documents it, errors classified as the OpenAI
path's, the format ladder, cut-off answers, and a whole run costing what the server bills."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import Settings, run
from pipeline.cli.parser import build_parser, settings_from_args
from pipeline.client.anthropic import AnthropicClient
from pipeline.client.budget import PROMPT_MARGIN, Budget
from pipeline.client.limits import Limiter
from pipeline.client.prices import PriceBook, load_prices
from pipeline.commands.estimate import from_prompts
from pipeline.commands.estimate import render as render_estimate
from pipeline.commands.status import collect
from pipeline.commands.status import render as render_status
from pipeline.core.loader import load_job
from pipeline.core.steps import Request
from pipeline.errors import AuthError, CallError, ConfigError, UnavailableError
from pipeline.report.aggregate import summarize
from pipeline.runs.settings import resolve
from pipeline.testing.simulator import SimConfig, Simulator
from tests.cli.test_cli import refine, run_args, start
from tests.client.test_caching import long_tasks
from tests.client.test_chat import SCHEMA
from tests.helpers import NO_BACKOFF, read_jsonl, tasks, wait_for_calls, write_jsonl

KEY = "sk-ant-test-key"
MODEL = "anthropic:claude-sonnet-4-6"
SYSTEM = {"role": "system", "content": "You review code. " * 300}  # over 1,024 tokens: cached


def make_client(sim: Simulator, **kw: Any) -> AnthropicClient:
    args: dict[str, Any] = dict(
        model=MODEL,
        request_model="claude-sonnet-4-6",
        base_url=sim.anthropic_url,
        api_key=KEY,
        timeout=5.0,
        max_retries=3,
        limiter=Limiter(),
        delays=NO_BACKOFF,
        rng=random.Random(0),
    )
    args.update(kw)
    return AnthropicClient(**args)


def ask(text: str, *, schema: dict[str, Any] | None = None, max_tokens: int = 200) -> Request:
    return Request(
        (SYSTEM, {"role": "user", "content": text}),
        temperature=0.7,
        max_tokens=max_tokens,
        schema=schema,
    )


@pytest.mark.anyio
async def test_a_call_is_sent_as_anthropic_documents_it() -> None:
    """The key goes as x-api-key with anthropic-version, the system prompt as blocks in
    `system`, max_tokens always set, the model without its prefix, breakpoints on the
    system prompt and the last turn; the usage splits into writes and plain input."""
    with Simulator(SimConfig(api_key=KEY)) as sim:
        client = make_client(sim)
        comp = await client.complete(ask("Review: print(1)"))
        await client.aclose()
        entry = sim.requests[-1]
    body = entry.body
    assert entry.headers.get("x-api-key") == KEY and "authorization" not in entry.headers
    assert entry.headers.get("anthropic-version") == "2023-06-01"
    assert body["model"] == "claude-sonnet-4-6" and body["max_tokens"] == 200
    assert body["system"] == [
        {"type": "text", "text": SYSTEM["content"], "cache_control": {"type": "ephemeral"}}
    ]
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "output_config" not in body and "tools" not in body
    assert comp.finish_reason == "stop" and comp.text
    assert comp.prompt_tokens == entry.prompt_tokens
    # The system prompt (over 1,024 tokens with the turn) is written, nothing read yet.
    assert comp.cache_write_tokens > 0 and comp.cached_tokens == 0


@pytest.mark.anyio
async def test_the_next_call_of_a_conversation_reads_what_the_last_one_wrote() -> None:
    """A call extending the previous one reads its whole prompt from the cache and writes
    only what it adds; with --cache-ttl 1h the breakpoints say so and the writes are 1h."""
    with Simulator(SimConfig(api_key=KEY)) as sim:
        client = make_client(sim, cache_ttl="1h")
        first = await client.complete(ask("Review: print(1)"))
        turns = (
            SYSTEM,
            {"role": "user", "content": "Review: print(1)"},
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "Now improve it."},
        )
        second = await client.complete(Request(turns, temperature=0.7, max_tokens=200))
        await client.aclose()
        body = sim.requests[-1].body
    assert body["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert second.cached_tokens == first.prompt_tokens
    assert second.cache_write_tokens == second.cache_write_1h_tokens > 0
    assert second.cached_tokens + second.cache_write_tokens <= second.prompt_tokens


@pytest.mark.anyio
@pytest.mark.parametrize(("structured", "level"), [("json_schema", 0), ("none", 1)])
async def test_feedback_json_steps_down_from_structured_outputs_to_a_forced_tool(
    structured: str, level: int
) -> None:
    """Feedback goes as output_config.format; a server without structured outputs refuses
    it and the ladder steps down to a forced `feedback` tool, whose input is the answer."""
    with Simulator(SimConfig(api_key=KEY, structured=structured)) as sim:
        client = make_client(sim)
        comp = await client.complete(ask("Give feedback.", schema=SCHEMA))
        await client.aclose()
        body = sim.completed_bodies()[-1]
    assert client.level == level
    parsed = orjson.loads(comp.text)
    assert isinstance(parsed["actions"], list) and isinstance(parsed["done"], bool)
    if level == 0:
        assert body["output_config"]["format"]["type"] == "json_schema"
        assert "tools" not in body
    else:
        assert "output_config" not in body
        assert body["tool_choice"] == {"type": "tool", "name": "feedback"}
        assert [t.status for t in comp.tries] == [400, 200]  # the refusal is in its tries


@pytest.mark.anyio
async def test_an_answer_cut_at_max_tokens_is_a_cut_off() -> None:
    """stop_reason max_tokens comes back as finish_reason "length" (the loop repairs it)."""
    with Simulator(SimConfig(api_key=KEY)) as sim:
        client = make_client(sim)
        comp = await client.complete(ask("Write a long essay.", max_tokens=3))
        await client.aclose()
        stop = sim.requests[-1]
    assert stop.status == 200
    assert comp.finish_reason == "length" and comp.completion_tokens == 3


@pytest.mark.anyio
async def test_429_and_529_are_retried_and_429_slows_the_pool() -> None:
    """rate_limit_error (429) and overloaded_error (529) are retried within --max-retries,
    each attempt counted; a 429 slows the pool as on the OpenAI path."""
    with Simulator(SimConfig(api_key=KEY, p_429=0.3, p_529=0.3, faults_seed=5)) as sim:
        limiter = Limiter()
        client = make_client(sim, limiter=limiter, max_retries=12)
        client.outage.threshold = 1000  # this test looks at retries, not outages
        for i in range(8):
            await client.complete(ask(f"q{i}"))
        await client.aclose()
        statuses = [r.status for r in sim.requests]
    assert 429 in statuses and 529 in statuses
    assert statuses.count(200) == 8
    assert client.retries == len(statuses) - 8
    assert limiter.factor < 1.0


@pytest.mark.anyio
async def test_a_prompt_too_long_fails_the_record_at_once() -> None:
    """400 "prompt is too long" is a context-length failure: no retry, no format step-down."""
    with Simulator(SimConfig(api_key=KEY, context_limit=50)) as sim:
        client = make_client(sim)
        with pytest.raises(CallError) as info:
            await client.complete(ask("Review this.", schema=SCHEMA))
        await client.aclose()
        sent = len(sim.requests)
    assert sent == 1 and client.level == 0
    assert info.value.status == 400 and "prompt is too long" in str(info.value)


@pytest.mark.anyio
async def test_a_refused_key_stops_the_run_and_is_masked() -> None:
    """401 is an AuthError (exit 3), its message never holding the key."""
    with Simulator(SimConfig(api_key="sk-ant-other")) as sim:
        client = make_client(sim)
        with pytest.raises(AuthError) as info:
            await client.complete(ask("hi"))
        await client.aclose()
    assert info.value.status == 401 and KEY not in str(info.value)


@pytest.mark.anyio
async def test_a_spent_credit_balance_is_the_quota_stop() -> None:
    """400 "credit balance is too low" stops the run as a spent quota (exit 5, resumable),
    not as a bad request that fails one record."""
    with Simulator(SimConfig(api_key=KEY, quota_requests=0)) as sim:
        client = make_client(sim)
        with pytest.raises(UnavailableError) as info:
            await client.complete(ask("hi"))
        await client.aclose()
    assert info.value.category == "quota"


@pytest.mark.anyio
async def test_anthropics_headers_pace_input_and_output_apart() -> None:
    """The anthropic-ratelimit-* headers of an answer set the pacer's input and output
    token limits, each apart, and its request limit."""
    with Simulator(SimConfig(api_key=KEY, rpm=600, itpm=90_000, otpm=6_000)) as sim:
        limiter = Limiter()
        client = make_client(sim, limiter=limiter)
        await client.complete(ask("hi"))
        await client.aclose()
    _, wait = limiter.book(10, 6_000)  # a whole minute of output...
    _, wait_next = limiter.book(10, 100)  # ...makes the next call wait for output
    assert wait == 0.0 and wait_next > 0.5
    fresh = Limiter()
    fresh.observe({"anthropic-ratelimit-input-tokens-limit": "90000"})
    _, first = fresh.book(1_500, 6_000)
    _, second = fresh.book(1_500, 6_000)  # output unlimited here: only input paces
    assert first == 0.0 and 0.5 < second < 1.5


def test_a_run_on_claude_costs_what_the_simulator_bills(tmp_path: Path) -> None:
    """A whole run with --model anthropic:NAME: every record done; the cost the outputs
    record equals the simulator's bill to the cent's millionth, cache reads and writes
    equal its accounting, and the critic's JSON came through structured outputs."""
    inp = write_jsonl(tmp_path / "in.jsonl", long_tasks(6, tokens=1500))  # cached from 1,024
    with Simulator(SimConfig(api_key=KEY, p_done=0.0)) as sim:
        settings = Settings(model=MODEL, base_url=sim.anthropic_url, max_iters=3, min_iters=2)
        summary = run("code-improve", inp, tmp_path / "run", settings, api_key=KEY)
        bill = sim.bill.to_json()
        bodies = sim.completed_bodies()
    assert summary.exit_code == 0
    outputs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outputs) == 6
    assert sum(o["cost_usd"] for o in outputs) == pytest.approx(bill["total_usd"], abs=1e-6)
    steps = [s for t in read_jsonl(tmp_path / "run" / "traces.jsonl") for s in t["steps"]]
    made = [s["usage"] for s in steps if not s.get("failed")]
    assert sum(u.get("cached_tokens", 0) for u in made) == bill["cached_tokens"] > 0
    assert sum(u.get("cache_write_tokens", 0) for u in made) == bill["cache_write_5m_tokens"]
    assert sum(u["prompt_tokens"] for u in made) == bill["prompt_tokens"]
    assert any("output_config" in b for b in bodies)
    info = collect(tmp_path / "run")
    assert info["cache_write_tokens"] == bill["cache_write_5m_tokens"] > 0
    assert info["cached_tokens"] == bill["cached_tokens"]
    assert info["cost_usd"] == pytest.approx(bill["total_usd"], abs=1e-5)
    assert f"{bill['cache_write_5m_tokens']} written to the cache" in render_status(info)
    report = summarize(tmp_path / "run")
    assert report.cache_write_tokens == bill["cache_write_5m_tokens"]
    assert report.cost_usd == pytest.approx(bill["total_usd"], abs=1e-5)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (Settings(model=MODEL, feedback_model="gpt-4o-mini"), "two providers"),
        (Settings(model=MODEL, service_tier="flex"), "--service-tier is OpenAI's"),
        (Settings(model=MODEL, cache_ttl="10m"), "--cache-ttl must be one of 5m, 1h"),
    ],
)
def test_settings_claude_does_not_take_are_refused_by_flag(settings: Settings, words: str) -> None:
    """A critic on another provider, an OpenAI service tier, an unknown TTL: a ConfigError
    naming the flag, before anything starts."""
    with pytest.raises(ConfigError, match=words):
        resolve(settings, 3)


def test_a_claude_run_reads_anthropics_key_and_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no --base-url a Claude run needs $ANTHROPIC_API_KEY (not OpenAI's), and the
    error names it; --cache-ttl defaults to 5m and is kept in the manifest."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1))
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY is not set"):
        run("code-improve", inp, tmp_path / "run", Settings(model=MODEL), show_progress=False)
    with Simulator(SimConfig(api_key=KEY)) as sim:
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", sim.anthropic_url)
        summary = run(
            "code-improve", inp, tmp_path / "run2", Settings(model=MODEL), show_progress=False
        )
    assert summary.exit_code == 0
    manifest = orjson.loads((tmp_path / "run2" / "manifest.json").read_bytes())
    assert manifest["settings"]["cache_ttl"] == "5m"
    assert manifest["endpoints"][-1]["base_url"] == [sim.anthropic_url]


def test_a_price_file_sets_each_cache_rate(tmp_path: Path) -> None:
    """--prices may give a Claude model's cache_write and cache_write_1h rates; a call's
    cost prices reads, 5-minute writes, 1-hour writes and plain input each at its own."""
    path = tmp_path / "prices.toml"
    path.write_text(
        '["anthropic:claude-sonnet-4-6"]\ninput = 2.0\noutput = 10.0\ncached_input = 0.5\n'
        "cache_write = 3.0\ncache_write_1h = 7.0\n"
    )
    price = PriceBook(load_prices(path)).price(MODEL)
    assert price is not None
    usage = {
        "prompt_tokens": 1_000_000 + 300_000 + 400_000 + 100_000,
        "cached_tokens": 300_000,
        "cache_write_tokens": 500_000,
        "cache_write_1h_tokens": 100_000,
        "completion_tokens": 100_000,
    }
    assert price.cost(usage) == pytest.approx(2.0 + 0.15 + 1.2 + 0.7 + 1.0)
    assert price.cost(usage, batch=True) == pytest.approx((2.0 + 0.15 + 1.2 + 0.7 + 1.0) / 2)
    builtin = PriceBook().price("anthropic:claude-haiku-4-5-20251001")
    assert builtin is not None and (builtin.write_rate, builtin.write_1h_rate) == (1.25, 2.0)


@pytest.mark.anyio
async def test_the_budget_holds_a_claude_prompt_at_the_write_price() -> None:
    """A Claude call's worst case prices its whole prompt as a 1-hour cache write (2x the
    input price), an OpenAI call's at the input price."""
    budget = Budget(1.0, PriceBook())
    claude = budget.worst_case(MODEL, 100_000, 0)
    openai_side = budget.worst_case("gpt-4o", 100_000, 0)
    assert claude is not None and openai_side is not None
    prompt = math.ceil(100_000 * PROMPT_MARGIN)
    assert claude == pytest.approx(prompt * 2 * 3.0 / 1e6)  # sonnet's input: $3
    assert openai_side == pytest.approx(prompt * 2.5 / 1e6)  # gpt-4o's input: $2.50


def test_the_estimate_models_claudes_cache_writes_and_reads(tmp_path: Path) -> None:
    """For a Claude model the estimate writes each call's new prompt to the cache and reads
    the prefix an earlier call marked; an hour's TTL costs more than five minutes'."""
    job = load_job("code-improve")
    inp = write_jsonl(tmp_path / "in.jsonl", long_tasks(4, tokens=2000))
    models = {"generate": MODEL, "refine": MODEL, "feedback": MODEL}
    short = from_prompts(job, inp, Settings(model=MODEL, max_iters=2), PriceBook(), models)
    long = from_prompts(
        job, inp, Settings(model=MODEL, max_iters=2, cache_ttl="1h"), PriceBook(), models
    )
    high = short.scenarios["high"]
    assert high.cache_write_tokens > 0 and high.cached_tokens > 0
    assert high.cached_tokens + high.cache_write_tokens <= high.prompt_tokens
    assert high.cost_usd is not None and high.uncached_cost_usd is not None
    assert high.cost_usd < high.uncached_cost_usd
    assert (long.scenarios["high"].cost_usd or 0) > high.cost_usd
    assert "cache writes" in render_estimate(short)


def test_a_killed_claude_run_resumes_repeating_only_calls_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`refine run --model anthropic:NAME` SIGKILLed mid-run, then the same command: every
    record done once, no call sent again and no answer billed but lost beyond those in
    flight at the kill."""
    n, concurrency = 16, 4
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(n))
    out = tmp_path / "run"
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    with Simulator(SimConfig(api_key=KEY, latency_s=0.03, p_done=0.0)) as sim:
        args = (
            *run_args(inp, out, sim.anthropic_url, "--model", MODEL, "--max-iters", "2"),
            "--concurrency",
            str(concurrency),
            "--quiet",
        )
        proc = start(*args)
        wait_for_calls(out, 20, proc)
        proc.kill()
        proc.communicate()
        final = refine(*args)
        sent = Counter(_conversation(b) for b in sim.completed_bodies())
        bill = sim.bill.to_json()
    assert proc.returncode == -9 and final.returncode == 0, final.stderr
    outputs = read_jsonl(out / "outputs.jsonl")
    assert sorted(o["id"] for o in outputs) == sorted(f"r{i}" for i in range(n))
    assert all(o["status"] == "done" for o in outputs)
    assert sum(count - 1 for count in sent.values()) <= concurrency
    # Answers billed but lost with the process: at most the calls in flight at the kill.
    lost = bill["answers"] - sum(o["usage"]["calls"] for o in outputs)
    assert 0 <= lost <= concurrency
    assert sum(o["cost_usd"] for o in outputs) <= bill["total_usd"] + 1e-9


def _conversation(body: dict[str, Any]) -> bytes:
    """A Messages request's system prompt and turns, without its cache breakpoints."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k != "cache_control"}
        return [plain(v) for v in value] if isinstance(value, list) else value

    return orjson.dumps([plain(body.get("system")), plain(body["messages"])])


def test_the_command_line_takes_the_format_level_and_the_ttl() -> None:
    """`refine run --structured text --cache-ttl 1h` reach the settings (text: the level
    that keeps a Claude record's calls on one cached prefix)."""
    line = ["run", "code-improve", "in.jsonl", "--out", "o", "--model", MODEL]
    args = build_parser().parse_args([*line, "--structured", "text", "--cache-ttl", "1h"])
    settings = settings_from_args(args)
    assert (settings.structured, settings.cache_ttl, settings.model) == ("text", "1h", MODEL)
    plain = settings_from_args(build_parser().parse_args(["run", "j", "i", "--out", "o"]))
    assert (plain.structured, plain.cache_ttl) == ("json_schema", None)
