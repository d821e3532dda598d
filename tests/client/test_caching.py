"""The provider's prefix cache: the simulator's model of it, prompt_cache_key, and cached
tokens priced at the cached rate in every figure (outputs, status, report, the bill)."""

from __future__ import annotations

import http.server
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from pipeline import Settings, run
from pipeline.commands.status import collect, render
from pipeline.report.aggregate import summarize
from pipeline.testing.simulator import SimConfig, Simulator
from pipeline.testing.simulator.caching import prefixes
from tests.helpers import read_jsonl, sent, write_jsonl

# The simulator's bill and the run's --prices agree: dollars per million tokens.
PRICES = {"sim-model": {"input": 1.0, "cached_input": 0.25, "output": 4.0, "batch": 0.5}}
SIM_PRICES: dict[str, Any] = dict(price_input=1.0, price_cached_input=0.25, price_output=4.0)


def long_tasks(n: int, tokens: int = 3000) -> list[dict[str, str]]:
    """``n`` code-improve records whose task is about ``tokens`` tokens long (4 chars each)."""
    rows = []
    for i in range(n):
        head = f"Record {i}: write a Python function that sums a list, given this context.\n"
        body = "".join(f"context line {k} of record {i}: the list is long.\n" for k in range(400))
        rows.append({"id": f"r{i}", "task": (head + body)[: tokens * 4]})
    return rows


def _prices(tmp_path: Path) -> str:
    path = tmp_path / "prices.json"
    path.write_bytes(orjson.dumps(PRICES))
    return str(path)


def _chat(sim: Simulator, messages: list[dict[str, str]], **extra: Any) -> Any:
    with openai.OpenAI(base_url=sim.url, api_key="k", max_retries=0) as c:
        return c.chat.completions.create(
            model="sim-model",
            messages=messages,  # type: ignore[arg-type]  # plain dicts, not the SDK's TypedDicts
            max_tokens=5,
            extra_body=extra or None,
        )


def _cached(reply: Any) -> int:
    return int(reply.usage.prompt_tokens_details.cached_tokens)


# -- the simulator's cache -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shared_chars", "expected"),
    [
        (1023 * 4, 0),  # under 1,024 tokens shared: nothing
        (1024 * 4, 1024),
        (1151 * 4, 1024),  # rounded down to 1,024 + a multiple of 128
        (1152 * 4, 1152),
        (2000 * 4, 1920),
    ],
)
def test_sim_cache_serves_the_shared_prefix_in_steps_of_128(
    shared_chars: int, expected: int
) -> None:
    """The longest prefix seen before, rounded down to 1,024 + k*128 tokens, is cached."""
    with Simulator(SimConfig()) as sim:
        shared = "s" * shared_chars
        assert _cached(_chat(sim, [{"role": "user", "content": shared + "a" * 12000}])) == 0
        again = _chat(sim, [{"role": "user", "content": shared + "b" * 12000}])
        assert _cached(again) == expected


def test_sim_cache_is_per_model_key_and_role_and_expires() -> None:
    """Another prompt_cache_key, another role layout, or an expired entry: no cached tokens."""
    text = "x" * 8000
    msgs = [{"role": "system", "content": text}, {"role": "user", "content": "q" * 100}]
    with Simulator(SimConfig(cache_ttl_s=0.3)) as sim:
        assert _cached(_chat(sim, msgs, prompt_cache_key="a")) == 0
        assert _cached(_chat(sim, msgs, prompt_cache_key="a")) == 1920  # of 2,025
        assert _cached(_chat(sim, msgs, prompt_cache_key="b")) == 0
        as_user = [{"role": "user", "content": text}, msgs[1]]
        assert _cached(_chat(sim, as_user, prompt_cache_key="a")) == 0
        time.sleep(0.4)
        assert _cached(_chat(sim, msgs, prompt_cache_key="a")) == 0
    with Simulator(SimConfig(prefix_cache=False)) as sim:
        _chat(sim, msgs)
        assert _cached(_chat(sim, msgs)) == 0


def test_prefixes_tell_message_boundaries_apart() -> None:
    """The same characters split into messages differently are different prefixes."""
    a = prefixes("m", [("user", "x" * 4096), ("user", "y" * 600)])
    b = prefixes("m", [("user", "x" * 4000), ("user", "x" * 96 + "y" * 600)])
    assert [t for t, _ in a] == [1024, 1152] and [t for t, _ in b] == [1024, 1152]
    assert a[0][1] != b[0][1]


def test_sim_bills_cached_tokens_at_the_cached_price() -> None:
    """The bill: uncached prompt at the input price, cached at the cached price, output."""
    msgs = [{"role": "user", "content": "z" * 8000}]
    with Simulator(SimConfig(**SIM_PRICES)) as sim:
        first, second = _chat(sim, msgs), _chat(sim, msgs)
        charges = sim.bill.charges()
    assert [c.cached_tokens for c in charges] == [0, 1920]
    u = second.usage
    want = ((u.prompt_tokens - 1920) * 1.0 + 1920 * 0.25 + u.completion_tokens * 4.0) / 1e6
    assert charges[1].usd == pytest.approx(want)
    assert charges[0].usd == pytest.approx(
        (first.usage.prompt_tokens * 1.0 + first.usage.completion_tokens * 4.0) / 1e6
    )


# -- the pipeline against it -----------------------------------------------------------------


