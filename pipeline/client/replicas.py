"""Several replicas of one model: requests go to the least loaded, a failing one is drained.

``--base-url`` given more than once names replicas of the same model (vLLM or llama.cpp
servers). Each has its own outage breaker. A request goes to the healthy replica with
the fewest requests in flight; a replica in an outage is drained (it gets no traffic)
and probed every few seconds (the client's probe, then the call that sent it) until it
answers again. When every replica is in an outage, requests queue for one-at-a-time
probes, exactly as with a single endpoint, and the run stops once the outage has lasted
past ``--max-outage``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from .outage import Outage

__all__ = ["PROBE_EVERY_S", "Replica", "Replicas"]

# How often a drained replica is probed while others carry the traffic.
PROBE_EVERY_S = 5.0

T = TypeVar("T")


class Replica(Generic[T]):
    """One replica: its base URL, its connection (``conn``), its breaker and its load."""

    __slots__ = ("conn", "in_flight", "next_probe", "outage", "takes_cache_key", "url")

    def __init__(self, url: str | None, conn: T, outage: Outage) -> None:
        self.url = url
        self.conn = conn
        self.outage = outage
        self.in_flight = 0
        self.next_probe = 0.0
        self.takes_cache_key = True  # False once it refused ``prompt_cache_key``


class Replicas(Generic[T]):
    """The replicas of one model, and the choice of the next one to use."""

    __slots__ = ("_clock", "all")

    def __init__(self, replicas: Sequence[Replica[T]], clock: Callable[[], float]) -> None:
        if not replicas:
            raise ValueError("at least one replica")
        self.all = list(replicas)
        self._clock = clock

    def healthy(self) -> list[Replica[T]]:
        """Replicas whose breaker is closed."""
        return [e for e in self.all if not e.outage.open]

    def pick(self) -> Replica[T]:
        """The replica for the next request.

        The least loaded healthy one; now and then (every PROBE_EVERY_S, and no sooner than
        its breaker's next probe) a drained one, to be probed, when no probe of it is in
        flight; when none is healthy, the one whose outage began last (the likeliest to
        come back), for a one-at-a-time probe.
        """
        healthy = self.healthy()
        if not healthy:
            return max(self.all, key=lambda e: e.outage.since or 0.0)
        now = self._clock()
        for e in self.all:
            due = now >= max(e.next_probe, e.outage.next_probe)
            if e.outage.open and not e.outage.lock.locked() and due:
                e.next_probe = now + PROBE_EVERY_S
                return e
        return min(healthy, key=lambda e: e.in_flight)
