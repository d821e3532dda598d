"""Anthropic's rate limits: requests, input tokens and output tokens per minute, apart.

Each limit is a token bucket refilled continuously (``ratelimit.Bucket``, enforced per
second). As Anthropic counts them, input tokens are the uncached input plus the cache
writes (cache reads do not count), and output tokens are charged at ``max_tokens`` when a
request is admitted, then settled to what the answer really used. A refused request
consumes nothing and gets 429 ``rate_limit_error`` with ``retry-after`` in whole seconds.

Every reply of the Messages API carries the ``anthropic-ratelimit-*`` headers of the
limits configured: ``-limit``, ``-remaining`` (exact, not rounded to thousands) and
``-reset`` (when the bucket is full again, RFC 3339) for ``requests``, ``input-tokens``
and ``output-tokens``, and ``tokens`` (input and output together, as the API reports it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Final

from ..ratelimit import Bucket, fmt_number

__all__ = ["MessagesAdmission", "MessagesLimiter", "rfc3339"]

_WHAT: Final = {
    "requests": "requests",
    "input-tokens": "input tokens",
    "output-tokens": "output tokens",
}


def rfc3339(wall: float) -> str:
    """A Unix time as RFC 3339 in UTC, to the second (rounded up)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.ceil(wall)))


@dataclass(frozen=True, slots=True)
class MessagesAdmission:
    """The decision on one request: 429's message and wait when refused, else None."""

    refusal: str | None = None
    wait_s: float = 0.0


class MessagesLimiter:
    """The buckets of the limits configured (``None``: no limit); ``wall0`` dates resets."""

    __slots__ = ("buckets", "wall0")

    def __init__(self, wall0: float) -> None:
        self.wall0 = wall0
        self.buckets: dict[str, Bucket] = {}

    def configure(
        self, now: float, rpm: float | None, itpm: float | None, otpm: float | None
    ) -> None:
        """Start fresh buckets for limits that changed."""
        for name, limit in (("requests", rpm), ("input-tokens", itpm), ("output-tokens", otpm)):
            bucket = self.buckets.get(name)
            if (bucket.limit if bucket else None) == limit:
                continue
            if limit:
                self.buckets[name] = Bucket(limit, now)
            else:
                self.buckets.pop(name, None)

    def admit(self, now: float, input_tokens: int, max_tokens: int) -> MessagesAdmission:
        """Decide on a request of ``input_tokens`` (uncached and written) and ``max_tokens``."""
        costs = {"requests": 1, "input-tokens": input_tokens, "output-tokens": max_tokens}
        refused: str | None = None
        wait = 0.0
        for name, bucket in self.buckets.items():
            bucket.refill(now)
            if not bucket.admits(costs[name]):
                refused = refused or name
                wait = max(wait, bucket.wait_s(costs[name]))
        if refused is None:
            for name, bucket in self.buckets.items():
                bucket.level -= costs[name]
            return MessagesAdmission()
        limit = fmt_number(self.buckets[refused].limit)
        message = (
            f"This request would exceed your organization's rate limit of {limit} "
            f"{_WHAT[refused]} per minute. Please slow down, or retry after the time the "
            "retry-after header gives."
        )
        return MessagesAdmission(message, wait)

    def settle(self, now: float, unused_output: int) -> None:
        """Give back the output tokens charged at ``max_tokens`` but not used."""
        bucket = self.buckets.get("output-tokens")
        if bucket is not None and unused_output > 0:
            bucket.refill(now)
            bucket.level = min(bucket.capacity, bucket.level + unused_output)

    def headers(self, now: float) -> list[tuple[str, str]]:
        """The ``anthropic-ratelimit-*`` headers of the limits configured, as of ``now``."""
        out: list[tuple[str, str]] = []
        tokens: list[Bucket] = []
        for name, bucket in self.buckets.items():
            bucket.refill(now)
            out += _bucket_headers(name, bucket.limit, bucket.level, self._reset(bucket, now))
            if name != "requests":
                tokens.append(bucket)
        if tokens:
            limit = sum(b.limit for b in tokens)
            level = sum(b.level for b in tokens)
            reset = max(self._reset(b, now) for b in tokens)
            out += _bucket_headers("tokens", limit, level, reset)
        return out

    def _reset(self, bucket: Bucket, now: float) -> float:
        return self.wall0 + now + max(0.0, bucket.capacity - bucket.level) / bucket.rate


def _bucket_headers(name: str, limit: float, level: float, reset: float) -> list[tuple[str, str]]:
    prefix = f"anthropic-ratelimit-{name}"
    return [
        (f"{prefix}-limit", fmt_number(limit)),
        (f"{prefix}-remaining", str(max(0, math.floor(level)))),
        (f"{prefix}-reset", rfc3339(reset)),
    ]
