"""One --budget for a Ray cluster: workers reserve against the driver's Budget."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from pipeline.backends.ray.spending import Accounts, RemoteBudget
from pipeline.client.budget import Budget, Reservation
from pipeline.client.prices import Price, PriceBook
from pipeline.errors import BudgetReached

pytestmark = pytest.mark.anyio

PRICES = PriceBook({"m": Price(1_000_000.0, 1_000_000.0)})  # a dollar a token: easy sums


class Spawner:
    """Runs the tasks Accounts starts in a task group; counts the wake-ups."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self.tg = tg
        self.wakes = 0

    def spawn(self, func: Any, *args: Any) -> None:
        self.tg.start_soon(func, *args)

    def wake(self) -> None:
        self.wakes += 1


def worst(prompt: int, max_tokens: int) -> float:
    """The worst case of a request, in dollars (PROMPT_MARGIN on the prompt)."""
    amount = Budget(None, PRICES).worst_case("m", prompt, max_tokens)
    assert amount is not None
    return amount


async def test_reservations_that_fit_are_held_at_once() -> None:
    """Asks that fit are answered in the next request, holding their worst case."""
    budget = Budget(100.0, PRICES)
    async with anyio.create_task_group() as tg:
        s = Spawner(tg)
        accounts = Accounts(budget, s.spawn, s.wake)
        accounts.ask(((0, "m", 3, 10), (1, "m", 3, 10)))
        assert accounts.take() == ((0, True), (1, True))
        assert budget.reserved == pytest.approx(2 * worst(3, 10)) and budget.held == 2
        accounts.settle(((0, {"prompt_tokens": 3, "completion_tokens": 2}), (1, None)))
    assert budget.held == 0 and budget.spent == pytest.approx(5.0)


async def test_a_reservation_that_does_not_fit_waits_for_others_to_settle() -> None:
    """As in one process: a request waits while money is held, on any worker, then goes."""
    budget = Budget(30.0, PRICES)
    async with anyio.create_task_group() as tg:
        s = Spawner(tg)
        first, second = Accounts(budget, s.spawn, s.wake), Accounts(budget, s.spawn, s.wake)
        first.ask(((0, "m", 3, 10),))  # holds 14 of 30
        first.ask(((1, "m", 3, 10),))  # holds 28
        second.ask(((0, "m", 3, 10),))  # does not fit: waits
        await anyio.wait_all_tasks_blocked()
        assert second.take() == ()
        first.settle(((0, {"prompt_tokens": 1, "completion_tokens": 0}),))  # 1 spent, 15 held
        await anyio.wait_all_tasks_blocked()
        assert second.take() == ((0, True),) and s.wakes == 1


async def test_nothing_held_anywhere_and_no_fit_is_refused() -> None:
    """When nothing is held and the request still does not fit, it is refused, and all after it."""
    budget = Budget(10.0, PRICES)
    async with anyio.create_task_group() as tg:
        s = Spawner(tg)
        accounts = Accounts(budget, s.spawn, s.wake)
        accounts.ask(((0, "m", 3, 10),))
        await anyio.wait_all_tasks_blocked()
        assert accounts.take() == ((0, False),) and budget.reached
        accounts.ask(((1, "m", 1, 1),))
        assert accounts.take() == ((1, False),)


async def test_a_dead_workers_reservations_count_at_their_worst_case() -> None:
    """A dead worker's calls in flight count in full; its waiting reservation goes unanswered."""
    budget = Budget(30.0, PRICES)
    async with anyio.create_task_group() as tg:
        s = Spawner(tg)
        accounts = Accounts(budget, s.spawn, s.wake)
        accounts.ask(((0, "m", 3, 10), (1, "m", 3, 10), (2, "m", 3, 10)))  # the third waits
        await anyio.wait_all_tasks_blocked()
        accounts.lost()
        await anyio.wait_all_tasks_blocked()
    assert budget.spent == pytest.approx(2 * worst(3, 10))
    assert budget.held == 0 and budget.reached  # 28 counted spent: the third never fits
    assert accounts.take() == ()


async def test_remote_budget_round_trip_keeps_a_single_process_cap() -> None:
    """Worker-side reservations answered by the driver: held, settled, then refused at the cap."""
    budget = Budget(30.0, PRICES)  # two worst cases (14 each) fit, not a third after them
    wakes: list[int] = []
    remote = RemoteBudget(lambda: wakes.append(1))
    results: list[Reservation | str | None] = []

    async def call() -> None:
        try:
            held = await remote.reserve("m", 3, 10)
        except BudgetReached:
            results.append("refused")
            return
        results.append(held)
        remote.settle(held, {"prompt_tokens": 3, "completion_tokens": 10})

    async with anyio.create_task_group() as tg:
        s = Spawner(tg)
        accounts = Accounts(budget, s.spawn, s.wake)
        for _ in range(3):
            tg.start_soon(call)
        with anyio.fail_after(5):
            while len(results) < 3:
                await anyio.wait_all_tasks_blocked()
                asks, settled = remote.take()
                accounts.settle(settled)
                accounts.ask(asks)
                await anyio.wait_all_tasks_blocked()
                remote.decided(accounts.take())
    assert results.count("refused") == 1 and budget.spent == pytest.approx(26.0)
    assert wakes


async def test_a_flex_run_reserves_and_settles_at_the_batch_rate() -> None:
    """--service-tier flex on Ray: the driver holds and settles workers' calls at the batch rate."""
    budget = Budget(100.0, PRICES)
    async with anyio.create_task_group() as tg:
        s = Spawner(tg)
        accounts = Accounts(budget, s.spawn, s.wake, batch=True)
        accounts.ask(((0, "m", 3, 10),))
        assert accounts.take() == ((0, True),)
        assert budget.reserved == pytest.approx(0.5 * worst(3, 10))
        accounts.settle(((0, {"prompt_tokens": 3, "completion_tokens": 2}),))
    assert budget.spent == pytest.approx(2.5)
