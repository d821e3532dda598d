"""The spending cap: every request reserves its worst case before it is sent.

With thousands of calls in flight, checking what was spent after each answer overshoots
by everything in flight. So before a request goes out it reserves its worst-case cost
(the prompt estimate, with a margin for tokenizers that count more than four characters
a token, at the dearest input rate, which is a cache write where the provider bills them,
plus ``max_tokens`` at the output price); when the answer comes the reservation
is settled with the real usage. A request that does not fit waits while other requests
hold money (their answers usually cost far less than their worst case, and free the
rest); when nothing is held and it still does not fit, it raises BudgetReached: the run
stops taking calls, lets those in flight finish, and exits resumable. Without a limit
the same object keeps the running total shown in progress and status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import anyio

from ..errors import BudgetReached
from .models import ModelId
from .prices import PriceBook

__all__ = ["PROMPT_MARGIN", "Budget", "Reservation", "Spending"]

# The prompt estimate is characters / 4; code and non-English text can run to about
# 3 characters a token, so the worst case counts a third more.
PROMPT_MARGIN = 4 / 3


@dataclass(frozen=True, slots=True)
class Reservation:
    """Dollars held for one request until its usage is known."""

    model: str
    amount: float
    batch: bool = False


class Spending(Protocol):
    """What the client asks of a budget: a ``Budget`` here, or the driver's on a Ray worker."""

    async def reserve(
        self, model: str, prompt_estimate: int, max_tokens: int, *, batch: bool = False
    ) -> Reservation | None:
        """Hold one request's worst case; BudgetReached when it cannot be held."""
        ...

    def settle(self, reservation: Reservation | None, usage: Mapping[str, int] | None) -> None:
        """Replace a reservation by what the call really cost."""
        ...


class Budget:
    """Spend so far, money held for requests in flight, and the cap."""

    __slots__ = ("_freed", "_prices", "held", "limit", "reached", "reserved", "spent", "unknown")

    def __init__(self, limit: float | None, prices: PriceBook, spent: float = 0.0) -> None:
        self.limit = limit
        self._prices = prices
        self.spent = spent  # settled dollars, this invocation and the earlier ones
        self.reserved = 0.0
        self.held = 0  # reservations not yet settled
        self.unknown = False  # a call to a model with no price was made: totals are incomplete
        self.reached = False  # a request found the budget spent
        self._freed: anyio.Event | None = None  # set when a reservation is settled

    @property
    def prices(self) -> PriceBook:
        """The price table in use."""
        return self._prices

    def total(self) -> float | None:
        """Dollars spent so far, or None when some call's price is unknown."""
        return None if self.unknown else round(self.spent, 6)

    def worst_case(
        self, model: str, prompt_estimate: int, max_tokens: int, *, batch: bool = False
    ) -> float | None:
        """The most one request can cost, or None when the model has no price."""
        price = self._prices.price(model)
        if price is None:
            return None
        worst_prompt = math.ceil(prompt_estimate * PROMPT_MARGIN)
        writes = ModelId.parse(model).provider.writes_cache  # every prompt token a cache write
        return price.worst_case(worst_prompt, max_tokens, batch=batch, writes=writes)

    def try_reserve(self, model: str, amount: float, *, batch: bool = False) -> Reservation | None:
        """Hold ``amount`` if it fits under the limit now; None when it does not."""
        if self.limit is not None and self.spent + self.reserved + amount > self.limit:
            return None
        self.reserved += amount
        self.held += 1
        return Reservation(model, amount, batch)

    async def reserve(
        self, model: str, prompt_estimate: int, max_tokens: int, *, batch: bool = False
    ) -> Reservation | None:
        """Hold the worst case of one request, waiting for others to settle if need be.

        Raises BudgetReached when nothing else is held and the request still does not fit.
        """
        amount = self.worst_case(model, prompt_estimate, max_tokens, batch=batch)
        if amount is None:
            self.unknown = True
            return None
        while True:
            if self.reached:
                raise self._reached(amount)
            held = self.try_reserve(model, amount, batch=batch)
            if held is not None:
                return held
            if self.held == 0:
                self.reached = True
                raise self._reached(amount)
            if self._freed is None:
                self._freed = anyio.Event()
            await self._freed.wait()

    def _reached(self, amount: float) -> BudgetReached:
        return BudgetReached(
            f"budget reached: ${self.spent:.4f} of --budget ${self.limit:g} spent; the next "
            f"call could cost up to ${amount:.4f}. Re-run with a larger --budget to continue"
        )

    def settle(self, reservation: Reservation | None, usage: Mapping[str, int] | None) -> None:
        """Replace a reservation by what the call really cost (nothing, when it failed)."""
        if reservation is None:
            return
        self.reserved = max(0.0, self.reserved - reservation.amount)
        self.held -= 1
        if usage is not None:
            price = self._prices.price(reservation.model)
            if price is not None:
                self.spent += price.cost(usage, batch=reservation.batch)
        freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()

    def charge(self, model: str, usage: Mapping[str, int], *, batch: bool = False) -> None:
        """Add the cost of a call made without a reservation in this process."""
        price = self._prices.price(model)
        if price is None:
            self.unknown = True
            return
        self.spent += price.cost(usage, batch=batch)
