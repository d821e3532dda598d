"""Batch API mode through the library, against an in-memory Batch API and a fake clock."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline import RunSummary, Settings, run
from pipeline.backends.batch import BatchBackend, BatchConfig, read_ledger
from pipeline.backends.batch.api import BatchIssue
from pipeline.backends.realtime import RealTimeBackend
from pipeline.client.formats import FormatLadder
from pipeline.client.prices import PriceBook
from pipeline.commands.cancel import cancel
from pipeline.commands.status import collect
from pipeline.core.steps import Completion, ModelClient, Request
from pipeline.core.trace import steps_of
from tests.fake_batches import FakeBatchAPI, FakeClock, answer_text, completion
from tests.helpers import read_jsonl, sent, tasks, write_jsonl

MODEL = "gpt-4o-mini"
FAST = BatchConfig(creates_per_s=1e6, polls_per_s=1e6)


def backend(api: FakeBatchAPI, clock: FakeClock, config: BatchConfig = FAST) -> BatchBackend:
    """The Batch API backend over the fake API, paced by the fake clock."""
    return BatchBackend(api, config=config, sleep=clock.sleep, clock=clock)


def batch_run(
    api: FakeBatchAPI,
    inp: Path,
    out: Path,
    *,
    config: BatchConfig = FAST,
    clock: FakeClock | None = None,
    **kw: Any,
) -> RunSummary:
    """Run code-improve with --batch over the fake (the run opens no real-time client)."""
    base: dict[str, Any] = dict(model=MODEL, base_url="http://unused.invalid/v1", max_iters=2)
    base.update(kw)
    return run(
        "code-improve",
        inp,
        out,
        Settings(batch=True, **base),
        api_key="k",
        show_progress=False,
        backend=backend(api, clock or FakeClock(), config),
    )


class EchoClient(ModelClient):
    """A real-time client answering exactly as the fake Batch API answers a line."""

    def __init__(self) -> None:
        self.ladder = FormatLadder()

    @property
    def model(self) -> str:
        return MODEL

    async def complete(self, request: Request) -> Completion:
        sent, extra = self.ladder.request(request.messages, request.schema, 0)
        body = {"model": MODEL, "messages": sent, **extra}
        usage = completion(body)["usage"]
        return Completion(
            answer_text(body), usage["prompt_tokens"], usage["completion_tokens"], 0.1, 1, MODEL
        )


def outcome_fields(out: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "status", "output", "iterations", "chosen_iteration", "stop_reason", "score")
    return {k: out[k] for k in keep} | {"usage": out["usage"]}


def test_batch_run_matches_real_time_at_half_the_cost(tmp_path: Path) -> None:
    """--batch makes the same calls and outputs as real time; steps carry their batch id.

    The same answers cost half: every step is priced at the Batch API discount.
    """
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(12))
    api = FakeBatchAPI()
    summary = batch_run(api, inp, tmp_path / "b")
    assert summary.exit_code == 0, summary.message
    real = run(
        "code-improve",
        inp,
        tmp_path / "rt",
        Settings(model=MODEL, max_iters=2),
        backend=RealTimeBackend(EchoClient()),
        show_progress=False,
    )
    assert real.exit_code == 0
    b_out = {o["id"]: o for o in read_jsonl(tmp_path / "b" / "outputs.jsonl")}
    r_out = {o["id"]: o for o in read_jsonl(tmp_path / "rt" / "outputs.jsonl")}
    assert set(b_out) == set(r_out) == {f"r{i}" for i in range(12)}
    for rid, o in b_out.items():
        assert outcome_fields(o) == outcome_fields(r_out[rid])
        assert o["cost_usd"] == pytest.approx(r_out[rid]["cost_usd"] / 2, rel=1e-3)
    r_traces = {t["id"]: steps_of(t["steps"]) for t in read_jsonl(tmp_path / "rt" / "traces.jsonl")}
    batch_ids = set(api.batches)
    for t in read_jsonl(tmp_path / "b" / "traces.jsonl"):
        steps = steps_of(t["steps"])
        assert [(s.role, s.messages, s.response) for s in steps] == [
            (s.role, s.messages, s.response) for s in r_traces[t["id"]]
        ]
        assert all(s["batch_id"] in batch_ids for s in t["steps"])
    # Feedback lines ask for the schema exactly as the real-time client does.
    formats = [b["response_format"] for b in api.bodies if "response_format" in b]
    assert formats and all(
        f["type"] == "json_schema" and f["json_schema"]["strict"] for f in formats
    )
    assert summary.counters.calls == len(api.processed) == sum(len(s) for s in r_traces.values())
    # Each batch carries its intent's token; every file uploaded or written is deleted.
    assert all(b.metadata["refine_token"] for b in api.batches.values())
    assert api.files == {}
    assert read_ledger(tmp_path / "b" / "batches.jsonl").entries == {}


def test_detach_exits_75_until_every_round_is_done(tmp_path: Path) -> None:
    """--detach submits, exits 75 while batches are in flight, and ends with 0 when done."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(6))
    api = FakeBatchAPI(looks_to_end=1)
    codes = []
    for _ in range(20):
        summary = batch_run(api, inp, tmp_path / "run", detach=True)
        codes.append(summary.exit_code)
        if summary.exit_code != 75:
            break
        assert summary.state == "waiting" and "run the same command again" in (
            summary.message or ""
        )
    assert codes[-1] == 0 and set(codes[:-1]) == {75} and len(codes) >= 3
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 6 and all(o["status"] == "done" for o in outs)
    assert len(api.processed) == len(set(api.processed))
    manifest = orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())
    assert manifest["state"] == "finished" and manifest["exit_code"] == 0


