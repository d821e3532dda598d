"""The outage breaker: an endpoint failing for everyone is probed, one request at a time.

After ``threshold`` endpoint faults (5xx, 429, timeouts, broken connections) with no
success between them the circuit opens. While it is open no call is sent: one probe at a
time is (the holder of ``lock``), each ``next_probe`` after the previous one's answer,
spaced by a growing interval (``Delays.probe_after``); the calls waiting behind it use up
none of their retries, and go again only once a probe succeeds and closes the circuit.
The client's probe is a tiny request of its own, not a record's: a request that reliably
crashes the server (a poison record) must not be what keeps the circuit open while the
endpoint serves everything else. The threshold is at most one more than a call's
retries, so a call alone in a dead server's queue opens the circuit before it gives up.

Only a request sent after the latest failed one can close it: an answer already on its
way when the server went down proves nothing. An outage longer than ``max_s``
(``first_s`` before any call has ever succeeded, which is most likely a wrong URL) stops
the run; records stay pending.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio

from ..errors import CallError, UnavailableError
from .retry import OutageState

__all__ = [
    "FIRST_CONTACT_S",
    "MAX_OUTAGE_S",
    "OUTAGE_AFTER",
    "PROBE_MAX_TOKENS",
    "PROBE_MESSAGES",
    "Outage",
    "unavailable_error",
]

# Consecutive endpoint faults with no success between them that make an outage; how
# long one is waited out (much less for an endpoint that never answered).
OUTAGE_AFTER = 8
MAX_OUTAGE_S = 300.0
FIRST_CONTACT_S = 30.0
# The client's probe: a one-token request of its own, so that what it proves is the
# endpoint's health, not that of some record's request.
PROBE_MESSAGES = ({"role": "user", "content": "Reply with OK."},)
PROBE_MAX_TOKENS = 1


class Outage:
    """A circuit breaker for one endpoint, and the schedule of its probes while open."""

    __slots__ = (
        "_clock",
        "failures",
        "first_s",
        "last_fault",
        "lock",
        "max_s",
        "next_probe",
        "probes",
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
        self.last_fault = -math.inf  # when the latest failed request was sent
        self.probes = 0  # failed probes since the circuit opened
        self.next_probe = -math.inf  # the earliest the next probe may go
        self.lock = anyio.Lock()  # held by the one call probing while open (FIFO: turns)

    @property
    def open(self) -> bool:
        """Whether calls must wait for probes."""
        return self.since is not None

    def close(self, sent_at: float) -> bool:
        """A success of a request sent at ``sent_at``; whether it proves the endpoint works.

        It does when sent after the latest failed request was: the circuit closes.
        """
        if sent_at < self.last_fault:
            return False
        self.failures = 0
        self.probes = 0
        self.since = None
        return True

    def failed(self, sent_at: float | None = None, delay: float = 0.0) -> None:
        """Count an endpoint fault of a request sent at ``sent_at`` (default: now).

        It may open the circuit. The next probe goes no sooner than ``delay`` from now (the
        probe interval, or the server's Retry-After), nor than any earlier fault asked.
        """
        now = self._clock()
        self.last_fault = max(self.last_fault, now if sent_at is None else sent_at)
        self.failures += 1
        if self.since is None and self.failures >= self.threshold:
            self.since = now
        self.next_probe = max(self.next_probe, now + delay)

    def probe_failed(self, sent_at: float, delay: float) -> None:
        """A probe sent at ``sent_at`` failed: the next one goes ``delay`` from now."""
        self.probes += 1
        self.failed(sent_at, delay)

    def wait_s(self) -> float:
        """Seconds until the next probe may go (0 when it may go now)."""
        return max(0.0, self.next_probe - self._clock())

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
        return OutageState(True, self.exceeded(ever_succeeded), self.duration())

    def unavailable(self, last: CallError) -> UnavailableError:
        """The error that stops the run: the outage outlasted what we wait for."""
        return unavailable_error(self.duration(), last)


def unavailable_error(duration_s: float, last: CallError) -> UnavailableError:
    """The error that stops the run after an outage of ``duration_s`` seconds, ``last`` its
    latest failure."""
    return UnavailableError(
        "unavailable",
        f"the endpoint has been failing for {duration_s:.0f} s (last: {last}); stopped, resumable",
        status=last.status,
    )
