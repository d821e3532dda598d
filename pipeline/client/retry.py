"""The retry policy: what to do after a failed attempt, as pure functions.

The client is the one retry layer (the openai SDK is built with ``max_retries=0``): after
each failed attempt it asks ``decide`` whether to retry after a delay, fail the record, or
stop the run, and does what it is told. Backoff is exponential with jitter, clamped so a
huge attempt number cannot overflow; ``set_testing(True)`` makes every wait zero (backoff,
Retry-After and the outage probe spacing) so tests of the policy need no real sleeps.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..errors import CallError, FatalCallError

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "OUTAGE_PROBE_CAP_S",
    "RETRY_AFTER_CAP_S",
    "Decision",
    "OutageState",
    "backoff_delay",
    "classify_status",
    "decide",
    "retry_after",
    "server_fault",
    "set_testing",
]

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# A server's Retry-After longer than this is not waited out in one sleep: the call waits
# this long, then asks again (and the outage breaker takes over if the server stays down).
RETRY_AFTER_CAP_S = 120.0
# Spacing of the one-at-a-time probes sent while an endpoint is in an outage.
OUTAGE_PROBE_CAP_S = 5.0
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Failures that are not the request's fault and may go away on their own.
_RETRYABLE_KINDS = frozenset({"timeout", "connection", "bad_response", "empty"})
_SERVER_FAULT_KINDS = frozenset({"timeout", "connection", "bad_response"})

_testing = False


def set_testing(on: bool) -> None:
    """Zero every wait of the retry policy (for tests); off again with ``False``."""
    global _testing
    _testing = on


def backoff_delay(
    attempt: int, rand: float, *, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S
) -> float:
    """Exponential backoff with jitter for retry ``attempt`` (1-based): half fixed, half random.

    Clamped before exponentiation so huge attempt numbers cannot overflow.
    """
    if _testing:
        return 0.0
    exp = min(max(attempt - 1, 0), 32)
    ceiling = min(cap, base * (2.0**exp))
    return ceiling * (0.5 + 0.5 * min(max(rand, 0.0), 1.0))


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asks us to wait (``retry-after-ms``, ``retry-after`` seconds or date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status(status: int) -> str:
    """What a failed status means: ``retry``, ``auth`` (stop the run) or ``record`` (fail it)."""
    if status in RETRYABLE_STATUS or status >= 500:
        return "retry"
    if status in (401, 403):
        return "auth"
    return "record"


def server_fault(failure: CallError) -> bool:
    """Failures that say the server (not this request) is in trouble: outage material."""
    status = failure.status
    return failure.kind in _SERVER_FAULT_KINDS or (status is not None and status >= 500)


def retryable(failure: CallError) -> bool:
    """Whether another attempt may succeed where this one failed."""
    if isinstance(failure, FatalCallError):
        return False
    if failure.status is not None:
        return classify_status(failure.status) == "retry"
    return failure.kind in _RETRYABLE_KINDS


@dataclass(frozen=True, slots=True)
class OutageState:
    """What the endpoint's outage breaker says after counting this failure."""

    open: bool = False  # the endpoint keeps failing: requests go one at a time as probes
    exceeded: bool = False  # ... and has done so for longer than the run waits
    probes: int = 0  # failed probes since it opened (spaces the next one)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the client does after a failed attempt."""

    action: Literal["retry", "fail", "stop"]  # stop: the run stops (the endpoint is gone)
    delay: float = 0.0
    counted: bool = True  # whether the attempt used up one of the call's retries


def decide(
    failure: CallError,
    *,
    attempt: int,
    max_retries: int,
    outage: OutageState,
    rand: float,
    wait: float | None = None,
    base: float = BACKOFF_BASE_S,
) -> Decision:
    """The policy: retry after a delay, fail the record, or stop the run.

    ``attempt`` counts the call's failed attempts so far, this one included. While the
    endpoint is in an outage its failures use up no call's retries (the probes wait it
    out, spaced by a capped backoff) until it has lasted too long. A 429's Retry-After is
    the server's exact answer; other statuses keep at least our own backoff, so a
    flapping server is not hammered.
    """
    if isinstance(failure, FatalCallError):
        return Decision("stop")
    if not retryable(failure):
        return Decision("fail")
    if outage.open and server_fault(failure):
        if outage.exceeded:
            return Decision("stop")
        probe = min(OUTAGE_PROBE_CAP_S, backoff_delay(outage.probes + 1, rand))
        return Decision("retry", probe, counted=False)
    if attempt > max_retries:
        return Decision("fail")
    delay = backoff_delay(attempt, rand, base=base)
    if wait is not None:
        asked = 0.0 if _testing else min(wait, RETRY_AFTER_CAP_S)
        delay = max(asked, 0.0 if failure.status == 429 else delay)
    return Decision("retry", delay)
