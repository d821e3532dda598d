"""Rate limiting: token estimates, durations, GCRA pacing and the adaptive Limiter (fake clock)."""

from __future__ import annotations

import math
import random

import pytest

from pipeline.client.limits import (
    BURST_S,
    MIN_FACTOR,
    RECOVERY_PER_S,
    SLOWDOWN,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_REQUEST,
    Limiter,
    Pace,
    estimate_tokens,
    parse_duration,
    parse_reset,
)


class FakeClock:
    """A clock that only moves when told to; its async sleep advances it and records the wait."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def make_limiter(
    rpm: float | None = None, tpm: float | None = None, now: float = 0.0
) -> tuple[Limiter, FakeClock]:
    """A Limiter driven by a fresh fake clock."""
    clock = FakeClock(now)
    return Limiter(rpm, tpm, clock=clock, sleep=clock.sleep), clock


async def send_times(
    limiter: Limiter, clock: FakeClock, n: int, prompt: int = 0, max_tokens: int = 0
) -> list[float]:
    """Acquire ``n`` requests one after another; the clock time at which each may be sent."""
    times = []
    for _ in range(n):
        await limiter.acquire(prompt, max_tokens)
        times.append(clock.now)
    return times


# -- estimate_tokens / admission cost ----------------------------------------------------------

BASE_TOKENS = TOKENS_PER_REQUEST + TOKENS_PER_MESSAGE  # one message with empty content


@pytest.mark.parametrize(
    ("contents", "expected"),
    [
        ([], TOKENS_PER_REQUEST),
        ([""], BASE_TOKENS),
        ([None], BASE_TOKENS),
        (["abcd"], BASE_TOKENS + 1),
        (["abcde"], BASE_TOKENS + 2),  # partial tokens round up: conservative
        (["a" * 400], BASE_TOKENS + 100),
        (["日本語"], BASE_TOKENS + 3),  # non-ASCII: one token a character
        (["é" * 400], BASE_TOKENS + 400),
        (["ab日本"], BASE_TOKENS + 1 + 2),
        (["😀 ok"], BASE_TOKENS + 1 + 1),
        (["abcd", "abcd"], TOKENS_PER_REQUEST + 2 * (TOKENS_PER_MESSAGE + 1)),
    ],
)
def test_estimate_tokens(contents: list[str | None], expected: int) -> None:
    """About 4 ASCII characters a token, 1 token per non-ASCII character, plus framing."""
    messages = [{"role": "user", "content": c} for c in contents]
    assert estimate_tokens(messages) == expected  # type: ignore[arg-type]


def test_estimate_tokens_grows_with_text() -> None:
    """Longer text never estimates fewer tokens, and 4x the text is about 4x the tokens."""
    sizes = [estimate_tokens([{"role": "user", "content": "x" * n}]) for n in range(0, 200)]
    assert sizes == sorted(sizes)
    small = estimate_tokens([{"role": "user", "content": "word " * 1000}]) - BASE_TOKENS
    large = estimate_tokens([{"role": "user", "content": "word " * 4000}]) - BASE_TOKENS
    assert large == 4 * small


def test_request_cost_adds_the_maximum_output() -> None:
    """Admission cost is the prompt estimate plus max_tokens."""
    messages = [{"role": "user", "content": "abcd"}]
    booking, _ = Limiter(tpm=60_000, clock=lambda: 0.0).book(estimate_tokens(messages), 500)
    assert booking.cost == estimate_tokens(messages) + 500


# -- parse_duration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1s", 1.0),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("6m0s", 360.0),
        ("1m30s", 90.0),
        ("1h2m", 3720.0),
        ("2h0m0.5s", 7200.5),
        ("0.5", 0.5),
        ("20", 20.0),
        (" 2s ", 2.0),
        ("abc", None),
        ("", None),
        ("5x", None),
        ("1s garbage", None),
        ("s", None),
        ("1 s", None),
        ("1m-1s", None),
    ],
)
def test_parse_duration(text: str, expected: float | None) -> None:
    """Go-style durations and plain seconds parse; anything else is None."""
    got = parse_duration(text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("text", ["inf", "nan", "-1", "-2.5"])
def test_parse_duration_rejects_non_durations(text: str) -> None:
    """Infinite, NaN or negative values are not durations a client can wait for."""
    assert parse_duration(text) is None


# -- Pace ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "burst_s", "at_once"),
    [
        (8.0, 0.25, 3),  # rate * burst_s + 1
        (32.0, 0.25, 9),
        (4.0, 0.5, 3),
        (16.0, 0.0, 1),
        (2.0, 0.25, 1),  # less than one unit of burst: only the first goes at once
    ],
)
def test_pace_burst_then_even_spacing(rate: float, burst_s: float, at_once: int) -> None:
    """From idle, floor(rate*burst_s)+1 requests go at once, then one every 1/rate seconds."""
    pace = Pace(rate, burst_s)
    waits = [pace.reserve(1, now=100.0) for _ in range(at_once + 5)]
    assert waits[:at_once] == [0.0] * at_once
    assert waits[at_once] > 0
    # request k starts at k/rate - burst_s after the first
    assert waits[at_once:] == pytest.approx(
        [k / rate - burst_s for k in range(at_once, at_once + 5)]
    )
    gaps = [b - a for a, b in zip(waits[at_once:], waits[at_once + 1 :], strict=False)]
    assert gaps == pytest.approx([1 / rate] * 4)


def test_pace_rejects_non_positive_rate() -> None:
    """A pace needs a positive rate."""
    with pytest.raises(ValueError):
        Pace(0)


@pytest.mark.parametrize(("rate", "window"), [(10.0, 1.0), (10.0, 0.3), (2.5, 4.0), (50.0, 0.1)])
def test_pace_never_exceeds_rate_in_any_window(rate: float, window: float) -> None:
    """Over a long bursty run, no window of W seconds sends more than rate*(W+burst)+1."""
    rng = random.Random(1234)
    pace = Pace(rate)
    now, sends = 0.0, []
    for _ in range(30):
        # an idle spell long enough to drain the backlog, so a fresh burst is allowed ...
        now += 200 / rate
        for _ in range(100):
            # ... then demand at about 3x the rate, some of it simultaneous
            now += rng.choice([0.0, rng.expovariate(3 * rate)])
            sends.append(now + pace.reserve(1, now))
    sends.sort()
    limit = rate * (window + BURST_S) + 1
    j, worst = 0, 0
    for i, start in enumerate(sends):
        while j < len(sends) and sends[j] < start + window - 1e-9:
            j += 1
        worst = max(worst, j - i)
    assert worst <= limit
    # the demand did saturate the pacer: some window came close to the bound
    assert worst >= rate * window


def test_pace_adjust_moves_the_schedule() -> None:
    """A charge delays the next start by delta/rate; a refund brings it forward as much."""
    waits = {}
    for delta in (0.0, 20.0, -20.0):
        pace = Pace(100.0, burst_s=0.0)
        pace.reserve(50, now=0.0)  # booked until t=0.5
        pace.adjust(delta)
        waits[delta] = pace.reserve(1, now=0.0)
    assert waits[0.0] == pytest.approx(0.5)
    assert waits[20.0] == pytest.approx(0.7)
    assert waits[-20.0] == pytest.approx(0.3)


def test_pace_adjust_before_any_booking_is_harmless() -> None:
    """Adjusting an idle pace changes nothing: the first request still goes at once."""
    pace = Pace(10.0)
    pace.adjust(-100)
    pace.adjust(100)
    assert pace.reserve(1, now=5.0) == 0.0
    assert math.isfinite(pace.tat)


def test_pace_refund_cannot_bank_credit_beyond_the_burst() -> None:
    """A refund larger than what is booked does not let more than a burst go at once later."""
    pace = Pace(8.0, burst_s=0.25)
    pace.reserve(1, now=0.0)
    pace.adjust(-1000)  # far more than was booked
    waits = [pace.reserve(1, now=10.0) for _ in range(6)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3] > 0


def test_pace_hold_delays_until_the_given_time() -> None:
    """After hold(until), nothing starts before ``until``; a past hold changes nothing."""
    pace = Pace(10.0)
    pace.hold(until=2.0)
    assert pace.reserve(1, now=0.5) == pytest.approx(1.5)
    idle = Pace(10.0)
    idle.hold(until=-5.0)
    assert idle.reserve(1, now=0.0) == 0.0


# -- Limiter ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(("rpm", "n"), [(600.0, 100), (60.0, 30), (1200.0, 500)])
async def test_limiter_paces_requests_to_rpm(rpm: float, n: int) -> None:
    """N sequential requests at R rpm take about N/(R/60) s: the last at (N-1)/rate - burst."""
    limiter, clock = make_limiter(rpm=rpm)
    times = await send_times(limiter, clock, n)
    rate = rpm / 60.0
    assert times[-1] == pytest.approx((n - 1) / rate - BURST_S)
    assert 0.9 * n / rate < times[-1] <= n / rate
    gaps = [b - a for a, b in zip(times[-10:], times[-9:], strict=False)]
    assert gaps == pytest.approx([1 / rate] * 9)


@pytest.mark.anyio
async def test_limiter_without_limits_never_waits() -> None:
    """With neither rpm nor tpm nor announced limits, acquire never sleeps."""
    limiter, clock = make_limiter()
    await send_times(limiter, clock, 50, prompt=1000, max_tokens=1000)
    assert clock.waits == [] and clock.now == 0.0


def test_rate_limited_lowers_factor_once_per_window() -> None:
    """A 429 multiplies the factor by SLOWDOWN; more 429s in the same second do not."""
    limiter, clock = make_limiter(rpm=600)
    assert limiter.factor == 1.0
    limiter.on_rate_limited(None)
    assert limiter.factor == pytest.approx(SLOWDOWN)
    clock.advance(0.5)
    limiter.on_rate_limited(None)
    assert limiter.factor == pytest.approx(SLOWDOWN)
    assert limiter.rate_limited == 2
    clock.advance(0.5)
    limiter.on_rate_limited(None)
    assert limiter.factor == pytest.approx(SLOWDOWN**2)


def test_rate_limited_factor_has_a_floor() -> None:
    """However many 429s arrive, the factor never drops below MIN_FACTOR."""
    limiter, clock = make_limiter(rpm=600)
    for _ in range(50):
        limiter.on_rate_limited(None)
        clock.advance(1.0)
    assert limiter.factor == pytest.approx(MIN_FACTOR)


def test_factor_recovers_over_time() -> None:
    """Without 429s the factor climbs back by RECOVERY_PER_S a second, capped at 1."""
    limiter, clock = make_limiter(rpm=600)
    limiter.on_rate_limited(None)
    clock.advance(5.0)
    limiter.book(0, 0)
    assert limiter.factor == pytest.approx(SLOWDOWN + 5 * RECOVERY_PER_S)
    clock.advance(1000.0)
    limiter.book(0, 0)
    assert limiter.factor == 1.0


@pytest.mark.anyio
async def test_rate_limited_slows_the_request_pace() -> None:
    """After a 429, requests are spaced by about 1/(rate*SLOWDOWN), then speed up again."""
    limiter, clock = make_limiter(rpm=600)  # 10/s
    before = await send_times(limiter, clock, 20)
    limiter.on_rate_limited(None)
    after = await send_times(limiter, clock, 20)
    gap_before = before[-1] - before[-2]
    gap_after = after[1] - after[0]
    assert gap_before == pytest.approx(0.1)
    slowed = 0.1 / SLOWDOWN
    # recovery during the gap itself makes it a little shorter than `slowed`
    assert slowed * 0.99 < gap_after <= slowed + 1e-9
    clock.advance(100.0)
    recovered = await send_times(limiter, clock, 20)
    assert recovered[-1] - recovered[-2] == pytest.approx(0.1)


@pytest.mark.anyio
@pytest.mark.parametrize(("retry_after", "wait"), [(None, 0.0), (0.5, 0.5), (30.0, 1.0)])
async def test_rate_limited_holds_requests_for_retry_after(
    retry_after: float | None, wait: float
) -> None:
    """A 429's retry-after holds the next request back, for at most one second."""
    limiter, clock = make_limiter(rpm=600, now=10.0)
    limiter.on_rate_limited(retry_after)
    await limiter.acquire(0, 0)
    assert clock.now == pytest.approx(10.0 + wait)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("rpm", "headers", "gap"),
    [
        (600.0, {"x-ratelimit-limit-requests": "60"}, 1.0),  # tighter: adopted
        (60.0, {"x-ratelimit-limit-requests": "6000"}, 1.0),  # looser: ignored
        (None, {"x-ratelimit-limit-requests": "120"}, 0.5),  # none set: adopted
        (600.0, {"x-ratelimit-limit-requests": "abc"}, 0.1),  # garbage: ignored
        (600.0, {"x-ratelimit-limit-requests": "0"}, 0.1),  # zero: ignored
        (600.0, {"x-ratelimit-limit-requests": ""}, 0.1),
        (600.0, {}, 0.1),
    ],
)
async def test_observe_adopts_only_tighter_request_limits(
    rpm: float | None, headers: dict[str, str], gap: float
) -> None:
    """x-ratelimit-limit-requests lowers the pace (or sets it), never raises it."""
    limiter, clock = make_limiter(rpm=rpm)
    limiter.observe(headers)
    times = await send_times(limiter, clock, 20)
    assert times[-1] - times[-2] == pytest.approx(gap)


