"""Faults as real servers send them (issue 60), each against the simulator over HTTP.

Retry-After on 5xx, probes during an outage, a request that always crashes the server
beside records that succeed, a context-length 400 on a feedback call, a 429 that never
clears and a spent quota, and a server that trickles its answer past --timeout.
"""

from __future__ import annotations

import itertools
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import Settings, run
from pipeline.client.chat import OpenAIClient
from pipeline.client.limits import Limiter
from pipeline.core.steps import Request
from pipeline.errors import CallError, UnavailableError
from pipeline.testing.simulator import SimConfig, Simulator
from tests.helpers import NO_BACKOFF, read_jsonl, tasks, write_jsonl

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["actions", "done"],
    "properties": {
        "actions": {"type": "array", "items": {"type": "string"}},
        "done": {"type": "boolean"},
    },
}
POISON = "<<crash-the-server>>"


def make_client(url: str, **kw: Any) -> OpenAIClient:
    args: dict[str, Any] = dict(
        model="m",
        base_url=url,
        api_key="k",
        timeout=5.0,
        max_retries=3,
        limiter=Limiter(),
        rng=random.Random(0),
    )
    args.update(kw)
    return OpenAIClient(**args)


def settings(url: str, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(model="sim-model", base_url=url, max_iters=1, concurrency=8)
    base.update(kw)
    return Settings(**base)


def one(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


# -- 1. Retry-After on every retryable status ------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["p_500", "p_503"])
@pytest.mark.parametrize("unit", ["s", "ms"])
async def test_retry_after_on_a_5xx_is_waited_out(fault: str, unit: str) -> None:
    """A 500 or 503 asking for 0.8 s (retry-after or retry-after-ms) is retried no sooner."""
    config = SimConfig(retry_after_s=0.8, retry_after_unit=unit, **{fault: 1.0})  # type: ignore[arg-type]
    with Simulator(config) as sim:
        client = make_client(sim.url, max_retries=1)
        client.outage.threshold = 1000  # one call's retries, not an outage
        with pytest.raises(CallError):
            await client.complete(Request(one("q"), temperature=0, max_tokens=20))
        await client.aclose()
        first, second = (r.t for r in sim.requests)
    assert second - first >= 0.8


# -- 2. One probe at a time during an outage -------------------------------------------------


def test_an_outage_is_probed_one_request_at_a_time(tmp_path: Path) -> None:
    """50 records in flight when the server goes down: after the first second of the
    outage, requests come one at a time, spaced, and every record still finishes."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(50))
    # 0.1 s a call: the records' calls still run when the outage starts at 0.3 s (at 0.02 s
    # a quick machine finished all 50 before it)
    with Simulator(SimConfig(latency_s=0.1, outages=((0.3, 6.3),))) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, concurrency=50),
            api_key="k",
            show_progress=False,
        )
        down = sorted((r for r in sim.requests if r.outcome == "outage"), key=lambda r: r.t)
    assert summary.exit_code == 0, summary.message
    during = [r.t for r in down]
    late = [t for t in during if t > 1.3]
    assert 1 <= len(late) <= 8, during
    # the probes are requests of their own: no record's request goes to a server that is down
    assert all(r.body["max_tokens"] == 1 for r in down if r.t > 1.3)
    assert all(b - a >= 0.2 for a, b in itertools.pairwise(late)), late
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 50 and all(o["status"] == "done" for o in outs)


def test_probes_wait_for_the_servers_retry_after(tmp_path: Path) -> None:
    """An outage whose 503s ask for 1 s: after the first requests, none comes sooner than
    1 s after the previous answer, and the run finishes once the server is back."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    config = SimConfig(outages=((0.0, 2.5),), retry_after_s=1.0)
    with Simulator(config) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, concurrency=10, max_retries=1),  # open after 2 faults
            api_key="k",
            show_progress=False,
        )
        during = sorted(r.t for r in sim.requests if r.outcome == "outage")
    assert summary.exit_code == 0, summary.message
    later = [t for t in during if t > during[0] + 0.5]
    assert later, during
    assert all(b - a >= 0.95 for a, b in itertools.pairwise(later)), during


# -- 3. A record whose requests always crash the server --------------------------------------


def poisoned(n: int, start: int = 0) -> list[dict[str, object]]:
    """``n`` code-improve records whose every request crashes the simulator."""
    return [{**t, "task": f"{t['task']} {POISON}"} for t in tasks(n, start)]


