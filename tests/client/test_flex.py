"""--service-tier: sent on every call, stored in the manifest and changeable; the flex tier
priced at the batch rate, its 429 resource_unavailable waited out as capacity."""

from __future__ import annotations

from dataclasses import replace
from functools import partialmethod
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from pipeline import Settings, run
from pipeline.cli.parser import build_parser, settings_from_args
from pipeline.client.budget import Budget, Reservation
from pipeline.client.chat import OpenAIClient
from pipeline.client.delays import DELAYS, Backoff
from pipeline.client.flex import FLEX_TIMEOUT_S, Capacity
from pipeline.client.limits import Limiter
from pipeline.client.prices import Price, PriceBook
from pipeline.commands.estimate import run_estimate
from pipeline.core.steps import Request, Step
from pipeline.errors import ConfigError
from pipeline.report.aggregate import summarize
from pipeline.runs.rundir import RunDir
from pipeline.runs.settings import DEFAULT_TIMEOUT_S, resolve
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

PRICES = {"sim-model": {"input": 1.0, "cached_input": 0.25, "output": 4.0, "batch": 0.5}}
SIM_PRICES: dict[str, Any] = dict(
    price_input=1.0, price_cached_input=0.25, price_output=4.0, batch_discount=0.5
)


def _prices(tmp_path: Path) -> str:
    path = tmp_path / "prices.json"
    path.write_bytes(orjson.dumps(PRICES))
    return str(path)


# -- the simulator's tiers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "served"),
    [(None, "default"), ("auto", "default"), ("default", "default"), ("priority", "priority")],
)
def test_sim_echoes_the_tier_that_served(asked: str | None, served: str) -> None:
    """default and priority are echoed, auto (and no tier) served as default."""
    with Simulator(SimConfig()) as sim, openai.OpenAI(base_url=sim.url, api_key="k") as c:
        extra = {} if asked is None else {"service_tier": asked}
        r = c.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hi"}], extra_body=extra
        )
        assert r.service_tier == served
        assert sim.bill.charges()[0].tier == served


def test_sim_flex_is_slower_refuses_some_and_bills_the_batch_rate() -> None:
    """Flex: the answer says flex, comes flex_slowdown times later, a share is refused with
    429 resource_unavailable (never billed), and the bill is at the batch discount."""
    cfg = SimConfig(flex_slowdown=4.0, p_flex_unavailable=0.3, **SIM_PRICES)
    msgs: Any = [{"role": "user", "content": "hello there"}]
    with Simulator(cfg) as sim, openai.OpenAI(base_url=sim.url, api_key="k", max_retries=0) as c:
        answered, refused = [], 0
        for _ in range(30):
            try:
                answered.append(
                    c.chat.completions.create(model="sim-model", messages=msgs, service_tier="flex")
                )
            except openai.RateLimitError as err:
                assert isinstance(err.body, dict) and err.body["code"] == "resource_unavailable"
                assert err.body["type"] == "resource_unavailable"
                refused += 1
        plain = c.chat.completions.create(model="sim-model", messages=msgs)
        charges = sim.bill.charges()
        sim.set_config(replace(cfg, latency_s=0.05, p_flex_unavailable=0.0))
        raw = c.chat.completions.with_raw_response
        slow = raw.create(model="sim-model", messages=msgs, service_tier="flex").elapsed
        fast = raw.create(model="sim-model", messages=msgs).elapsed
    assert 3 <= refused <= 18 and all(r.service_tier == "flex" for r in answered)
    assert len(charges) == len(answered) + 1
    flex, default = charges[0], charges[-1]
    assert flex.tier == "flex" and default.tier == "default"
    assert flex.usd == pytest.approx(default.usd * 0.5)
    assert plain.service_tier == "default"
    assert slow.total_seconds() >= 0.2 > fast.total_seconds()  # flex: 4 x the 50 ms


# -- pricing and settings --------------------------------------------------------------------


def test_a_step_served_by_flex_costs_the_batch_rate() -> None:
    """A traced call on the flex tier is priced at the model's batch factor."""
    book = PriceBook({"m": Price(1.0, 4.0, 0.25, batch=0.5)})
    usage = {"prompt_tokens": 1000, "cached_tokens": 500, "completion_tokens": 100}
    plain = Step("generate", 0, [], "a", None, usage, 0.1, 1, model="m")
    flex = Step("generate", 0, [], "a", None, usage, 0.1, 1, model="m", service_tier="flex")
    assert book.step_cost(plain, None) == pytest.approx((500 + 125 + 400) / 1e6)
    assert book.step_cost(flex, None) == pytest.approx(0.5 * (500 + 125 + 400) / 1e6)


