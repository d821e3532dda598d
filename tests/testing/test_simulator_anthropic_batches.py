"""The simulator's Message Batches, driven by Anthropic's own client on a clock the tests
move by hand (no sleeping)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from pipeline.testing.simulator import SimConfig, Simulator
from tests.anthropic_helpers import anthropic, cached_text, client, params, raw, text
from tests.client.test_limits import FakeClock

pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")

DAY = 24 * 3600.0


def request(custom_id: str, **extra: Any) -> dict[str, Any]:
    """One batch request asking a question named after ``custom_id``."""
    return {"custom_id": custom_id, "params": params(f"question {custom_id}", **extra)}


def config(**changes: Any) -> SimConfig:
    """Batches in progress for 100 s, canceling for 10 s (on the test's clock)."""
    return SimConfig(batch_delay_s=100.0, batch_finalizing_s=10.0, **changes)


def test_a_batch_runs_to_its_end_and_its_results_match_by_custom_id() -> None:
    """A batch is in_progress with every request processing (counts show only at the end)
    while its requests run steadily, then ended with results_url; every result succeeded,
    billed at half the real-time price."""
    clock = FakeClock()
    with Simulator(config(), clock=clock) as sim, client(sim) as c:
        created = c.messages.batches.create(requests=[request(f"r{i}") for i in range(6)])
        clock.advance(50.0)
        halfway = c.messages.batches.retrieve(created.id)
        lines_halfway = len(sim.requests)
        clock.advance(50.0)
        ended = c.messages.batches.retrieve(created.id)
        results = list(c.messages.batches.results(created.id))
        single = c.messages.create(**params("question r0"))
        charges = sim.bill.charges()
        logged = sim.requests
    assert created.id.startswith("msgbatch_") and created.type == "message_batch"
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 6
    assert (created.expires_at - created.created_at).total_seconds() == DAY
    assert halfway.processing_status == "in_progress" and lines_halfway == 3
    assert (halfway.request_counts.processing, halfway.request_counts.succeeded) == (6, 0)
    assert ended.processing_status == "ended" and ended.ended_at is not None
    assert (ended.request_counts.processing, ended.request_counts.succeeded) == (0, 6)
    assert ended.results_url is not None and ended.results_url.endswith(f"{created.id}/results")
    assert sorted(r.custom_id for r in results) == [f"r{i}" for i in range(6)]
    assert {r.result.type for r in results} == {"succeeded"}
    by_id = {r.custom_id: r.result.message for r in results}
    assert by_id["r0"].usage.service_tier == "batch"
    assert by_id["r0"].content[0].text == single.content[0].text
    batch_charge = next(ch for ch, e in zip(charges, logged, strict=True) if e.custom_id == "r0")
    assert batch_charge.tier == "batch"
    assert batch_charge.usd == pytest.approx(charges[-1].usd / 2)
    assert {e.batch_id for e in logged[:6]} == {created.id}
    assert {e.provider for e in logged} == {"anthropic"}


def test_a_canceled_batch_ends_with_the_requests_not_run_canceled() -> None:
    """Cancel: canceling (cancel_initiated_at set) for the finalizing time, then ended with
    the requests run so far kept and the rest canceled; an ended batch cannot be canceled."""
    clock = FakeClock()
    with Simulator(config(), clock=clock) as sim, client(sim) as c:
        batch = c.messages.batches.create(requests=[request(f"r{i}") for i in range(10)])
        clock.advance(30.0)
        canceling = c.messages.batches.cancel(batch.id)
        clock.advance(10.0)
        ended = c.messages.batches.retrieve(batch.id)
        results = list(c.messages.batches.results(batch.id))
        with pytest.raises(anthropic.BadRequestError):
            c.messages.batches.cancel(batch.id)
        billed = len(sim.bill.charges())
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at
    assert canceling.request_counts.processing == 10
    counts = ended.request_counts
    assert ended.processing_status == "ended"
    assert (counts.succeeded, counts.canceled, counts.processing) == (3, 7, 0)
    assert Counter(r.result.type for r in results) == {"succeeded": 3, "canceled": 7}
    assert billed == 3


def test_requests_error_or_expire_in_the_shares_configured() -> None:
    """p_line_fail errors a share of requests (the error's type matching its status, none
    billed); an expiring batch runs expire_fraction of them and the rest expire."""
    clock = FakeClock()
    failing = config(
        p_line_fail=0.3,
        line_fail_statuses=(500, 529, 429),
        p_batch_expire=1.0,
        expire_fraction=0.6,
        faults_seed=3,
    )
    error_types = {500: "api_error", 529: "overloaded_error", 429: "rate_limit_error"}
    with Simulator(failing, clock=clock) as sim, client(sim) as c:
        batch = c.messages.batches.create(requests=[request(f"r{i}") for i in range(20)])
        clock.advance(100.0)
        counts = c.messages.batches.retrieve(batch.id).request_counts
        results = list(c.messages.batches.results(batch.id))
        billed = len(sim.bill.charges())
        statuses = {e.custom_id: e.status for e in sim.requests}
    assert counts.expired == 8 and counts.succeeded + counts.errored == 12
    assert counts.errored > 0 and billed == counts.succeeded
    for line in results:
        if line.result.type == "errored":
            status = statuses[line.custom_id]
            assert line.result.error.error.type == error_types[status]
            assert line.result.error.type == "error"
    assert Counter(r.result.type for r in results)["expired"] == 8


def test_a_request_with_invalid_params_ends_errored() -> None:
    """Params are validated when the request runs: an invalid one errors with
    invalid_request_error naming the field, the others succeed."""
    clock = FakeClock()
    body = {"requests": [request("good"), {"custom_id": "bad", "params": {"model": "m"}}]}
    with Simulator(config(), clock=clock) as sim:
        status, _, created = raw(sim, "POST", "/v1/messages/batches", body)
        clock.advance(100.0)
        got, headers, data = raw(sim, "GET", f"/v1/messages/batches/{created['id']}/results")
    assert status == 200 and got == 200
    assert headers["request-id"].startswith("req_")
    lines = {line["custom_id"]: line["result"] for line in map(orjson.loads, data.splitlines())}
    assert lines["good"]["type"] == "succeeded"
    error = lines["bad"]["error"]["error"]
    assert lines["bad"]["type"] == "errored" and error["type"] == "invalid_request_error"
    assert "max_tokens: Field required" in error["message"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"requests": [request("a"), request("a")]}, 400, "duplicate custom_id"),
        ({"requests": [request("a b")]}, 400, "custom_id: String should match pattern"),
        ({"requests": [request(f"r{i}") for i in range(4)]}, 400, "at most 3 requests"),
        ({"requests": []}, 400, "at least one request"),
        ({"requests": [request("a")], "input_file_id": "f"}, 400, "Extra inputs"),
        ({"requests": [request("a", extra=text(1000))]}, 413, "maximum allowed number of bytes"),
    ],
)
def test_malformed_batches_are_refused_at_creation(body: Any, status: int, words: str) -> None:
    """The envelope is checked at once: duplicate or malformed custom_ids, too many or no
    requests, unknown fields (400); a body over the byte limit is 413 request_too_large."""
    cfg = config(message_batch_max_requests=3, message_batch_max_bytes=2000)
    with Simulator(cfg) as sim:
        got, _, answer = raw(sim, "POST", "/v1/messages/batches", body)
        listed = sim.message_batches
    error_type = "request_too_large" if status == 413 else "invalid_request_error"
    assert (got, answer["error"]["type"]) == (status, error_type)
    assert words in answer["error"]["message"]
    assert listed == []


