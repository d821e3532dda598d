"""The real-time driver: up to ``--concurrency`` records in flight through the pool."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from anyio.abc import ObjectSendStream

from ..core.loop import refine_record
from ..core.records import Record
from ..errors import BudgetReached, FatalCallError, StoreError
from .clients import Models
from .pool import run_pool
from .session import Session, StopReason, stop_reason_of

__all__ = ["Driver", "run_realtime"]

# What every driver is: given a run's session and its clients, run the records.
Driver = Callable[[Session, Models], Awaitable[None]]


async def run_realtime(session: Session, models: Models) -> None:
    """The real-time driver: up to ``--concurrency`` records in flight through the pool."""

    async def produce(send: ObjectSendStream[Record]) -> None:
        await session.records(send.send)

    async def work(record: Record) -> None:
        session.counters.in_flight += 1
        try:
            outcome = await refine_record(
                record,
                session.job,
                models.generator,
                session.sink(),
                session.policy,
                critic=models.critic,
                prior=session.take_prior(record.id),
            )
        except BudgetReached as err:
            session.stop.set(StopReason.BUDGET, err)  # the record stays pending
            return
        finally:
            session.counters.in_flight -= 1
        session.finish(outcome)

    try:
        await run_pool(produce, work, session.settings.concurrency)
    except* (FatalCallError, StoreError) as group:
        err = group.exceptions[0]
        session.stop.set(stop_reason_of(err), err)
