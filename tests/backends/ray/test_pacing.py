"""One rate limit for a Ray cluster: the driver books slots for the workers' asks (fake clock)."""

from __future__ import annotations

import anyio
import pytest

from pipeline.backends.ray.messages import PaceAsk
from pipeline.backends.ray.pacing import RemoteLimiter, grant
from pipeline.client.limits import SLOWDOWN, Booking
from tests.client.test_limits import FakeClock, make_limiter


@pytest.mark.parametrize(
    ("rpm", "tpm", "costs", "expected"),
    [
        # 600 RPM: 0.1 s apart, whichever worker asked.
        (600, None, [[(0, 0)] * 3, [(0, 0)] * 2], [[0.0, 0.1, 0.2], [0.3, 0.4]]),
        # 6000 TPM (100 tokens/s): a 50-token request holds the next for 0.5 s.
        (None, 6000, [[(30, 20)], [(80, 20), (10, 0)]], [[0.0], [0.5, 1.5]]),
        # Both: the slower of the two decides.
        (60, 60_000, [[(500, 500)], [(10, 10)]], [[0.0], [1.0]]),
        # No limit: nothing waits.
        (None, None, [[(100, 100)] * 2, [(1, 1)]], [[0.0, 0.0], [0.0]]),
    ],
)
def test_asks_of_several_workers_share_one_pace(
    rpm: float | None,
    tpm: float | None,
    costs: list[list[tuple[int, int]]],
    expected: list[list[float]],
) -> None:
    """Blocks asked by different workers are paced as one stream: never above the limit."""
    limiter, _ = make_limiter(rpm, tpm)
    waits = [grant(limiter, PaceAsk(tuple(c))) for c in costs]
    assert [[round(w, 6) for w in ws] for ws in waits] == expected


def test_a_limit_announced_to_one_worker_paces_the_others() -> None:
    """A header limit a worker passes on paces the slots booked for every worker after it."""
    limiter, _ = make_limiter()
    headers = {"x-ratelimit-limit-requests": "120", "x-ratelimit-remaining-requests": "119"}
    grant(limiter, PaceAsk(headers=(headers,)))
    assert grant(limiter, PaceAsk(((0, 0),) * 3)) == pytest.approx((0.0, 0.5, 1.0))


def test_a_429_on_one_worker_slows_the_cluster() -> None:
    """A 429 a worker reports slows the shared pace and holds it for the server's wait."""
    limiter, _ = make_limiter(rpm=600)
    grant(limiter, PaceAsk(refused=(0.3,)))
    assert limiter.factor == pytest.approx(SLOWDOWN)
    first, second = grant(limiter, PaceAsk(((0, 0), (0, 0))))
    assert first == pytest.approx(0.3)
    assert second - first == pytest.approx(0.1 / SLOWDOWN)


def test_token_corrections_arrive_summed() -> None:
    """Prompt tokens counted above the estimates push the token pace back by that many."""
    limiter, _ = make_limiter(tpm=6000)
    grant(limiter, PaceAsk(((100, 0),)))  # next slot at 1.0 s
    assert grant(limiter, PaceAsk(((0, 0),), correction=50)) == pytest.approx((1.5,))


def remote(limited: bool) -> tuple[RemoteLimiter, FakeClock, list[int]]:
    """A RemoteLimiter with a fake sleep, counting how often it asks to be heard."""
    clock = FakeClock()
    wakes: list[int] = []
    return RemoteLimiter(limited, lambda: wakes.append(1), sleep=clock.sleep), clock, wakes


@pytest.mark.anyio
async def test_unlimited_requests_go_at_once_and_ask_nothing() -> None:
    """Without a limit no request waits for the driver: no round trip at all."""
    lim, clock, wakes = remote(limited=False)
    booking = await lim.acquire(40, 10)
    assert booking == Booking(40, 50, 10)
    assert not lim.take() and not wakes and clock.waits == []


