"""Service tiers, and the flex tier's refusals waited out as capacity.

``--service-tier`` is sent as ``service_tier`` on every chat call. On ``flex`` (OpenAI's
synchronous calls at the Batch API rate) the provider may answer 429
``resource_unavailable`` when it has no capacity: that is neither a rate limit (the pacer
must not slow every record for it) nor the request's fault (it uses up no retry and fails
no record) nor an endpoint outage. The call waits with backoff (``Delays.flex``) and goes
again. Only when
no flex call at all has succeeded for ``max_s`` seconds since the first refusal does the
run stop, resumable, with exit status 5.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from ..errors import CallError, UnavailableError
from .delays import Backoff

__all__ = [
    "FLEX",
    "FLEX_TIMEOUT_S",
    "SERVICE_TIERS",
    "Capacity",
    "flex_refused",
    "tier_options",
]

SERVICE_TIERS: Final = ("flex", "default", "priority", "auto")
FLEX: Final = "flex"
# OpenAI's advice for flex: a long timeout (its SDK's default is 600 s).
FLEX_TIMEOUT_S: Final = 900.0
_UNAVAILABLE: Final = "resource_unavailable"


def tier_options(tier: str | None) -> dict[str, str]:
    """The request-body field naming the service tier (none when unset)."""
    return {} if tier is None else {"service_tier": tier}


def flex_refused(status: int | None, code: str | None) -> bool:
    """Whether an error answer is the flex tier's "no capacity now" (429 resource_unavailable)."""
    return status == 429 and (code or "").lower() == _UNAVAILABLE


class Capacity:
    """The flex tier's refusals: how long each refused call waits, and when to give up."""

    __slots__ = ("_clock", "backoff", "max_s", "refused", "since")

    def __init__(self, max_s: float, clock: Callable[[], float], backoff: Backoff) -> None:
        self.max_s = max_s
        self._clock = clock
        self.backoff = backoff
        self.since: float | None = None  # the first refusal since the last success
        self.refused = 0  # refusals in all (a figure for progress and tests)

    def succeeded(self) -> None:
        """A flex call was answered: capacity is there."""
        self.since = None

    def refusal(self, waits: int, rand: float) -> float:
        """Count a refusal; the seconds the call waits before its ``waits``-th try again."""
        self.refused += 1
        if self.since is None:
            self.since = self._clock()
        return self.backoff.delay(waits, rand)

    def exceeded(self) -> bool:
        """Whether no flex call has succeeded for longer than the run waits."""
        return self.since is not None and self._clock() - self.since > self.max_s

    def duration(self) -> float:
        """Seconds since the first refusal with no success after it (0 when none)."""
        return 0.0 if self.since is None else self._clock() - self.since

    def unavailable(self, last: CallError) -> UnavailableError:
        """The error that stops the run: the flex tier refused everything for too long."""
        return UnavailableError(
            "flex_unavailable",
            f"the flex tier has had no capacity for {math.floor(self.duration()):.0f} s "
            f"(--max-outage {self.max_s:g}; last: {last}); stopped, resumable: run the same "
            "command again later, or with --service-tier default",
            status=last.status,
        )
