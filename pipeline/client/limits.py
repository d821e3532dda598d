"""Rate limiting: smooth request and token pacing that holds when limits are enforced per second.

Providers state limits per minute but may enforce them in short quanta (OpenAI
documents per-second enforcement), so a client that spends a minute's budget in
a burst is refused. We pace with GCRA (a virtual-time leaky bucket): each
request or token costs ``cost / rate`` seconds of virtual time and may run at
most ``burst_s`` ahead of it. We do not use aiolimiter's leaky bucket here
because the pacer must refund or charge tokens after the answer (usage is only
known then) and change its rate at run time (adaptive slow-down), which
aiolimiter's public API does not offer.

Providers count tokens differently, and the pacer follows what each announces:
OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers give one token
budget (prompt plus ``max_tokens`` at admission); Anthropic's
``anthropic-ratelimit-{requests,input-tokens,output-tokens}-{limit,remaining,reset}`` give
input and output tokens apart (input: the prompt less what its cache served; output:
``max_tokens`` at admission, settled to what the answer used), each paced on its own.
Anthropic's combined ``anthropic-ratelimit-tokens-*`` is the sum of those two and adds no
limit of its own, so it is not read.

Everything takes ``now`` explicitly or reads an injected clock, so tests drive
it with a fake clock and no real sleeps.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Protocol

import anyio

__all__ = [
    "LIMIT_HEADERS",
    "RATE_HEADERS",
    "Booking",
    "LimitHeaders",
    "Limiter",
    "Pace",
    "RateLimiter",
    "estimate_tokens",
    "parse_duration",
    "parse_reset",
    "rate_limits",
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


@dataclass(frozen=True, slots=True)
class LimitHeaders:
    """One per-minute budget a provider announces, by the names of its three headers."""

    bucket: str  # the pace it sets: "requests", "tokens", "input" or "output"
    limit: str
    remaining: str
    reset: str


def _openai(bucket: str) -> LimitHeaders:
    names = (f"x-ratelimit-{what}-{bucket}" for what in ("limit", "remaining", "reset"))
    return LimitHeaders(bucket, *names)


def _anthropic(bucket: str, name: str) -> LimitHeaders:
    prefix = f"anthropic-ratelimit-{name}"
    return LimitHeaders(bucket, f"{prefix}-limit", f"{prefix}-remaining", f"{prefix}-reset")


# The budgets the pacer reads, OpenAI's and Anthropic's.
LIMIT_HEADERS: Final = (
    _openai("requests"),
    _openai("tokens"),
    _anthropic("requests", "requests"),
    _anthropic("input", "input-tokens"),
    _anthropic("output", "output-tokens"),
)
# Every header the pacer reads (a Ray worker passes these on to the driver's pacer).
RATE_HEADERS: Final = tuple(h for b in LIMIT_HEADERS for h in (b.limit, b.remaining, b.reset))


def rate_limits(headers: Mapping[str, str]) -> dict[str, float]:
    """The limits ``headers`` announce, by the bucket they set (valid, positive numbers only)."""
    found: dict[str, float] = {}
    for named in LIMIT_HEADERS:
        raw = headers.get(named.limit)
        if not raw:
            continue
        try:
            limit = float(raw)
        except ValueError:
            continue
        if math.isfinite(limit) and limit > 0:
            found[named.bucket] = limit
    return found


def parse_reset(text: str, now_wall: float) -> float | None:
    """Seconds until a reset header's moment: a duration (OpenAI's ``1s``, ``6m0s``) or an
    RFC 3339 time (Anthropic's ``2025-05-14T00:00:05Z``), ``now_wall`` being Unix time."""
    wait = parse_duration(text)
    if wait is not None:
        return wait
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now_wall)


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
    max_tokens: int = 0  # output tokens booked (settled to those the answer used)


