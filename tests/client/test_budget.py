"""Spending under control: prices, the budget cap, cost in outputs and status, the critic model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from pipeline import BudgetReached, ConfigError, RunDirError, Settings, run
from pipeline.client.budget import PROMPT_MARGIN, Budget
from pipeline.client.prices import BUILTIN, Price, PriceBook, load_prices
from pipeline.commands.status import collect, render
from pipeline.core.steps import Step
from pipeline.core.trace import steps_of
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl

# Dear enough that a few hundred small simulator calls cost dollars.
PRICES: dict[str, dict[str, float]] = {
    "sim-model": {"input": 20.0, "output": 80.0},
    "critic-model": {"input": 10, "output": 40},
}


def price_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.json"
    path.write_bytes(orjson.dumps(PRICES))
    return path


# -- prices ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o-mini", BUILTIN["gpt-4o-mini"]),
        ("gpt-4o-mini-2024-07-18", BUILTIN["gpt-4o-mini"]),  # a dated snapshot: its family
        ("gpt-4o", BUILTIN["gpt-4o"]),  # not confused with gpt-4o-mini
        ("local:qwen2.5-coder-0.5b", Price(0.0, 0.0, 0.0, 1.0)),
        ("my-finetune", None),  # unknown: no guess
        (None, None),
    ],
)
def test_price_lookup(model: str | None, expected: Price | None) -> None:
    """Built-in prices by name and snapshot; local models are free; unknown models have none."""
    assert PriceBook().price(model) == expected


@pytest.mark.parametrize(
    ("usage", "batch", "dollars"),
    [
        ({"prompt_tokens": 1_000_000, "completion_tokens": 0}, False, 2.0),
        ({"prompt_tokens": 0, "completion_tokens": 1_000_000}, False, 8.0),
        ({"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}, True, 5.0),
        (
            {"prompt_tokens": 1_000_000, "cached_tokens": 500_000, "completion_tokens": 0},
            False,
            1.25,
        ),
    ],
)
def test_price_cost_table(usage: dict[str, int], batch: bool, dollars: float) -> None:
    """Cost = uncached prompt at input, cached prompt at cached_input, completion at output."""
    assert Price(2.0, 8.0, 0.5).cost(usage, batch=batch) == pytest.approx(dollars)


def test_price_file_overrides_and_extends(tmp_path: Path) -> None:
    """--prices (JSON or TOML) adds models and replaces built-in prices."""
    toml = tmp_path / "p.toml"
    toml.write_text(
        '[gpt-4o-mini]\ninput = 1\noutput = 2\n\n["my-model"]\ninput = 0.5\noutput = 1.5\n'
    )
    book = PriceBook(load_prices(toml))
    assert book.price("gpt-4o-mini") == Price(1.0, 2.0)
    assert book.price("my-model") == Price(0.5, 1.5)
    assert book.price("gpt-4o") == BUILTIN["gpt-4o"]
    js = tmp_path / "p.json"
    js.write_bytes(orjson.dumps({"m": {"input": 1, "output": 2, "batch": 0.4}}))
    assert PriceBook(load_prices(js)).price("m") == Price(1.0, 2.0, None, 0.4)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"m": {"input": 1}}', "missing 'output'"),
        ('{"m": {"input": -1, "output": 2}}', "must be >= 0"),
        ('{"m": {"input": "x", "output": 2}}', "expected a number"),
        ('{"m": {"input": 1, "output": 2, "cheap": true}}', "unknown key 'cheap'"),
        ("[1, 2]", "expected a table of model names"),
        ("{not json", "not valid JSON or TOML"),
    ],
)
def test_bad_price_file_names_the_problem(tmp_path: Path, content: str, message: str) -> None:
    """A broken price file is refused with its path and the offending model and key."""
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as info:
        load_prices(path)
    assert str(path) in str(info.value)


def test_steps_cost_uses_each_steps_model_and_batch_discount() -> None:
    """Each step is priced by its own model; a Batch API step at the batch factor."""
    book = PriceBook({"gen": Price(1.0, 1.0), "critic": Price(10.0, 10.0)})
    usage = {"prompt_tokens": 500_000, "completion_tokens": 500_000}
    steps = [
        Step("generate", 0, [], "a", None, usage, 0.1, 1, model="gen"),
        Step("feedback", 0, [], "{}", {}, usage, 0.1, 1, model="critic"),
        Step("refine", 1, [], "b", None, usage, 0.1, 1, model=None, batch_id="batch_1"),
    ]
    cost = book.steps_cost(steps, {"refine": "gen"})
    assert cost == pytest.approx(1.0 + 10.0 + 0.5)
    unknown = [Step("generate", 0, [], "a", None, usage, 0.1, 1, model="other")]
    assert book.steps_cost(unknown, {}) is None


# -- the budget --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_budget_reserves_worst_case_and_settles_real_usage() -> None:
    """A request holds prompt estimate (with margin) + max_tokens; the answer settles it."""
    budget = Budget(1.0, PriceBook({"m": Price(1000.0, 1000.0)}))
    held = await budget.reserve("m", 100, 200)
    worst = (math.ceil(100 * PROMPT_MARGIN) + 200) * 1000 / 1e6
    assert held is not None and held.amount == pytest.approx(worst)
    assert budget.reserved == pytest.approx(worst)
    budget.settle(held, {"prompt_tokens": 90, "completion_tokens": 10})
    assert budget.reserved == 0.0 and budget.spent == pytest.approx(0.1)


@pytest.mark.anyio
async def test_budget_waits_for_requests_in_flight_then_refuses() -> None:
    """A request that does not fit waits while others hold money; with nothing held it refuses."""
    budget = Budget(1.0, PriceBook({"m": Price(1000.0, 1000.0)}))
    first = await budget.reserve("m", 0, 600)  # $0.60 held
    got: list[object] = []

    async def second() -> None:
        try:
            got.append(await budget.reserve("m", 0, 600))
        except BudgetReached as err:
            got.append(err)

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.sleep(0.01)
        assert got == [], "the second request must wait, not fail, while the first is held"
        budget.settle(first, {"prompt_tokens": 0, "completion_tokens": 100})  # cost $0.10
    assert got and not isinstance(got[0], BudgetReached)  # $0.10 + $0.60 fits
    budget.settle(got[0], {"prompt_tokens": 0, "completion_tokens": 600})  # type: ignore[arg-type]
    assert budget.spent == pytest.approx(0.7) and budget.held == 0
    with pytest.raises(BudgetReached, match="larger --budget"):
        await budget.reserve("m", 0, 600)
    assert budget.reached


# -- whole runs --------------------------------------------------------------------------------


def test_budget_stops_the_run_within_the_cap_and_a_larger_one_finishes(tmp_path: Path) -> None:
    """--budget 0.25: exit 6, spend <= $0.25; a larger budget finishes all 300, no call again."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(300))
    out = tmp_path / "run"
    prices = price_file(tmp_path)
    with Simulator(SimConfig(p_done=0.3)) as sim:
        base: dict[str, Any] = dict(
            model="sim-model",
            base_url=sim.url,
            max_iters=2,
            concurrency=64,
            prices=str(prices),
        )
        capped = run(
            "code-improve",
            inp,
            out,
            Settings(**base, budget=0.25),
            api_key="k",
            show_progress=False,
        )
        answered = len(sim.completed_bodies())
        spent = _server_spend(sim, PRICES["sim-model"])
        info = collect(out)
        more = run(
            "code-improve",
            inp,
            out,
            Settings(**base, budget=50.0),
            api_key="k",
            show_progress=False,
        )
        answered_total = len(sim.completed_bodies())
        spent_total = _server_spend(sim, PRICES["sim-model"])
    assert capped.exit_code == 6
    assert "budget reached" in (capped.message or "")
    assert 0 < spent <= 0.25
    assert info["cost_usd"] == pytest.approx(spent, rel=1e-6)
    assert "of --budget $0.25" in render(info)
    assert info["pending"] > 0
    assert more.exit_code == 0
    outs = read_jsonl(out / "outputs.jsonl")
    assert len(outs) == 300 and all(o["status"] == "done" for o in outs)
    assert answered_total == sum(o["usage"]["calls"] for o in outs), "a call was repeated"
    assert answered < answered_total
    total_cost = sum(o["cost_usd"] for o in outs)
    assert total_cost == pytest.approx(spent_total, rel=1e-6)


