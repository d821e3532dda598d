"""What the driver and a Ray worker say to each other.

The driver keeps one call in flight per worker, ``Worker.exchange(Orders) -> Report``.
The orders carry acknowledgements of journaled steps, records to run, decisions on the
worker's asks (time slots, budget reservations) and whether to halt; the report carries what
happened since (steps to journal, records finished or halted, calls settled) and the
worker's new asks. Time slots asked in a report are answered by the very next orders, in
order; a reservation is answered by its number, later when it has to wait for money.
Everything here crosses process boundaries: plain values only (errors too, see WireError).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.records import Record
from ...core.steps import Outcome, Step
from ...errors import AuthError, BudgetReached, FatalCallError, UnavailableError

__all__ = [
    "POLL_S",
    "Assignment",
    "Crashed",
    "Event",
    "Finished",
    "Halted",
    "Orders",
    "PaceAsk",
    "Report",
    "Saved",
    "WireError",
]

# How long a worker with records in flight holds an exchange open when it has nothing to
# say yet: the longest the driver waits to tell it something (halt, new limits).
POLL_S = 0.25

_FATAL: dict[str, type[FatalCallError]] = {
    "AuthError": AuthError,
    "UnavailableError": UnavailableError,
    "FatalCallError": FatalCallError,
}


@dataclass(frozen=True, slots=True)
class WireError:
    """An error that stops the run, in a form that survives pickling (CallError's does not)."""

    type: str  # the class name: AuthError, UnavailableError, FatalCallError or BudgetReached
    message: str
    category: str = ""
    status: int | None = None

    @classmethod
    def of(cls, err: FatalCallError | BudgetReached) -> WireError:
        """The wire form of ``err``."""
        if isinstance(err, BudgetReached):
            return cls("BudgetReached", str(err))
        name = next((n for n, t in _FATAL.items() if type(err) is t), "FatalCallError")
        return cls(name, str(err), err.category, err.status)

    def error(self) -> FatalCallError | BudgetReached:
        """The error again, as the driver raises or reports it."""
        if self.type == "BudgetReached":
            return BudgetReached(self.message)
        return _FATAL.get(self.type, FatalCallError)(
            self.category, self.message, status=self.status
        )


@dataclass(frozen=True, slots=True)
class Assignment:
    """A record to run, with the steps the driver has journaled for it (its resume point)."""

    record: Record
    prior: tuple[Step, ...] = ()


@dataclass(frozen=True, slots=True)
class Saved:
    """A completed call: the worker's loop waits until the driver acknowledges ``seq``.

    The step travels in its stored form (``core.trace``): the messages it added to the
    record's conversation, not the whole conversation again.
    """

    seq: int
    record_id: str
    index: int
    step: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Finished:
    """A record's loop ended; ``outcome.steps`` holds only steps the driver never journaled.

    That is the call that failed for good, if any: the driver has every other step already,
    so sending them again would double the traffic of every record.
    """

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Halted:
    """A record's loop stopped unfinished: by an error that halts the run, or a halt request."""

    record_id: str
    error: WireError | None = None


@dataclass(frozen=True, slots=True)
class Crashed:
    """A record's loop raised an error nobody expected (a bug): the driver re-raises it."""

    record_id: str
    text: str  # the traceback, as the worker formatted it


Event = Saved | Finished | Halted | Crashed


@dataclass(frozen=True, slots=True)
class PaceAsk:
    """What one client of a worker tells the driver's limiter, and the slots it asks for."""

    costs: tuple[tuple[int, int], ...] = ()  # (prompt estimate, max_tokens) per waiting request
    correction: int = 0  # prompt tokens counted minus those estimated, since the last ask
    headers: tuple[dict[str, str], ...] = ()  # rate-limit headers that announce something new
    refused: tuple[float | None, ...] = ()  # the Retry-After of each 429 since the last ask
    output: int = 0  # output tokens booked but not used (<= 0), where output is paced apart

    def __bool__(self) -> bool:
        return bool(self.costs or self.correction or self.headers or self.refused or self.output)


@dataclass(frozen=True, slots=True)
class Orders:
    """The driver to a worker (named apart from a model call's ``core.steps.Request``)."""

    instance: str  # the worker process this is meant for; another one ignores it
    acks: tuple[int, ...] = ()
    assign: tuple[Assignment, ...] = ()
    waits: tuple[tuple[float, ...], ...] = ()  # per client, seconds before each asked slot
    reserved: tuple[tuple[int, bool], ...] = ()  # per reservation asked for: held, or refused
    halt: bool = False  # start no more calls; finish those in flight
    poll_s: float = POLL_S


@dataclass(frozen=True, slots=True)
class Report:
    """A worker to the driver."""

    instance: str
    pid: int
    node: str
    events: tuple[Event, ...] = ()
    pace: tuple[PaceAsk, ...] = ()  # per client: generator, then critic
    reserve: tuple[tuple[int, str, int, int], ...] = ()  # (seq, model, prompt, max_tokens)
    settled: tuple[tuple[int, dict[str, int] | None], ...] = ()  # (seq, usage or None)
    calls: int = 0  # HTTP requests sent, retries and 429s seen, since the process started
    retries: int = 0
    rate_limited: int = 0