def test_expired_batch_keeps_finished_lines_and_resends_the_rest(tmp_path: Path) -> None:
    """An expired batch's finished lines are checkpointed; only the others go out again.

    Lines never run use up no retry, so the run finishes with --max-retries 0.
    """
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    api = FakeBatchAPI(fate=lambda seq: "expired" if seq % 2 == 0 else "completed")
    summary = batch_run(api, inp, tmp_path / "run", max_retries=0, max_iters=0)
    assert summary.exit_code == 0, summary.message
    first = api.batches["batch_0"]
    assert first.info is not None and first.info.status == "expired"
    assert len(api.processed) == len(set(api.processed)) == 10  # nothing run twice
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 10 and all(o["status"] == "done" for o in outs)
    resent = {line["custom_id"] for b in list(api.batches.values())[1:] for line in b.lines}
    assert len(resent) == 5  # half of the first batch expired unrun


def test_failed_lines_follow_the_real_time_error_classes(tmp_path: Path) -> None:
    """500 and 429 lines are retried in a later batch; a 400 line fails its record."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(6))
    seen: Counter[str] = Counter()

    def status(cid: str, body: dict[str, Any]) -> int:
        task = body["messages"][-1]["content"]
        seen[task] += 1
        if "number 1 " in task:
            return 400
        if "number 2 " in task and seen[task] <= 2:
            return 500 if seen[task] == 1 else 429
        return 200

    api = FakeBatchAPI(line_status=status)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0)
    assert summary.exit_code == 1  # finished, one record failed
    outs = {o["id"]: o for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")}
    assert outs["r1"]["status"] == "failed" and outs["r1"]["error"]["type"] == "http_400"
    assert outs["r2"]["status"] == "done"
    traces = {t["id"]: t["steps"] for t in read_jsonl(tmp_path / "run" / "traces.jsonl")}
    (step,) = traces["r2"]
    assert step["attempts"] == 3 and [t[0] for t in step["tries"]] == [500, 429, 200]
    assert traces["r1"][-1]["error"]["status"] == 400
    assert summary.counters.retries == 2


def test_refused_response_format_steps_down_like_real_time(tmp_path: Path) -> None:
    """Feedback lines refused for json_schema go out again as json_object, using up no retry
    and showing the refusal in the call's tries, as in real time."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))

    def status(cid: str, body: dict[str, Any]) -> int:
        return 400 if body.get("response_format", {}).get("type") == "json_schema" else 200

    api = FakeBatchAPI(
        line_status=status,
        error_message=lambda code, body: "response_format json_schema is not supported",
    )
    summary = batch_run(api, inp, tmp_path / "run", max_iters=1, max_retries=0)
    assert summary.exit_code == 0, summary.message
    feedback = [b for b in api.bodies if "response_format" in b]
    assert {b["response_format"]["type"] for b in feedback} == {"json_schema", "json_object"}
    for t in read_jsonl(tmp_path / "run" / "traces.jsonl"):
        ((step, asked),) = [
            (s, m) for s, m in zip(t["steps"], sent(t), strict=True) if s["role"] == "feedback"
        ][:1]
        assert "JSON Schema" in asked[-1]["content"]  # the schema spelled out
        assert step["attempts"] == 2 and [t[0] for t in step["tries"]] == [400, 200]
    assert summary.counters.retries == 0