@pytest.mark.anyio
async def test_observe_adopts_tighter_token_limits() -> None:
    """x-ratelimit-limit-tokens lowers the token pace, never raises it."""
    limiter, clock = make_limiter(tpm=60_000)  # 1000 tokens/s
    limiter.observe({"x-ratelimit-limit-tokens": "6000"})  # 100 tokens/s
    limiter.observe({"x-ratelimit-limit-tokens": "600000"})
    times = await send_times(limiter, clock, 10, prompt=50, max_tokens=50)
    assert times[-1] - times[-2] == pytest.approx(1.0)


@pytest.mark.anyio
async def test_token_pacing_with_tpm() -> None:
    """With a tpm limit, each request costs prompt+max_tokens tokens of the per-second budget."""
    limiter, clock = make_limiter(tpm=6000)  # 100 tokens/s; each request below costs 100
    times = await send_times(limiter, clock, 10, prompt=30, max_tokens=70)
    # the first goes at once; request k may start at k * 1.0 - BURST_S
    assert times == pytest.approx([0.0] + [k * 1.0 - BURST_S for k in range(1, 10)])


@pytest.mark.anyio
async def test_both_limits_the_tighter_wins() -> None:
    """With rpm and tpm, a request waits for whichever budget is further behind."""
    limiter, clock = make_limiter(rpm=600, tpm=6000)  # 10 req/s, but 1 s of tokens each
    times = await send_times(limiter, clock, 10, prompt=30, max_tokens=70)
    assert times[-1] - times[-2] == pytest.approx(1.0)
    limiter, clock = make_limiter(rpm=60, tpm=6_000_000)  # 1 req/s, tokens plentiful
    times = await send_times(limiter, clock, 10, prompt=30, max_tokens=70)
    assert times[-1] - times[-2] == pytest.approx(1.0)


