"""Rate limiting: smooth request and token pacing that holds when limits are enforced per second.

Providers state limits per minute but may enforce them in short quanta (OpenAI
documents per-second enforcement), so a client that spends a minute's budget in
a burst is refused. We pace with GCRA (a virtual-time leaky bucket): each
request or token costs ``cost / rate`` seconds of virtual time and may run at
most ``burst_s`` ahead of it. We do not use aiolimiter's leaky bucket here
because the pacer must refund or charge tokens after the answer (usage is only
known then) and change its rate at run time (adaptive slow-down), which
aiolimiter's public API does not offer.

Everything takes ``now`` explicitly or reads an injected clock, so tests drive
it with a fake clock and no real sleeps.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

__all__ = [
    "Booking",
    "Limiter",
    "Pace",
    "RateLimiter",
    "estimate_tokens",
    "parse_duration",
]

# No burst at all: requests go strictly 1/rate apart from the first one. A server
# may count per second in a token bucket (capacity limit/60), a sliding window or
# fixed calendar seconds; strict spacing at the limit never exceeds any of them,
# while even a quarter-second burst at start overflows a window counter (the first
# second would see the burst plus a full second of paced requests). The cost is
# at most one second of budget at start, which a bucket-enforcing server would
# have allowed.
BURST_S = 0.0
# Adaptive slow-down after a 429: a gentle multiplicative decrease, at most once
# per window, then a slow additive recovery while no 429 arrives. Gentle, because
# with strict pacing a 429 means timing jitter at a window edge, not a wrong rate.
SLOWDOWN = 0.9
MIN_FACTOR = 0.3
RECOVERY_PER_S = 0.01
SLOWDOWN_WINDOW_S = 1.0
# Tokens a chat request costs beyond its message texts (role markers, priming).
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REQUEST = 3

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def estimate_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """A conservative prompt token estimate with no tokenizer download.

    English BPE averages about 4 characters a token; non-ASCII text (CJK,
    emoji) is closer to one token a character, so it is counted as such.
    """
    total = TOKENS_PER_REQUEST
    for m in messages:
        text = m.get("content") or ""
        ascii_chars = len(text.encode("ascii", "ignore"))
        total += TOKENS_PER_MESSAGE + math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)
    return total


def parse_duration(text: str) -> float | None:
    """Seconds in an ``x-ratelimit-reset-*`` value such as ``1s``, ``250ms`` or ``6m0s``."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


class Pace:
    """GCRA pacing for one budget (requests or tokens) at ``rate`` units per second."""

    __slots__ = ("burst_s", "rate", "tat")

    def __init__(self, rate: float, burst_s: float = BURST_S) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = rate
        self.burst_s = burst_s
        self.tat = -math.inf  # theoretical arrival time of the next unit

    def reserve(self, cost: float, now: float) -> float:
        """Book ``cost`` units; return how long to wait before sending."""
        start = max(now, self.tat - self.burst_s)
        self.tat = max(self.tat, now) + cost / self.rate
        return start - now

    def adjust(self, delta: float) -> None:
        """Charge (delta > 0) or refund (delta < 0) units already booked."""
        if math.isfinite(self.tat):
            self.tat += delta / self.rate

    def hold(self, until: float) -> None:
        """Send nothing before ``until`` (the server said its bucket is empty)."""
        self.tat = max(self.tat, until + self.burst_s)


@dataclass(frozen=True, slots=True)
class Booking:
    """What one request booked, to settle once its real usage is known."""

    prompt_estimate: int
    cost: int


class RateLimiter(Protocol):
    """What the client asks of its pacer: a ``Limiter`` here, or a cluster-wide one on Ray."""

    rate_limited: int  # 429s seen

    async def acquire(self, prompt_estimate: int, max_tokens: int) -> Booking:
        """Wait until one request of this size may be sent."""
        ...

    def settle(self, booking: Booking, prompt_tokens: int | None) -> None:
        """Correct the token budget with the prompt tokens the server really counted."""
        ...

    def observe(self, headers: Mapping[str, str]) -> None:
        """Take note of the rate-limit headers of an answer."""
        ...

    def on_rate_limited(self, retry_after: float | None) -> None:
        """A 429 arrived."""
        ...