@pytest.mark.parametrize("good", [1, 0])
def test_poison_records_fail_beside_a_working_endpoint(tmp_path: Path, good: int) -> None:
    """Three records whose every call gets a 500 end failed with that error (exit 1), with
    a good record beside them or alone: the endpoint answers everything else."""
    inp = write_jsonl(tmp_path / "in.jsonl", [*tasks(good), *poisoned(3, start=good)])
    with Simulator(SimConfig(poison=POISON)) as sim:
        started = time.monotonic()
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, max_retries=2, max_outage=5.0),
            api_key="k",
            show_progress=False,
        )
        elapsed = time.monotonic() - started
        crashes = sum(r.outcome == "poison" for r in sim.requests)
    assert summary.exit_code == 1, summary.message
    outs = {o["id"]: o for o in read_jsonl(tmp_path / "run" / "outputs.jsonl")}
    assert len(outs) == good + 3
    for i in range(good, good + 3):
        out = outs[f"r{i}"]
        assert out["status"] == "failed"
        assert isinstance(out["error"], dict) and out["error"]["type"] == "http_500"
    assert all(outs[f"r{i}"]["status"] == "done" for i in range(good))
    assert crashes <= 3 * 5  # three attempts each, and a few that waited for a probe
    assert elapsed < 20


# -- 4. A context-length 400 is no refused format --------------------------------------------


@pytest.mark.anyio
async def test_context_length_400_fails_the_step_at_once() -> None:
    """A feedback call past the context window costs one request, keeps the pool's format,
    and fails with the provider's message."""
    with Simulator(SimConfig(context_limit=200)) as sim:
        client = make_client(sim.url)
        with pytest.raises(CallError) as info:
            await client.complete(
                Request(one("word " * 400), temperature=0, max_tokens=50, schema=SCHEMA)
            )
        await client.aclose()
        assert len(sim.requests) == 1
    assert info.value.status == 400
    assert "maximum context length" in str(info.value)
    assert client.level == 0


# -- 5. A rate limit that never clears, a spent quota ----------------------------------------


def test_a_429_that_never_clears_stops_the_run_resumably(tmp_path: Path) -> None:
    """429s without Retry-After past --max-outage, no call succeeding: exit 5, none failed."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    with Simulator(SimConfig(throttles=((0.0, 1000.0),))) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, max_outage=2.0),
            api_key="k",
            show_progress=False,
        )
    assert summary.exit_code == 5, summary.message
    assert "resumable" in (summary.message or "")
    assert read_jsonl(tmp_path / "run" / "outputs.jsonl") == []


def test_a_429_that_sets_in_mid_run_stops_it_with_no_record_failed(tmp_path: Path) -> None:
    """Records done before a lasting 429 stay done; the rest stay pending (exit 5)."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(30))
    with Simulator(SimConfig(latency_s=0.05, throttles=((1.0, 1000.0),))) as sim:
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, concurrency=4, max_outage=2.0),
            api_key="k",
            show_progress=False,
        )
    assert summary.exit_code == 5, summary.message
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert outs and len(outs) < 30
    assert all(o["status"] == "done" for o in outs)


def test_a_spent_quota_stops_the_run_at_once(tmp_path: Path) -> None:
    """A 429 insufficient_quota stops the run at once (exit 5) with one clear message."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(10))
    with Simulator(SimConfig(quota_requests=3)) as sim:
        started = time.monotonic()
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(sim.url, concurrency=2),
            api_key="k",
            show_progress=False,
        )
        elapsed = time.monotonic() - started
        refused = sum(r.outcome == "quota" for r in sim.requests)
    assert summary.exit_code == 5, summary.message
    assert "quota" in (summary.message or "") and "resumable" in (summary.message or "")
    assert refused <= 2  # the calls in flight, each asked once
    assert elapsed < 10
    assert all(o["status"] == "done" for o in read_jsonl(tmp_path / "run" / "outputs.jsonl"))


# -- --timeout bounds the whole attempt ------------------------------------------------------


@pytest.fixture
def trickler() -> Iterator[str]:
    """A server that sends its headers at once, then one byte of body every 0.1 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                body = b'{"choices": []}' + b" " * 200
                head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n"
                try:
                    conn.sendall(head.encode())
                    for byte in body:
                        if stop.wait(0.1):
                            return
                        conn.sendall(bytes([byte]))
                except OSError:
                    continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    thread.join(timeout=5)
    listener.close()


@pytest.mark.anyio
async def test_timeout_bounds_the_whole_attempt(trickler: str) -> None:
    """A server trickling its answer byte by byte is cut off at --timeout, not later."""
    client = make_client(trickler, timeout=0.6, max_retries=0)
    started = time.monotonic()
    with pytest.raises(CallError) as info:
        await client.complete(Request(one("q"), temperature=0, max_tokens=20))
    elapsed = time.monotonic() - started
    await client.aclose()
    assert info.value.category == "timeout"
    assert 0.6 <= elapsed < 1.2


@pytest.mark.anyio
async def test_unavailable_names_the_last_failure() -> None:
    """A server down for good stops the call with UnavailableError naming what it said."""
    with Simulator(SimConfig(p_503=1.0)) as sim:
        client = make_client(sim.url, max_retries=1, max_outage=0.5, delays=NO_BACKOFF)
        with pytest.raises(UnavailableError, match="503"):
            await client.complete(Request(one("q"), temperature=0, max_tokens=20))
        await client.aclose()
