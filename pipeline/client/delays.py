"""Every delay the retry layer takes, as one frozen value given to the client.

A ``Backoff`` is exponential with jitter (half of each delay fixed, half random), clamped
so a huge attempt number cannot overflow. ``Delays`` holds the three schedules the client
waits by (a call's retries, the outage probes, the flex tier's refusals) and the longest
part of a server's Retry-After waited in one go. Runs use ``DELAYS``; tests give the client
``NO_DELAYS`` (or a schedule of their own) instead of sleeping for real.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_CAP_S",
    "DELAYS",
    "FLEX_BACKOFF_BASE_S",
    "FLEX_BACKOFF_CAP_S",
    "NO_DELAYS",
    "OUTAGE_PROBE_CAP_S",
    "PROBE_BASE_S",
    "RETRY_AFTER_CAP_S",
    "Backoff",
    "Delays",
    "backoff_delay",
]

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# A server's Retry-After longer than this is not waited out in one sleep: the call waits
# this long, then asks again (and the outage breaker takes over if the server stays down).
RETRY_AFTER_CAP_S = 120.0
# Spacing of the one-at-a-time probes sent while an endpoint is in an outage: the first
# this long after the circuit opens, each next one twice as long after the previous one's
# answer (half of it jittered), at most OUTAGE_PROBE_CAP_S (or the server's Retry-After).
PROBE_BASE_S = 0.5
OUTAGE_PROBE_CAP_S = 5.0
# A refused flex call waits 1 s, then twice as long each time, at most a minute (half of it
# jittered, so the calls refused together do not come back together).
FLEX_BACKOFF_BASE_S = 1.0
FLEX_BACKOFF_CAP_S = 60.0
_MAX_DOUBLINGS = 32  # 2**32 times any base is past every cap: no overflow beyond it


def backoff_delay(
    attempt: int, rand: float, *, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S
) -> float:
    """Exponential backoff with jitter for retry ``attempt`` (1-based): half fixed, half random.

    Clamped before exponentiation so huge attempt numbers cannot overflow.
    """
    exp = min(max(attempt - 1, 0), _MAX_DOUBLINGS)
    ceiling = min(cap, base * (2.0**exp))
    return ceiling * (0.5 + 0.5 * min(max(rand, 0.0), 1.0))


@dataclass(frozen=True, slots=True)
class Backoff:
    """One backoff schedule: ``base`` seconds doubled per attempt, at most ``cap``."""

    base: float
    cap: float

    def delay(self, attempt: int, rand: float) -> float:
        """The delay before retry ``attempt`` (1-based), ``rand`` in [0, 1] its jitter."""
        return backoff_delay(attempt, rand, base=self.base, cap=self.cap)


@dataclass(frozen=True, slots=True)
class Delays:
    """How long the client waits: between a call's attempts, between outage probes, after a
    flex refusal, and at most for a server's Retry-After in one go."""

    retry: Backoff = Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S)
    probe: Backoff = Backoff(PROBE_BASE_S, OUTAGE_PROBE_CAP_S)
    flex: Backoff = Backoff(FLEX_BACKOFF_BASE_S, FLEX_BACKOFF_CAP_S)
    asked_cap: float = RETRY_AFTER_CAP_S

    def asked(self, wait: float | None) -> float:
        """The part of a server's Retry-After (``wait``) waited in one go: capped."""
        if wait is None:
            return 0.0
        return min(max(wait, 0.0), self.asked_cap)

    def after_failure(self, attempt: int, rand: float, wait: float | None = None) -> float:
        """The delay before a call's retry ``attempt``: our backoff, or the server's
        Retry-After when longer (a flapping server is not hammered, and one that names its
        wait gets it)."""
        return max(self.retry.delay(attempt, rand), self.asked(wait))

    def probe_after(self, probes: int, rand: float, wait: float | None = None) -> float:
        """How long after a failed probe's answer (``probes`` failed so far) the next one goes.

        Doubling from the probe schedule's base up to its cap, half of it jittered, or the
        server's Retry-After when longer.
        """
        return max(self.probe.delay(probes + 1, rand), self.asked(wait))


DELAYS = Delays()
NO_DELAYS = Delays(Backoff(0.0, 0.0), Backoff(0.0, 0.0), Backoff(0.0, 0.0), 0.0)
