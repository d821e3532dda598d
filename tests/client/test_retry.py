"""The retry policy as pure functions: backoff, Retry-After, status classes and decide()."""

from __future__ import annotations

import pytest

from pipeline.client.delays import (
    DELAYS,
    NO_DELAYS,
    OUTAGE_PROBE_CAP_S,
    RETRY_AFTER_CAP_S,
    Backoff,
    Delays,
    backoff_delay,
)
from pipeline.client.retry import (
    Decision,
    OutageState,
    classify_status,
    decide,
    endpoint_fault,
    error_fields,
    quota_spent,
    retry_after,
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
    ("status", "meaning"),
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
def test_classify_status(status: int, meaning: str) -> None:
    """Statuses map to retry, stop-the-run (auth) or fail-the-record."""
    assert classify_status(status) == meaning


HTTP500 = CallError("http_500", "HTTP 500: boom", status=500)
HTTP429 = CallError("http_429", "HTTP 429: slow down", status=429)
HTTP503 = CallError("http_503", "HTTP 503: busy", status=503)
HTTP408 = CallError("http_408", "HTTP 408: request timeout", status=408)
HTTP409 = CallError("http_409", "HTTP 409: conflict", status=409)
HTTP400 = CallError("http_400", "HTTP 400: bad request", status=400)
TIMEOUT = CallError("timeout", "no answer within 60 s")
BROKEN = CallError("connection", "connection failed: reset")
EMPTY = CallError("empty", "empty answer")
REFUSAL = CallError("refusal", "model refused: no")
AUTH = AuthError("auth", "HTTP 401: bad key", status=401)
NOT_FOUND = FatalCallError("not_found", "HTTP 404: no such model", status=404)
CLOSED = OutageState()
OPEN = OutageState(open=True)
GONE = OutageState(open=True, exceeded=True)


@pytest.mark.parametrize(
    ("failure", "attempt", "outage", "wait", "expected"),
    [
        # retryable failures back off exponentially until the call's retries are used up
        (HTTP500, 1, CLOSED, None, Decision("retry", 0.5)),
        (HTTP500, 3, CLOSED, None, Decision("retry", 2.0)),
        (HTTP500, 4, CLOSED, None, Decision("fail")),
        (TIMEOUT, 2, CLOSED, None, Decision("retry", 1.0)),
        (EMPTY, 1, CLOSED, None, Decision("retry", 0.5)),
        # a server's Retry-After, whatever the retryable status, when longer than backoff
        (HTTP503, 1, CLOSED, 3.0, Decision("retry", 3.0)),
        (HTTP500, 1, CLOSED, 3.0, Decision("retry", 3.0)),
        (HTTP408, 1, CLOSED, 3.0, Decision("retry", 3.0)),
        (HTTP409, 1, CLOSED, 3.0, Decision("retry", 3.0)),
        (HTTP429, 1, CLOSED, 3.0, Decision("retry", 3.0)),
        # ... capped, and never shorter than our own backoff
        (HTTP429, 1, CLOSED, 1000.0, Decision("retry", RETRY_AFTER_CAP_S)),
        (HTTP429, 3, CLOSED, 0.1, Decision("retry", 2.0)),
        (HTTP503, 3, CLOSED, 0.1, Decision("retry", 2.0)),
        # the request's own fault, or an answer that will not change: fail the record
        (HTTP400, 1, CLOSED, None, Decision("fail")),
        (REFUSAL, 1, CLOSED, None, Decision("fail")),
        # errors every record would hit stop the run at once
        (AUTH, 1, CLOSED, None, Decision("stop")),
        (NOT_FOUND, 1, OPEN, None, Decision("stop")),
        # in an outage, endpoint faults wait for the probes: no delay of their own, not
        # counted; a rate limit is the endpoint's state too
        (HTTP500, 4, OPEN, None, Decision("retry", 0.0, counted=False)),
        (TIMEOUT, 9, OPEN, None, Decision("retry", 0.0, counted=False)),
        (HTTP429, 4, OPEN, 0.2, Decision("retry", 0.0, counted=False)),
        (HTTP500, 1, GONE, None, Decision("stop")),
        (HTTP429, 1, GONE, None, Decision("stop")),
        # a failure that is not the endpoint's follows the call's own budget in an outage
        (EMPTY, 4, OPEN, None, Decision("fail")),
        (HTTP409, 2, OPEN, None, Decision("retry", 1.0)),
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


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (HTTP500, True),
        (HTTP503, True),
        (HTTP429, True),
        (HTTP408, True),
        (TIMEOUT, True),
        (BROKEN, True),
        (CallError("bad_response", "malformed response body"), True),
        (HTTP409, False),
        (HTTP400, False),
        (EMPTY, False),
        (REFUSAL, False),
    ],
)
def test_endpoint_fault_table(failure: CallError, expected: bool) -> None:
    """5xx, 429, 408, timeouts and broken answers are the endpoint's; the rest the request's."""
    assert endpoint_fault(failure) is expected


@pytest.mark.parametrize(
    ("status", "code", "message", "expected"),
    [
        (429, "insufficient_quota", "You exceeded your current quota.", True),
        (429, None, "You exceeded your current quota, please check your plan and billing.", True),
        (429, "billing_hard_limit_reached", "Billing hard limit has been reached", True),
        (429, None, "Your billing details need attention", True),
        (429, "rate_limit_exceeded", "Rate limit reached for requests", False),
        (429, None, "Rate limit reached on tokens per day (TPD)", False),
        (500, "insufficient_quota", "You exceeded your current quota.", False),
    ],
)
def test_quota_spent_table(status: int, code: str | None, message: str, expected: bool) -> None:
    """Only a 429 naming the quota or billing (by code or words) is a spent quota."""
    assert quota_spent(status, code, message) is expected


def test_quota_words_with_a_retry_after_are_a_rate_limit() -> None:
    """Quota words with a Retry-After are waited out; OpenAI's quota code never is."""
    words = "You exceeded your current quota, please check your plan and billing details."
    assert not quota_spent(429, None, words, wait=30.0)
    assert quota_spent(429, "insufficient_quota", words, wait=30.0)


@pytest.mark.parametrize(
    ("probes", "rand", "wait", "expected"),
    [
        (0, 1.0, None, 0.5),
        (0, 0.0, None, 0.25),
        (1, 1.0, None, 1.0),
        (3, 1.0, None, 4.0),
        (4, 1.0, None, OUTAGE_PROBE_CAP_S),
        (10**6, 1.0, None, OUTAGE_PROBE_CAP_S),
        (0, 1.0, 3.0, 3.0),  # the server's Retry-After, when longer
        (10, 1.0, 60.0, 60.0),
        (10, 1.0, 10**6, RETRY_AFTER_CAP_S),
    ],
)
def test_probe_delay_table(probes: int, rand: float, wait: float | None, expected: float) -> None:
    """Probes go at a doubling, capped interval, or after the server's Retry-After."""
    assert DELAYS.probe_after(probes, rand, wait) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"message": "m", "code": "context_length_exceeded", "param": "messages"},
            ("context_length_exceeded", "messages"),
        ),
        (
            {"error": {"message": "m", "code": "insufficient_quota", "param": None}},
            ("insufficient_quota", None),
        ),
        (
            {"error": {"code": 400, "message": "m", "type": "exceed_context_size_error"}},
            ("exceed_context_size_error", None),
        ),
        (
            {"object": "error", "message": "m", "type": "BadRequestError", "code": 400},
            ("BadRequestError", None),
        ),
        ("Bad Request", (None, None)),
        (None, (None, None)),
    ],
)
def test_error_fields_table(body: object, expected: tuple[str | None, str | None]) -> None:
    """The code (or llama.cpp's type) and param of OpenAI's, vLLM's and llama.cpp's errors."""
    assert error_fields(body) == expected