def _server_spend(sim: Simulator, price: dict[str, float]) -> float:
    """Dollars of every answer the server gave, from its own log of usage."""
    return (
        sum(
            r.prompt_tokens * price["input"] + r.completion_tokens * price["output"]
            for r in sim.requests
        )
        / 1e6
    )


def test_budget_with_unknown_price_is_refused(tmp_path: Path) -> None:
    """A budget for a model with no price stops at start, naming --prices."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    with (
        Simulator(SimConfig()) as sim,
        pytest.raises(ConfigError, match="--prices") as info,
    ):
        run(
            "code-improve",
            inp,
            tmp_path / "run",
            Settings(model="sim-model", base_url=sim.url, budget=1.0),
            api_key="k",
            show_progress=False,
        )
    assert "sim-model" in str(info.value)
    assert not sim.requests


def test_cost_per_record_and_in_status(tmp_path: Path) -> None:
    """Each output line carries cost_usd; status sums it; unknown prices stay unknown."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    with Simulator(SimConfig(p_done=1.0)) as sim:
        s = Settings(
            model="sim-model", base_url=sim.url, max_iters=1, prices=str(price_file(tmp_path))
        )
        run("code-improve", inp, tmp_path / "priced", s, api_key="k", show_progress=False)
        plain = Settings(model="sim-model", base_url=sim.url, max_iters=1)
        run("code-improve", inp, tmp_path / "unpriced", plain, api_key="k", show_progress=False)
    outs = read_jsonl(tmp_path / "priced" / "outputs.jsonl")
    price = PRICES["sim-model"]
    for o in outs:
        u = o["usage"]
        expected = (
            u["prompt_tokens"] * price["input"] + u["completion_tokens"] * price["output"]
        ) / 1e6
        assert o["cost_usd"] == pytest.approx(expected)
    assert collect(tmp_path / "priced")["cost_usd"] == pytest.approx(
        sum(o["cost_usd"] for o in outs)
    )
    assert all(o["cost_usd"] is None for o in read_jsonl(tmp_path / "unpriced" / "outputs.jsonl"))
    info = collect(tmp_path / "unpriced")
    assert info["cost_usd"] is None and "unknown" in render(info)


