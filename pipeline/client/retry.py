"""The retry policy: what to do after a failed attempt, as pure functions.

The client is the one retry layer (the openai SDK is built with ``max_retries=0``): after
each failed attempt its retry sequence (``attempts``) asks ``decide`` whether to retry
after a delay, fail the record, or stop the run. The delays are the client's ``Delays``
(``delays``): exponential backoff with jitter, or a server's Retry-After (``retry-after``
or ``retry-after-ms``, on any retryable status) when longer, up to a cap at a time; tests
pass ``NO_DELAYS`` rather than sleep.

Record faults and endpoint faults: a failure that says the endpoint is in trouble (5xx,
429, 408, timeouts, broken connections; ``endpoint_fault``) also counts toward the
endpoint's outage breaker (``outage``), which opens only when no request has succeeded
since. While it is open such failures use up no call's retries: the calls wait behind
one-at-a-time probes, spaced by ``Delays.probe_after``. While it is closed (other requests
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
from .delays import DELAYS, Delays

__all__ = [
    "Decision",
    "OutageState",
    "classify_status",
    "decide",
    "endpoint_fault",
    "error_fields",
    "quota_spent",
    "retry_after",
    "retryable",
]

RETRYABLE_STATUS = frozenset({408, 409, 429})
# Failures that are not the request's fault and may go away on their own.
_RETRYABLE_CATEGORIES = frozenset({"timeout", "connection", "bad_response", "empty"})
# ... and those of them that say the endpoint (not this request) is in trouble.
_ENDPOINT_CATEGORIES = frozenset({"timeout", "connection", "bad_response"})
_ENDPOINT_STATUS = frozenset({408, 429})
# A 429 that no wait clears: OpenAI's ``insufficient_quota`` and its billing limits.
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_not_active"})
_QUOTA_WORDS = re.compile(r"exceeded your current quota|insufficient[ _]quota|billing", re.I)


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
    return failure.category in _ENDPOINT_CATEGORIES


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


def retryable(failure: CallError) -> bool:
    """Whether another attempt may succeed where this one failed."""
    if isinstance(failure, FatalCallError):
        return False
    if failure.status is not None:
        return classify_status(failure.status) == "retry"
    return failure.category in _RETRYABLE_CATEGORIES


@dataclass(frozen=True, slots=True)
class OutageState:
    """What the endpoint's outage breaker says after counting this failure."""

    open: bool = False  # the endpoint keeps failing: requests wait for one-at-a-time probes
    exceeded: bool = False  # ... and has done so for longer than the run waits
    duration_s: float = 0.0  # how long it has been failing (named by the error that stops)


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
    delays: Delays = DELAYS,
) -> Decision:
    """The policy: retry after a delay, fail the record, or stop the run.

    ``attempt`` counts the call's failed attempts so far, this one included. While the
    endpoint is in an outage its faults use up no call's retries: the call waits its turn
    behind the outage's probes (no delay of its own) until the outage has lasted too long.
    Otherwise the delay is ``delays.after_failure``: our backoff, or the server's
    Retry-After (``wait``) when longer, whatever the status.
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
    return Decision("retry", delays.after_failure(attempt, rand, wait))