def test_service_tier_option_defaults_and_checks() -> None:
    """--service-tier reaches Settings; flex makes the default timeout 900 s, not --timeout."""
    parser = build_parser()
    args = parser.parse_args(["run", "gsm", "in.jsonl", "--out", "o", "--service-tier", "flex"])
    flex = resolve(settings_from_args(args), 1)
    assert (flex.service_tier, flex.timeout) == ("flex", FLEX_TIMEOUT_S)
    args = parser.parse_args(["run", "gsm", "in.jsonl", "--out", "o"])
    plain = resolve(settings_from_args(args), 1)
    assert (plain.service_tier, plain.timeout) == (None, DEFAULT_TIMEOUT_S)
    assert resolve(Settings(service_tier="flex", timeout=30.0), 1).timeout == 30.0
    with pytest.raises(ConfigError, match="--service-tier"):
        resolve(Settings(service_tier="cheap"), 1)
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "gsm", "in.jsonl", "--out", "o", "--service-tier", "cheap"])


def test_estimate_prices_the_flex_tier_at_the_batch_rate(tmp_path: Path) -> None:
    """refine estimate with --service-tier flex: every scenario at half the default cost."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    plain = run_estimate("code-improve", inp, Settings(prices=_prices(tmp_path), model="sim-model"))
    flex = run_estimate(
        "code-improve",
        inp,
        Settings(prices=_prices(tmp_path), model="sim-model", service_tier="flex"),
    )
    for name, figures in plain[0].scenarios.items():
        other = flex[0].scenarios[name]
        assert figures.cost_usd and other.cost_usd == pytest.approx(figures.cost_usd * 0.5, 1e-3)
        assert figures.uncached_cost_usd is not None
        assert other.uncached_cost_usd == pytest.approx(figures.uncached_cost_usd * 0.5, 1e-3)
    assert "service tier flex, priced at the batch rate" in flex[0].basis


class _Spy(Budget):
    """A budget that records the rate each reservation was held and settled at."""

    def __init__(self) -> None:
        super().__init__(None, PriceBook({"sim-model": Price(1.0, 4.0, 0.25)}))
        self.reserved_at: list[bool] = []
        self.settled_at: list[bool] = []

    async def reserve(
        self, model: str, prompt_estimate: int, max_tokens: int, *, batch: bool = False
    ) -> Reservation | None:
        self.reserved_at.append(batch)
        return await super().reserve(model, prompt_estimate, max_tokens, batch=batch)

    def settle(self, reservation: Reservation | None, usage: Any) -> None:
        assert reservation is not None
        self.settled_at.append(reservation.batch)
        super().settle(reservation, usage)


@pytest.mark.anyio
async def test_client_sends_the_tier_and_reserves_at_its_rate() -> None:
    """service_tier is sent only when set; flex reserves and settles at the batch rate."""
    msgs = ({"role": "user", "content": "hi"},)
    with Simulator(SimConfig()) as sim:
        for tier, batch in (("flex", True), (None, False), ("priority", False)):
            spy = _Spy()
            client = OpenAIClient(
                model="sim-model",
                base_url=sim.url,
                api_key="k",
                timeout=10,
                max_retries=0,
                limiter=Limiter(None, None),
                budget=spy,
                service_tier=tier,
            )
            comp = await client.complete(Request(msgs, temperature=0.0, max_tokens=5))
            await client.aclose()
            assert comp.service_tier == (tier or "default")
            assert (spy.reserved_at, spy.settled_at) == ([batch], [batch])
            assert sim.requests[-1].body.get("service_tier") == tier


# -- runs on the flex tier -------------------------------------------------------------------


def test_150_records_on_flex_with_15_percent_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every record done, every answered call traced on the flex tier, no retry used up and
    no slow-down for a refusal, cost within 1% of the flex-rate bill."""
    # The backoff's first wait a tenth of its 1 s: a call refused five times in a row (it
    # happens in a run this size) then waits 3 s at most, not 30. The run opens its own
    # clients: they are given these delays as they are made.
    quick = replace(DELAYS, flex=Backoff(0.1, DELAYS.flex.cap))
    monkeypatch.setattr(
        OpenAIClient, "__init__", partialmethod(OpenAIClient.__init__, delays=quick)
    )
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(150))
    out = tmp_path / "run"
    cfg = SimConfig(latency_s=0.002, p_flex_unavailable=0.15, p_done=0.3, **SIM_PRICES)
    with Simulator(cfg) as sim:
        settings = Settings(
            model="sim-model",
            base_url=sim.url,
            max_iters=1,
            max_retries=0,  # a refusal that used one up would fail its record
            concurrency=64,
            checks=False,
            prices=_prices(tmp_path),
            service_tier="flex",
        )
        summary = run("code-improve", inp, out, settings, api_key="k", show_progress=False)
        requests, charges = sim.requests, sim.bill.charges()
    assert summary.exit_code == 0
    refused = [r for r in requests if r.outcome == "flex_unavailable"]
    answered = [r for r in requests if r.status == 200]
    assert 0.08 < len(refused) / len(requests) < 0.25, (len(refused), len(requests))
    assert all(r.body.get("service_tier") == "flex" for r in requests)
    outputs = read_jsonl(out / "outputs.jsonl")
    assert len(outputs) == 150 and all(o["status"] == "done" for o in outputs)
    steps = [s for t in read_jsonl(out / "traces.jsonl") for s in t["steps"]]
    assert len(steps) == len(answered) == len(charges)
    assert all(s["service_tier"] == "flex" and s["response"] is not None for s in steps)
    assert {c.tier for c in charges} == {"flex"}
    reported = sum(float(o["cost_usd"]) for o in outputs)
    bill = sim.bill.total_usd()
    assert reported == pytest.approx(bill, rel=0.01)
    progress = orjson.loads((out / "progress.json").read_bytes())
    assert progress.get("rate_limited", 0) == 0  # refusals are no rate-limit signal
    report = summarize(out)
    assert report.tiers == {"flex": len(steps)}
    assert report.cost_usd == pytest.approx(bill, rel=0.01)
    print(
        f"flex: {len(requests)} requests, {len(refused)} refused, {len(answered)} answered; "
        f"reported ${reported:.6f}, bill ${bill:.6f}"
    )


