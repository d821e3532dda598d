"""OpenAI-style per-minute limits on requests and tokens, enforced per second."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from .replies import error_body

__all__ = ["Admission", "Bucket", "ChatLimiter", "fmt_duration", "fmt_number"]

_UNITS: Final = {"requests": "RPM", "tokens": "TPM"}


def fmt_duration(seconds: float) -> str:
    """Format like Go's ``time.Duration`` at millisecond precision ("250ms", "1.5s", "6m0s")."""
    ms = math.ceil(seconds * 1000.0 - 1e-6)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = str(rest // 1000) if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def fmt_number(value: float) -> str:
    """``value`` without a trailing ".0"."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class Bucket:
    """Token bucket of capacity ``limit/60`` refilled at ``limit/60`` per second.

    It starts full. A full bucket admits one request of any cost (going into debt), so a
    request larger than the per-second capacity is not starved; the long-run rate holds.
    """

    __slots__ = ("capacity", "level", "limit", "rate", "stamp")

    def __init__(self, per_minute: float, now: float) -> None:
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.capacity = self.rate
        self.level = self.capacity
        self.stamp = now

    def refill(self, now: float) -> None:
        """Add what accrued since the last refill."""
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def admits(self, cost: float) -> bool:
        """Whether a request of ``cost`` may pass now."""
        return self.level >= cost or self.level >= self.capacity

    def wait_s(self, cost: float) -> float:
        """Seconds until a request of ``cost`` would pass."""
        return max(0.0, (min(cost, self.capacity) - self.level) / self.rate)

    def headers(self, bucket: str) -> list[tuple[str, str]]:
        """The ``x-ratelimit-*`` headers for this bucket."""
        return [
            (f"x-ratelimit-limit-{bucket}", fmt_number(self.limit)),
            (f"x-ratelimit-remaining-{bucket}", str(max(0, math.floor(self.level)))),
            (f"x-ratelimit-reset-{bucket}", fmt_duration((self.capacity - self.level) / self.rate)),
        ]


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision on one request: the headers to send, and the 429 body when refused."""

    headers: list[tuple[str, str]]
    refusal: bytes | None = None
    limited: str | None = None


_OPEN: Final = Admission([])


class ChatLimiter:
    """The request and token buckets; refused requests consume nothing."""

    __slots__ = ("requests", "tokens")

    def __init__(self) -> None:
        self.requests: Bucket | None = None
        self.tokens: Bucket | None = None

    def configure(self, now: float, rpm: float | None, tpm: float | None) -> None:
        """Start fresh buckets for limits that changed (``None``: no limit)."""
        if (self.requests.limit if self.requests else None) != rpm:
            self.requests = Bucket(rpm, now) if rpm else None
        if (self.tokens.limit if self.tokens else None) != tpm:
            self.tokens = Bucket(tpm, now) if tpm else None

    def admit(self, now: float, cost: int) -> Admission:
        """Decide on a request of ``cost`` tokens arriving at ``now``."""
        rb, tb = self.requests, self.tokens
        if rb is None and tb is None:
            return _OPEN
        limited: str | None = None
        wait = 0.0
        if rb is not None:
            rb.refill(now)
            if not rb.admits(1):
                limited, wait = "requests", rb.wait_s(1)
        if tb is not None:
            tb.refill(now)
            if not tb.admits(cost):
                limited = limited or "tokens"
                wait = max(wait, tb.wait_s(cost))
        if limited is None:
            if rb is not None:
                rb.level -= 1
            if tb is not None:
                tb.level -= cost
        headers: list[tuple[str, str]] = []
        if rb is not None:
            headers += rb.headers("requests")
        if tb is not None:
            headers += tb.headers("tokens")
        if limited is None:
            return Admission(headers)
        bucket = rb if limited == "requests" else tb
        assert bucket is not None
        wait_ms = max(1, math.ceil(wait * 1000))
        asked = 1 if limited == "requests" else cost
        message = (
            f"Rate limit reached for {limited} in organization org-simulator on {limited} "
            f"per min ({_UNITS[limited]}): Limit {fmt_number(bucket.limit)}, Requested {asked}. "
            f"Please try again in {fmt_duration(wait_ms / 1000)}."
        )
        headers += [
            ("retry-after-ms", str(wait_ms)),
            ("retry-after", str(max(1, math.ceil(wait_ms / 1000)))),
        ]
        return Admission(
            headers, error_body(message, limited, None, "rate_limit_exceeded"), limited
        )
