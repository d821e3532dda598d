"""One rate limit for the cluster: the driver books time slots, workers ask for them in blocks.

The driver keeps one ``Limiter`` per model (generator, critic), the same GCRA pacer a
single process uses, so ``--rpm``/``--tpm``, limits adopted from headers and the slow-down
after a 429 behave exactly as they do there, for the whole cluster at once. A worker's
client gets a ``RemoteLimiter``: a request waiting to be sent joins the worker's next report
to the driver, which books every waiting request of that report at once and answers each
with the seconds to wait. So there is one round trip per block of requests, never one per
request, and none at all while the run has no limit. Waits are relative to the driver's
clock when it booked them: a slot reaches the worker a little late, never early, so the
cluster never goes faster than the limit, whichever machine each worker runs on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import anyio

from ...client.limits import LIMIT_HEADERS, RATE_HEADERS, Booking, Limiter, rate_limits
from .messages import PaceAsk

__all__ = ["RATE_HEADERS", "RemoteLimiter", "grant"]


class _SlotAsk:
    """One request waiting for its time slot."""

    __slots__ = ("granted", "max_tokens", "prompt", "wait")

    def __init__(self, prompt: int, max_tokens: int) -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.wait = 0.0
        self.granted = anyio.Event()


class RemoteLimiter:
    """A worker client's limiter: every request waits for a slot the driver's limiter booked."""

    __slots__ = (
        "_asked",
        "_correction",
        "_headers",
        "_limits",
        "_output",
        "_refused",
        "_sleep",
        "_waiting",
        "_wake",
        "limited",
        "rate_limited",
    )

    def __init__(
        self,
        limited: bool,
        wake: Callable[[], None],
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.limited = limited  # whether there is a limit at all (without one, nothing is asked)
        self.rate_limited = 0
        self._wake = wake  # tells the worker it has something to say
        self._sleep = sleep
        self._waiting: list[_SlotAsk] = []  # not yet asked for
        self._asked: list[_SlotAsk] = []  # asked for in the last report
        self._correction = 0
        self._output = 0  # output tokens booked but not used, since the last ask
        self._headers: list[dict[str, str]] = []
        self._refused: list[float | None] = []
        self._limits: dict[str, str] = {}  # the limit headers last passed on, by bucket

    async def acquire(self, prompt_estimate: int, max_tokens: int) -> Booking:
        """Wait for a time slot (at once, while the run has no limit)."""
        booking = Booking(prompt_estimate, prompt_estimate + max_tokens, max_tokens)
        if not self.limited:
            return booking
        slot = _SlotAsk(prompt_estimate, max_tokens)
        self._waiting.append(slot)
        self._wake()
        await slot.granted.wait()
        if slot.wait > 0:
            await self._sleep(slot.wait)
        return booking

    def settle(
        self, booking: Booking, prompt_tokens: int | None, completion_tokens: int | None = None
    ) -> None:
        """Pass the prompt (and output) tokens really counted on with the next ask."""
        if prompt_tokens is not None:
            self._correction += prompt_tokens - booking.prompt_estimate
        if completion_tokens is not None:
            self._output += min(0, completion_tokens - booking.max_tokens)

    def observe(self, headers: Mapping[str, str]) -> None:
        """Pass on headers that say something new: another limit, or a budget spent."""
        picked = {k: v for k in RATE_HEADERS if (v := headers.get(k)) is not None}
        news = False
        for bucket, limit in rate_limits(picked).items():
            if self._limits.get(bucket) != str(limit):
                self._limits[bucket] = str(limit)
                self.limited = news = True
        if any(picked.get(b.remaining, "").strip() == "0" for b in LIMIT_HEADERS):
            news = True
        if news:
            self._headers.append(picked)
            self._wake()

    def on_rate_limited(self, retry_after: float | None) -> None:
        """A 429: the driver slows the whole cluster down."""
        self.rate_limited += 1
        self._refused.append(retry_after)
        self._wake()

    @property
    def waiting(self) -> bool:
        """Whether requests or news wait for the next report."""
        return bool(self._waiting or self._headers or self._refused)

    def take(self) -> PaceAsk:
        """Everything to tell the driver in this report; the waiting requests are now asked for."""
        asking, self._waiting = self._waiting, []
        self._asked.extend(asking)
        ask = PaceAsk(
            tuple((s.prompt, s.max_tokens) for s in asking),
            self._correction,
            tuple(self._headers),
            tuple(self._refused),
            self._output,
        )
        self._correction = 0
        self._output = 0
        self._headers = []
        self._refused = []
        return ask

    def grant(self, waits: tuple[float, ...]) -> None:
        """The driver's grant of the last ask: each asked request's wait, in order."""
        asked, self._asked = self._asked, []
        for slot, wait in zip(asked, waits, strict=False):
            slot.wait = wait
            slot.granted.set()
        # Ungranted (the grant was lost with a driver call): ask again, never send unbooked.
        self._waiting[:0] = asked[len(waits) :]


def grant(limiter: Limiter, ask: PaceAsk | None) -> tuple[float, ...]:
    """Apply a worker's news to the cluster's limiter and book its requests: their waits."""
    if ask is None:
        return ()
    for headers in ask.headers:
        limiter.observe(headers)
    for retry_after in ask.refused:
        limiter.on_rate_limited(retry_after)
    if ask.correction or ask.output:
        # The worker's corrections arrive summed: settle them as one booking estimated at 0.
        limiter.settle(Booking(0, 0), ask.correction, ask.output or None)
    return tuple(limiter.book(prompt, max_tokens)[1] for prompt, max_tokens in ask.costs)