@pytest.mark.anyio
@pytest.mark.parametrize(("actual", "shift"), [(30, 0.0), (10, -0.2), (50, 0.2), (None, 0.0)])
async def test_settle_corrects_the_token_budget(actual: int | None, shift: float) -> None:
    """The server's prompt token count refunds or charges the difference from the estimate."""
    limiter, clock = make_limiter(tpm=6000)  # 100 tokens/s
    await send_times(limiter, clock, 3, prompt=30, max_tokens=70)
    booking = await limiter.acquire(30, 70)
    planned = clock.now
    limiter.settle(booking, actual)
    await limiter.acquire(30, 70)
    # without correction the next request starts 1 s later; 20 tokens are 0.2 s at 100/s
    assert clock.now - planned == pytest.approx(1.0 + shift)


def test_empty_budget_header_holds_next_request() -> None:
    """An answer saying remaining=0 makes the next request wait for the announced reset."""
    clock = FakeClock()
    limiter = Limiter(rpm=600, clock=clock)
    _, first = limiter.book(10, 10)
    limiter.observe({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "400ms"})
    _, wait = limiter.book(10, 10)
    assert first == 0.0
    assert wait == pytest.approx(0.4)


def test_nonzero_remaining_does_not_hold() -> None:
    """A budget that is not spent changes nothing beyond normal pacing."""
    clock = FakeClock()
    limiter = Limiter(rpm=600, clock=clock)
    limiter.book(10, 10)
    limiter.observe({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "400ms"})
    _, wait = limiter.book(10, 10)
    assert wait == pytest.approx(0.1)


