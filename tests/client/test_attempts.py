"""A call's retry sequence as a pure state machine: what follows each failed attempt, and the
error a call ends with, built whole with its trace data."""

from __future__ import annotations

import pytest

from pipeline.client.attempts import Attempts, FailRecord, HaltRun, Retry, StepDown, Verdict
from pipeline.client.delays import NO_DELAYS
from pipeline.client.formats import FormatLadder
from pipeline.client.retry import OutageState
from pipeline.core.steps import Try
from pipeline.errors import AuthError, CallError, FatalCallError, UnavailableError

SENT = [{"role": "user", "content": "Review it."}]
FORMAT = CallError("http_400", "HTTP 400: response_format json_schema not supported", status=400)
CONTEXT = CallError("http_400", "HTTP 400: maximum context length exceeded", status=400)
HTTP500 = CallError("http_500", "HTTP 500: boom", status=500)
TIMEOUT = CallError("timeout", "no answer within 60 s")
AUTH = AuthError("auth", "HTTP 401: bad key", status=401)
CLOSED = OutageState()
OPEN = OutageState(open=True)
GONE = OutageState(open=True, exceeded=True, duration_s=301.0)


def one_more(
    failure: CallError,
    *,
    counted: int = 0,
    structured: bool = False,
    outage: OutageState = CLOSED,
) -> tuple[Verdict, Attempts]:
    """The verdict on ``failure`` after ``counted`` retries used, with max_retries 2."""
    attempts = Attempts("m", 2, tries=[Try(500, 0.1)] * counted, counted=counted)
    attempts.failed(failure, 0.2)
    ladder = FormatLadder() if structured else None
    verdict = attempts.after(
        failure, SENT, 0, ladder=ladder, outage=lambda f: outage, jitter=lambda: 1.0
    )
    return verdict, attempts


@pytest.mark.parametrize(
    ("failure", "counted", "structured", "outage", "expected"),
    [
        # a refused format steps down, using up nothing; without a schema it is a 400
        (FORMAT, 0, True, CLOSED, StepDown(1)),
        (FORMAT, 2, True, CLOSED, StepDown(1)),
        (FORMAT, 0, False, CLOSED, FailRecord),
        # a 400 naming another cause is no refused format
        (CONTEXT, 0, True, CLOSED, FailRecord),
        # retryable failures back off, each using up one retry, until none is left
        (HTTP500, 0, False, CLOSED, Retry(0.5, counted=True)),
        (TIMEOUT, 1, True, CLOSED, Retry(1.0, counted=True)),
        (HTTP500, 2, False, CLOSED, FailRecord),
        # an endpoint in an outage: the call waits for its probes, using up nothing
        (HTTP500, 2, False, OPEN, Retry(0.0, counted=False)),
        # ... until the outage outlasts what the run waits: the run stops
        (HTTP500, 0, False, GONE, HaltRun),
        # a failure every record would meet stops the run at once
        (AUTH, 0, False, CLOSED, HaltRun),
    ],
)
def test_what_follows_a_failed_attempt(
    failure: CallError,
    counted: int,
    structured: bool,
    outage: OutageState,
    expected: Verdict | type[FailRecord | HaltRun],
) -> None:
    """Step down, retry (counted or not), fail the record or stop the run, as the table says."""
    verdict, _ = one_more(failure, counted=counted, structured=structured, outage=outage)
    if isinstance(expected, type):
        assert type(verdict) is expected
    else:
        assert verdict == expected


@pytest.mark.parametrize(
    ("failure", "structured", "outage", "counted_after", "floor_after"),
    [
        (FORMAT, True, CLOSED, 1, 1),  # a step down keeps the count, lowers the floor
        (HTTP500, False, CLOSED, 2, 0),  # a counted retry adds one
        (HTTP500, False, OPEN, 1, 0),  # an outage's wait adds none
    ],
)
def test_the_call_keeps_its_count_and_floor(
    failure: CallError, structured: bool, outage: OutageState, counted_after: int, floor_after: int
) -> None:
    """Only counted retries add to the call's count; only a refused format moves its floor;
    every attempt shows in its tries."""
    _, attempts = one_more(failure, counted=1, structured=structured, outage=outage)
    assert (attempts.counted, attempts.floor) == (counted_after, floor_after)
    assert len(attempts.tries) == 2 and attempts.tries[-1] == Try(failure.status or 0, 0.2)


def test_the_final_error_is_built_whole_from_the_attempts_failure() -> None:
    """The error a call ends with is a new one of the failure's type, carrying every try,
    the messages as sent and the model, and raised from the attempt's failure."""
    verdict, _ = one_more(HTTP500, counted=2)
    assert isinstance(verdict, FailRecord) and verdict.cause is HTTP500
    err = verdict.error
    assert type(err) is CallError and err is not HTTP500
    assert (err.category, str(err), err.status) == ("http_500", "HTTP 500: boom", 500)
    assert (err.attempts, err.tries) == (3, (Try(500, 0.1), Try(500, 0.1), Try(500, 0.2)))
    assert (err.messages, err.model) == (SENT, "m")
    assert (HTTP500.attempts, HTTP500.tries, HTTP500.model) == (1, (), None)  # left alone