def test_retries_end_at_max_retries(tmp_path: Path) -> None:
    """A line that keeps failing with 500 fails its record after --max-retries more batches."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    api = FakeBatchAPI(line_status=lambda cid, body: 500)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0, max_retries=2)
    assert summary.exit_code == 1
    assert len(api.batches) == 3  # the first try and two retries
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert all(o["status"] == "failed" and o["error"]["type"] == "http_500" for o in outs)


def test_failed_line_counts_survive_a_restart(tmp_path: Path) -> None:
    """Retries already used are read back from the ledger: a restart does not reset them."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(1))
    api = FakeBatchAPI(line_status=lambda cid, body: 500, looks_to_end=1)
    for _ in range(2):  # two invocations, each collecting one failed batch
        summary = batch_run(api, inp, tmp_path / "run", max_iters=0, max_retries=1, detach=True)
    assert summary.exit_code == 75
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0, max_retries=1, detach=True)
    assert summary.exit_code == 1
    assert len(api.batches) == 2
    (trace,) = read_jsonl(tmp_path / "run" / "traces.jsonl")
    (step,) = trace["steps"]  # the failed call shows the try an earlier invocation counted
    assert step["attempts"] == 2 and [t[0] for t in step["tries"]] == [500, 500]


def test_unauthorized_line_stops_the_run_with_exit_3(tmp_path: Path) -> None:
    """A 401 line stops the run (exit 3) after the batch's other lines are checkpointed."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    api = FakeBatchAPI(line_status=lambda cid, body: 401 if cid.endswith("-0") else 200)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0)
    assert summary.exit_code == 3 and "401" in (summary.message or "")
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 3  # the record whose line was refused stays pending


def test_auth_failure_of_the_control_plane_exits_3(tmp_path: Path) -> None:
    """A key the files endpoint refuses stops the run at once with exit 3."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    summary = batch_run(FakeBatchAPI(auth_fails=True), inp, tmp_path / "run")
    assert summary.exit_code == 3


def test_validation_failure_stops_with_its_errors(tmp_path: Path) -> None:
    """A batch failed at validation stops the run (exit 2) with the provider's errors shown."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    issue = BatchIssue("invalid_url", "The URL provided does not match", 2)
    api = FakeBatchAPI(fate=lambda seq: "failed", issues=lambda seq: (issue,))
    summary = batch_run(api, inp, tmp_path / "run")
    assert summary.exit_code == 2
    assert "failed validation: line 2: invalid_url: The URL provided" in (summary.message or "")
    assert not (tmp_path / "run" / "outputs.jsonl").read_bytes()  # records stay pending
    assert api.files == {}


def test_token_limit_refusal_waits_and_retries(tmp_path: Path) -> None:
    """A batch failed for the enqueued token limit goes out again, in smaller batches."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(8))
    issue = BatchIssue("token_limit_exceeded", "Enqueued token limit reached")
    api = FakeBatchAPI(
        fate=lambda seq: "failed" if seq == 0 else "completed", issues=lambda seq: (issue,)
    )
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0)
    assert summary.exit_code == 0, summary.message
    sizes = [len(b.lines) for b in api.batches.values()]
    assert sizes[0] == 8 and max(sizes[1:]) == 4
    assert summary.counters.rate_limited == 1


