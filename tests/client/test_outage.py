"""The outage breaker on a fake clock: when it opens, when it closes, when probes go."""

from __future__ import annotations

from pipeline.client.outage import Outage
from pipeline.client.retry import OutageState
from pipeline.errors import CallError
from tests.client.test_limits import FakeClock


def breaker(clock: FakeClock, threshold: int = 3) -> Outage:
    return Outage(max_s=60.0, first_s=10.0, clock=clock, threshold=threshold)


def test_opens_after_threshold_faults_with_no_success_between() -> None:
    """Consecutive endpoint faults open the circuit; a success sent after them resets it."""
    clock = FakeClock(100.0)
    outage = breaker(clock)
    outage.failed(sent_at=99.0)
    outage.failed(sent_at=99.5)
    assert outage.close(sent_at=99.6)  # sent after the latest failed request
    outage.failed(sent_at=99.7)
    outage.failed(sent_at=99.8)
    assert not outage.open
    outage.failed(sent_at=99.9)
    assert outage.open
    assert outage.state(ever_succeeded=True) == OutageState(open=True)


def test_an_answer_sent_before_the_latest_failure_proves_nothing() -> None:
    """A success of a request sent before the latest failed one neither resets nor closes."""
    clock = FakeClock(100.0)
    outage = breaker(clock, threshold=2)
    outage.failed(sent_at=99.0)
    assert not outage.close(sent_at=98.0)
    outage.failed(sent_at=99.5)
    assert outage.open
    assert not outage.close(sent_at=99.2)
    assert outage.open
    assert outage.close(sent_at=99.5)
    assert not outage.open


def test_probes_are_scheduled_after_each_answer() -> None:
    """The next probe is due ``delay`` after the latest fault's answer and no sooner than any
    earlier fault asked; a failed probe pushes it on and is counted; a shorter wait never
    brings it forward."""
    clock = FakeClock(100.0)
    outage = breaker(clock, threshold=2)
    outage.failed(sent_at=99.0, delay=2.0)  # a Retry-After before the circuit opened holds
    clock.advance(1.0)
    outage.failed(sent_at=100.5, delay=0.5)
    assert outage.open and outage.wait_s() == 1.0
    clock.advance(0.5)
    outage.failed(sent_at=101.0, delay=0.5)
    assert outage.wait_s() == 0.5
    clock.advance(0.5)
    assert outage.wait_s() == 0.0
    outage.probe_failed(sent_at=clock.now, delay=1.0)
    assert outage.probes == 1 and outage.wait_s() == 1.0
    outage.failed(sent_at=clock.now, delay=3.0)  # a call in flight, asked to wait 3 s
    assert outage.wait_s() == 3.0
    outage.failed(sent_at=clock.now, delay=0.1)  # a shorter wait never brings it forward
    assert outage.wait_s() == 3.0
    assert outage.close(sent_at=clock.now)
    assert outage.probes == 0 and not outage.open


def test_an_outage_stops_the_run_after_max_s_or_first_s() -> None:
    """An outage outlasting max_s is exceeded; before any success, first_s is the limit."""
    clock = FakeClock(0.0)
    outage = breaker(clock, threshold=2)
    outage.failed()
    outage.failed()
    clock.advance(11.0)
    assert outage.exceeded(ever_succeeded=False)
    assert not outage.exceeded(ever_succeeded=True)
    clock.advance(50.0)
    assert outage.exceeded(ever_succeeded=True)
    assert outage.state(ever_succeeded=True) == OutageState(True, True, duration_s=61.0)
    assert outage.duration() == 61.0
    assert "failing for 61 s" in str(outage.unavailable(CallError("http_503", "HTTP 503")))