def test_anthropics_spent_budget_holds_until_its_rfc3339_reset() -> None:
    """anthropic-ratelimit-output-tokens-remaining 0 with a reset given as a moment (RFC
    3339) holds the next request until then (capped at a second, as OpenAI's)."""
    clock = FakeClock()
    limiter = Limiter(clock=clock, wall=lambda: 1_747_180_800.0)  # 2025-05-14T00:00:00Z
    limiter.observe(
        {
            "anthropic-ratelimit-output-tokens-limit": "60000",
            "anthropic-ratelimit-output-tokens-remaining": "0",
            "anthropic-ratelimit-output-tokens-reset": "2025-05-14T00:00:00.400Z",
        }
    )
    _, wait = limiter.book(10, 10)
    assert wait == pytest.approx(0.4)
    assert parse_reset("2025-05-14T00:00:05Z", 1_747_180_800.0) == pytest.approx(5.0)
    assert parse_reset("soon", 0.0) is None


def test_output_tokens_are_refunded_to_their_own_pace() -> None:
    """Where output is paced apart, settling an answer shorter than max_tokens gives the
    unused output back (the next request waits less), and the prompt correction goes to
    the input pace only."""
    clock = FakeClock()
    limiter = Limiter(clock=clock)
    limiter.observe({"anthropic-ratelimit-output-tokens-limit": "600"})  # 10 a second
    booking, _ = limiter.book(0, 100)
    _, before = limiter.book(0, 0)
    limiter.settle(booking, None, 20)  # 80 of the 100 booked were not used
    _, after = limiter.book(0, 0)
    assert before == pytest.approx(10.0)
    assert after == pytest.approx(2.0)