def test_a_stop_keeps_the_fatal_type_or_names_the_outage() -> None:
    """A fatal failure stops the run as itself (its type kept); an outage past its limit as
    UnavailableError naming how long it lasted; both with the trace data."""
    auth, _ = one_more(AUTH)
    assert isinstance(auth, HaltRun) and type(auth.error) is AuthError
    assert auth.error.attempts == 1 and auth.error.model == "m" and auth.cause is AUTH
    gone, _ = one_more(HTTP500, outage=GONE)
    assert isinstance(gone, HaltRun) and isinstance(gone.error, UnavailableError)
    assert "failing for 301 s" in str(gone.error) and "HTTP 500" in str(gone.error)
    assert gone.error.status == 500 and gone.error.messages == SENT


def test_the_breaker_is_not_asked_about_a_refused_format() -> None:
    """A format refusal is the request's business: the endpoint's breaker never counts it,
    and no jitter is drawn for it."""
    asked: list[str] = []
    attempts = Attempts("m", 2, NO_DELAYS)

    def breaker(failure: CallError) -> OutageState:
        asked.append(failure.category)
        return CLOSED

    def jitter() -> float:
        asked.append("jitter")
        return 0.0

    ladder = FormatLadder()
    refused = attempts.after(FORMAT, SENT, 0, ladder=ladder, outage=breaker, jitter=jitter)
    assert refused == StepDown(1) and asked == []
    failed = attempts.after(HTTP500, SENT, 1, ladder=ladder, outage=breaker, jitter=jitter)
    assert failed == Retry(0.0, counted=True)
    assert asked == ["http_500", "jitter"]  # the breaker counts first, then the backoff


def test_a_call_resumed_across_rounds_keeps_its_retries_used() -> None:
    """Attempts made from an earlier round's tries (as the Batch API driver keeps a line
    across batches) go on counting from them: the retries left are the same."""
    earlier = [Try(500, 0.0), Try(503, 0.0)]
    attempts = Attempts("m", 2, tries=earlier, counted=len(earlier))
    attempts.failed(HTTP500, 1.5)
    verdict = attempts.after(HTTP500, SENT, 0)
    assert isinstance(verdict, FailRecord) and verdict.error.attempts == 3
    fresh = Attempts("m", 2)
    fresh.failed(HTTP500, 1.5)
    assert isinstance(fresh.after(HTTP500, SENT, 0), Retry)


def test_a_success_shows_its_tries_only_after_a_failure() -> None:
    """The tries of a call answered at once are not traced; after failures, all of them are."""
    at_once = Attempts("m", 5)
    assert at_once.succeeded(0.4) == () and len(at_once.tries) == 1
    later = Attempts("m", 5)
    later.failed(TIMEOUT, 0.3)
    later.failed(HTTP500, 0.2)
    assert later.succeeded(0.4) == (Try("timeout", 0.3), Try(500, 0.2), Try(200, 0.4))


def test_the_next_level_is_the_pools_or_the_calls_floor() -> None:
    """A call goes at the pool's level, or lower once a bare refusal lowered its own floor."""
    ladder = FormatLadder()
    attempts = Attempts("m", 2)
    assert attempts.level(ladder) == 0
    bare = CallError("http_400", "HTTP 400: Bad Request", status=400)
    assert attempts.after(bare, SENT, 0, ladder=ladder) == StepDown(1)
    assert (attempts.level(ladder), ladder.level) == (1, 0)  # the call's floor, not the pool's
    ladder.level = 2
    assert attempts.level(ladder) == 2


@pytest.mark.parametrize(
    "error",
    [
        CallError("empty", "empty answer"),
        FatalCallError("not_found", "HTTP 404", status=404),
        AuthError("auth", "HTTP 401", status=401),
        UnavailableError("unavailable", "down", status=503),
    ],
)
def test_traced_keeps_the_type_and_what_the_error_says(error: CallError) -> None:
    """CallError.traced returns an error of the same class, message and status, with the trace."""
    tries = (Try(503, 1.0),)
    traced = error.traced(attempts=1, tries=tries, messages=SENT, model="m")
    assert type(traced) is type(error) and traced is not error
    assert (traced.category, str(traced), traced.status) == (
        error.category,
        str(error),
        error.status,
    )
    assert (traced.attempts, traced.tries, traced.messages, traced.model) == (1, tries, SENT, "m")


def test_trace_data_cannot_be_patched_after_raising() -> None:
    """A CallError's trace data is read-only: it is given whole when the error is built."""
    error = CallError("http_500", "HTTP 500: boom", status=500)
    with pytest.raises(AttributeError):
        error.attempts = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        error.messages = SENT  # type: ignore[misc]
    assert (error.attempts, error.messages) == (1, None)
