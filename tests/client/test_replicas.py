"""Several endpoints (`--base-url` more than once): least loaded first, a failing one drained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import Settings, run
from pipeline.client import replicas as replicas_mod
from pipeline.client.outage import Outage
from pipeline.client.replicas import PROBE_EVERY_S, Replica, Replicas
from pipeline.testing.simulator import SimConfig, Simulator
from tests.client.test_limits import FakeClock
from tests.helpers import read_jsonl, tasks, write_jsonl


def replicas(
    clock: FakeClock, loads: list[int], down: tuple[float | None, ...] = ()
) -> Replicas[str]:
    """Replicas named e0, e1, ... with requests in flight ``loads``; ``down[i]`` opens e{i}'s
    breaker at that time."""
    all_ = []
    for i, load in enumerate(loads):
        e = Replica(f"e{i}", f"conn{i}", Outage(300.0, 30.0, clock, threshold=2))
        e.in_flight = load
        when = down[i] if i < len(down) else None
        if when is not None:
            clock.now, saved = when, clock.now
            e.outage.failed()
            e.outage.failed()
            clock.now = saved
        all_.append(e)
    return Replicas(all_, clock)


@pytest.mark.parametrize(
    ("loads", "down", "expected"),
    [
        ([3, 1, 2], (), "e1"),  # the least loaded
        ([0, 0, 0], (), "e0"),  # ties: the first
        ([0, 5, 9], (None,), "e0"),
        ([9, 5, 0], (None, None, 1.0), "e2"),  # a drained one's first probe is due at once
        ([5, 5], (1.0, 2.0), "e1"),  # all down: the one whose outage began last
        ([5, 5, 5], (3.0, 1.0, 2.0), "e0"),
    ],
)
def test_pick(loads: list[int], down: tuple[float | None, ...], expected: str) -> None:
    """The request goes to the least loaded healthy endpoint, or as a probe where due."""
    clock = FakeClock(10.0)
    assert replicas(clock, loads, down).pick().url == expected


@pytest.mark.anyio
async def test_a_drained_endpoint_is_probed_every_few_seconds_only() -> None:
    """A failing endpoint gets one probe each PROBE_EVERY_S, none while one is in flight."""
    clock = FakeClock(10.0)
    eps = replicas(clock, [0, 4], down=(5.0,))
    assert eps.pick().url == "e0"  # the first probe
    assert [eps.pick().url for _ in range(5)] == ["e1"] * 5
    clock.advance(PROBE_EVERY_S)
    assert eps.pick().url == "e0"
    clock.advance(PROBE_EVERY_S)
    async with eps.all[0].outage.lock:  # a probe in flight
        assert eps.pick().url == "e1"
    assert eps.pick().url == "e0"


def test_a_recovered_endpoint_takes_traffic_again() -> None:
    """Once a probe succeeds the breaker closes and the endpoint is picked by load again."""
    clock = FakeClock(10.0)
    eps = replicas(clock, [0, 4], down=(5.0,))
    probe = eps.pick()
    probe.outage.close(sent_at=clock.now)
    assert [eps.pick().url for _ in range(3)] == ["e0"] * 3
    assert len(eps.healthy()) == 2


def served(sim: Simulator) -> list[float]:
    """When each call a simulator answered in full arrived (seconds since it started)."""
    return [r.t for r in sim.requests if r.completed]


def settings(*urls: str, **kw: Any) -> Settings:
    """A code-improve run against several replicas."""
    return Settings(**{"model": "sim-model", "base_url": tuple(urls), "max_iters": 1, **kw})


def test_a_failing_replica_is_drained_and_the_run_finishes_on_the_other(tmp_path: Path) -> None:
    """With one replica answering 503s, the other serves every record; the first only probes."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    with (
        Simulator(SimConfig(latency_s=0.02, outages=((0.0, 1e6),))) as down,
        Simulator(SimConfig(latency_s=0.02)) as up,
    ):
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(down.url, up.url, concurrency=4, max_retries=3),
            show_progress=False,
        )
        wall = max(served(up))
        refused = len(down.requests)
    assert summary.exit_code == 0, summary.message
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 40 and all(o["status"] == "done" for o in outs)
    assert len(served(up)) == summary.counters.calls - refused
    # Opening the breaker takes max_retries + 1 faults; the requests in flight then, and a
    # probe each PROBE_EVERY_S after.
    assert refused <= (3 + 1) + 4 + wall / PROBE_EVERY_S + 1


def test_a_replica_that_comes_back_is_used_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica down for its first second is probed, found back, and carries calls again."""
    monkeypatch.setattr(replicas_mod, "PROBE_EVERY_S", 0.2)
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(60))
    with (
        Simulator(SimConfig(latency_s=0.03, outages=((0.0, 1.0),))) as flaky,
        Simulator(SimConfig(latency_s=0.03)) as steady,
    ):
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(flaky.url, steady.url, concurrency=4, max_retries=2),
            show_progress=False,
        )
        back = served(flaky)
        outage = [r for r in flaky.requests if r.outcome == "outage"]
        end = max(served(steady))
    assert summary.exit_code == 0, summary.message
    assert outage and back, "the replica must have failed, then served"
    assert min(back) >= 1.0 and end > 1.5
    # Back in the rotation: it takes a fair part of the calls made after its return.
    after = len([t for t in served(steady) if t > min(back)])
    assert len(back) >= 0.3 * (len(back) + after)


def test_requests_spread_over_replicas_by_load(tmp_path: Path) -> None:
    """Two equally slow replicas each serve about half of the calls."""
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(40))
    with (
        Simulator(SimConfig(latency_s=0.1)) as a,
        Simulator(SimConfig(latency_s=0.1)) as b,
    ):
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(a.url, b.url, concurrency=10, max_iters=0),
            show_progress=False,
        )
        counts = len(served(a)), len(served(b))
    assert summary.exit_code == 0, summary.message
    assert sum(counts) == 40 and min(counts) >= 15, counts


def test_one_replica_down_past_max_outage_does_not_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-outage stops the run only when every replica is down: one down for good is
    drained and probed while the other serves every record."""
    monkeypatch.setattr(replicas_mod, "PROBE_EVERY_S", 0.2)
    inp = write_jsonl(tmp_path / "in.jsonl", tasks(60))
    with (
        Simulator(SimConfig(latency_s=0.02, outages=((0.0, 1e6),))) as down,
        Simulator(SimConfig(latency_s=0.05)) as up,
    ):
        summary = run(
            "code-improve",
            inp,
            tmp_path / "run",
            settings(down.url, up.url, concurrency=4, max_retries=2, max_outage=0.5),
            show_progress=False,
        )
        wall = max(served(up))
    assert summary.exit_code == 0, summary.message
    assert wall > 1.0, "the run must outlast the down replica's --max-outage"
    outs = read_jsonl(tmp_path / "run" / "outputs.jsonl")
    assert len(outs) == 60 and all(o["status"] == "done" for o in outs)