@pytest.mark.anyio
async def test_waiting_requests_are_asked_for_as_one_block() -> None:
    """Requests waiting together go out in one ask, and each then sleeps the wait it was granted."""
    lim, clock, wakes = remote(limited=True)
    sent: list[int] = []

    async def request(i: int) -> None:
        await lim.acquire(10 * i, 5)
        sent.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(request, i)
        await anyio.wait_all_tasks_blocked()
        assert sent == [] and wakes
        ask = lim.take()
        assert ask.costs == ((0, 5), (10, 5), (20, 5))
        assert not lim.take().costs  # asked once
        lim.grant((0.0, 0.2, 0.4))
    assert sorted(sent) == [0, 1, 2]
    assert sorted(clock.waits) == [0.2, 0.4]


@pytest.mark.anyio
async def test_slots_not_answered_are_asked_for_again() -> None:
    """Slots left unanswered are asked for again: no request goes out without a slot."""
    lim, _, _ = remote(limited=True)
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(lim.acquire, 1, 1)
        await anyio.wait_all_tasks_blocked()
        lim.take()
        lim.grant((0.0,))
        await anyio.wait_all_tasks_blocked()
        assert len(lim.take().costs) == 2
        lim.grant((0.0, 0.0))


@pytest.mark.parametrize(
    ("headers", "news"),
    [
        ({"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "10"}, True),
        ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms"}, True),
        ({"x-ratelimit-remaining-requests": "3"}, False),
        ({"content-type": "application/json"}, False),
    ],
)
def test_only_headers_that_say_something_new_are_passed_on(
    headers: dict[str, str], news: bool
) -> None:
    """A new limit or an empty budget is passed on to the driver; routine headers are not."""
    lim, _, _ = remote(limited=False)
    lim.observe(headers)
    passed = lim.take().headers
    assert bool(passed) is news
    if news:
        assert passed[0] == {k: v for k, v in headers.items() if k.startswith("x-ratelimit")}


def test_a_limit_header_is_passed_on_once_and_turns_pacing_on() -> None:
    """The first limit header makes requests wait for slots; the same limit again is no news."""
    lim, _, _ = remote(limited=False)
    lim.observe({"x-ratelimit-limit-requests": "500"})
    assert lim.limited and len(lim.take().headers) == 1
    lim.observe({"x-ratelimit-limit-requests": "500"})
    assert not lim.take().headers
    lim.observe({"x-ratelimit-limit-requests": "400"})
    assert lim.take().headers == ({"x-ratelimit-limit-requests": "400"},)


def test_429s_and_corrections_travel_with_the_next_ask() -> None:
    """429s (with their Retry-After) and token corrections since the last ask go in the next."""
    lim, _, wakes = remote(limited=True)
    lim.on_rate_limited(0.5)
    lim.on_rate_limited(None)
    lim.settle(Booking(100, 150), 130)
    lim.settle(Booking(100, 150), None)
    ask = lim.take()
    assert ask.refused == (0.5, None) and ask.correction == 30
    assert lim.rate_limited == 2 and len(wakes) == 2
    assert not lim.take()


def test_unused_output_tokens_travel_to_the_drivers_output_pace() -> None:
    """A worker's answers shorter than max_tokens send the unused output tokens with the
    next ask, and the driver's output pace (Anthropic's, apart from input) gives them back."""
    lim, _, _ = remote(limited=True)
    lim.settle(Booking(10, 110, 100), 10, 40)  # 60 output tokens booked but not used
    lim.settle(Booking(10, 110, 100), 10, 100)  # all used: nothing to give back
    ask = lim.take()
    assert ask.output == -60 and ask.correction == 0
    limiter, _ = make_limiter()
    grant(limiter, PaceAsk(headers=({"anthropic-ratelimit-output-tokens-limit": "600"},)))
    grant(limiter, PaceAsk(((0, 100),)))  # next slot at 10 s (10 output tokens a second)
    assert grant(limiter, PaceAsk(((0, 0),), output=-60)) == pytest.approx((4.0,))