def test_flex_without_capacity_stops_resumable_naming_the_tier(tmp_path: Path) -> None:
    """No flex call succeeds for --max-outage seconds: exit 5, records pending, and the
    message names the flex tier; the next invocation on the default tier finishes."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    out = tmp_path / "run"
    with Simulator(SimConfig(p_flex_unavailable=1.0, p_done=1.0)) as sim:
        base: dict[str, Any] = dict(model="sim-model", base_url=sim.url, max_iters=1, checks=False)
        flex = Settings(**base, service_tier="flex", max_outage=1.0)
        summary = run("code-improve", inp, out, flex, api_key="k", show_progress=False)
        assert summary.exit_code == 5 and "flex tier" in (summary.message or "")
        assert read_jsonl(out / "outputs.jsonl") == []
        manifest = RunDir(out).require_manifest()
        assert manifest.settings.service_tier == "flex"
        # The tier only changes how calls are made: another one continues the same run.
        again = run("code-improve", inp, out, Settings(**base), api_key="k", show_progress=False)
        assert again.exit_code == 0
        assert RunDir(out).require_manifest().settings.service_tier is None
    assert len(read_jsonl(out / "outputs.jsonl")) == 4


def test_capacity_gives_up_only_after_max_s_without_a_success() -> None:
    """A success resets the clock; refusals alone for longer than max_s exceed it."""
    now = [0.0]
    cap = Capacity(10.0, lambda: now[0], DELAYS.flex)
    cap.refusal(1, 0.5)
    now[0] = 9.0
    assert not cap.exceeded()
    cap.succeeded()
    now[0] = 15.0
    cap.refusal(1, 0.5)
    now[0] = 24.0
    assert not cap.exceeded()
    now[0] = 25.5
    assert cap.exceeded() and "flex tier" in str(cap.unavailable(_failure()))


def _failure() -> Any:
    from pipeline.errors import CallError

    return CallError("http_429", "HTTP 429: no capacity", status=429)