class RateLimiter(Protocol):
    """What the client asks of its pacer: a ``Limiter`` here, or a cluster-wide one on Ray."""

    rate_limited: int  # 429s seen

    async def acquire(self, prompt_estimate: int, max_tokens: int) -> Booking:
        """Wait until one request of this size may be sent."""
        ...

    def settle(
        self, booking: Booking, prompt_tokens: int | None, completion_tokens: int | None = None
    ) -> None:
        """Correct the token budgets with the prompt tokens the server really counted (those
        its input limit counts) and, where output is paced apart, the answer's tokens."""
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
    announces in its headers lower them (or set them, when the user gave none).
    Input and output tokens are paced apart once a server announces them apart.
    """

    __slots__ = (
        "_clock",
        "_factor",
        "_last_slow",
        "_last_tick",
        "_limits",
        "_paces",
        "_sleep",
        "_wall",
        "rate_limited",
    )

    def __init__(
        self,
        rpm: float | None = None,
        tpm: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._wall = wall  # Unix time, for reset headers that name a moment
        # Per-minute limits in force, and their paces, by bucket: requests, tokens (prompt
        # and max_tokens together), input and output (where a server counts them apart).
        self._limits: dict[str, float] = {}
        self._paces: dict[str, Pace] = {}
        for bucket, limit in (("requests", rpm), ("tokens", tpm)):
            if limit:
                self._limits[bucket] = limit
                self._paces[bucket] = Pace(limit / 60.0)
        self._factor = 1.0
        self._last_slow = -math.inf
        self._last_tick = clock()
        self.rate_limited = 0  # 429s seen, for progress and benchmarks

    @property
    def factor(self) -> float:
        """The current share of the configured rates in use (1.0 = full speed)."""
        return self._factor

    def _retune(self) -> None:
        for bucket, pace in self._paces.items():
            pace.rate = self._limits[bucket] / 60.0 * self._factor

    def _recover(self, now: float) -> None:
        elapsed = now - self._last_tick
        self._last_tick = now
        if self._factor < 1.0 and elapsed > 0:
            self._factor = min(1.0, self._factor + RECOVERY_PER_S * elapsed)
            self._retune()

    def book(self, prompt_estimate: int, max_tokens: int) -> tuple[Booking, float]:
        """Reserve one request; return the booking and the wait before sending.

        A request costs its prompt plus ``max_tokens`` of the token budget, as providers
        count at admission (its prompt of the input budget, ``max_tokens`` of the output
        budget, where they are apart); ``settle`` corrects them once the answer is known.
        """
        now = self._clock()
        self._recover(now)
        costs = {
            "requests": 1,
            "tokens": prompt_estimate + max_tokens,
            "input": prompt_estimate,
            "output": max_tokens,
        }
        wait = 0.0
        for bucket, pace in self._paces.items():
            wait = max(wait, pace.reserve(costs[bucket], now))
        return Booking(prompt_estimate, prompt_estimate + max_tokens, max_tokens), wait

    async def acquire(self, prompt_estimate: int, max_tokens: int) -> Booking:
        """Wait until one request of this size may be sent."""
        booking, wait = self.book(prompt_estimate, max_tokens)
        if wait > 0:
            await self._sleep(wait)
        return booking

    def settle(
        self, booking: Booking, prompt_tokens: int | None, completion_tokens: int | None = None
    ) -> None:
        """Correct the token budgets with the prompt tokens the server really counted and,
        where output is paced apart, the answer's tokens (``max_tokens`` was booked)."""
        if prompt_tokens is not None:
            for bucket in ("tokens", "input"):
                pace = self._paces.get(bucket)
                if pace is not None:
                    pace.adjust(prompt_tokens - booking.prompt_estimate)
        output = self._paces.get("output")
        if output is not None and completion_tokens is not None:
            output.adjust(min(0, completion_tokens - booking.max_tokens))

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
            for pace in self._paces.values():
                pace.hold(now + min(retry_after, 1.0))

    def _respect_empty(self, headers: Mapping[str, str], named: LimitHeaders) -> None:
        """The server says this budget is spent: send nothing of it until it refills a little."""
        if headers.get(named.remaining, "").strip() != "0":
            return
        pace = self._paces.get(named.bucket)
        reset = parse_reset(headers.get(named.reset, ""), self._wall())
        if pace is not None and reset is not None:
            # Capped: a minute-window server's reset can be long, and other answers in
            # flight may already have been admitted; a 429 still slows us properly.
            pace.hold(self._clock() + min(reset, 1.0))

    def observe(self, headers: Mapping[str, str]) -> None:
        """Adopt the limits the server announces when tighter than ours; respect an empty budget."""
        for bucket, limit in rate_limits(headers).items():
            known = self._limits.get(bucket)
            if known is None or limit < known:
                self._limits[bucket] = limit
                if bucket not in self._paces:
                    self._paces[bucket] = Pace(limit / 60.0 * self._factor)
                self._retune()
        for named in LIMIT_HEADERS:
            self._respect_empty(headers, named)
