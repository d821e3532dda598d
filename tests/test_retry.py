"""The retry policy as pure functions: backoff, Retry-After, status classes and decide()."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline.client.retry import (
    OUTAGE_PROBE_CAP_S,
    RETRY_AFTER_CAP_S,
    Decision,
    OutageState,
    backoff_delay,
    classify_status,
    decide,
    retry_after,
    set_testing,
)
from pipeline.errors import AuthError, CallError, FatalCallError


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.0, 0.25),
        (1, 1.0, 0.5),
        (2, 1.0, 1.0),
        (3, 0.5, 1.5),
        (60, 1.0, 30.0),
        (10**9, 1.0, 30.0),
        (0, 1.0, 0.5),
    ],
)
def test_backoff_delay_table(attempt: int, rand: float, expected: float) -> None:
    """Backoff doubles per attempt, keeps half of it fixed, and is capped without overflow."""
    assert backoff_delay(attempt, rand) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after-ms": "x", "retry-after": "2"}, 2.0),
        ({}, None),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
    ],
)
def test_retry_after_table(headers: dict[str, str], expected: float | None) -> None:
    """Retry-After is read from milliseconds, seconds or an HTTP date (past dates mean now)."""
    assert retry_after(headers) == expected


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (408, "retry"),
        (409, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
        (401, "auth"),
        (403, "auth"),
        (400, "record"),
        (404, "record"),
        (422, "record"),
    ],
)
def test_classify_status(status: int, kind: str) -> None:
    """Statuses map to retry, stop-the-run (auth) or fail-the-record."""
    assert classify_status(status) == kind


HTTP500 = CallError("http_500", "HTTP 500: boom", status=500)
HTTP429 = CallError("http_429", "HTTP 429: slow down", status=429)
HTTP503 = CallError("http_503", "HTTP 503: busy", status=503)
HTTP400 = CallError("http_400", "HTTP 400: bad request", status=400)
TIMEOUT = CallError("timeout", "no answer within 60 s")
EMPTY = CallError("empty", "empty answer")
REFUSAL = CallError("refusal", "model refused: no")
AUTH = AuthError("auth", "HTTP 401: bad key", status=401)
NOT_FOUND = FatalCallError("not_found", "HTTP 404: no such model", status=404)
CLOSED = OutageState()
OPEN = OutageState(open=True, probes=2)
GONE = OutageState(open=True, exceeded=True, probes=40)


@pytest.mark.parametrize(
    ("failure", "attempt", "outage", "wait", "expected"),
    [
        # retryable failures back off exponentially until the call's retries are used up
        (HTTP500, 1, CLOSED, None, Decision("retry", 0.5)),
        (HTTP500, 3, CLOSED, None, Decision("retry", 2.0)),
        (HTTP500, 4, CLOSED, None, Decision("fail")),
        (TIMEOUT, 2, CLOSED, None, Decision("retry", 1.0)),
        (EMPTY, 1, CLOSED, None, Decision("retry", 0.5)),
        # a 429's Retry-After is the server's exact answer, even when shorter than backoff
        (HTTP429, 3, CLOSED, 0.1, Decision("retry", 0.1)),
        (HTTP429, 1, CLOSED, 1000.0, Decision("retry", RETRY_AFTER_CAP_S)),
        # other statuses keep at least our backoff
        (HTTP503, 3, CLOSED, 0.1, Decision("retry", 2.0)),
        # the request's own fault, or an answer that will not change: fail the record
        (HTTP400, 1, CLOSED, None, Decision("fail")),
        (REFUSAL, 1, CLOSED, None, Decision("fail")),
        # errors every record would hit stop the run at once
        (AUTH, 1, CLOSED, None, Decision("stop")),
        (NOT_FOUND, 1, OPEN, None, Decision("stop")),
        # in an outage, server faults are probes: spaced, capped, not counted
        (HTTP500, 4, OPEN, None, Decision("retry", 2.0, counted=False)),
        (
            TIMEOUT,
            9,
            OutageState(open=True, probes=30),
            None,
            Decision("retry", OUTAGE_PROBE_CAP_S, False),
        ),
        (HTTP500, 1, GONE, None, Decision("stop")),
        # a 429 during an outage is not a server fault: it follows the normal rule
        (HTTP429, 4, OPEN, 0.2, Decision("fail")),
    ],
)
def test_decide_table(
    failure: CallError,
    attempt: int,
    outage: OutageState,
    wait: float | None,
    expected: Decision,
) -> None:
    """decide() maps failure, attempt and outage state to retry-after-d, fail record, or stop."""
    got = decide(failure, attempt=attempt, max_retries=3, outage=outage, rand=1.0, wait=wait)
    assert got == expected


@pytest.fixture
def testing() -> Iterator[None]:
    """The testing switch on for one test."""
    set_testing(True)
    yield
    set_testing(False)


@pytest.mark.usefixtures("testing")
def test_testing_switch_zeroes_every_wait() -> None:
    """set_testing(True) zeroes backoff, Retry-After and the outage probe spacing."""
    assert backoff_delay(30, 1.0) == 0.0
    assert decide(HTTP429, attempt=1, max_retries=3, outage=CLOSED, rand=1.0, wait=60.0) == (
        Decision("retry", 0.0)
    )
    assert decide(HTTP500, attempt=1, max_retries=3, outage=OPEN, rand=1.0) == Decision(
        "retry", 0.0, counted=False
    )
    set_testing(False)
    assert backoff_delay(1, 1.0) == 0.5
