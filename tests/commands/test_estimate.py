"""`refine estimate`: calls, tokens and dollars before a run, from prompts or from a sample."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from pipeline import Settings, load_job
from pipeline.client.prices import Price, PriceBook
from pipeline.commands.estimate import from_prompts, from_sample, render, run_estimate
from pipeline.commands.status import collect
from pipeline.runs.settings import effective_job
from pipeline.testing.simulator import SimConfig, Simulator
from tests.client.test_caching import PRICES, SIM_PRICES, long_tasks
from tests.helpers import read_jsonl, tasks, write_jsonl

JOB = load_job("code-improve")  # scored; plain Self-Refine
MODELS = {"generate": "m", "refine": "m", "feedback": "m"}


@pytest.mark.parametrize("max_iters", [0, 1, 3])
def test_calls_per_scenario_follow_the_loop(tmp_path: Path, max_iters: int) -> None:
    """low = generate + one feedback; high = the whole budget plus the scoring feedback."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    est = from_prompts(JOB, inp, Settings(max_iters=max_iters), PriceBook(), MODELS)
    calls = {name: f.calls for name, f in est.scenarios.items()}
    if max_iters == 0:
        assert calls == {"low": 40, "expected": 40, "high": 40}
    else:
        assert calls["low"] == 40 * 2
        assert calls["high"] == 40 * (1 + 2 * max_iters + 1)
        assert calls["low"] < calls["expected"] <= calls["high"]
    low, exp, high = (est.scenarios[n] for n in ("low", "expected", "high"))
    assert low.prompt_tokens <= exp.prompt_tokens <= high.prompt_tokens
    assert high.completion_tokens == high.calls * JOB.max_tokens


def test_strategies_add_their_calls_to_the_estimate(tmp_path: Path) -> None:
    """Each strategy's calls are counted: samples=2 drafts every answer twice; restart adds a
    draft per refinement (expected and high); copy-retry one per refinement (high only)."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    plain = from_prompts(JOB, inp, Settings(max_iters=2), PriceBook(), MODELS)
    assert plain.scenarios["high"].calls == 10 * (1 + 2 * 2 + 1)
    settings = Settings(max_iters=2, strategy=("samples=2", "restart", "copy-retry"))
    job = effective_job(JOB, settings)
    est = from_prompts(job, inp, settings, PriceBook(), MODELS)
    assert est.scenarios["low"].calls == 10 * (2 + 1)
    assert est.scenarios["expected"].calls == 10 * (2 + (1 + 2 + 1) + 1)
    assert est.scenarios["high"].calls == 10 * (2 + 2 * (1 + 2 + 1 + 1) + 1)


def test_the_layout_lets_a_cache_serve_the_history(tmp_path: Path) -> None:
    """With long inputs, each call after a record's first repeats the one before as its
    prefix: the estimate counts that share as cached, and prices it with and without."""
    long_tasks = [{"id": f"t{i}", "task": f"Task {i}: " + "word " * 3000} for i in range(5)]
    inp = write_jsonl(tmp_path / "in.jsonl", long_tasks)
    prices = PriceBook({"m": Price(1.0, 2.0, 0.1)})
    est = from_prompts(JOB, inp, Settings(max_iters=2), prices, MODELS)
    high = est.scenarios["high"]
    assert 0.6 < high.cached_tokens / high.prompt_tokens < 1.0
    assert high.cost_usd is not None and high.uncached_cost_usd is not None
    assert high.cost_usd < 0.5 * high.uncached_cost_usd
    short = from_prompts(
        JOB, write_jsonl(tmp_path / "s.jsonl", tasks(5)), Settings(), prices, MODELS
    )
    assert short.scenarios["low"].cached_tokens == 0  # prompts under 1,024 tokens: no cache
    assert "no cache" in render(est)


def test_a_local_critic_is_sized_with_the_schema_in_its_prompt(tmp_path: Path) -> None:
    """The local server's critic reads the schema spelled out in its prompt (its grammar
    shows the model nothing): each of its feedback prompts is sized with it."""
    from pipeline.client.formats import schema_instruction
    from pipeline.client.limits import estimate_tokens

    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    local = {**MODELS, "feedback": "local:tiny"}
    remote = from_prompts(JOB, inp, Settings(max_iters=1), PriceBook(), MODELS)
    shown = from_prompts(JOB, inp, Settings(max_iters=1), PriceBook(), local)
    assert JOB.feedback_schema is not None
    each = estimate_tokens([{"role": "user", "content": schema_instruction(JOB.feedback_schema)}])
    low = shown.scenarios["low"].prompt_tokens - remote.scenarios["low"].prompt_tokens
    assert low == pytest.approx(10 * each, rel=0.05)  # one feedback per record, low
    assert shown.scenarios["low"].calls == remote.scenarios["low"].calls


def test_scaled_to_the_input_from_its_first_records(tmp_path: Path) -> None:
    """Prompts of the first records are scaled to every input line (and to --limit)."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(100))
    whole = from_prompts(JOB, inp, Settings(max_iters=1), PriceBook(), MODELS, prompt_records=10)
    part = from_prompts(JOB, inp, Settings(max_iters=1, limit=50), PriceBook(), MODELS)
    assert (whole.records, part.records) == (100, 50)
    assert whole.scenarios["high"].calls == 100 * 4
    assert part.scenarios["high"].calls == 50 * 4