def test_refused_create_waits_and_asks_again(tmp_path: Path) -> None:
    """A create answered 429 (queue limit) is asked again a poll later, for the same file."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    clock = FakeClock()
    api = FakeBatchAPI(refuse_creates=2)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0, clock=clock, poll=30)
    assert summary.exit_code == 0, summary.message
    assert api.requests["create"] == 3 and api.requests["upload"] == 1
    assert clock.now >= 60  # waited a poll between the asks


def test_completed_batch_with_only_an_error_file(tmp_path: Path) -> None:
    """A completed batch whose every line failed (no output file) is handled: lines retried."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    answered: list[str] = []

    def status(cid: str, body: dict[str, Any]) -> int:
        answered.append(cid)
        return 500 if len(answered) <= 3 else 200  # the whole first batch fails

    api = FakeBatchAPI(line_status=status)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0)
    assert summary.exit_code == 0, summary.message
    info = api.batches["batch_0"].info
    assert info is not None and info.status == "completed"
    assert info.output_file_id is None and info.error_file_id is not None
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 3


def test_completed_batch_holding_no_lines_sends_them_again(tmp_path: Path) -> None:
    """A batch that says completed but holds no line at all loses nothing: all lines resent.

    Each such miss counts as a failed attempt, so a provider that keeps doing it ends.
    """
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    api = FakeBatchAPI(fate=lambda seq: "completed_empty" if seq == 0 else "completed")
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0, max_retries=1)
    assert summary.exit_code == 0, summary.message
    assert len(api.batches) == 2 and len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 3
    steps = [t["steps"][0] for t in read_jsonl(tmp_path / "run" / "traces.jsonl")]
    assert all(s["attempts"] == 2 for s in steps)
    always = FakeBatchAPI(fate=lambda seq: "completed_empty")
    summary = batch_run(always, inp, tmp_path / "run2", max_iters=0, max_retries=1)
    assert summary.exit_code == 1 and len(always.batches) == 2


def test_splits_batches_by_max_lines_and_bytes(tmp_path: Path) -> None:
    """A round's lines are split into batches within the line and byte limits."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(7))
    api = FakeBatchAPI()
    config = BatchConfig(max_lines=3, creates_per_s=1e6, polls_per_s=1e6)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0, config=config)
    assert summary.exit_code == 0
    assert [len(b.lines) for b in api.batches.values()] == [3, 3, 1]
    api = FakeBatchAPI()
    config = BatchConfig(max_bytes=2000, creates_per_s=1e6, polls_per_s=1e6)
    summary = batch_run(api, inp, tmp_path / "run2", max_iters=0, config=config)
    assert summary.exit_code == 0
    assert len(api.uploads) > 2 and all(len(data) <= 2000 for data in api.uploads)
    assert sum(len(b.lines) for b in api.batches.values()) == 7


def test_files_that_cannot_be_deleted_do_not_stop_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server refusing file deletion (405) costs a warning per file, not the run."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(2))
    api = FakeBatchAPI(delete_status=405)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=0)
    assert summary.exit_code == 0, summary.message
    assert any("could not be deleted" in r.getMessage() for r in caplog.records)
    assert read_ledger(tmp_path / "run" / "batches.jsonl").entries == {}


def test_budget_stops_with_exit_6_within_budget(tmp_path: Path) -> None:
    """--budget with --batch: calls that do not fit wait; none fits: exit 6; spend <= budget."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    api = FakeBatchAPI()
    budget = 0.002
    summary = batch_run(api, inp, tmp_path / "run", budget=budget)
    assert summary.exit_code == 6, summary.message
    info = collect(tmp_path / "run")
    assert 0 < info["cost_usd"] <= budget
    assert info["done"] < 40
    prices = PriceBook()
    price = prices.price(MODEL)
    assert price is not None
    paid = sum(
        price.cost(completion(b)["usage"], batch=True) for b in api.bodies
    )  # every line run, at the batch price
    assert paid == pytest.approx(info["cost_usd"], rel=1e-3)