def test_code_improve_prompts_hit_the_cache_and_cost_matches_the_bill(tmp_path: Path) -> None:
    """30 records of ~3,000 tokens, refined twice: >= 60% of distinct prompts' tokens cached,
    no request sent twice, reported cost within 1% of the server's bill; status and the
    report count the cached tokens."""
    inp = write_jsonl(tmp_path / "in.jsonl", long_tasks(30))
    out = tmp_path / "run"
    cfg = SimConfig(latency_s=0.002, p_done=0.0, **SIM_PRICES)
    with Simulator(cfg) as sim:
        settings = Settings(
            model="sim-model",
            base_url=sim.url,
            max_iters=2,
            concurrency=16,
            checks=False,
            prices=_prices(tmp_path),
        )
        summary = run("code-improve", inp, out, settings, api_key="k", show_progress=False)
        bodies = sim.completed_bodies()
        charges = sim.bill.charges()
    assert summary.exit_code == 0
    seen: dict[bytes, int] = {}
    for body, charge in zip(bodies, charges, strict=True):
        key = orjson.dumps(body["messages"])
        assert key not in seen, "no two requests with identical messages"
        seen[key] = charge.cached_tokens
        assert body["prompt_cache_key"].startswith("r")
    prompt = sum(c.prompt_tokens for c in charges)
    cached = sum(c.cached_tokens for c in charges)
    assert cached / prompt >= 0.6, (cached, prompt)
    traces = read_jsonl(out / "traces.jsonl")
    openings = set()
    for trace in traces:
        asked = sent(trace)
        openings.add(orjson.dumps(asked[0][0]))  # the shared part comes first
        for before, after in pairwise(asked):
            assert after[: len(before)] == before, "each call extends the previous"
            assert after[len(before)]["role"] == "assistant"
    assert len(openings) == 1
    outputs = read_jsonl(out / "outputs.jsonl")
    assert len(charges) == sum(o["usage"]["calls"] for o in outputs) > 30 * 3
    reported = sum(float(o["cost_usd"]) for o in outputs)
    bill = sim.bill.total_usd()
    assert reported == pytest.approx(bill, rel=0.01)
    assert sum(o["usage"]["cached_tokens"] for o in outputs) == cached
    uncached = sum(c.prompt_tokens * 1.0 + c.completion_tokens * 4.0 for c in charges) / 1e6
    assert bill < 0.6 * uncached  # the cached price is what made it cheaper
    info = collect(out)
    assert (info["cached_tokens"], info["prompt_tokens"]) == (cached, prompt)
    assert info["cost_usd"] == pytest.approx(bill, rel=0.01)
    assert f"{cached} cached" in render(info)
    report = summarize(out)
    assert report.cached_tokens == cached
    assert report.cost_usd == pytest.approx(bill, rel=0.01)
    print(f"cached share {cached / prompt:.3f}, reported ${reported:.6f}, bill ${bill:.6f}")


def test_record_id_is_the_prompt_cache_key_until_the_endpoint_refuses_it(tmp_path: Path) -> None:
    """A 400 naming prompt_cache_key drops it for the endpoint: the call goes again without
    it, using up no retry, and no record fails."""
    inp = write_jsonl(tmp_path / "in.jsonl", long_tasks(6, tokens=300))
    out = tmp_path / "run"
    with Simulator(SimConfig(accept_cache_key=False, p_done=0.0)) as sim:
        settings = Settings(
            model="sim-model", base_url=sim.url, max_iters=1, max_retries=0, checks=False
        )
        summary = run("code-improve", inp, out, settings, api_key="k", show_progress=False)
        requests = sim.requests
    assert summary.exit_code == 0
    refused = [r for r in requests if r.status == 400]
    assert refused and all("prompt_cache_key" in r.body for r in refused)
    answered = [r for r in requests if r.status == 200]
    assert answered and all("prompt_cache_key" not in r.body for r in answered)
    # only the calls in flight when the endpoint first refused it sent the key
    assert len(refused) <= 6
    assert all(o["status"] == "done" for o in read_jsonl(out / "outputs.jsonl"))

    with Simulator(SimConfig(p_done=1.0)) as sim:
        settings = Settings(model="sim-model", base_url=sim.url, max_iters=1, checks=False)
        run("code-improve", inp, tmp_path / "run2", settings, api_key="k", show_progress=False)
        keys = {r.body["prompt_cache_key"] for r in sim.requests}
    assert keys == {f"r{i}" for i in range(6)}


class _NamesTheKeyAlways(http.server.BaseHTTPRequestHandler):
    """A server whose every answer is a 400 naming prompt_cache_key, sent or not."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = orjson.dumps(
            {"error": {"message": "prompt_cache_key: bad request", "type": "invalid_request"}}
        )
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_400_naming_the_key_after_it_was_dropped_fails_the_call(tmp_path: Path) -> None:
    """Once a call goes without the key, a 400 naming it is the request's own fault: the
    record fails instead of the call going round again for ever."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NamesTheKeyAlways)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        settings = Settings(model="m", base_url=url, max_iters=1, max_retries=0, checks=False)
        inp = write_jsonl(tmp_path / "in.jsonl", long_tasks(1, tokens=50))
        summary = run("code-improve", inp, tmp_path / "run", settings, api_key="k")
    finally:
        server.shutdown()
        server.server_close()
    assert summary.exit_code == 1
    (out,) = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert out["status"] == "failed" and "prompt_cache_key" in out["error"]["message"]
