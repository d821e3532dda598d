"""The retry policy: what to do after a failed attempt, as pure functions.

The client is the one retry layer (the openai SDK is built with ``max_retries=0``): after
each failed attempt it asks ``decide`` whether to retry after a delay, fail the record, or
stop the run, and does what it is told. Backoff is exponential with jitter, clamped so a
huge attempt number cannot overflow; a server's Retry-After (``retry-after`` or
``retry-after-ms``, on any retryable status) is waited when longer, up to
``RETRY_AFTER_CAP_S`` at a time. ``set_testing(True)`` makes every wait zero (backoff,
Retry-After and the outage probe spacing) so tests of the policy need no real sleeps.

Record faults and endpoint faults: a failure that says the endpoint is in trouble (5xx,
429, 408, timeouts, broken connections; ``endpoint_fault``) also counts toward the
endpoint's outage breaker (``outage``), which opens only when no request has succeeded
since. While it is open such failures use up no call's retries: the calls wait behind
one-at-a-time probes, spaced by ``probe_delay``. While it is closed (other requests
succeed) a call whose own attempts keep failing uses up its retries and fails its record.
A 429 saying the quota or billing limit is spent (``quota_spent``) stops the run at once.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..errors import CallError, FatalCallError

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "OUTAGE_PROBE_CAP_S",
    "PROBE_BASE_S",
    "RETRY_AFTER_CAP_S",
    "Decision",
    "OutageState",
    "asked_wait",
    "backoff_delay",
    "classify_status",
    "decide",
    "endpoint_fault",
    "error_fields",
    "probe_delay",
    "quota_spent",
    "retry_after",
    "retryable",
    "set_testing",
]

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# A server's Retry-After longer than this is not waited out in one sleep: the call waits
# this long, then asks again (and the outage breaker takes over if the server stays down).
RETRY_AFTER_CAP_S = 120.0
# Spacing of the one-at-a-time probes sent while an endpoint is in an outage: the first
# this long after the circuit opens, each next one twice as long after the previous one's
# answer (half of it jittered), at most OUTAGE_PROBE_CAP_S (or the server's Retry-After).
PROBE_BASE_S = 0.5
OUTAGE_PROBE_CAP_S = 5.0
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Failures that are not the request's fault and may go away on their own.
_RETRYABLE_KINDS = frozenset({"timeout", "connection", "bad_response", "empty"})
# ... and those of them that say the endpoint (not this request) is in trouble.
_ENDPOINT_KINDS = frozenset({"timeout", "connection", "bad_response"})
_ENDPOINT_STATUS = frozenset({408, 429})
# A 429 that no wait clears: OpenAI's ``insufficient_quota`` and its billing limits.
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_not_active"})
_QUOTA_WORDS = re.compile(r"exceeded your current quota|insufficient[ _]quota|billing", re.I)

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


def endpoint_fault(failure: CallError) -> bool:
    """Failures that say the endpoint (not this request) may be in trouble: outage material.

    5xx, 408 and 429 (a rate limit is the endpoint's state, not the record's), timeouts,
    broken connections and bodies that are no answer.
    """
    status = failure.status
    if status is not None:
        return status >= 500 or status in _ENDPOINT_STATUS
    return failure.kind in _ENDPOINT_KINDS


def quota_spent(status: int, code: str | None, message: str, wait: float | None = None) -> bool:
    """Whether an error answer says the key's quota or billing limit is spent (no wait helps).

    OpenAI says so by its code; a provider that only says it in words but names a
    Retry-After (some use the quota words for per-minute limits) is waited out instead.
    """
    if status != 429:
        return False
    if (code or "").lower() in _QUOTA_CODES:
        return True
    return wait is None and _QUOTA_WORDS.search(message) is not None


def error_fields(body: object) -> tuple[str | None, str | None]:
    """OpenAI's ``code`` and ``param`` in an error answer's body, where it sent them."""
    inner = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        return None, None
    code, param = inner.get("code"), inner.get("param")
    # llama.cpp's server puts its cause in ``type`` and a number in ``code``.
    if not isinstance(code, str):
        code = inner.get("type") if isinstance(inner.get("type"), str) else None
    return code, param if isinstance(param, str) else None


def asked_wait(wait: float | None) -> float:
    """The part of a server's Retry-After we wait in one go: capped, zero when testing."""
    if wait is None or _testing:
        return 0.0
    return min(max(wait, 0.0), RETRY_AFTER_CAP_S)


def probe_delay(probes: int, rand: float, wait: float | None = None) -> float:
    """How long after a failed probe's answer (``probes`` failed so far) the next one goes.

    Doubling from PROBE_BASE_S up to OUTAGE_PROBE_CAP_S, half of it jittered, or the
    server's Retry-After when longer.
    """
    spacing = backoff_delay(probes + 1, rand, base=PROBE_BASE_S, cap=OUTAGE_PROBE_CAP_S)
    return max(spacing, asked_wait(wait))


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

    open: bool = False  # the endpoint keeps failing: requests wait for one-at-a-time probes
    exceeded: bool = False  # ... and has done so for longer than the run waits


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
    endpoint is in an outage its faults use up no call's retries: the call waits its turn
    behind the outage's probes (no delay of its own) until the outage has lasted too long.
    Otherwise the delay is our backoff, or the server's Retry-After when longer, whatever
    the status: a flapping server is not hammered, and one that names its wait gets it.
    """
    if isinstance(failure, FatalCallError):
        return Decision("stop")
    if not retryable(failure):
        return Decision("fail")
    if outage.open and endpoint_fault(failure):
        if outage.exceeded:
            return Decision("stop")
        return Decision("retry", 0.0, counted=False)
    if attempt > max_retries:
        return Decision("fail")
    return Decision("retry", max(backoff_delay(attempt, rand, base=base), asked_wait(wait)))
