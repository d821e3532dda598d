"""The Batch API driver's window: the records it holds, their next calls and their batches.

The window is the driver's memory bound (``BatchConfig.window`` records, their steps in
memory). A record of a batch an earlier invocation left in flight is read past the bound
(``live``), so that batch's lines find their record when it ends.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ...client.attempts import Attempts
from ...client.budget import Reservation
from ...core.loop import Call
from ...core.records import Record
from ...core.steps import Step
from .ledger import Entry

__all__ = ["Held", "Window"]


@dataclass(slots=True)
class Held:
    """A record in the window: its steps, its next call and that call's attempts, and the
    batch carrying the call."""

    record: Record
    steps: list[Step]
    call: Call | None = None
    # The call's retry sequence (its tries, retries used, format floor): set with ``call``,
    # kept across the batches that carry it.
    attempts: Attempts | None = None
    token: str | None = None  # the open batch that carries the call
    reservation: Reservation | None = None


class Window:
    """The records held, by id; whether the input has ended; the live calls not yet read."""

    __slots__ = ("exhausted", "held", "live")

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}
        self.exhausted = False  # the record stream has ended
        self.live: dict[str, tuple[str, int]] = {}  # record -> (token, step) of live calls unread

    def __len__(self) -> int:
        return len(self.held)

    def carried(self, entry: Entry) -> list[Held]:
        """The held records whose call this batch carries."""
        out = []
        for rid, n, _ in entry.calls:
            held = self.held.get(rid)
            if held is not None and held.token == entry.token and len(held.steps) == n:
                out.append(held)
        return out

    def ready(self) -> list[Held]:
        """The held records whose next call is planned and in no batch."""
        return [h for h in self.held.values() if h.call is not None and h.token is None]

    def in_batches(self) -> int:
        """Held records whose call an open batch carries."""
        return sum(1 for h in self.held.values() if h.token is not None)

    def waiting(self) -> dict[str, int]:
        """Held records with a call planned, by the call's role."""
        return dict(Counter(h.call.role for h in self.held.values() if h.call is not None))