class Limiter:
    """Requests- and tokens-per-minute pacing shared by every call of a run.

    ``rpm``/``tpm`` set by the user are upper bounds; limits the server
    announces in ``x-ratelimit-limit-*`` headers lower them (or set them, when
    the user gave none).
    """

    __slots__ = (
        "_clock",
        "_factor",
        "_last_slow",
        "_last_tick",
        "_requests",
        "_rpm",
        "_sleep",
        "_tokens",
        "_tpm",
        "rate_limited",
    )

    def __init__(
        self,
        rpm: float | None = None,
        tpm: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._rpm = rpm
        self._tpm = tpm
        self._requests = Pace(rpm / 60.0) if rpm else None
        self._tokens = Pace(tpm / 60.0) if tpm else None
        self._factor = 1.0
        self._last_slow = -math.inf
        self._last_tick = clock()
        self.rate_limited = 0  # 429s seen, for progress and benchmarks

    @property
    def factor(self) -> float:
        """The current share of the configured rates in use (1.0 = full speed)."""
        return self._factor

    def _retune(self) -> None:
        if self._requests is not None and self._rpm:
            self._requests.rate = self._rpm / 60.0 * self._factor
        if self._tokens is not None and self._tpm:
            self._tokens.rate = self._tpm / 60.0 * self._factor

    def _recover(self, now: float) -> None:
        elapsed = now - self._last_tick
        self._last_tick = now
        if self._factor < 1.0 and elapsed > 0:
            self._factor = min(1.0, self._factor + RECOVERY_PER_S * elapsed)
            self._retune()

    def book(self, prompt_estimate: int, max_tokens: int) -> tuple[Booking, float]:
        """Reserve one request; return the booking and the wait before sending.

        A request costs its prompt plus ``max_tokens`` of the token budget, as providers
        count at admission; ``settle`` corrects the prompt part once it is known.
        """
        now = self._clock()
        self._recover(now)
        cost = prompt_estimate + max_tokens
        wait = 0.0
        if self._requests is not None:
            wait = self._requests.reserve(1, now)
        if self._tokens is not None:
            wait = max(wait, self._tokens.reserve(cost, now))
        return Booking(prompt_estimate, cost), wait

    async def acquire(self, prompt_estimate: int, max_tokens: int) -> Booking:
        """Wait until one request of this size may be sent."""
        booking, wait = self.book(prompt_estimate, max_tokens)
        if wait > 0:
            await self._sleep(wait)
        return booking

    def settle(self, booking: Booking, prompt_tokens: int | None) -> None:
        """Correct the token budget with the prompt tokens the server really counted."""
        if self._tokens is not None and prompt_tokens is not None:
            self._tokens.adjust(prompt_tokens - booking.prompt_estimate)

    def on_rate_limited(self, retry_after: float | None) -> None:
        """A 429: slow the whole pool down (once per window) and respect the server's wait."""
        now = self._clock()
        self.rate_limited += 1
        if now - self._last_slow >= SLOWDOWN_WINDOW_S:
            self._last_slow = now
            self._factor = max(MIN_FACTOR, self._factor * SLOWDOWN)
            self._retune()
        self._last_tick = now
        if retry_after is not None:
            # The server's bucket is empty until then; a short hold keeps the
            # next requests from being refused too. Long waits stay per request.
            for pace in (self._requests, self._tokens):
                if pace is not None:
                    pace.hold(now + min(retry_after, 1.0))

    def _respect_empty(self, headers: Mapping[str, str], bucket: str) -> None:
        """The server says this budget is spent: send nothing of it until it refills a little."""
        if headers.get(f"x-ratelimit-remaining-{bucket}", "").strip() != "0":
            return
        pace = self._requests if bucket == "requests" else self._tokens
        reset = parse_duration(headers.get(f"x-ratelimit-reset-{bucket}", ""))
        if pace is not None and reset is not None:
            # Capped: a minute-window server's reset can be long, and other answers in
            # flight may already have been admitted; a 429 still slows us properly.
            pace.hold(self._clock() + min(reset, 1.0))

    def observe(self, headers: Mapping[str, str]) -> None:
        """Adopt the limits the server announces when tighter than ours; respect an empty budget."""
        for bucket in ("requests", "tokens"):
            self._respect_empty(headers, bucket)
            raw = headers.get(f"x-ratelimit-limit-{bucket}")
            if not raw:
                continue
            try:
                limit = float(raw)
            except ValueError:
                continue
            if limit <= 0:
                continue
            if bucket == "requests" and (self._rpm is None or limit < self._rpm):
                self._rpm = limit
                if self._requests is None:
                    self._requests = Pace(limit / 60.0 * self._factor)
                self._retune()
            elif bucket == "tokens" and (self._tpm is None or limit < self._tpm):
                self._tpm = limit
                if self._tokens is None:
                    self._tokens = Pace(limit / 60.0 * self._factor)
                self._retune()
