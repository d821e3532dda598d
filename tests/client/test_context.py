"""A record whose prompt cannot fit the model's context window fails without a call."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from pipeline import Settings, load_job, run
from pipeline.client.chat import OpenAIClient
from pipeline.client.context import CONTEXT_LENGTH, context_window, least_tokens, overflow
from pipeline.client.limits import Limiter, estimate_tokens
from pipeline.commands.estimate import render, run_estimate
from pipeline.commands.fit import window_of
from pipeline.core.steps import Request
from pipeline.errors import CallError
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import read_jsonl, tasks, write_jsonl


def user(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


@pytest.mark.parametrize(
    ("text", "window", "refused"),
    [
        ("word " * 98, 100, False),  # 98 words + 1 for the message: 99 < 100
        ("word " * 99, 100, True),  # 100: no token left for the answer
        ("x" * 5000, 100, False),  # one long word may be few tokens: never refused
        ("短文" * 3000, 100, False),  # no spaces: the bound cannot tell, so it lets it go
        ("a b " * 10_000, 1000, True),
    ],
)
def test_overflow_refuses_only_prompts_sure_not_to_fit(
    text: str, window: int, refused: bool
) -> None:
    """The bound is one token per whitespace-separated word and per message: a prompt is
    refused only when that many tokens exceed the window."""
    err = overflow(user(text), window, "m")
    assert (err is not None) == refused
    if err is not None:
        assert err.category == CONTEXT_LENGTH and err.attempts == 0
        assert f"{window:,}-token context window of m" in str(err)


def test_the_bound_never_exceeds_the_projects_estimate() -> None:
    """The lower bound stays at or under estimate_tokens on ordinary text and code."""
    for text in ("The quick brown fox jumps over the lazy dog. " * 50, "def f(x):\n    return x\n"):
        assert least_tokens(user(text)) <= estimate_tokens(user(text))


@pytest.mark.parametrize(
    ("model", "window"),
    [("gpt-4o-mini", 128_000), ("gpt-4o-mini-2024-07-18", 128_000), ("gpt-5", 400_000)],
)
def test_known_models_have_their_window(model: str, window: int) -> None:
    """OpenAI's models (dated snapshots by their family) have their published window."""
    assert context_window(model) == window


def test_unknown_models_have_none_unless_given() -> None:
    """A model outside the table has no window (nothing refused) unless --context-tokens
    gives one; the embedded model's is its server slot."""
    assert context_window("sim-model") is None
    assert window_of("sim-model", Settings()) is None
    assert window_of("sim-model", Settings(context_tokens=4096)) == 4096
    assert window_of("local:qwen2.5-coder-1.5b", Settings()) == 8192


@pytest.mark.anyio
async def test_the_client_sends_no_call_that_cannot_fit() -> None:
    """A prompt past the client's window raises CallError at once; the server sees nothing."""
    with Simulator(SimConfig()) as sim:
        client = OpenAIClient(
            model="m", base_url=sim.url, api_key="k", timeout=5, max_retries=2,
            limiter=Limiter(), rng=random.Random(0), context_tokens=50,
        )  # fmt: skip
        with pytest.raises(CallError) as caught:
            await client.complete(Request(user("word " * 60), temperature=0, max_tokens=10))
        await client.complete(Request(user("word " * 10), temperature=0, max_tokens=10))
        await client.aclose()
        assert caught.value.category == CONTEXT_LENGTH
        assert len(sim.requests) == 1 and client.calls == 1


def long_record(words: int) -> dict[str, str]:
    return {"id": "huge", "task": "Sum a list. " + "context " * words}


def test_a_record_too_long_for_a_known_model_fails_unsent(tmp_path: Path) -> None:
    """gpt-4o-mini's 128,000 tokens: a 200,000-word record fails with a clear error and
    no request, its neighbours run, the run exits 1."""
    inp = write_jsonl(tmp_path / "in.jsonl", [*tasks(2), long_record(200_000)])
    with Simulator(SimConfig()) as sim:
        settings = Settings(model="gpt-4o-mini", base_url=sim.url, max_iters=1)
        summary = run(
            "code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False
        )
        sent = [r.body for r in sim.requests]
    assert summary.exit_code == 1
    assert not any("context context" in m["content"] for b in sent for m in b["messages"])
    out = {o["id"]: o for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")}
    assert out["huge"]["status"] == "failed"
    assert out["huge"]["usage"]["calls"] == 0
    error = out["huge"]["error"]
    assert isinstance(error, dict) and error["type"] == CONTEXT_LENGTH
    assert "128,000-token context window of gpt-4o-mini" in error["message"]
    assert {out["r0"]["status"], out["r1"]["status"]} == {"done"}


def test_context_tokens_is_recorded_and_applies_to_any_model(
    sim: Simulator, tmp_path: Path
) -> None:
    """--context-tokens gives an unknown model a window; the manifest records it."""
    inp = write_jsonl(tmp_path / "in.jsonl", [*tasks(1), long_record(3000)])
    settings = Settings(model="sim-model", base_url=sim.url, max_iters=1, context_tokens=2000)
    summary = run("code-improve", inp, tmp_path / "run", settings, api_key="k", show_progress=False)
    assert summary.exit_code == 1
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["settings"]["context_tokens"] == 2000
    out = {o["id"]: o["status"] for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")}
    assert out == {"r0": "done", "huge": "failed"}


def test_estimate_names_the_records_that_cannot_fit(tmp_path: Path) -> None:
    """`refine estimate` warns how many records cannot fit and names their lines and ids."""
    rows = [*tasks(3), long_record(300), *tasks(1, start=9)]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    [est] = run_estimate("code-improve", inp, Settings(model="sim-model", context_tokens=200))
    assert est.unfit is not None
    assert (est.unfit.count, est.unfit.first) == (1, ((4, "huge"),))
    text = render(est)
    assert "1 of 5 records cannot fit the 200-token context window of sim-model" in text
    assert "line 4 (id huge)" in text
    [fine] = run_estimate("code-improve", write_jsonl(tmp_path / "ok.jsonl", tasks(3)), Settings())
    assert fine.unfit is None
    assert load_job("code-improve").max_tokens > 0


def test_a_batch_run_fails_a_record_too_long_without_a_line(tmp_path: Path) -> None:
    """--batch: a record that cannot fit fails before its line is written; the rest run."""
    from tests.backends.batch.test_simulated import FAST, batch_run

    inp = write_jsonl(tmp_path / "in.jsonl", [*tasks(2), long_record(3000)])
    with Simulator(FAST) as sim:
        summary = batch_run(sim, inp, tmp_path / "run", max_iters=1, context_tokens=2000)
        lines = [r.body for r in sim.requests if r.is_batch]
    assert summary.exit_code == 1
    assert not any("context context" in m["content"] for b in lines for m in b["messages"])
    out = {o["id"]: o for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")}
    assert out["huge"]["status"] == "failed" and out["r0"]["status"] == "done"