def test_no_delays_zero_every_wait() -> None:
    """NO_DELAYS zeroes backoff, Retry-After and the outage probe spacing, where the
    defaults wait."""
    assert NO_DELAYS.retry.delay(30, 1.0) == NO_DELAYS.flex.delay(30, 1.0) == 0.0
    assert decide(HTTP429, attempt=1, max_retries=3, outage=CLOSED, rand=1.0, wait=60.0,
                  delays=NO_DELAYS) == Decision("retry", 0.0)  # fmt: skip
    assert decide(HTTP500, attempt=1, max_retries=3, outage=OPEN, rand=1.0,
                  delays=NO_DELAYS) == Decision("retry", 0.0, counted=False)  # fmt: skip
    assert NO_DELAYS.probe_after(5, 1.0, 60.0) == 0.0
    assert decide(HTTP429, attempt=1, max_retries=3, outage=CLOSED, rand=1.0, wait=60.0) == (
        Decision("retry", 60.0)
    )
    assert DELAYS.probe_after(5, 1.0, 60.0) == 60.0 and DELAYS.retry.delay(1, 1.0) == 0.5


@pytest.mark.parametrize(
    ("delays", "attempt", "wait", "expected"),
    [
        (Delays(retry=Backoff(2.0, 10.0)), 1, None, 2.0),  # a schedule of its own
        (Delays(retry=Backoff(2.0, 10.0)), 4, None, 10.0),  # ... capped
        (Delays(retry=Backoff(0.0, 0.0)), 1, 3.0, 3.0),  # no backoff: the server's wait stays
        (Delays(asked_cap=5.0), 1, 60.0, 5.0),  # the server's wait, capped by our own cap
        (Delays(asked_cap=5.0), 1, -1.0, 0.5),  # a negative Retry-After counts as none
    ],
)
def test_a_retrys_delay_follows_the_clients_delays(
    delays: Delays, attempt: int, wait: float | None, expected: float
) -> None:
    """decide() delays a retry by the Delays given: their backoff, or the capped Retry-After."""
    got = decide(HTTP500, attempt=attempt, max_retries=9, outage=CLOSED, rand=1.0, wait=wait,
                 delays=delays)  # fmt: skip
    assert got == Decision("retry", expected)
