"""The outage breaker: an endpoint that keeps failing is probed one request at a time.

After ``threshold`` server faults with no success between them the circuit opens:
requests to that endpoint then go one at a time (probes) with a capped backoff, and
their failures use up no call's retries, until a success closes it. The threshold is at
most one more than a call's retries, so a call alone in a dead server's queue opens the
circuit before it gives up. Only a request sent after the latest fault can close it: an
answer already on its way when the server went down proves nothing. An outage longer
than ``max_s`` (``first_s`` before any call has ever succeeded, which is most likely a
wrong URL) stops the run; records stay pending.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio

from .retry import OutageState

__all__ = ["FIRST_CONTACT_S", "MAX_OUTAGE_S", "OUTAGE_AFTER", "Outage"]

# Consecutive server faults (5xx, timeouts, broken connections) with no success between
# them that make an outage; how long one is waited out (much less for an endpoint that
# never answered).
OUTAGE_AFTER = 8
MAX_OUTAGE_S = 300.0
FIRST_CONTACT_S = 30.0


class Outage:
    """A circuit breaker for one endpoint."""

    __slots__ = (
        "_clock",
        "failures",
        "first_s",
        "last_fault",
        "lock",
        "max_s",
        "since",
        "threshold",
    )

    def __init__(
        self,
        max_s: float,
        first_s: float,
        clock: Callable[[], float],
        threshold: int = OUTAGE_AFTER,
    ) -> None:
        self.max_s = max_s
        self.first_s = first_s
        self.threshold = max(2, threshold)
        self._clock = clock
        self.failures = 0
        self.since: float | None = None
        self.last_fault = -math.inf
        self.lock = anyio.Lock()  # held by the one probe in flight while open

    @property
    def open(self) -> bool:
        """Whether requests should currently go one at a time."""
        return self.since is not None

    def close(self, sent_at: float) -> None:
        """A success of a request sent at ``sent_at``: the endpoint works, if sent after a fault."""
        if sent_at >= self.last_fault:
            self.failures = 0
            self.since = None

    def failed(self) -> None:
        """Count a server fault (it may open the circuit)."""
        now = self._clock()
        self.last_fault = now
        self.failures += 1
        if self.failures >= self.threshold and self.since is None:
            self.since = now

    def duration(self) -> float:
        """Seconds since the circuit opened (0 when closed)."""
        return 0.0 if self.since is None else self._clock() - self.since

    def exceeded(self, ever_succeeded: bool) -> bool:
        """Whether the outage has outlasted what we wait for."""
        limit = self.max_s if ever_succeeded else min(self.max_s, self.first_s)
        return self.duration() > limit

    def state(self, ever_succeeded: bool) -> OutageState:
        """The breaker as the retry policy sees it."""
        if not self.open:
            return OutageState()
        return OutageState(
            open=True,
            exceeded=self.exceeded(ever_succeeded),
            probes=max(0, self.failures - self.threshold),
        )