def test_cancel_then_run_collects_and_resends(tmp_path: Path) -> None:
    """`refine cancel` cancels the batches in flight; the next run keeps their finished lines."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(6))
    api = FakeBatchAPI(looks_to_end=5)
    clock = FakeClock()
    first = batch_run(api, inp, tmp_path / "run", max_iters=0, detach=True, clock=clock)
    assert first.exit_code == 75
    infos = cancel(tmp_path / "run", api=api)
    assert [i.status for i in infos] == ["cancelled"]
    assert read_ledger(tmp_path / "run" / "batches.jsonl").entries.popitem()[1].cancelled
    again = batch_run(api, inp, tmp_path / "run", max_iters=0, clock=clock)
    assert again.exit_code == 0
    assert len(api.processed) == len(set(api.processed)) == 6
    assert len(read_jsonl(tmp_path / "run" / "outputs.jsonl")) == 6


def test_cancel_deletes_the_input_file_of_a_batch_never_created(tmp_path: Path) -> None:
    """`refine cancel` deletes the input file of an intent whose batch was never created and
    forgets the intent; a delete that fails leaves the intent for the next run to delete."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    ledger = tmp_path / "run" / "batches.jsonl"
    api = FakeBatchAPI(refuse_creates=1)
    clock = FakeClock()
    first = batch_run(api, inp, tmp_path / "run", max_iters=0, detach=True, clock=clock)
    assert first.exit_code == 75
    (entry,) = read_ledger(ledger).entries.values()
    assert entry.batch_id is None and entry.file_id in api.files
    api.delete_status = 500
    assert cancel(tmp_path / "run", api=api) == []
    assert entry.token in read_ledger(ledger).entries and entry.file_id in api.files
    api.delete_status = None
    assert cancel(tmp_path / "run", api=api) == []
    assert read_ledger(ledger).entries == {} and api.files == {}
    assert api.deleted == [entry.file_id]
    again = batch_run(api, inp, tmp_path / "run", max_iters=0, clock=clock)
    assert again.exit_code == 0
    assert len(api.processed) == len(set(api.processed)) == 3


def test_lost_create_answer_is_found_by_token_not_resent(tmp_path: Path) -> None:
    """A create whose answer was lost is looked for by its token: the batch is adopted once."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    api = FakeBatchAPI(lose_create_answers=1)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=1)
    assert summary.exit_code == 0, summary.message
    assert len(api.processed) == len(set(api.processed))
    first = api.batches["batch_0"]
    assert {line["custom_id"] for line in first.lines} <= set(api.processed)
    tokens = [b.metadata["refine_token"] for b in api.batches.values()]
    assert len(tokens) == len(set(tokens))  # no batch was created twice for one intent
    assert api.requests["list"] >= 1


def test_lost_upload_answer_leaves_no_file_behind(tmp_path: Path) -> None:
    """An upload whose answer was lost is found by its name and deleted; its calls go out
    again in a new batch, and every input file ends deleted."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(4))
    api = FakeBatchAPI(lose_upload_answers=1)
    summary = batch_run(api, inp, tmp_path / "run", max_iters=1)
    assert summary.exit_code == 0, summary.message
    stray = next(iter(api.names))
    assert stray in api.deleted and stray not in api.files
    assert not [f for f in api.names if f in api.files]  # no input file is left
    assert next(b.input_file_id for b in api.batches.values()) != stray
    assert len(api.processed) == len(set(api.processed))
    assert api.requests["list_files"] >= 1


def test_status_shows_batches_in_flight(tmp_path: Path) -> None:
    """`refine status` reads the ledger: the batches in flight and their ids."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(3))
    api = FakeBatchAPI(looks_to_end=3)
    summary = batch_run(api, inp, tmp_path / "run", detach=True)
    assert summary.exit_code == 75
    info = collect(tmp_path / "run")
    assert info["batches"]["in_flight"] == ["batch_0"]
