"""One ``--budget`` for the cluster: workers reserve every request against the driver's Budget.

A single process reserves each request's worst case before sending it and settles it with
the real usage after (``pipeline.budget``). Under ``--budget`` a worker's client does the
same through a ``RemoteBudget``: its reservations join the worker's next report, the driver
holds them in the run's one ``Budget`` and decides in the next request; settlements travel
the same way. The cap is therefore exactly a single process's: a request that does not fit
waits while others (on any worker) hold money, and when nothing is held anywhere and it
still does not fit, it is refused and the run stops. Reservations cost no extra round trip:
they ride the exchange the worker makes anyway, in blocks. A worker that dies leaves its
reservations counted at their worst case, since its calls in flight may have been paid.
Without ``--budget`` nothing is asked: the driver adds up the steps as they arrive.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio

from ...client.budget import PROMPT_MARGIN, Budget, Reservation
from ...errors import BudgetReached

__all__ = ["Accounts", "RemoteBudget", "WorkerReservation", "reached"]

# (seq, model, prompt estimate, max_tokens) of one reservation asked for
Ask = tuple[int, str, int, int]


@dataclass(frozen=True, slots=True)
class WorkerReservation(Reservation):
    """A reservation the driver holds for a worker, by its number on that worker."""

    seq: int = 0


class RemoteBudget:
    """A worker's budget: the driver's, reached through the exchange."""

    __slots__ = ("_asks", "_pending", "_seqs", "_settled", "_wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._seqs = itertools.count()
        self._asks: list[Ask] = []
        self._pending: dict[int, tuple[anyio.Event, list[bool]]] = {}
        self._settled: list[tuple[int, dict[str, int] | None]] = []

    async def reserve(
        self, model: str, prompt_estimate: int, max_tokens: int, *, batch: bool = False
    ) -> Reservation | None:
        """Wait for the driver to hold this request's worst case; BudgetReached if it will not."""
        seq = next(self._seqs)
        waiting: tuple[anyio.Event, list[bool]] = (anyio.Event(), [])
        self._pending[seq] = waiting
        self._asks.append((seq, model, prompt_estimate, max_tokens))
        self._wake()
        await waiting[0].wait()
        if not waiting[1][0]:
            raise BudgetReached("the run's --budget is reached")
        return WorkerReservation(model, 0.0, batch, seq)

    def settle(self, reservation: Reservation | None, usage: Mapping[str, int] | None) -> None:
        """Report what the call cost, with the next report."""
        if isinstance(reservation, WorkerReservation):
            self._settled.append((reservation.seq, None if usage is None else dict(usage)))

    @property
    def waiting(self) -> bool:
        """Whether reservations wait to be asked for."""
        return bool(self._asks)

    def take(self) -> tuple[tuple[Ask, ...], tuple[tuple[int, dict[str, int] | None], ...]]:
        """The reservations to ask for and the settlements to report in this report."""
        asks, settled = tuple(self._asks), tuple(self._settled)
        self._asks, self._settled = [], []
        return asks, settled

    def decided(self, decisions: tuple[tuple[int, bool], ...]) -> None:
        """The driver's decisions: held, or refused."""
        for seq, held in decisions:
            waiting = self._pending.pop(seq, None)
            if waiting is not None:
                waiting[1].append(held)
                waiting[0].set()


def reached(budget: Budget) -> BudgetReached:
    """The error the run stops with when a worker's request is refused."""
    return BudgetReached(
        f"budget reached: ${budget.spent:.4f} of --budget ${budget.limit or 0:g} spent; "
        "re-run with a larger --budget to continue"
    )


class Accounts:
    """The driver's side of one worker's reservations in the run's Budget."""

    __slots__ = ("_batch", "_budget", "_generation", "_spawn", "_wake", "decisions", "held")

    def __init__(
        self,
        budget: Budget,
        spawn: Callable[..., None],
        wake: Callable[[], None],
        *,
        batch: bool = False,
    ) -> None:
        self._budget = budget
        self._batch = batch  # the run's calls cost the batch rate (the flex tier)
        self._spawn = spawn  # starts a task that outlives one exchange
        self._wake = wake
        self._generation = 0  # the worker process the reservations belong to
        self.held: dict[int, tuple[Reservation, dict[str, int]]] = {}  # with its worst usage
        self.decisions: list[tuple[int, bool]] = []  # for the next request

    def ask(self, asks: tuple[Ask, ...]) -> None:
        """Hold what fits now; a request that does not fit waits in a task, as in one process."""
        budget = self._budget
        for seq, model, prompt, max_tokens in asks:
            amount = budget.worst_case(model, prompt, max_tokens, batch=self._batch)
            if amount is None:  # no price: nothing to hold (the run has none with --budget)
                budget.unknown = True
                self.decisions.append((seq, True))
                continue
            held = None if budget.reached else budget.try_reserve(model, amount, batch=self._batch)
            if held is not None:
                self._keep(seq, held, prompt, max_tokens)
            elif budget.reached:
                self.decisions.append((seq, False))
            else:
                self._spawn(self._wait, self._generation, seq, model, prompt, max_tokens)

    async def _wait(
        self, generation: int, seq: int, model: str, prompt: int, max_tokens: int
    ) -> None:
        try:
            held = await self._budget.reserve(model, prompt, max_tokens, batch=self._batch)
        except BudgetReached:
            held, refused = None, True
        else:
            refused = False
        if generation != self._generation:  # the worker died meanwhile: nobody to tell
            self._budget.settle(held, None)
            return
        if refused:
            self.decisions.append((seq, False))
        elif held is None:
            self.decisions.append((seq, True))
        else:
            self._keep(seq, held, prompt, max_tokens)
        self._wake()

    def _keep(self, seq: int, held: Reservation, prompt: int, max_tokens: int) -> None:
        worst = {
            "prompt_tokens": math.ceil(prompt * PROMPT_MARGIN),
            "completion_tokens": max_tokens,
        }
        self.held[seq] = (held, worst)
        self.decisions.append((seq, True))

    def settle(self, settled: tuple[tuple[int, dict[str, int] | None], ...]) -> None:
        """Replace the worker's reservations by what its calls cost."""
        for seq, usage in settled:
            held = self.held.pop(seq, None)
            if held is not None:
                self._budget.settle(held[0], usage)

    def take(self) -> tuple[tuple[int, bool], ...]:
        """The decisions for the next request."""
        decisions, self.decisions = tuple(self.decisions), []
        return decisions

    def lost(self) -> None:
        """The worker died: its calls in flight may have been paid, so count their worst case."""
        self._generation += 1
        for held, worst in self.held.values():
            self._budget.settle(held, worst)
        self.held.clear()
        self.decisions.clear()