def test_dollars_use_the_prices_and_batch_discount(tmp_path: Path) -> None:
    """Dollars come from the price table (half with --batch); an unknown price says so."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    book = PriceBook({"m": Price(1.0, 2.0)})
    est = from_prompts(JOB, inp, Settings(max_iters=1), book, MODELS)
    high = est.scenarios["high"]
    assert high.cost_usd == pytest.approx(
        (high.prompt_tokens * 1.0 + high.completion_tokens * 2.0) / 1e6, rel=1e-3
    )
    batch = from_prompts(JOB, inp, Settings(max_iters=1, batch=True), book, MODELS)
    assert batch.scenarios["high"].cost_usd == pytest.approx(high.cost_usd / 2, rel=1e-3)  # type: ignore[operator]
    unknown = from_prompts(JOB, inp, Settings(max_iters=1), PriceBook(), MODELS)
    assert unknown.scenarios["low"].cost_usd is None
    assert "--prices" in render(unknown)


def test_sample_extrapolates_mean_with_an_interval() -> None:
    """From a sample: expected = mean x records; low and high bound the 90% interval."""
    per = [(4, 100, 50, 0.01, 50, 0.02), (6, 140, 70, 0.03, 70, 0.05)]
    est = from_sample(per, 1000)
    exp = est.scenarios["expected"]
    assert (exp.calls, exp.prompt_tokens, exp.completion_tokens) == (5000, 120_000, 60_000)
    assert exp.cost_usd == pytest.approx(20.0)
    assert exp.cached_tokens == 60_000 and exp.uncached_cost_usd == pytest.approx(35.0)
    assert est.scenarios["low"].calls < 5000 < est.scenarios["high"].calls


def test_sample_runs_for_real_and_is_not_paid_again(tmp_path: Path) -> None:
    """`refine estimate --sample 10 --out DIR`, then `refine run --out DIR`: no record twice."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    out = tmp_path / "run"
    with Simulator(SimConfig(p_done=0.5)) as sim:
        settings = Settings(model="sim-model", base_url=sim.url, max_iters=1)
        static, sampled = run_estimate("code-improve", inp, settings, sample=10, out=out)
        sampled_calls = len(sim.completed_bodies())
        env = {**os.environ, "OPENAI_API_KEY": "k"}
        args = ["run", "code-improve", str(inp), "--out", str(out), "--base-url", sim.url]
        full = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.cli",
                *args,
                "--model",
                "sim-model",
                "--max-iters",
                "1",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        total_calls = len(sim.completed_bodies())
    assert full.returncode == 0, full.stderr
    assert sampled.records == 40 and "10 records run for real" in sampled.basis
    assert sampled.scenarios["expected"].calls == pytest.approx(sampled_calls * 4, abs=1)
    outs = read_jsonl(out / "outputs.jsonl")
    assert len(outs) == 40
    assert total_calls == sum(o["usage"]["calls"] for o in outs)
    assert static.scenarios["low"].calls == 80


def test_estimate_command_prints_three_scenarios(tmp_path: Path) -> None:
    """`refine estimate JOB INPUT` prints low, expected and high; --json gives the figures."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(5))
    cmd = [sys.executable, "-m", "pipeline.cli", "estimate", "code-improve", str(inp)]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert all(word in text.stdout for word in ("low", "expected", "high", "$"))
    js = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60)
    [est] = orjson.loads(js.stdout)
    assert est["records"] == 5 and set(est["scenarios"]) == {"low", "expected", "high"}


def test_a_sample_shows_the_cache_as_status_does(tmp_path: Path) -> None:
    """`estimate --sample` prints the cached share `refine status` shows for the same
    sample, and a cost without the cache above the cost with it (not 0% and unknown)."""
    prices = tmp_path / "prices.json"
    prices.write_bytes(orjson.dumps(PRICES))
    inp = write_jsonl(tmp_path / "in.jsonl", long_tasks(20))
    out = tmp_path / "sample"
    with Simulator(SimConfig(p_done=0.0, **SIM_PRICES)) as sim:
        settings = Settings(
            model="sim-model", base_url=sim.url, max_iters=2, checks=False,
            prices=str(prices),
        )  # fmt: skip
        _, sampled = run_estimate("code-improve", inp, settings, sample=5, out=out)
    info = collect(out)
    exp = sampled.scenarios["expected"]
    status_share = info["cached_tokens"] / info["prompt_tokens"]
    assert status_share > 0.3
    assert exp.cached_tokens / exp.prompt_tokens == pytest.approx(status_share, abs=0.01)
    assert exp.cost_usd == pytest.approx(info["cost_usd"] * 4, rel=0.01)  # 20 records of 5
    assert exp.cost_usd is not None and exp.uncached_cost_usd is not None
    assert exp.uncached_cost_usd > exp.cost_usd
    text = render(sampled)
    assert f"{status_share:.0%}" in text and "unknown" not in text