def test_batches_are_listed_most_recent_first_page_by_page() -> None:
    """The list pages by after_id (the SDK follows it) and before_id, newest first."""
    with Simulator(config(), clock=FakeClock()) as sim, client(sim) as c:
        ids = [c.messages.batches.create(requests=[request("a")]).id for _ in range(5)]
        first = c.messages.batches.list(limit=2)
        every = [b.id for b in c.messages.batches.list(limit=2)]
        _, _, before = raw(sim, "GET", f"/v1/messages/batches?limit=2&before_id={ids[1]}")
    assert [b.id for b in first.data] == [ids[4], ids[3]] and first.has_more
    assert every == ids[::-1]
    assert [b["id"] for b in before["data"]] == [ids[3], ids[2]]


def test_a_batch_is_deleted_only_once_it_has_ended() -> None:
    """DELETE refuses a batch in progress; an ended one is deleted and then unknown."""
    clock = FakeClock()
    with Simulator(config(), clock=clock) as sim, client(sim) as c:
        batch = c.messages.batches.create(requests=[request("a")])
        with pytest.raises(anthropic.BadRequestError):
            c.messages.batches.delete(batch.id)
        clock.advance(100.0)
        deleted = c.messages.batches.delete(batch.id)
        with pytest.raises(anthropic.NotFoundError):
            c.messages.batches.retrieve(batch.id)
        left = sim.message_batches
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    assert left == []


def test_results_are_kept_29_days() -> None:
    """Results stay available 29 days after creation; then 404, archived_at set."""
    clock = FakeClock()
    with Simulator(config(), clock=clock) as sim, client(sim) as c:
        batch = c.messages.batches.create(requests=[request("a")])
        clock.advance(28 * DAY)
        assert len(list(c.messages.batches.results(batch.id))) == 1
        clock.advance(DAY)
        with pytest.raises(anthropic.NotFoundError):
            c.messages.batches.results(batch.id)
        archived = c.messages.batches.retrieve(batch.id).archived_at
        assert archived is not None and raw(sim, "GET", "/v1/messages/batches")[0] == 200


def test_batch_requests_read_the_cache_and_pay_half_for_reads_too() -> None:
    """A batch request reads the prefix a real-time call cached; its charge is half of
    uncached input, cache reads at 0.1x and output at Sonnet's prices."""
    clock = FakeClock()
    system = [cached_text(text(2000, "shared"))]
    with Simulator(config(), clock=clock) as sim, client(sim) as c:
        c.messages.create(**params("warm up"), system=system)
        batch = c.messages.batches.create(requests=[request("a", system=system)])
        clock.advance(100.0)
        (line,) = list(c.messages.batches.results(batch.id))
        charge = sim.bill.charges()[-1]
    usage = line.result.message.usage
    assert usage.cache_read_input_tokens == 2000 and usage.cache_creation_input_tokens == 0
    full = usage.input_tokens * 3 + 2000 * 0.3 + usage.output_tokens * 15
    assert charge.tier == "batch" and charge.usd == pytest.approx(full / 2 / 1e6)


def test_batches_in_progress_are_capped_when_configured() -> None:
    """batch_max_in_progress refuses one more batch with 429 rate_limit_error."""
    with Simulator(config(batch_max_in_progress=1), clock=FakeClock()) as sim:
        assert raw(sim, "POST", "/v1/messages/batches", {"requests": [request("a")]})[0] == 200
        status, _, body = raw(sim, "POST", "/v1/messages/batches", {"requests": [request("b")]})
    assert (status, body["error"]["type"]) == (429, "rate_limit_error")