def test_critic_on_another_model(tmp_path: Path) -> None:
    """--feedback-model: every feedback call reaches the critic, the rest the generator; traced."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(8))
    with Simulator(SimConfig(models=("sim-model", "critic-model"), p_done=0.3)) as sim:
        s = Settings(
            model="sim-model",
            base_url=sim.url,
            feedback_model="critic-model",
            max_iters=2,
            prices=str(price_file(tmp_path)),
        )
        summary = run("code-improve", inp, tmp_path / "run", s, api_key="k", show_progress=False)
        bodies = sim.completed_bodies()
    assert summary.exit_code == 0
    for body in bodies:
        wants_feedback = "response_format" in body
        assert body["model"] == ("critic-model" if wants_feedback else "sim-model")
    steps = [s for t in read_jsonl(tmp_path / "run" / "traces.jsonl") for s in t["steps"]]
    assert {(s["role"] == "feedback", s["model"]) for s in steps} == {
        (True, "critic-model"),
        (False, "sim-model"),
    }
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert (manifest["model"], manifest["feedback_model"]) == ("sim-model", "critic-model")
    # prices apply per model: the record's cost splits by the role of each step
    book = PriceBook(load_prices(tmp_path / "prices.json"))
    for t, o in zip(
        sorted(read_jsonl(tmp_path / "run" / "traces.jsonl"), key=lambda x: str(x["id"])),
        sorted(read_jsonl(tmp_path / "run" / "outputs.jsonl"), key=lambda x: str(x["id"])),
        strict=True,
    ):
        steps_ = steps_of(t["steps"])
        assert o["cost_usd"] == pytest.approx(book.steps_cost(steps_, {}))
    # the critic is part of the run's identity
    with (
        Simulator(SimConfig(models=("sim-model", "critic-model"))) as sim,
        pytest.raises(RunDirError, match="feedback_model"),
    ):
        other = Settings(model="sim-model", base_url=sim.url, max_iters=2)
        run("code-improve", inp, tmp_path / "run", other, api_key="k", show_progress=False)
